//! The HTTP shell: one listener for `/filter`, `/bind`, `/webhook`, `/healthz`, `/readyz`
//! (TLS from cert/key files, reloaded when they change; plain HTTP without them), and a
//! second one for `/metrics`.

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

use crate::admission::{Admission, admit};
use crate::extender::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderFilterResult, from_json_any_case,
};
use crate::runtime::Scheduler;

/// Largest request body accepted.
pub const MAX_BODY: usize = 1 << 20;

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

pub fn metrics_router(scheduler: Arc<Scheduler>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(s): State<Arc<Scheduler>>| async move {
                let text = s.metrics.render(&s.state());
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    text,
                )
            }),
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

async fn readyz(State(s): State<Arc<Scheduler>>) -> Response {
    if s.ready() {
        (StatusCode::OK, "ok").into_response()
    } else if !s.leader.is_leader() {
        (StatusCode::SERVICE_UNAVAILABLE, "not the leader").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "informers not synced").into_response()
    }
}

/// AdmissionReview v1 and v1beta1, answered in the version received.
async fn webhook(State(s): State<Arc<Scheduler>>, raw: Result<Bytes, BytesRejection>) -> Response {
    let bytes = match body(raw) {
        Ok(b) => b,
        Err((status, error)) => return json_response(status, &json!({ "error": error })),
    };
    let (status, value) = review(&bytes, &s.settings.webhook);
    json_response(status, &value)
}

/// The webhook's answer to one AdmissionReview body.
pub fn review(bytes: &[u8], config: &crate::admission::WebhookConfig) -> (StatusCode, Value) {
    let bad = |message: String| (StatusCode::BAD_REQUEST, json!({ "error": message }));
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
    if is_pod && operation == "CREATE" {
        match request
            .get("object")
            .map(|o| serde_json::from_value::<Pod>(o.clone()))
        {
            None => refuse(
                &mut response,
                400,
                "BadRequest",
                "the AdmissionReview request has no object".into(),
            ),
            Some(Err(e)) => refuse(
                &mut response,
                400,
                "BadRequest",
                format!("the pod in the AdmissionReview does not decode: {e}"),
            ),
            Some(Ok(pod)) => match admit(&pod, config) {
                Admission::Ignore { .. } => {}
                Admission::Allow { patch } => {
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
    (
        StatusCode::OK,
        json!({ "apiVersion": api_version, "kind": "AdmissionReview", "response": response }),
    )
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
                let stamp = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
                let mut last: (Option<SystemTime>, Option<SystemTime>) =
                    (stamp(&cert), stamp(&key));
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    let now = (stamp(&cert), stamp(&key));
                    if now != last {
                        match reload.reload_from_pem_file(&cert, &key).await {
                            Ok(()) => info!("reloaded the TLS certificate"),
                            Err(e) => {
                                warn!(error = %e, "cannot reload the TLS certificate; keeping the old one")
                            }
                        }
                        last = now;
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
