//! The web UI of hami-rs (`hami ui`, the `hami-webui` Deployment): the cluster's GPUs,
//! nodes, cards and partitions, which compute units of which card each pod holds, and
//! per-pod utilization, live.
//!
//! Server-rendered HTML and CSS with SVG charts: nothing to build, no JavaScript needed to
//! read a page; where JavaScript runs, a short script (`assets/live.js`) brings the page's
//! content up to date every few seconds in place (only what changed, so focus, selection and
//! what a screen reader read stay), with a pause button. The cluster is read by watch
//! through the scheduler's own usage state (`ClusterState`, as `hami status`), the monitors
//! by scraping.
//!
//! - [`world`], [`samples`]: what is known (plain data, fed by [`watch`] and [`scrape`];
//!   what a watch item does to the world is [`watch_feed`], pure).
//! - [`pages`], [`overview`] (and its Top-5 tables, [`tops`]), [`cards`], [`pods`], [`dra`]
//!   (DRA nodes, devices and pods), [`whatif`], [`svg`], [`html`]: pure rendering; [`query`]:
//!   the list pages' query strings, pages of rows and the links that keep them; [`usage`]:
//!   the monitors' figures per node and card, with their age, or why a node has none.
//! - [`server`]: the axum routes and the security headers every response carries;
//!   [`connections`]: the accept loop (connection cap, request-head timeout);
//!   [`same_origin`]: the What-if POST's origin check; [`whatif_run`]: plans with a
//!   deadline, a concurrency limit and a stop when the client or the UI goes.
//! - [`whatif_live`] (rendered by [`whatif_live_page`]): What-if from the live cluster
//!   ("+N nodes like X", "remove node Y", the waiting pods before and after);
//!   [`defrag_view`]: `hami defrag plan`'s planner on the live cluster, shown, never run.

/// The log filter of `hami-webui` and `hami ui` (unless `RUST_LOG`): kube-runtime's
/// watcher warns at each retry of a refused watch, for ever; the UI's watchers log the first
/// error of each run themselves (`watch_feed`), and show it as a banner while it lasts.
pub const LOG_FILTER: &str = "info,kube_client=warn,kube_runtime=warn,kube_runtime::watcher=error";

/// The report the pages read their cluster figures from, as `hami status` builds it
/// (`hami_report::status_report`, `hami_report::dra_status`): for tools and tests that set
/// the pages beside the CLI's numbers.
pub use hami_report as report;

pub mod cards;
pub mod charts;
pub mod connections;
mod defrag_facts;
pub mod defrag_view;
pub mod dra;
#[cfg(test)]
mod fixtures;
pub mod grafana;
pub mod html;
#[cfg(test)]
mod legible_tests;
pub mod live;
pub mod overview;
#[cfg(test)]
mod overview_tests;
pub mod pages;
pub mod physical;
pub mod pod_charts;
pub mod pods;
#[cfg(test)]
mod pods_tests;
pub mod query;
pub mod same_origin;
pub mod samples;
pub mod scrape;
pub mod server;
pub mod svg;
pub mod tops;
#[cfg(test)]
mod trust_tests;
pub mod usage;
pub mod watch;
pub mod watch_feed;
pub mod whatif;
pub mod whatif_live;
pub mod whatif_live_page;
#[cfg(test)]
mod whatif_live_tests;
pub mod whatif_run;
pub mod world;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;

use crate::connections::ConnectionLimits;
use crate::samples::Metrics;
use crate::server::Shared;
use crate::whatif_run::Runner;
use crate::world::World;

/// What the UI's server allows: connections and request heads, and What-if plans (their
/// size, deadline, how many at once, and the form's body).
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// Connections at once and the request-head timeout.
    pub connections: ConnectionLimits,
    /// What one What-if request may ask.
    pub whatif: whatif::Limits,
}

/// `hami ui` / `hami-webui`.
#[derive(Debug, Clone, clap::Args)]
pub struct UiArgs {
    /// Address to serve the UI on.
    #[arg(long, default_value = "127.0.0.1:8088", env = "HAMI_UI_LISTEN")]
    pub listen: SocketAddr,
    /// kubeconfig file; default: $KUBECONFIG, ~/.kube/config, then in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// A monitor's metrics URL (http://NODE:9394/metrics); repeatable.
    #[arg(long = "monitor", value_name = "URL")]
    pub monitors: Vec<String>,
    /// A Prometheus server (http://prometheus:9090) whose /federate gives the monitors'
    /// series, instead of or beside --monitor.
    #[arg(long, value_name = "URL", env = "HAMI_UI_PROMETHEUS")]
    pub prometheus: Option<String>,
    /// Seconds between scrapes.
    #[arg(long, default_value_t = 5)]
    pub scrape_seconds: u64,
    /// Whether to watch the AMD DRA driver's ResourceSlices and the ResourceClaims (the
    /// DRA nodes' devices and their pods' shares; needs list/watch on both): `--dra` (=on)
    /// from the start; `--dra=off` never (the chart passes one of the two, with its
    /// draPlugin.enabled, so it asks only for what its role grants); `auto`, the default,
    /// once a node is labelled hami.io/amd-mode=dra.
    #[arg(
        long,
        value_enum,
        default_value_t = DraWatch::Auto,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "on",
        value_name = "auto|on|off"
    )]
    pub dra: DraWatch,
    /// Grafana's address (http://grafana:3000): the pages link its hami-rs dashboards
    /// (deploy/grafana/) for ranges longer than the UI keeps; without it, no link.
    #[arg(long, value_name = "URL", env = "HAMI_UI_GRAFANA_URL", value_parser = grafana::parse_base)]
    pub grafana_url: Option<String>,
}

/// When the UI watches the DRA resources (`--dra`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DraWatch {
    /// Once a node is in DRA mode (until then no resource.k8s.io request is made).
    Auto,
    /// From the start.
    On,
    /// Never: a node in DRA mode gets a banner naming the flag.
    Off,
}

/// A running UI.
pub struct RunningUi {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The state its pages read (watched objects and scraped metrics).
    pub shared: Shared,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningUi {
    /// `http://<addr>/`.
    pub fn url(&self) -> String {
        server::local_url(self.addr)
    }

    /// Stops the server (every connection with it), the watchers, the scraper and any
    /// What-if plan running (at its next pod).
    pub fn shutdown(self) {
        self.shared.whatif.stop();
        for t in self.tasks {
            t.abort();
        }
    }
}

/// Starts watchers (the DRA ones too), scrapers and the server on `listener`.
pub fn start(
    client: kube::Client,
    listener: tokio::net::TcpListener,
    monitors: Vec<String>,
    scrape_every: Duration,
) -> anyhow::Result<RunningUi> {
    start_with(client, listener, monitors, scrape_every, DraWatch::On)
}

/// [`start`], with the DRA watchers as `dra` says (`--dra`).
pub fn start_with(
    client: kube::Client,
    listener: tokio::net::TcpListener,
    monitors: Vec<String>,
    scrape_every: Duration,
    dra: DraWatch,
) -> anyhow::Result<RunningUi> {
    start_limited(
        client,
        listener,
        monitors,
        scrape_every,
        dra,
        Limits::default(),
    )
}

/// [`start_with`], under `limits` instead of the defaults.
pub fn start_limited(
    client: kube::Client,
    listener: tokio::net::TcpListener,
    monitors: Vec<String>,
    scrape_every: Duration,
    dra: DraWatch,
    limits: Limits,
) -> anyhow::Result<RunningUi> {
    let addr = listener.local_addr()?;
    let world = Arc::new(RwLock::new(World::default()));
    let metrics = Arc::new(RwLock::new(Metrics::with_endpoints(&monitors)));
    let shared = Shared {
        world: world.clone(),
        metrics: metrics.clone(),
        whatif: Arc::new(Runner::new(limits.whatif)),
        client: Some(client.clone()),
    };
    let mut tasks = watch::start(client, world.clone(), dra);
    if !monitors.is_empty() {
        tasks.push(tokio::spawn(scrape::run(world, metrics, scrape_every)));
    }
    let serving = shared.clone();
    tasks.push(tokio::spawn(server::serve(
        listener,
        serving,
        limits.connections,
    )));
    Ok(RunningUi {
        addr,
        shared,
        tasks,
    })
}

/// `hami ui`: serves until Ctrl-C (or SIGTERM in a pod).
pub async fn run(args: UiArgs) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = hami_plugin_core::kube_client::client(args.kubeconfig.as_deref())
        .await
        .context("cannot configure a Kubernetes client (give --kubeconfig, set KUBECONFIG, or run in a pod)")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (give another --listen)", args.listen))?;
    let mut monitors = args.monitors.clone();
    if let Some(p) = &args.prometheus {
        monitors.push(scrape::federate_url(p));
    }
    let ui = start_with(
        client,
        listener,
        monitors,
        Duration::from_secs(args.scrape_seconds.max(1)),
        args.dra,
    )?;
    if let Ok(mut m) = ui.shared.metrics.write() {
        m.grafana = args.grafana_url.clone();
    }
    println!("hami web UI: {}", ui.url());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    ui.shutdown();
    Ok(())
}
