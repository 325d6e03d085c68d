//! The HTTP shell: parses requests, applies injected faults, checks access and routes
//! each request; resource requests go to `resource` (gets and writes), `admitted` (writes
//! through mutating admission), `list` and `watch`. Decisions live in the store and its
//! helpers.

mod admitted;
mod list;
mod resource;
mod watch;

use resource::resource_request;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use serde_json::Value;

use crate::discovery;
use crate::faults::FaultState;
use crate::openapi;
use crate::request_log::{RequestLog, RequestRecord};
use crate::resources::ResourceType;
use crate::route::{self, ResourceRoute, Route};
use crate::state::SharedStore;
use crate::status::ApiError;
use crate::store::{Committed, Store, WriteContext};
use crate::table;

/// Kubernetes' request body limit (3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// What the HTTP shell of a running server holds: the shared store (no HTTP in it) and
/// the request-level settings, faults and log.
pub struct AppState {
    /// The objects, shared with the server's other handles.
    pub store: SharedStore,
    /// Faults set through [`crate::FaultHandle`]; every request consults them.
    pub faults: Mutex<FaultState>,
    /// Requests answered, for tests to inspect.
    pub log: RequestLog,
    /// Address advertised in the `/api` document (`serverAddressByClientCIDRs`).
    pub server_address: String,
    /// Interval of BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Watch duration when the client gives no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// Authentication + RBAC; None: every request is allowed.
    pub auth: Option<crate::authn::AuthConfig>,
    /// Time for a request body to arrive once the head has.
    pub body_read_timeout: Duration,
    /// The ServiceAccount admission plugin runs on pod creation (`Config::service_accounts`).
    pub service_accounts: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AppState {
    /// See [`SharedStore::write`].
    pub fn write<T>(
        &self,
        f: impl FnOnce(&mut Store) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        self.store.write(f)
    }

    /// See [`SharedStore::write_ctx`].
    pub fn write_ctx<T>(
        &self,
        ctx: &WriteContext,
        f: impl FnOnce(&mut Store) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        self.store.write_ctx(ctx, f)
    }

    /// Runs `f` on the store under its lock.
    pub fn read<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        self.store.read(f)
    }

    /// Ends every open watch now (clients re-watch); watches started later are not affected.
    pub fn close_all_watches(&self) {
        self.store.close_all_watches();
    }
}

/// Query parameters of a resource request.
#[derive(Debug, Default)]
struct Params {
    watch: bool,
    label_selector: String,
    field_selector: String,
    limit: Option<usize>,
    continue_token: Option<String>,
    resource_version: Option<String>,
    timeout_seconds: Option<u64>,
    allow_bookmarks: bool,
    send_initial_events: bool,
    dry_run: bool,
    field_manager: Option<String>,
    force: bool,
    /// The User-Agent, from which the default field manager is derived.
    user_agent: Option<String>,
    /// The authenticated user (None when authentication is off): admission webhooks'
    /// `request.userInfo`.
    user: Option<crate::rbac::UserInfo>,
}

fn parse_params(uri: &axum::http::Uri) -> Result<Params, ApiError> {
    let pairs: Vec<(String, String)> =
        match axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri) {
            Ok(q) => q.0,
            Err(e) => {
                return Err(ApiError::bad_request(format!(
                    "malformed query string: {e}"
                )));
            }
        };
    let mut p = Params::default();
    let truthy = |v: &str| v == "true" || v == "1";
    for (k, v) in pairs {
        match k.as_str() {
            "watch" => p.watch = truthy(&v),
            "labelSelector" => p.label_selector = v,
            "fieldSelector" => p.field_selector = v,
            "limit" => {
                p.limit =
                    Some(v.parse().map_err(|_| {
                        ApiError::bad_request(format!("limit: invalid value {v:?}"))
                    })?)
            }
            "continue" => p.continue_token = Some(v),
            "resourceVersion" => p.resource_version = Some(v),
            "timeoutSeconds" => {
                p.timeout_seconds = Some(v.parse().map_err(|_| {
                    ApiError::bad_request(format!("timeoutSeconds: invalid value {v:?}"))
                })?)
            }
            "allowWatchBookmarks" => p.allow_bookmarks = truthy(&v),
            "sendInitialEvents" => p.send_initial_events = truthy(&v),
            "dryRun" => p.dry_run = !v.is_empty(),
            "fieldManager" => p.field_manager = Some(v).filter(|m| !m.is_empty()),
            "force" => p.force = truthy(&v),
            _ => {}
        }
    }
    Ok(p)
}

/// The Kubernetes verb of a request, for logs and fault rules.
fn verb_of(method: &Method, rr: &ResourceRoute, watch: bool) -> &'static str {
    match (method.as_str(), rr.name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "other",
    }
}

fn json_response(code: u16, body: &Value) -> Response {
    bytes_response(code, serde_json::to_vec(body).unwrap_or_default())
}

fn bytes_response(code: u16, body: Vec<u8>) -> Response {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn error_response(e: &ApiError) -> Response {
    json_response(e.code, &e.to_status())
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(String::from)
}

/// The axum fallback handler: every request comes through here.
pub async fn handle(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let method = parts.method.clone();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or("").to_string();
    let ct = header_str(&parts.headers, header::CONTENT_TYPE);
    let accept = header_str(&parts.headers, header::ACCEPT).unwrap_or_default();
    let user_agent = header_str(&parts.headers, header::USER_AGENT);
    let route = route::parse(&path);
    let params = parse_params(&parts.uri).map(|mut p| {
        p.user_agent = user_agent.clone();
        p
    });
    let api_group = match &route {
        Route::Resource(rr) => rr.resource.group.to_string(),
        _ => String::new(),
    };
    let (verb, resource, namespace, name) = match (&route, &params) {
        (Route::Resource(rr), Ok(p)) => (
            verb_of(&method, rr, p.watch),
            rr.resource_path(),
            rr.namespace.clone(),
            rr.name.clone(),
        ),
        (Route::Resource(rr), Err(_)) => (
            verb_of(&method, rr, false),
            rr.resource_path(),
            rr.namespace.clone(),
            rr.name.clone(),
        ),
        _ => ("discovery", String::new(), None, None),
    };
    let authorization = header_str(&parts.headers, header::AUTHORIZATION);
    let (user, access) = match crate::impersonation::from_headers(&parts.headers) {
        Ok(imp) => check_access(&st, authorization.as_deref(), imp, &route, verb),
        Err(e) => (None, Err(e)),
    };
    // A body that trickles in (or never comes) must not hold the connection forever.
    let body = match tokio::time::timeout(
        st.body_read_timeout,
        axum::body::to_bytes(body, MAX_BODY + 1),
    )
    .await
    {
        Ok(b) => b.map_err(|_| ApiError::too_large()),
        Err(_) => Err(ApiError::new(
            408,
            "Timeout",
            format!(
                "the request body did not arrive within {:?}",
                st.body_read_timeout
            ),
        )),
    };
    let (resp, body_text) = match body {
        Ok(_) if access.is_err() => (
            error_response(
                &access
                    .clone()
                    .err()
                    .unwrap_or_else(crate::authn::unauthorized),
            ),
            String::new(),
        ),
        Err(e) => (error_response(&e), String::new()),
        Ok(b) if b.len() > MAX_BODY => (error_response(&ApiError::too_large()), String::new()),
        Ok(b) => {
            let latency = lock(&st.faults).latency;
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            let injected = if verb == "discovery" {
                None
            } else {
                lock(&st.faults).take_failure(verb, &resource)
            };
            let resp = match (injected, params) {
                (Some(e), _) => error_response(&e),
                (None, Err(e)) => error_response(&e),
                (None, Ok(mut p)) => {
                    p.user = user.clone();
                    dispatch(&st, &method, route, p, ct.as_deref(), &accept, &b)
                        .await
                        .unwrap_or_else(|e| error_response(&e))
                }
            };
            (
                resp,
                String::from_utf8_lossy(&b[..b.len().min(16 * 1024)]).into_owned(),
            )
        }
    };
    st.log.push(RequestRecord {
        method: method.to_string(),
        path,
        query,
        verb: verb.to_string(),
        api_group,
        resource,
        namespace,
        name,
        content_type: ct,
        user_agent,
        user: user.map(|u| u.name),
        body: body_text,
        status: resp.status().as_u16(),
    });
    resp
}

/// Authentication and authorization (when on): the user (if authenticated), and the
/// 401/403 to answer instead of serving.
fn check_access(
    st: &AppState,
    authorization: Option<&str>,
    impersonate: Option<crate::rbac::UserInfo>,
    route: &Route,
    verb: &str,
) -> (Option<crate::rbac::UserInfo>, Result<(), ApiError>) {
    let Some(auth) = &st.auth else {
        // Every request is the admin, who may impersonate anyone (system:masters may).
        return (impersonate, Ok(()));
    };
    let outcome = st.read(|s| {
        let user = crate::authn::authenticate(s, auth, authorization)?;
        let user = match impersonate {
            None => user,
            Some(as_user) => {
                let policy = crate::rbac::policy_from_store(s);
                crate::impersonation::authorize(&policy, &user, &as_user)
                    .map_err(ApiError::forbidden)?;
                as_user
            }
        };
        let decision = match route {
            Route::Resource(rr) => {
                let attrs = crate::rbac::ResourceAttributes {
                    verb: verb.to_string(),
                    api_group: rr.resource.group.to_string(),
                    resource: rr.resource.plural.to_string(),
                    subresource: rr.subresource.clone(),
                    namespace: rr.namespace.clone(),
                    name: rr.name.clone(),
                };
                crate::rbac::authorize(&crate::rbac::policy_from_store(s), &user, &attrs)
            }
            // Health and version are public; discovery and OpenAPI need authentication
            // (the bootstrap system:public-info-viewer and system:discovery roles).
            Route::Health | Route::Version => Ok(()),
            _ if user.name == crate::rbac::ANONYMOUS => Err(format!(
                "forbidden: User \"{}\" cannot get path \"discovery\"",
                user.name
            )),
            _ => Ok(()),
        };
        Ok::<_, ApiError>((user, decision))
    });
    match outcome {
        Err(e) => (None, Err(e)),
        Ok((user, decision)) => (Some(user), decision.map_err(ApiError::forbidden)),
    }
}

async fn dispatch(
    st: &Arc<AppState>,
    method: &Method,
    route: Route,
    p: Params,
    ct: Option<&str>,
    accept: &str,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let get_only = |v: Value| -> Result<Response, ApiError> {
        if *method == Method::GET {
            Ok(json_response(200, &v))
        } else {
            Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method})"
            )))
        }
    };
    match route {
        Route::Version => get_only(discovery::version()),
        Route::Health => {
            let mut r = Response::new(Body::from("ok"));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            Ok(r)
        }
        Route::ApiVersions => get_only(discovery::api_versions(&st.server_address)),
        Route::ApiGroupList => get_only(discovery::api_group_list()),
        Route::ApiGroup(g) => discovery::api_group(&g)
            .ok_or_else(ApiError::no_route)
            .and_then(get_only),
        Route::ResourceList(g, v) => discovery::api_resource_list(&g, &v)
            .ok_or_else(ApiError::no_route)
            .and_then(get_only),
        Route::OpenApiV2 => {
            if accept.contains("protobuf") {
                let mut r = Response::new(Body::from(openapi::v2_protobuf()));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(
                        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                    ),
                );
                Ok(r)
            } else {
                get_only(openapi::v2_json())
            }
        }
        Route::OpenApiV3Root => get_only(openapi::v3_root()),
        Route::OpenApiV3(g, v) => openapi::v3_group_version(&g, &v)
            .ok_or_else(ApiError::no_route)
            .and_then(get_only),
        Route::NotFound => Err(ApiError::no_route()),
        Route::Resource(rr) => resource_request(st, method, rr, p, ct, accept, body).await,
    }
}

fn store_ns(rr: &ResourceRoute) -> &str {
    rr.namespace.as_deref().unwrap_or("")
}

/// Renders an object, or a Table of it when the client asked for one (kubectl get).
fn object_response(code: u16, r: &ResourceType, obj: &Value, accept: &str) -> Response {
    if table::wants_table(accept) {
        return json_response(code, &table::table(r, &[obj], None, None));
    }
    json_response(code, obj)
}

/// [`object_response`] for a write: the JSON the store serialised when it committed the
/// object (the same text, not serialised again), unless a Table was asked for or nothing
/// was stored.
fn committed_response(code: u16, r: &ResourceType, out: &Committed, accept: &str) -> Response {
    match &out.stored {
        Some(stored) if !table::wants_table(accept) => {
            bytes_response(code, stored.json.as_bytes().to_vec())
        }
        _ => object_response(code, r, &out.value, accept),
    }
}
