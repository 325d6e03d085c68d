//! The HTTP shell: parses requests, applies injected faults, calls the store and renders
//! JSON responses and watch streams. Decisions live in the store and its helpers.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::admission;
use crate::codec;
use crate::discovery;
use crate::faults::FaultState;
use crate::openapi;
use crate::patch::{self, PatchType};
use crate::request_log::{RequestLog, RequestRecord};
use crate::resources::{self, ResourceType};
use crate::route::{self, ResourceRoute, Route};
use crate::selector::{FieldSelector, LabelSelector};
use crate::state::SharedStore;
use crate::status::{ApiError, success_status};
use crate::store::{
    DeleteOptions, EventType, ListOptions, Store, Subresource, WatchEvent, WriteContext,
};
use crate::stored::StoredObject;
use crate::strategy;
use crate::table;
use crate::watch::{self, WatchFilter};

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

async fn resource_request(
    st: &Arc<AppState>,
    method: &Method,
    rr: ResourceRoute,
    p: Params,
    ct: Option<&str>,
    accept: &str,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let r = rr.resource;
    if !crate::protobuf::accepts_json(accept) {
        // We answer JSON only; protobuf-first clients list JSON after it (client-go does).
        return Err(ApiError::new(
            406,
            "NotAcceptable",
            format!(
                "only the following media types are accepted: application/json (Accept: {accept:?})"
            ),
        ));
    }
    let ns = store_ns(&rr).to_string();
    let sub = rr.subresource.as_deref();
    let manager = match (
        &p.field_manager,
        ct.map(|c| c.starts_with("application/apply-patch")),
    ) {
        (Some(m), _) => m.clone(),
        (None, Some(true)) if *method == Method::PATCH => {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "PatchOptions",
                "",
                &[(
                    "fieldManager",
                    "Required value: is required for apply patch".into(),
                )],
            ));
        }
        // Kubernetes derives the default manager from the User-Agent's product name.
        _ => p
            .user_agent
            .as_deref()
            .and_then(|u| u.split('/').next())
            .filter(|m| !m.is_empty())
            .unwrap_or("unknown")
            .to_string(),
    };
    let ctx = WriteContext {
        manager,
        force: p.force,
        dry_run: p.dry_run,
    };
    if p.dry_run && *method == Method::POST && rr.name.is_none() && sub.is_none() {
        // A dry-run create is admitted like any other (webhooks see `dryRun: true`; the
        // shipped ones declare sideEffects None or NoneOnDryRun), then not stored.
        let obj = codec::decode_object(ct, body)?;
        let created =
            create_with_admission(st, &ctx, p.user.as_ref(), r, rr.namespace.as_deref(), obj)
                .await?;
        return Ok(object_response(201, r, &created, accept));
    }
    if (*method == Method::PUT || *method == Method::PATCH)
        && let Some(name) = rr.name.clone()
        && matches!(sub, None | Some("status"))
        && let Some(configs) = update_webhooks(st, r, &ns, &name, sub)
    {
        return update_with_admission(st, &ctx, &p, method, &rr, &name, configs, ct, body)
            .await
            .map(|out| object_response(200, r, &out, accept));
    }
    if p.dry_run && *method != Method::GET {
        return dry_run_request(st, &ctx, method, rr, ct, accept, body);
    }
    match (method.as_str(), rr.name.as_deref(), sub) {
        ("GET", _, _) if p.watch => watch_request(st, &rr, p, accept),
        ("GET", Some(name), None | Some("status")) => {
            let obj = st.read(|s| s.get_stored(r, &ns, name))?;
            if table::wants_table(accept) {
                return Ok(object_response(200, r, &obj.to_value(), accept));
            }
            Ok(bytes_response(200, obj.json.as_bytes().to_vec()))
        }
        ("GET", None, None) => list_request(st, &rr, &p, accept),
        ("POST", None, None) => {
            let obj = codec::decode_object(ct, body)?;
            let created =
                create_with_admission(st, &ctx, p.user.as_ref(), r, rr.namespace.as_deref(), obj)
                    .await?;
            Ok(object_response(201, r, &created, accept))
        }
        ("POST", Some(name), Some("binding")) => {
            let b = codec::decode_object(ct, body)?;
            if b.get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k != "Binding")
            {
                return Err(ApiError::bad_request(
                    "the body of a pods/binding request must be a Binding",
                ));
            }
            if let Some(bn) = b
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty() && *n != name)
            {
                return Err(ApiError::bad_request(format!(
                    "the name of the Binding ({bn}) does not match the pod name on the URL ({name})"
                )));
            }
            st.write_ctx(&ctx, |s| s.bind(&ns, name, &b))?;
            Ok(json_response(201, &success_status(201, None)))
        }
        ("POST", Some(name), Some("token")) => {
            let req = codec::decode_object(ct, body)?;
            let answer = st.write_ctx(&ctx, |s| crate::authn::token_request(s, &ns, name, &req))?;
            Ok(json_response(201, &answer))
        }
        ("POST", Some(name), Some("eviction")) => {
            let _ = codec::decode_object(ct, body)?;
            let opts = DeleteOptions::default();
            st.write_ctx(&ctx, |s| s.delete(r, &ns, name, &opts))?;
            Ok(json_response(201, &success_status(201, None)))
        }
        ("PUT", Some(name), None | Some("status")) => {
            let obj = codec::decode_object(ct, body)?;
            let subres = if sub == Some("status") {
                Subresource::Status
            } else {
                Subresource::Main
            };
            let out = st.write_ctx(&ctx, |s| s.update(r, &ns, name, obj, subres))?;
            Ok(object_response(200, r, &out, accept))
        }
        ("PATCH", Some(name), None | Some("status")) => {
            let ty = PatchType::from_content_type(ct.unwrap_or(""))?;
            let patch_body = patch::parse_body(ty, body)?;
            let subres = if sub == Some("status") {
                Subresource::Status
            } else {
                Subresource::Main
            };
            let existed = st.read(|s| s.get(r, &ns, name).is_ok());
            let out = if !existed && ty == PatchType::Apply && r.plural == "pods" {
                // Apply-creating a pod goes through admission like any other create.
                let mut obj = patch_body.clone();
                obj["metadata"]["name"] = json!(name);
                create_with_admission(st, &ctx, p.user.as_ref(), r, rr.namespace.as_deref(), obj)
                    .await?
            } else {
                (*st.write_ctx(&ctx, |s| s.patch(r, &ns, name, ty, &patch_body, subres))?).clone()
            };
            let code = if existed { 200 } else { 201 };
            Ok(object_response(code, r, &out, accept))
        }
        ("DELETE", Some(name), None) => {
            let opts = codec::decode_delete_options(ct, body)?;
            let out = st.write_ctx(&ctx, |s| s.delete(r, &ns, name, &opts))?;
            Ok(object_response(200, r, &out, accept))
        }
        ("DELETE", None, None) => {
            let opts = list_options(r, &p)?;
            let deleted = st.write_ctx(&ctx, |s| {
                let page = s.list(r, rr.namespace.as_deref(), &opts)?;
                let mut out = Vec::new();
                for obj in page.items {
                    let (ons, oname) = (obj.namespace().to_string(), obj.name().to_string());
                    out.push(s.delete(r, &ons, &oname, &DeleteOptions::default())?);
                }
                Ok((out, s.resource_version()))
            })?;
            let items: Vec<Value> = deleted.0.iter().map(|v| (**v).clone()).collect();
            Ok(json_response(
                200,
                &json!({"kind": r.list_kind(), "apiVersion": r.api_version(), "metadata": {"resourceVersion": deleted.1.to_string()}, "items": items}),
            ))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {})",
            rr.resource_path()
        ))),
    }
}

/// `dryRun=All` of an update, patch or delete: the write is validated and answered as if
/// done, but nothing is stored, watched or persisted (one no webhook's rule names; the
/// others go through [`update_with_admission`]).
fn dry_run_request(
    st: &Arc<AppState>,
    ctx: &WriteContext,
    method: &Method,
    rr: ResourceRoute,
    ct: Option<&str>,
    accept: &str,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let r = rr.resource;
    let ns = store_ns(&rr).to_string();
    let sub = if rr.subresource.as_deref() == Some("status") {
        Subresource::Status
    } else {
        Subresource::Main
    };
    let name = rr.name.clone();
    let outcome = st.write_ctx(ctx, |s| {
        match (method.as_str(), name.as_deref(), rr.subresource.as_deref()) {
            ("PUT", Some(n), None | Some("status")) => codec::decode_object(ct, body)
                .and_then(|o| s.update(r, &ns, n, o, sub))
                .map(|v| (200, v)),
            ("PATCH", Some(n), None | Some("status")) => {
                PatchType::from_content_type(ct.unwrap_or(""))
                    .and_then(|ty| patch::parse_body(ty, body).map(|b| (ty, b)))
                    .and_then(|(ty, b)| s.patch(r, &ns, n, ty, &b, sub))
                    .map(|v| (200, v))
            }
            ("DELETE", Some(n), None) => s
                .delete(r, &ns, n, &DeleteOptions::default())
                .map(|v| (200, v)),
            _ => Err(ApiError::bad_request(format!(
                "dryRun is not supported for {method} {}",
                rr.resource_path()
            ))),
        }
    })?;
    Ok(object_response(outcome.0, r, &outcome.1, accept))
}

/// The webhook configurations to consult for an UPDATE of the existing pod `ns/name` (or
/// its `sub`), when any of their rules names it; None: the update is stored directly.
fn update_webhooks(
    st: &AppState,
    r: &'static ResourceType,
    ns: &str,
    name: &str,
    sub: Option<&str>,
) -> Option<Vec<Arc<Value>>> {
    if r.plural != "pods" {
        return None;
    }
    let mwc = resources::lookup(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
    )?;
    let configs: Vec<Arc<Value>> = st.read(|s| {
        if s.get(r, ns, name).is_err() {
            // Not there: the plain path answers (404, or an apply patch's create).
            return Vec::new();
        }
        s.list(mwc, None, &ListOptions::default())
            .map(|l| l.items.iter().map(|o| Arc::new(o.to_value())).collect())
            .unwrap_or_default()
    });
    admission::any_rule_matches(&configs, r, sub, "UPDATE").then_some(configs)
}

/// How many times an UPDATE is prepared and admitted again when the object changed while
/// its webhooks were called (upstream's patcher retries a conflicting patch 5 times).
const ADMITTED_UPDATE_ATTEMPTS: usize = 6;

/// A PUT or PATCH through mutating admission, as upstream orders it: the change is applied
/// to the stored object (managedFields recorded), the webhooks see that result as `object`
/// and the stored one as `oldObject` (operation UPDATE, UpdateOptions), their patches are
/// applied, and the result is validated and stored if the object has not changed meanwhile.
/// If it has, an unconditional update or a patch is prepared and admitted again; an update
/// naming a resourceVersion then answers 409.
#[allow(clippy::too_many_arguments)]
async fn update_with_admission(
    st: &Arc<AppState>,
    ctx: &WriteContext,
    p: &Params,
    method: &Method,
    rr: &ResourceRoute,
    name: &str,
    configs: Vec<Arc<Value>>,
    ct: Option<&str>,
    body: &Bytes,
) -> Result<Value, ApiError> {
    enum Change {
        Put(Value),
        Patch(PatchType, Value),
    }
    let r = rr.resource;
    let ns = store_ns(rr).to_string();
    let subres = if rr.subresource.as_deref() == Some("status") {
        Subresource::Status
    } else {
        Subresource::Main
    };
    let change = if *method == Method::PUT {
        Change::Put(codec::decode_object(ct, body)?)
    } else {
        let ty = PatchType::from_content_type(ct.unwrap_or(""))?;
        Change::Patch(ty, patch::parse_body(ty, body)?)
    };
    let nsr = resources::lookup("", "v1", "namespaces").expect("served");
    let ns_labels = st.read(|s| {
        s.get(nsr, "", &ns)
            .ok()
            .and_then(|o| o.pointer("/metadata/labels").cloned())
    });
    let prepare = WriteContext {
        dry_run: true,
        ..ctx.clone()
    };
    let who = admission::Requester {
        user: p.user.clone(),
        dry_run: ctx.dry_run,
        field_manager: p.field_manager.clone(),
    };
    let target = admission::Target {
        resource: r,
        sub: rr.subresource.as_deref(),
        operation: "UPDATE",
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (old, new) = st.write_ctx(&prepare, |s| {
            let old = s.get(r, &ns, name)?;
            let new = match &change {
                Change::Put(o) => s.update(r, &ns, name, o.clone(), subres)?,
                Change::Patch(ty, b) => s.patch(r, &ns, name, *ty, b, subres)?,
            };
            Ok((old, new))
        })?;
        let expected = old
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let admitted = admission::admit(
            configs.clone(),
            target,
            &ns,
            ns_labels.clone(),
            (*new).clone(),
            Some((*old).clone()),
            who.clone(),
        )
        .await?;
        match st.write_ctx(ctx, |s| {
            s.commit_admitted(r, &ns, name, admitted, subres, &expected)
        }) {
            Ok(out) => return Ok((*out).clone()),
            // Changed while the webhooks were called: prepare against the new state.
            Err(e) if e.code == 409 && attempt < ADMITTED_UPDATE_ATTEMPTS => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Creates an object, running mutating admission webhooks first for pods.
async fn create_with_admission(
    st: &Arc<AppState>,
    ctx: &WriteContext,
    user: Option<&crate::rbac::UserInfo>,
    r: &'static ResourceType,
    ns: Option<&str>,
    obj: Value,
) -> Result<Value, ApiError> {
    let mwc = resources::lookup(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
    )
    .expect("served");
    let nsr = resources::lookup("", "v1", "namespaces").expect("served");
    let (mut prepared, configs, ns_labels) = st.read(|s| -> Result<_, ApiError> {
        let mut prepared = s.prepare_create(r, ns, obj)?;
        strategy::prepare_for_create(r, &mut prepared);
        let configs = if r.plural == "pods" {
            s.list(mwc, None, &ListOptions::default())?
                .items
                .iter()
                .map(|o| Arc::new(o.to_value()))
                .collect()
        } else {
            Vec::new()
        };
        let ns_labels = ns
            .and_then(|n| s.get(nsr, "", n).ok())
            .and_then(|o| o.pointer("/metadata/labels").cloned());
        Ok((prepared, configs, ns_labels))
    })?;
    if !configs.is_empty() {
        prepared = admission::admit_create(
            configs,
            r,
            ns.unwrap_or(""),
            ns_labels,
            prepared,
            admission::Requester {
                user: user.cloned(),
                dry_run: ctx.dry_run,
                field_manager: None,
            },
        )
        .await?;
    }
    let created = st.write_ctx(ctx, |s| s.create(r, ns, prepared))?;
    Ok((*created).clone())
}

fn list_options(r: &ResourceType, p: &Params) -> Result<ListOptions, ApiError> {
    Ok(ListOptions {
        labels: LabelSelector::parse(&p.label_selector)?,
        fields: FieldSelector::parse(&p.field_selector, r.plural)?,
        limit: p.limit,
        continue_token: p.continue_token.clone(),
    })
}

fn list_request(
    st: &Arc<AppState>,
    rr: &ResourceRoute,
    p: &Params,
    accept: &str,
) -> Result<Response, ApiError> {
    let r = rr.resource;
    let opts = list_options(r, p)?;
    let page = st.read(|s| s.list(r, rr.namespace.as_deref(), &opts))?;
    if table::wants_table(accept) {
        let values: Vec<Value> = page.items.iter().map(|v| v.to_value()).collect();
        let refs: Vec<&Value> = values.iter().collect();
        return Ok(json_response(
            200,
            &table::table(
                r,
                &refs,
                Some(page.resource_version),
                page.continue_token.as_deref(),
            ),
        ));
    }
    // Assemble the list by hand: items are serialised once, outside the store lock.
    let mut out = Vec::with_capacity(64 + page.items.len() * 1024);
    let mut meta = json!({"resourceVersion": page.resource_version.to_string()});
    if let Some(c) = &page.continue_token {
        meta["continue"] = json!(c);
    }
    out.extend_from_slice(
        format!(
            "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[",
            r.list_kind(),
            r.api_version(),
            meta
        )
        .as_bytes(),
    );
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item.json.as_bytes());
    }
    out.extend_from_slice(b"]}");
    Ok(bytes_response(200, out))
}

struct WatchStream {
    queue: VecDeque<String>,
    rx: broadcast::Receiver<Arc<WatchEvent>>,
    filter: WatchFilter,
    deadline: tokio::time::Instant,
    closer: tokio::sync::watch::Receiver<u64>,
    bookmarks: Option<tokio::time::Interval>,
    last_rv: u64,
    done: bool,
    /// Send each object as a one-row Table (`kubectl get -w`).
    table: bool,
}

/// One watch frame; for Table watches the object is rendered as a one-row Table.
fn frame_for(table: bool, r: &ResourceType, t: EventType, obj: &StoredObject) -> String {
    if table {
        let t_obj = table::table(r, &[&obj.to_value()], None, None);
        return watch::event_frame(t, &t_obj.to_string());
    }
    watch::event_frame(t, &obj.json)
}

async fn next_frame(mut ws: WatchStream) -> Option<(Result<Bytes, Infallible>, WatchStream)> {
    if let Some(f) = ws.queue.pop_front() {
        return Some((Ok(Bytes::from(f)), ws));
    }
    if ws.done {
        return None;
    }
    loop {
        let bookmark = async {
            match ws.bookmarks.as_mut() {
                Some(i) => {
                    i.tick().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep_until(ws.deadline) => return None,
            _ = ws.closer.changed() => return None,
            _ = bookmark => {
                let f = watch::bookmark_frame(ws.filter.resource, ws.last_rv, false);
                return Some((Ok(Bytes::from(f)), ws));
            }
            ev = ws.rx.recv() => match ev {
                Ok(ev) => {
                    if ev.rv <= ws.last_rv {
                        continue;
                    }
                    ws.last_rv = ev.rv;
                    if let Some(t) = ws.filter.classify(&ev) {
                        let f = frame_for(ws.table, ws.filter.resource, t, &ev.object);
                        return Some((Ok(Bytes::from(f)), ws));
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Too slow a consumer: end with 410 so that it relists, as the real server does.
                    ws.done = true;
                    let e = ApiError::expired(format!("too old resource version: {} (watcher fell behind)", ws.last_rv));
                    return Some((Ok(Bytes::from(watch::error_frame(&e))), ws));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

fn watch_request(
    st: &Arc<AppState>,
    rr: &ResourceRoute,
    p: Params,
    accept: &str,
) -> Result<Response, ApiError> {
    let r = rr.resource;
    let table = table::wants_table(accept);
    let mut fields = FieldSelector::parse(&p.field_selector, r.plural)?;
    if let Some(name) = &rr.name {
        fields.0.push(("metadata.name".into(), true, name.clone()));
    }
    let filter = WatchFilter {
        resource: r,
        namespace: rr.namespace.clone(),
        labels: LabelSelector::parse(&p.label_selector)?,
        fields,
    };
    let from: Option<u64> = match p.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(v) => Some(v.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {v:?}: must be a number"
            ))
        })?),
    };
    let timeout = p
        .timeout_seconds
        .map(Duration::from_secs)
        .unwrap_or(st.default_watch_timeout);
    let start = st.store.watch(&filter, from, p.send_initial_events)?;
    let mut queue: VecDeque<String> = start
        .initial
        .iter()
        .map(|(t, obj)| frame_for(table, r, *t, obj))
        .collect();
    if let (Some(rv), true) = (start.listed_at, p.send_initial_events && p.allow_bookmarks) {
        queue.push_back(watch::bookmark_frame(r, rv, true));
    }
    if let Some(e) = &start.expired {
        // Kubernetes answers 200 and sends the 410 as an ERROR event.
        queue.push_back(watch::error_frame(e));
    }
    if start.expired.is_some() || start.stopping {
        // Stopping: the stream ends at once (clients re-watch elsewhere).
        let ws = WatchStream {
            queue,
            rx: start.rx,
            filter,
            deadline: tokio::time::Instant::now(),
            closer: start.closer,
            bookmarks: None,
            last_rv: start.last_rv,
            done: true,
            table,
        };
        return Ok(stream_response(ws));
    }
    let (rx, closer, last_rv) = (start.rx, start.closer, start.last_rv);
    let bookmarks = p.allow_bookmarks.then(|| {
        let mut i = tokio::time::interval_at(
            tokio::time::Instant::now() + st.bookmark_interval,
            st.bookmark_interval,
        );
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    let ws = WatchStream {
        queue,
        rx,
        filter,
        deadline: tokio::time::Instant::now() + timeout,
        closer,
        bookmarks,
        last_rv,
        done: false,
        table,
    };
    Ok(stream_response(ws))
}

fn stream_response(ws: WatchStream) -> Response {
    let stream = futures::stream::unfold(ws, next_frame);
    let mut resp = Body::from_stream(stream).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    resp
}
