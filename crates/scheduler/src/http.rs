//! The HTTP shell. Routers: [`router`] (everything, for a loopback listener: tests, the
//! demo), [`webhook_router`] (`/webhook`, `/healthz`, `/readyz`; `/filter`, `/preempt` and
//! `/bind` refused: that listener is reachable through the Service, from any pod),
//! [`extender_router`] (`/filter` and `/bind`, forwarded to the leader from a follower;
//! served with [`serve_mtls`], which requires a client certificate from the CA
//! kube-scheduler's and the replicas' certificates come from), and [`metrics_router`].
//! The review codec is pure ([`hami_scheduler_core::review_codec`]); the listeners and
//! their TLS are [`crate::listener`] (re-exported here, where callers found them).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tracing::info;

use crate::extender::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderFilterResult, from_json_any_case,
};
use crate::forward::Route;
pub use crate::listener::{ClientAuth, mtls_config, pin_of, serve, serve_mtls, serve_on};
use crate::runtime::Scheduler;
pub use hami_scheduler_core::review_codec::{Reviewed, review_with};

/// Largest request body accepted.
pub const MAX_BODY: usize = 1 << 20;

/// Every endpoint on one listener: `/filter`, `/bind`, `/webhook`, `/healthz`, `/readyz`
/// (when `--http-bind` is loopback and no `--extender-bind` is given).
pub fn router(scheduler: Arc<Scheduler>) -> Router {
    Router::new()
        .route("/filter", post(filter))
        .route("/preempt", post(crate::preempt::preempt))
        .route("/bind", post(bind))
        .route("/webhook", post(webhook))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(scheduler)
}

/// `/webhook`, `/healthz`, `/readyz`; `/filter`, `/preempt` and `/bind` answer 403: this
/// listener is reachable by any pod through the webhook Service, and binding on the
/// scheduler's rights needs an authenticated caller (issue 13 item 8).
pub fn webhook_router(scheduler: Arc<Scheduler>) -> Router {
    let refuse = || async {
        json_response(
            StatusCode::FORBIDDEN,
            &json!({"error": "/filter, /preempt and /bind are not served on the webhook listener: kube-scheduler calls the extender listener (--extender-bind), which requires its client certificate"}),
        )
    };
    Router::new()
        .route("/filter", post(refuse))
        .route("/preempt", post(refuse))
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
        .route("/preempt", post(crate::preempt::extender_preempt))
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
pub(crate) async fn extender_call<F, Fut>(
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
                    let taken = {
                        let mut state = s.state();
                        // Capacity gauges leave out vendors whose plugin stopped refreshing.
                        state.expire_heartbeats(std::time::Instant::now());
                        s.metrics.take(&state)
                    };
                    // The defragmentation gauges are measured here, the lock released.
                    let text = s.metrics.encode(taken, format);
                    ([(header::CONTENT_TYPE, format.content_type())], text)
                },
            ),
        )
        .with_state(scheduler)
}

pub(crate) fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(value).unwrap_or_default(),
    )
        .into_response()
}

/// Reads the body or explains why not (too large, unreadable).
pub(crate) fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, (StatusCode, String)> {
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
/// pod (fail closed), giving back the quota its DRA claims reserved. A pod over its
/// namespace's quota is denied (`quota_admission`, D-29).
async fn webhook(State(s): State<Arc<Scheduler>>, raw: Result<Bytes, BytesRejection>) -> Response {
    let bytes = match body(raw) {
        Ok(b) => b,
        Err((status, error)) => return json_response(status, &json!({ "error": error })),
    };
    let (shapes, unreadable) =
        if hami_scheduler_core::review_codec::may_need_shapes(&bytes, &s.settings.webhook) {
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
    let mut ticket = None;
    if reviewed.denied().is_none() {
        // Issue 30: a pod its namespace's quotas cannot hold even on the smallest GPU; a
        // DRA-mode pod's claims are reserved under the lock (D-29).
        let admitted = hami_scheduler_core::quota_admission::admit(
            &bytes,
            &s.settings.webhook,
            &mut s.state(),
            &shapes,
            reviewed.dry_run,
            std::time::Instant::now(),
        );
        match admitted {
            Ok(t) => ticket = t,
            Err(refusal) => {
                info!(namespace = %reviewed.namespace, "webhook: {refusal}");
                reviewed.deny(refusal.to_string());
            }
        }
    }
    if !reviewed.claims.is_empty()
        && !reviewed.dry_run
        && let Err(message) = s
            .dra()
            .ensure_templates(&reviewed.namespace, &reviewed.claims)
            .await
    {
        if let Some(t) = &ticket {
            s.state().quota.cancel_admission(t);
        }
        reviewed.deny(message);
    }
    json_response(status(reviewed.status), &reviewed.body)
}

/// The webhook's answer to one AdmissionReview body, knowing no device shapes (the DRA
/// templates of [`review_with`] are not created here).
pub fn review(
    bytes: &[u8],
    config: &hami_scheduler_core::admission::WebhookConfig,
) -> (StatusCode, Value) {
    let (code, body) = hami_scheduler_core::review_codec::review(bytes, config);
    (status(code), body)
}

/// The codec's status as HTTP's (the codec answers only 200 and 400).
fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}
