//! The HTTP shell: routes to the pure page functions. Every route is a read (the What-if
//! form posts a scenario to plan in memory; nothing is written to the cluster). Every
//! response carries the security headers ([`CONTENT_SECURITY_POLICY`] and the rest); the
//! What-if POST is checked for its origin (`same_origin.rs`), its body read under a size
//! and time limit, and planned by the [`Runner`]. So are the live cluster's What-if and
//! defrag forms (`/whatif/live`, `/whatif/defrag`: `whatif_live.rs`, `defrag_view.rs`).

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
use crate::defrag_view::Budgets;
use crate::html::{CSS, LIVE_JS, Page, not_found};
use crate::samples::Metrics;
use crate::scrape::unix_now;
use crate::whatif::Problem;
use crate::whatif_live::{MAX_FORM_BYTES, Snapshot, form_fields};
use crate::whatif_live_page::{Choices, Filled, Shown};
use crate::whatif_run::Runner;
use crate::world::World;
use crate::{defrag_view, pages, same_origin, whatif, whatif_live, whatif_live_page};

/// What the handlers read, written by the watchers and the scraper.
#[derive(Clone)]
pub struct Shared {
    /// The watched Kubernetes objects.
    pub world: Arc<RwLock<World>>,
    /// The scraped monitor metrics.
    pub metrics: Arc<RwLock<Metrics>>,
    /// The What-if planner (its limits, slots and stop switch).
    pub whatif: Arc<Runner>,
    /// The cluster's API, for what a page reads on demand (the defrag plan's
    /// PodDisruptionBudgets); `None`: such reads are skipped and the page says so.
    pub client: Option<kube::Client>,
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

async fn pod(
    State(s): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    with_state(&s, |w, m| {
        pages::pod_in(
            w,
            m,
            &ns,
            &name,
            query.as_deref().unwrap_or_default(),
            unix_now(),
        )
    })
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
    let too_large = format!(
        "the form is larger than the UI accepts ({max} bytes, a scenario of {} bytes): shorten the scenario, or run it with `hami plan --scenario FILE`",
        limits.max_scenario_bytes
    );
    body_within(max, too_large, limits, headers, body).await
}

/// A body of at most `max` bytes (`too_large` past it, 413), within the body timeout.
async fn body_within(
    max: usize,
    too_large: String,
    limits: &whatif::Limits,
    headers: &HeaderMap,
    body: Body,
) -> Result<Vec<u8>, Problem> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(Problem::too_large(too_large));
    }
    match tokio::time::timeout(limits.body_timeout, Limited::new(body, max).collect()).await {
        Err(_) => Err(Problem {
            status: 408,
            message: format!(
                "the form's body did not arrive within {} s; submit the form again",
                limits.body_timeout.as_secs()
            ),
        }),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(Problem::too_large(too_large))
        }
        Ok(Err(e)) => Err(Problem::bad(format!(
            "the form's body could not be read ({e}); submit the form again"
        ))),
        Ok(Ok(collected)) => Ok(collected.to_bytes().to_vec()),
    }
}

/// The POST's origin (`same_origin::check`): a 403 problem when posted from another site.
fn cross_site(headers: &HeaderMap) -> Option<Problem> {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    same_origin::check(
        text(header::HOST),
        text(header::ORIGIN),
        headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()),
    )
    .err()
    .map(|message| Problem {
        status: 403,
        message,
    })
}

/// The live cluster as the UI sees it now (the lock held only while copying).
fn snapshot(s: &Shared) -> Option<Snapshot> {
    let world = s.world.read().ok()?;
    Some(Snapshot::of(&world, unix_now()))
}

fn live_page(s: &Shared, choices: &Choices, filled: &Filled, shown: &Shown) -> Response {
    let problem = match shown {
        Shown::Live(Err(p)) | Shown::Defrag(Err(p)) => Some(p.status),
        _ => None,
    };
    let mut response = respond(whatif_live_page::page(choices, filled, shown, &banners(s)));
    if problem == Some(429) {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    response
}

async fn whatif_live_form(State(s): State<Shared>) -> Response {
    let Some(choices) = s.world.read().ok().map(|w| Choices::of_world(&w)) else {
        return unavailable();
    };
    live_page(&s, &choices, &Filled::default(), &Shown::Forms)
}

/// Which of the live forms was posted.
#[derive(Clone, Copy)]
enum LiveForm {
    Edits,
    Defrag,
}

async fn whatif_live_post(s: Shared, headers: HeaderMap, body: Body, form: LiveForm) -> Response {
    let Some(snap) = snapshot(&s) else {
        return unavailable();
    };
    let choices = Choices::of(&snap);
    let shown = |p: Problem| match form {
        LiveForm::Edits => Shown::Live(Err(p)),
        LiveForm::Defrag => Shown::Defrag(Err(p)),
    };
    if let Some(p) = cross_site(&headers) {
        return live_page(&s, &choices, &Filled::default(), &shown(p));
    }
    let limits = s.whatif.limits().clone();
    let too_large = format!(
        "the form is larger than the UI accepts ({MAX_FORM_BYTES} bytes); post it from the What-if page"
    );
    let fields = match body_within(MAX_FORM_BYTES, too_large, &limits, &headers, body)
        .await
        .and_then(|b| form_fields(&b).map(|f| (b, f)))
    {
        Ok(read) => read,
        Err(p) => return live_page(&s, &choices, &Filled::default(), &shown(p)),
    };
    let (bytes, filled) = (fields.0, Filled(fields.1));
    let result = match form {
        LiveForm::Edits => {
            let planned = match whatif_live::edits_from_form(&bytes, &snap, &limits) {
                Err(p) => Err(p),
                Ok(edits) => {
                    s.whatif
                        .run(move |stop, limits| whatif_live::job(&snap, &edits, limits, stop))
                        .await
                }
            };
            Shown::Live(planned)
        }
        LiveForm::Defrag => {
            let planned = match defrag_view::form_from_body(&bytes) {
                Err(p) => Err(p),
                Ok(form) => {
                    let budgets = budgets(&s, &limits).await;
                    s.whatif
                        .run(move |stop, limits| {
                            defrag_view::job(&snap, &budgets, &form, limits, stop)
                        })
                        .await
                }
            };
            Shown::Defrag(planned)
        }
    };
    live_page(&s, &choices, &filled, &result)
}

/// The PodDisruptionBudgets for a defrag plan, listed now (the UI watches none): within
/// the form's time limit; refused (a role without list on them) or failed, the
/// plan is made without them and says why.
async fn budgets(s: &Shared, limits: &whatif::Limits) -> Budgets {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let Some(client) = s.client.clone() else {
        return Budgets::Unread("the UI has no cluster client".into());
    };
    let api = kube::Api::<PodDisruptionBudget>::all(client);
    let listed = tokio::time::timeout(
        limits.body_timeout,
        api.list(&kube::api::ListParams::default()),
    )
    .await;
    match listed {
        Ok(Ok(list)) => Budgets::Read(list.items),
        Ok(Err(kube::Error::Api(e))) if e.code == 403 => Budgets::Unread(
            "the UI may not list poddisruptionbudgets (API group policy); grant it list on them to see each move's budget".into(),
        ),
        Ok(Err(e)) => Budgets::Unread(format!("listing them failed: {e}")),
        Err(_) => Budgets::Unread(format!(
            "listing them took longer than {} s",
            limits.body_timeout.as_secs()
        )),
    }
}

async fn whatif_live_edits(State(s): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    whatif_live_post(s, headers, body, LiveForm::Edits).await
}

async fn whatif_defrag(State(s): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    whatif_live_post(s, headers, body, LiveForm::Defrag).await
}

async fn whatif_plan(State(s): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    if let Some(p) = cross_site(&headers) {
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
            "/whatif/live",
            get(whatif_live_form).post(whatif_live_edits),
        )
        .route("/whatif/defrag", get(whatif_live_form).post(whatif_defrag))
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
