//! The HTTP surface (`/metrics` only, as the reference) and the wiring of the monitor:
//! informer → periodic refresh → scrape.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hami_protocol::exposition::Format;

use crate::metrics::{LegacyMetrics, render_as};
use crate::node_monitor::{MonitorConfig, NodeMonitor};
use crate::pods::{PodIndex, PodInformer};

/// Settings of a running monitor.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// What the monitor scans.
    pub monitor: MonitorConfig,
    /// Where `/metrics` is served.
    pub bind: SocketAddr,
    /// Which pre-2026 metric names are served beside the `hami_*` ones.
    pub legacy_metrics: LegacyMetrics,
    /// The scheduler whose pods' allocation annotations are believed (D-4).
    pub scheduler_name: String,
    /// Period of the directory scan and the fdinfo sampling.
    pub refresh_interval: Duration,
}

#[derive(Clone)]
struct AppState {
    monitor: Arc<NodeMonitor>,
    legacy: LegacyMetrics,
}

/// The `/metrics` router over a monitor.
pub fn router(monitor: Arc<NodeMonitor>, legacy: LegacyMetrics) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .with_state(AppState { monitor, legacy })
}

async fn scrape(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let monitor = state.monitor.clone();
    // The 0.0.4 text unless the scraper names OpenMetrics (issue 27).
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    // Region reads are memory loads and fcntl queries: short, but not async.
    match tokio::task::spawn_blocking(move || render_as(&monitor.snapshot(), state.legacy, format))
        .await
    {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("scrape failed: {e}"),
        )
            .into_response(),
    }
}

/// Parses `--metrics-bind-address`: `:9394` (all interfaces, as Go writes it) or `host:port`.
pub fn parse_bind_address(text: &str) -> Result<SocketAddr, String> {
    let full = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_owned()
    };
    full.parse().map_err(|e| {
        format!("--metrics-bind-address {text:?} is not an address such as :9394 or 127.0.0.1:9394 ({e})")
    })
}

/// Runs one refresh on a blocking thread.
pub async fn refresh(monitor: &Arc<NodeMonitor>, index: PodIndex) {
    let monitor = monitor.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || monitor.refresh(index)).await {
        tracing::error!("refresh pass failed: {e}");
    }
}

/// Posts the Events the last refresh's hook check queued (issue 29); one that fails is
/// logged, and queued again by the next refresh that still finds its container unhooked.
pub async fn post_hook_events(monitor: &Arc<NodeMonitor>, client: &kube::Client) {
    for event in monitor.hooks().take_events() {
        if let Err(e) = crate::hook_check::post_event(client, &event).await {
            tracing::warn!(
                pod = %format!("{}/{}", event.namespace, event.pod),
                "cannot post the {} Event: {e}; retried at the next refresh (the monitor's role needs events: create)",
                event.reason
            );
            monitor.hooks().not_posted(&event);
        }
    }
}

/// Runs the monitor until `shutdown` resolves.
pub async fn serve(
    config: ServeConfig,
    client: kube::Client,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let containers: PathBuf = config.monitor.hook_path.join("containers");
    if !containers.is_dir() {
        tracing::warn!(dir = %containers.display(), "the containers directory does not exist yet; it is scanned again every {}s", config.refresh_interval.as_secs());
    }
    let events = client.clone();
    let mut informer =
        PodInformer::start(client, &config.monitor.node_name, &config.scheduler_name);
    informer.wait_ready().await?;
    let monitor = Arc::new(NodeMonitor::new(config.monitor.clone()));
    refresh(&monitor, informer.index_with_dra().await).await;
    post_hook_events(&monitor, &events).await;
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.bind))?;
    tracing::info!(address = %config.bind, "serving /metrics");
    let ticker_monitor = monitor.clone();
    let interval = config.refresh_interval;
    let ticker = tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            refresh(&ticker_monitor, informer.index_with_dra().await).await;
            post_hook_events(&ticker_monitor, &events).await;
        }
    });
    let result = axum::serve(listener, router(monitor, config.legacy_metrics))
        .with_graceful_shutdown(shutdown)
        .await;
    ticker.abort();
    result.map_err(|e| anyhow::anyhow!("metrics server: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_addresses_in_go_and_rust_forms() {
        assert_eq!(
            parse_bind_address(":9394").unwrap().to_string(),
            "0.0.0.0:9394"
        );
        assert_eq!(parse_bind_address("127.0.0.1:1").unwrap().port(), 1);
        assert!(parse_bind_address("9394").unwrap_err().contains(":9394"));
    }
}
