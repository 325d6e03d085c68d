//! The HTTP shell. Routers: [`router`] (everything, for a loopback listener: tests, the
//! demo), [`webhook_router`] (`/webhook`, `/healthz`, `/readyz`; `/filter` and `/bind`
//! refused: that listener is reachable through the Service, from any pod),
//! [`extender_router`] (`/filter` and `/bind`, forwarded to the leader from a follower;
//! served with [`serve_mtls`], which requires a client certificate from the CA
//! kube-scheduler's and the replicas' certificates come from), and [`metrics_router`].
//! TLS certificates are reloaded when their files change ([`crate::reload_poll`] decides).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::admission::{Admission, PodReview, review_pod_with};
use crate::dra_claims::{ContainerClaim, Shape};
use crate::extender::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderFilterResult, from_json_any_case,
};
use crate::forward::Route;
use crate::reload_poll::ReloadPoll;
use crate::runtime::Scheduler;

/// Largest request body accepted.
pub const MAX_BODY: usize = 1 << 20;

/// Every endpoint on one listener: `/filter`, `/bind`, `/webhook`, `/healthz`, `/readyz`
/// (when `--http-bind` is loopback and no `--extender-bind` is given).
pub fn router(scheduler: Arc<Scheduler>) -> Router {
    Router::new()
        .route("/filter", post(filter))
        .route("/bind", post(bind))
        .route("/webhook", post(webhook))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(scheduler)
}

/// `/webhook`, `/healthz`, `/readyz`; `/filter` and `/bind` answer 403: this listener is
/// reachable by any pod through the webhook Service, and binding on the scheduler's rights
/// needs an authenticated caller (issue 13 item 8).
pub fn webhook_router(scheduler: Arc<Scheduler>) -> Router {
    let refuse = || async {
        json_response(
            StatusCode::FORBIDDEN,
            &json!({"error": "/filter and /bind are not served on the webhook listener: kube-scheduler calls the extender listener (--extender-bind), which requires its client certificate"}),
        )
    };
    Router::new()
        .route("/filter", post(refuse))
        .route("/bind", post(refuse))
        .route("/webhook", post(webhook))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(scheduler)
}

/// Where a follower forwards extender calls, and who this replica is.
#[derive(Clone)]
pub struct ForwardContext {
    /// This replica's identity (its pod name), sent in [`crate::forward::FORWARDED_BY`].
    pub identity: String,
    /// How to reach the leader; `None` when this replica never forwards.
    pub forwarder: Option<Arc<crate::forward::Forwarder>>,
}

/// `/filter` and `/bind` (a follower forwards them to the leader), `/healthz`, `/readyz`.
pub fn extender_router(scheduler: Arc<Scheduler>, forwarding: ForwardContext) -> Router {
    Router::new()
        .route("/filter", post(extender_filter))
        .route("/bind", post(extender_bind))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .layer(axum::Extension(Arc::new(forwarding)))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(scheduler)
}

/// Where this call goes: here, to the leader, or refused.
fn route_of(s: &Scheduler, ctx: &ForwardContext, headers: &axum::http::HeaderMap) -> Route {
    let forwarded_by = headers
        .get(crate::forward::FORWARDED_BY)
        .and_then(|v| v.to_str().ok());
    let holder = s.leader.holder();
    crate::forward::route(
        s.leader.is_elected(),
        s.leader.is_leader(),
        holder.as_deref(),
        &ctx.identity,
        forwarded_by,
        ctx.forwarder.is_some(),
    )
}

async fn forwarded(
    ctx: &ForwardContext,
    leader: &str,
    verb: &str,
    bytes: Bytes,
) -> Result<Response, String> {
    let Some(forwarder) = &ctx.forwarder else {
        return Err("forwarding is not configured".into());
    };
    let (status, body) = forwarder
        .forward(leader, &ctx.identity, verb, bytes)
        .await?;
    Ok((
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

async fn extender_filter(
    State(s): State<Arc<Scheduler>>,
    axum::Extension(ctx): axum::Extension<Arc<ForwardContext>>,
    headers: axum::http::HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let routed = extender_call(s, &ctx, &headers, raw, "filter", |s, bytes| {
        filter(State(s), Ok(bytes))
    });
    match routed.await {
        Ok(response) => response,
        Err(error) => json_response(
            StatusCode::OK,
            &ExtenderFilterResult {
                error,
                ..Default::default()
            },
        ),
    }
}

async fn extender_bind(
    State(s): State<Arc<Scheduler>>,
    axum::Extension(ctx): axum::Extension<Arc<ForwardContext>>,
    headers: axum::http::HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let routed = extender_call(s, &ctx, &headers, raw, "bind", |s, bytes| {
        bind(State(s), Ok(bytes))
    });
    match routed.await {
        Ok(response) => response,
        Err(error) => json_response(StatusCode::OK, &json!({ "error": error })),
    }
}

/// One extender call (`verb` is `filter` or `bind`): a bad body is answered here, the leader
/// runs `local`, a follower forwards to the leader; `Err` is the error the caller shapes
/// into its verb's result (forwarding failed, or no leader to forward to).
async fn extender_call<F, Fut>(
    s: Arc<Scheduler>,
    ctx: &ForwardContext,
    headers: &axum::http::HeaderMap,
    raw: Result<Bytes, BytesRejection>,
    verb: &str,
    local: F,
) -> Result<Response, String>
where
    F: FnOnce(Arc<Scheduler>, Bytes) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let bytes = match body(raw) {
        Ok(b) => b,
        Err((status, error)) => return Ok(json_response(status, &json!({ "error": error }))),
    };
    match route_of(&s, ctx, headers) {
        Route::Local => Ok(local(s, bytes).await),
        Route::Forward { leader } => forwarded(ctx, &leader, verb, bytes).await,
        Route::Refuse { why } => Err(format!(
            "{} ({why}); kube-scheduler retries",
            s.not_leader()
        )),
    }
}

/// `/metrics` (OpenMetrics or Prometheus text, as the scraper asks).
pub fn metrics_router(scheduler: Arc<Scheduler>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(
                |State(s): State<Arc<Scheduler>>, headers: axum::http::HeaderMap| async move {
                    // The 0.0.4 text unless the scraper names OpenMetrics (issue 27).
                    let format = hami_protocol::exposition::Format::negotiate(
                        headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()),
                    );
                    let text = {
                        let mut state = s.state();
                        // Capacity gauges leave out vendors whose plugin stopped refreshing.
                        state.expire_heartbeats(std::time::Instant::now());
                        s.metrics.render_as(&state, format)
                    };
                    ([(header::CONTENT_TYPE, format.content_type())], text)
                },
            ),
        )
        .with_state(scheduler)
}

fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(value).unwrap_or_default(),
    )
        .into_response()
}

/// Reads the body or explains why not (too large, unreadable).
fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, (StatusCode, String)> {
    body.map_err(|rejection| {
        let status = rejection.status();
        let error = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!(
                "request body is larger than {} bytes; the extender refuses it",
                MAX_BODY
            )
        } else {
            format!("cannot read the request body: {rejection}")
        };
        (status, error)
    })
}

async fn filter(State(s): State<Arc<Scheduler>>, raw: Result<Bytes, BytesRejection>) -> Response {
    let bytes = match body(raw) {
        Ok(b) => b,
        Err((status, error)) => return json_response(status, &json!({ "error": error })),
    };
    let result = match from_json_any_case::<ExtenderArgs>(&bytes) {
        Ok(args) => s.filter(args).await,
        Err(error) => ExtenderFilterResult {
            error,
            ..Default::default()
        },
    };
    json_response(StatusCode::OK, &result)
}

async fn bind(State(s): State<Arc<Scheduler>>, raw: Result<Bytes, BytesRejection>) -> Response {
    let bytes = match body(raw) {
        Ok(b) => b,
        Err((status, error)) => return json_response(status, &json!({ "error": error })),
    };
    match from_json_any_case::<ExtenderBindingArgs>(&bytes) {
        Ok(args) => json_response(StatusCode::OK, &s.bind(args).await),
        Err(error) => json_response(StatusCode::OK, &json!({ "error": error })),
    }
}

/// Ready when both watches are live; the leader and its followers alike (a follower
/// serves the webhook and forwards the extender's calls).
async fn readyz(State(s): State<Arc<Scheduler>>) -> Response {
    match s.view_problem() {
        None => (StatusCode::OK, "ok").into_response(),
        Some(problem) => (StatusCode::SERVICE_UNAVAILABLE, problem).into_response(),
    }
}

/// AdmissionReview v1 and v1beta1, answered in the version received. In DRA mode the
/// claim templates the patch names are created first (not on dryRun); a failure denies the
/// pod (fail closed).
async fn webhook(State(s): State<Arc<Scheduler>>, raw: Result<Bytes, BytesRejection>) -> Response {
    let bytes = match body(raw) {
        Ok(b) => b,
        Err((status, error)) => return json_response(status, &json!({ "error": error })),
    };
    let (shapes, unreadable) = if crate::dra_templates::may_need_shapes(&bytes, &s.settings.webhook)
    {
        match s.dra().shapes().await {
            Ok(shapes) => (shapes, None),
            Err(why) => (Vec::new(), Some(why)),
        }
    } else {
        (Vec::new(), None)
    };
    let mut reviewed = review_with(&bytes, &s.settings.webhook, &shapes);
    for warning in reviewed
        .body
        .pointer("/response/warnings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        info!(namespace = %reviewed.namespace, "webhook warning: {}", warning.as_str().unwrap_or_default());
    }
    if let Some(why) = unreadable {
        reviewed.note_missing_shapes(&why);
    }
    if !reviewed.claims.is_empty()
        && !reviewed.dry_run
        && let Err(message) = s
            .dra()
            .ensure_templates(&reviewed.namespace, &reviewed.claims)
            .await
    {
        reviewed.deny(message);
    }
    json_response(reviewed.status, &reviewed.body)
}

/// The webhook's decision on one AdmissionReview body, before any API call.
#[derive(Debug, Clone)]
pub struct Reviewed {
    /// The HTTP status to answer with.
    pub status: StatusCode,
    /// The AdmissionReview answer (or the error body of a bad request).
    pub body: Value,
    /// DRA mode: the claim templates the patch names (the caller creates them).
    pub claims: Vec<ContainerClaim>,
    /// `request.namespace` (the pod's, else `default`).
    pub namespace: String,
    /// `request.dryRun`: nothing may be created.
    pub dry_run: bool,
}

impl Reviewed {
    /// Turns the answer into a denial with `message` (fail closed), dropping any patch.
    pub fn deny(&mut self, message: String) {
        if let Some(response) = self.body.get_mut("response").and_then(Value::as_object_mut) {
            response.remove("patch");
            response.remove("patchType");
            response.remove("warnings");
            response.insert("allowed".into(), json!(false));
            response.insert(
                "status".into(),
                json!({"code": 403, "reason": "Forbidden", "message": message, "status": "Failure"}),
            );
        }
        self.claims.clear();
    }

    /// The denial message, if the answer is a denial.
    pub fn denied(&self) -> Option<&str> {
        self.body
            .pointer("/response/status/message")
            .and_then(Value::as_str)
            .filter(|_| self.body.pointer("/response/allowed") == Some(&json!(false)))
    }

    /// The slices could not be read: a denial for want of shapes says why.
    fn note_missing_shapes(&mut self, why: &str) {
        if let Some(message) = self.denied()
            && message.contains("no ResourceSlice of")
        {
            let message = format!("{message} (the scheduler cannot read ResourceSlices: {why})");
            self.deny(message);
        }
    }
}

/// The webhook's answer to one AdmissionReview body, knowing no device shapes (the DRA
/// templates of [`review_with`] are not created here).
pub fn review(bytes: &[u8], config: &crate::admission::WebhookConfig) -> (StatusCode, Value) {
    let reviewed = review_with(bytes, config, &[]);
    (reviewed.status, reviewed.body)
}

/// The webhook's decision on one AdmissionReview body with the DRA driver's device shapes.
pub fn review_with(
    bytes: &[u8],
    config: &crate::admission::WebhookConfig,
    shapes: &[Shape],
) -> Reviewed {
    let bad = |message: String| Reviewed {
        status: StatusCode::BAD_REQUEST,
        body: json!({ "error": message }),
        claims: Vec::new(),
        namespace: String::new(),
        dry_run: false,
    };
    let Ok(review) = serde_json::from_slice::<Value>(bytes) else {
        return bad("the body is not JSON; expected an AdmissionReview".into());
    };
    let api_version = review
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !matches!(
        api_version,
        "admission.k8s.io/v1" | "admission.k8s.io/v1beta1"
    ) {
        return bad(format!(
            "apiVersion {api_version:?} is not admission.k8s.io/v1 or v1beta1"
        ));
    }
    let Some(request) = review.get("request") else {
        return bad("the AdmissionReview has no request".into());
    };
    let uid = request
        .get("uid")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    let mut response = json!({ "uid": uid, "allowed": true });
    let mut claims = Vec::new();
    let namespace = request
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .or_else(|| {
            request
                .pointer("/object/metadata/namespace")
                .and_then(Value::as_str)
        })
        .filter(|n| !n.is_empty())
        .unwrap_or("default")
        .to_owned();
    let dry_run = request
        .get("dryRun")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let is_pod = request.pointer("/kind/kind").and_then(Value::as_str) == Some("Pod");
    let operation = request
        .get("operation")
        .and_then(Value::as_str)
        .unwrap_or("CREATE");
    let refuse = |response: &mut Value, code: u16, reason: &str, message: String| {
        response["allowed"] = json!(false);
        response["status"] =
            json!({"code": code, "reason": reason, "message": message, "status": "Failure"});
    };
    // D-4 is checked on UPDATE too (admission::review_pod); other operations pass.
    if is_pod && matches!(operation, "CREATE" | "UPDATE") {
        let decode = |field: &str| {
            request
                .get(field)
                .filter(|v| !v.is_null())
                .map(|o| serde_json::from_value::<Pod>(o.clone()))
        };
        match (decode("object"), decode("oldObject").transpose()) {
            (None, _) => refuse(
                &mut response,
                400,
                "BadRequest",
                "the AdmissionReview request has no object".into(),
            ),
            (Some(Err(e)), _) | (_, Err(e)) => refuse(
                &mut response,
                400,
                "BadRequest",
                format!("the pod in the AdmissionReview does not decode: {e}"),
            ),
            (Some(Ok(pod)), Ok(old)) => match review_pod_with(
                &PodReview {
                    operation,
                    username: request
                        .pointer("/userInfo/username")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                    object: Some(&pod),
                    old_object: old.as_ref(),
                },
                config,
                shapes,
            ) {
                Admission::Ignore { .. } => {}
                Admission::Allow {
                    patch,
                    claims: templates,
                } => {
                    claims = templates;
                    // Said, never silent: what a claim could not list (kubectl prints
                    // an admission response's warnings to whoever created the pod).
                    let warnings: Vec<String> =
                        claims.iter().flat_map(ContainerClaim::warnings).collect();
                    if !warnings.is_empty() {
                        response["warnings"] = json!(warnings);
                    }
                    if !patch.is_empty() {
                        let encoded = serde_json::to_vec(&patch).unwrap_or_default();
                        response["patchType"] = json!("JSONPatch");
                        response["patch"] =
                            serde_json::to_value(ByteString(encoded)).unwrap_or_default();
                    }
                }
                Admission::Deny { message } => refuse(&mut response, 403, "Forbidden", message),
            },
        }
    }
    Reviewed {
        status: StatusCode::OK,
        body: json!({ "apiVersion": api_version, "kind": "AdmissionReview", "response": response }),
        claims,
        namespace,
        dry_run,
    }
}

/// Serves `app` on `addr`, with TLS when cert and key are given (reloaded every few
/// seconds when the files change, so certificate rotation needs no restart).
pub async fn serve(
    app: Router,
    addr: SocketAddr,
    tls: Option<(PathBuf, PathBuf)>,
) -> anyhow::Result<()> {
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    serve_on(app, listener, tls).await
}

/// How the extender listener authenticates its callers.
#[derive(Debug, Clone)]
pub enum ClientAuth {
    /// A client certificate chained to this CA (PEM file), valid for client authentication.
    Ca(PathBuf),
    /// Exactly the first certificate of this PEM file (the replicas' own serving
    /// certificate), reloaded into `pins` when the file changes (`cert_pin`).
    Pinned {
        /// The PEM file.
        file: PathBuf,
        /// The pins it is loaded into.
        pins: crate::cert_pin::SharedPins,
    },
}

impl ClientAuth {
    fn file(&self) -> &std::path::Path {
        match self {
            ClientAuth::Ca(f) | ClientAuth::Pinned { file: f, .. } => f,
        }
    }
}

/// The first certificate of a PEM file, as the pin.
pub fn pin_of(
    file: &std::path::Path,
) -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    let pem =
        std::fs::read(file).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    let certs = crate::extender_client::certs_from_pem(&pem)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    Ok(certs.into_iter().take(1).collect())
}

/// The extender listener's TLS: `cert`/`key` served, and a client certificate required of
/// every caller (kube-scheduler's extender `tlsConfig.certFile`, a follower forwarding to
/// the leader), checked as `auth` says. A connection without one fails the handshake.
pub fn mtls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
    auth: &ClientAuth,
) -> anyhow::Result<rustls::ServerConfig> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn rustls::server::danger::ClientCertVerifier> = match auth {
        ClientAuth::Ca(client_ca) => {
            let roots = crate::extender_client::roots_from_pem(&read(client_ca)?)
                .map_err(|e| anyhow::anyhow!("client CA {}: {e}", client_ca.display()))?;
            rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            )
            .build()
            .map_err(|e| anyhow::anyhow!("client CA {}: {e}", client_ca.display()))?
        }
        ClientAuth::Pinned { pins, .. } => Arc::new(crate::cert_pin::PinnedClients::new(
            pins.clone(),
            provider.clone(),
        )),
    };
    let certs = crate::extender_client::certs_from_pem(&read(cert)?)
        .map_err(|e| anyhow::anyhow!("certificate {}: {e}", cert.display()))?;
    let key_der = {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::PrivateKeyDer::from_pem_slice(&read(key)?)
            .map_err(|e| anyhow::anyhow!("key {}: not a PEM private key ({e})", key.display()))?
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key_der)
        .map_err(|e| {
            anyhow::anyhow!(
                "certificate {} / key {}: {e}",
                cert.display(),
                key.display()
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves `app` with [`mtls_config`], rebuilt (and the pins rotated) when any of the
/// three files changes.
pub async fn serve_mtls(
    app: Router,
    listener: std::net::TcpListener,
    cert: PathBuf,
    key: PathBuf,
    auth: ClientAuth,
) -> anyhow::Result<()> {
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let config = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(mtls_config(
        &cert, &key, &auth,
    )?));
    let reload = config.clone();
    tokio::spawn(async move {
        let files = [cert, key, auth.file().to_owned()];
        let mut poll = ReloadPoll::new(stamps(&files));
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if poll.poll(stamps(&files)) {
                if let ClientAuth::Pinned { file, pins } = &auth {
                    match pin_of(file) {
                        Ok(next) => pins
                            .write()
                            .unwrap_or_else(|p| p.into_inner())
                            .rotate(next, std::time::Instant::now()),
                        Err(e) => {
                            warn!(error = %e, "cannot reload the pinned certificate; keeping the old one")
                        }
                    }
                }
                match mtls_config(&files[0], &files[1], &auth) {
                    Ok(c) => {
                        reload.reload_from_config(Arc::new(c));
                        info!("reloaded the extender's TLS certificate and client CA");
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot reload the extender's TLS; keeping the old one")
                    }
                }
            }
        }
    });
    info!(%addr, "serving the extender over HTTPS with client certificates required");
    axum_server::from_tcp_rustls(listener, config)?
        .serve(app.into_make_service())
        .await?;
    Ok(())
}

/// The files' modification times (`None` for one that cannot be read), for [`ReloadPoll`].
fn stamps(files: &[PathBuf]) -> Vec<Option<SystemTime>> {
    files
        .iter()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

/// Like [`serve`], on a listener the caller bound (tests bind port 0).
pub async fn serve_on(
    app: Router,
    listener: std::net::TcpListener,
    tls: Option<(PathBuf, PathBuf)>,
) -> anyhow::Result<()> {
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    match tls {
        None => {
            info!(%addr, "serving plain HTTP");
            axum::serve(tokio::net::TcpListener::from_std(listener)?, app).await?;
        }
        Some((cert, key)) => {
            let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(&cert, &key)
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "cannot load TLS certificate {} / key {}: {e}",
                        cert.display(),
                        key.display()
                    )
                })?;
            let reload = config.clone();
            tokio::spawn(async move {
                let files = [cert, key];
                let mut poll = ReloadPoll::new(stamps(&files));
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    if poll.poll(stamps(&files)) {
                        let [cert, key] = &files;
                        match reload.reload_from_pem_file(cert, key).await {
                            Ok(()) => info!("reloaded the TLS certificate"),
                            Err(e) => {
                                warn!(error = %e, "cannot reload the TLS certificate; keeping the old one")
                            }
                        }
                    }
                }
            });
            info!(%addr, "serving HTTPS");
            axum_server::from_tcp_rustls(listener, config)?
                .serve(app.into_make_service())
                .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::WebhookConfig;
    use crate::dra_claims::AmdMode;

    fn body(dry_run: Option<bool>, namespace: &str) -> Vec<u8> {
        let mut request = json!({
            "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE", "namespace": namespace,
            "userInfo": {"username": "alice"},
            "object": {"metadata": {"name": "p", "annotations": {"hami.io/amd-mode": "dra"}},
                       "spec": {"containers": [{"name": "c", "resources": {"limits": {"amd.com/gpumem": "1024"}}}]}}
        });
        if let Some(d) = dry_run {
            request["dryRun"] = json!(d);
        }
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}))
            .unwrap()
    }

    #[test]
    fn a_dra_review_names_its_templates_namespace_and_dry_run() {
        let config = WebhookConfig::default();
        let r = review_with(&body(Some(true), "team-a"), &config, &[]);
        assert_eq!((r.namespace.as_str(), r.dry_run), ("team-a", true));
        assert_eq!(r.claims.len(), 1);
        assert_eq!(r.body["response"]["patchType"], "JSONPatch");
        let r = review_with(&body(None, ""), &config, &[]);
        assert_eq!((r.namespace.as_str(), r.dry_run), ("default", false));
        // A failed create turns the answer into a denial without the patch.
        let mut r = review_with(&body(Some(false), "ns"), &config, &[]);
        r.deny("cannot create ResourceClaimTemplate ns/x: forbidden".into());
        assert_eq!(r.body["response"]["allowed"], false);
        assert!(r.body["response"].get("patch").is_none());
        assert!(r.claims.is_empty());
        assert_eq!(
            r.denied(),
            Some("cannot create ResourceClaimTemplate ns/x: forbidden")
        );
        // The slices could not be read: a denial for want of them says why.
        let pct = String::from_utf8(body(None, "ns"))
            .unwrap()
            .replace("amd.com/gpumem", "amd.com/gpumem-percentage")
            .replace("1024", "50");
        let mut r = review_with(pct.as_bytes(), &config, &[]);
        r.note_missing_shapes("403 Forbidden");
        let message = r.denied().unwrap();
        assert!(
            message.contains("no ResourceSlice of")
                && message.contains("cannot read ResourceSlices: 403 Forbidden"),
            "{message}"
        );
        // Only a DRA-mode review is worth reading the slices for.
        assert!(crate::dra_templates::may_need_shapes(
            &body(None, "ns"),
            &config
        ));
        let plain = br#"{"request": {"object": {"metadata": {}}}}"#;
        assert!(!crate::dra_templates::may_need_shapes(plain, &config));
        let dra = WebhookConfig {
            amd_mode: AmdMode::Dra,
            ..WebhookConfig::default()
        };
        assert!(crate::dra_templates::may_need_shapes(plain, &dra));
    }
}
