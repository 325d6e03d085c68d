//! The HTTP shell: routes to the pure page functions. Every route is a read (the What-if
//! form posts a scenario to plan in memory; nothing is written to the cluster). Every
//! response carries the security headers ([`CONTENT_SECURITY_POLICY`] and the rest); the
//! What-if POST is checked for its origin (`same_origin.rs`), its body read under a size
//! and time limit, and planned by the [`Runner`].

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http_body_util::{BodyExt, Limited};

use crate::connections::{self, ConnectionLimits};
use crate::html::{CSS, LIVE_JS, Page, not_found};
use crate::samples::Metrics;
use crate::scrape::unix_now;
use crate::whatif::Problem;
use crate::whatif_run::Runner;
use crate::world::World;
use crate::{pages, same_origin, whatif};

/// What the handlers read, written by the watchers and the scraper.
#[derive(Clone)]
pub struct Shared {
    /// The watched Kubernetes objects.
    pub world: Arc<RwLock<World>>,
    /// The scraped monitor metrics.
    pub metrics: Arc<RwLock<Metrics>>,
    /// The What-if planner (its limits, slots and stop switch).
    pub whatif: Arc<Runner>,
}

/// The UI's Content-Security-Policy: its own script and stylesheet only (no inline script,
/// style or handler runs, so a name that slipped through escaping could not run either), no
/// plugins, fetches and form posts to itself only, and no framing by any page.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// Adds the security headers to every response.
async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
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

async fn overview(State(s): State<Shared>, RawQuery(query): RawQuery) -> Response {
    with_state(&s, |w, m| {
        pages::overview(w, m, query.as_deref().unwrap_or_default(), unix_now())
    })
}

async fn node(State(s): State<Shared>, Path(name): Path<String>) -> Response {
    with_state(&s, |w, m| pages::node(w, m, &name, unix_now()))
}

async fn cards(State(s): State<Shared>, RawQuery(query): RawQuery) -> Response {
    with_state(&s, |w, m| {
        crate::cards::cards(w, m, query.as_deref().unwrap_or_default())
    })
}

async fn pods(State(s): State<Shared>, RawQuery(query): RawQuery) -> Response {
    with_state(&s, |w, m| {
        crate::pods::pods(w, m, query.as_deref().unwrap_or_default(), unix_now())
    })
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

fn problem_page(p: Problem, scenario: &str, banners: &[String]) -> Response {
    let retry = p.status == 429;
    let mut response = respond(whatif::page(scenario, Some(Err(p)), banners));
    if retry {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    response
}

/// The form's body, at most a form-encoded scenario of the limit, within the body timeout.
async fn form_body(
    limits: &whatif::Limits,
    headers: &HeaderMap,
    body: Body,
) -> Result<Vec<u8>, Problem> {
    // Form encoding may take three bytes per byte of text.
    let max = limits
        .max_scenario_bytes
        .saturating_mul(3)
        .saturating_add(4096);
    let too_large = || {
        Problem::too_large(format!(
            "the form is larger than the UI accepts ({max} bytes, a scenario of {} bytes): shorten the scenario, or run it with `hami plan --scenario FILE`",
            limits.max_scenario_bytes
        ))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(limits.body_timeout, Limited::new(body, max).collect()).await {
        Err(_) => Err(Problem {
            status: 408,
            message: format!(
                "the form's body did not arrive within {} s; submit the form again",
                limits.body_timeout.as_secs()
            ),
        }),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(Problem::bad(format!(
            "the form's body could not be read ({e}); submit the form again"
        ))),
        Ok(Ok(collected)) => Ok(collected.to_bytes().to_vec()),
    }
}

async fn whatif_plan(State(s): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if let Err(message) = same_origin::check(
        text(header::HOST),
        text(header::ORIGIN),
        headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()),
    ) {
        let p = Problem {
            status: 403,
            message,
        };
        return problem_page(p, whatif::DEFAULT_SCENARIO, &banners(&s));
    }
    let scenario = match form_body(s.whatif.limits(), &headers, body)
        .await
        .and_then(|b| whatif::scenario_from_form(&b))
    {
        Ok(scenario) => scenario,
        Err(p) => return problem_page(p, whatif::DEFAULT_SCENARIO, &banners(&s)),
    };
    match s.whatif.plan(scenario.clone()).await {
        Ok(report) => respond(whatif::page(&scenario, Some(Ok(report)), &banners(&s))),
        Err(p) => problem_page(p, &scenario, &banners(&s)),
    }
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
        .route("/cards", get(cards))
        .route("/pods", get(pods))
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
        .layer(axum::middleware::map_response(security_headers))
        .with_state(shared)
}

/// Serves `router` on `listener` under `limits` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, shared: Shared, limits: ConnectionLimits) {
    connections::serve(listener, router(shared), limits).await
}

/// The URL to open for a listener at `addr`.
pub fn local_url(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}
