//! The HTTP shell: routes to the pure page functions. Every route is a read (the What-if
//! form posts a scenario to plan in memory; nothing is written to the cluster).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Form, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;

use crate::html::{CSS, LIVE_JS, Page, not_found};
use crate::samples::Metrics;
use crate::scrape::unix_now;
use crate::world::World;
use crate::{pages, whatif};

/// What the handlers read, written by the watchers and the scraper.
#[derive(Clone)]
pub struct Shared {
    /// The watched Kubernetes objects.
    pub world: Arc<RwLock<World>>,
    /// The scraped monitor metrics.
    pub metrics: Arc<RwLock<Metrics>>,
}

fn respond(page: Page) -> Response {
    let status = StatusCode::from_u16(page.status).unwrap_or(StatusCode::OK);
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        page.html,
    )
        .into_response()
}

fn unavailable() -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "the UI's state is unavailable (a watcher panicked); restart the UI",
    )
        .into_response()
}

/// Renders under the read locks (pages are pure and fast; no await inside).
fn with_state(shared: &Shared, f: impl FnOnce(&World, &Metrics) -> Page) -> Response {
    let (Ok(world), Ok(metrics)) = (shared.world.read(), shared.metrics.read()) else {
        return unavailable();
    };
    respond(f(&world, &metrics))
}

async fn overview(State(s): State<Shared>) -> Response {
    with_state(&s, |w, m| pages::overview(w, m, unix_now()))
}

async fn node(State(s): State<Shared>, Path(name): Path<String>) -> Response {
    with_state(&s, |w, m| pages::node(w, m, &name, unix_now()))
}

async fn pod(State(s): State<Shared>, Path((ns, name)): Path<(String, String)>) -> Response {
    with_state(&s, |w, m| pages::pod(w, m, &ns, &name, unix_now()))
}

fn banners(s: &Shared) -> Vec<String> {
    s.world.read().map(|w| w.banners()).unwrap_or_default()
}

async fn whatif_form(State(s): State<Shared>) -> Response {
    respond(whatif::page(whatif::DEFAULT_SCENARIO, None, &banners(&s)))
}

#[derive(Deserialize)]
struct PlanForm {
    #[serde(default)]
    scenario: String,
}

async fn whatif_plan(State(s): State<Shared>, Form(form): Form<PlanForm>) -> Response {
    let text = form.scenario.clone();
    let result = tokio::task::spawn_blocking(move || whatif::plan(&text))
        .await
        .unwrap_or_else(|e| Err(format!("the planner failed: {e}")));
    respond(whatif::page(&form.scenario, Some(result), &banners(&s)))
}

async fn fallback(State(s): State<Shared>) -> Response {
    respond(not_found("This page", &banners(&s)))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("max-age=300"),
            ),
        ],
        body,
    )
        .into_response()
}

/// Every page, the static assets and `/healthz`.
pub fn router(shared: Shared) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/nodes/{name}", get(node))
        .route("/pods/{namespace}/{name}", get(pod))
        .route("/whatif", get(whatif_form).post(whatif_plan))
        .route(
            "/static/style.css",
            get(|| async { asset("text/css; charset=utf-8", CSS) }),
        )
        .route(
            "/static/live.js",
            get(|| async { asset("text/javascript; charset=utf-8", LIVE_JS) }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .fallback(fallback)
        .layer(DefaultBodyLimit::max(whatif::MAX_SCENARIO_BYTES + 4096))
        .with_state(shared)
}

/// Serves `router` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, shared: Shared) -> std::io::Result<()> {
    axum::serve(listener, router(shared)).await
}

/// The URL to open for a listener at `addr`.
pub fn local_url(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}
