//! An embedded Kubernetes API server speaking the real HTTP/JSON protocol, so that stock
//! clients (kube-rs, kubectl) run unchanged against it in tests and in `hami demo`.
//! See README.md for what is faithful and what is not.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default()).await?;
//! server.write_kubeconfig(std::path::Path::new("/tmp/kubeconfig"))?;
//! server.faults().fail_next(Some("patch"), Some("pods"), 1, 500);
//! # Ok(()) }
//! ```

pub mod admission;
pub mod authn;
pub mod bound_tokens;
pub mod cel;
pub mod codec;
pub mod connections;
pub mod depth;
pub mod discovery;
pub mod event_mirror;
pub mod event_ttl;
pub mod eviction;
pub mod faults;
pub mod http;
pub mod impersonation;
pub mod kubeconfig;
pub mod lagging_watch;
pub mod managed_fields;
pub mod match_conditions;
pub mod meta;
pub mod openapi;
pub mod patch;
pub mod persistence;
pub mod protobuf;
pub mod quantity;
pub mod rbac;
pub mod request_log;
pub mod resources;
pub mod route;
pub mod selector;
pub mod service_accounts;
pub mod state;
pub mod status;
pub mod store;
pub mod stored;
pub mod strategic_merge;
pub mod strategy;
pub mod table;
pub mod tls;
pub mod watch;
pub mod webhook_client;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

pub use request_log::RequestRecord;
pub use status::ApiError;

use crate::http::AppState;
use crate::store::Store;

/// Settings of a server.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to bind; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Keep objects in this directory across restarts.
    pub data_dir: Option<PathBuf>,
    /// Watch events kept for resuming watches; older resourceVersions get 410 Expired.
    pub history_limit: usize,
    /// Watch events older than this are dropped from the history too (410 Expired).
    pub history_max_age: Duration,
    /// Events are deleted this long after their last write (kube-apiserver's `--event-ttl`).
    pub event_ttl: Duration,
    /// At most this many Events are kept (core and events.k8s.io together); the oldest go.
    pub max_events: usize,
    /// Events buffered per watcher before a slow watcher is ended with 410.
    pub watch_buffer: usize,
    /// Interval of BOOKMARK events for watches that allow them.
    pub bookmark_interval: Duration,
    /// Watch duration when the client gives no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// Requests kept in the request log.
    pub request_log_capacity: usize,
    /// Authenticate bearer tokens and enforce RBAC. None (the default): no authentication,
    /// every request is allowed.
    pub auth: Option<authn::AuthConfig>,
    /// Connections served at once (more wait in the listen backlog).
    pub max_connections: usize,
    /// Time for a client to send a request head, and for an idle keep-alive connection to
    /// start its next request (32 s: kube-apiserver's ReadHeaderTimeout).
    pub header_read_timeout: Duration,
    /// Time for a client to send a request body once its head arrived (60 s:
    /// kube-apiserver's default request timeout); 408 otherwise.
    pub body_read_timeout: Duration,
    /// At shutdown, time in-flight requests get before their connections are dropped.
    pub shutdown_grace: Duration,
    /// Serve HTTPS only, with a CA and serving certificate made at start (see [`tls`]):
    /// [`RunningApiServer::url`] is `https://…`, [`RunningApiServer::ca_pem`] the CA, and
    /// the written kubeconfig carries it. Off (the default): plain HTTP.
    pub tls: bool,
    /// Run the serviceaccount controller (a `default` account in every namespace), the
    /// root-CA publisher (`kube-root-ca.crt` in every namespace, with `tls`) and the
    /// ServiceAccount admission plugin on pod creation (see [`service_accounts`]).
    /// kube-apiserver always runs them; off by default because most tests create pods in
    /// namespaces without accounts and compare specs without the injected token volume.
    pub service_accounts: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: None,
            history_limit: store::DEFAULT_HISTORY,
            history_max_age: store::DEFAULT_HISTORY_AGE,
            event_ttl: store::DEFAULT_EVENT_TTL,
            max_events: store::DEFAULT_MAX_EVENTS,
            watch_buffer: 16 * 1024,
            bookmark_interval: Duration::from_secs(10),
            default_watch_timeout: Duration::from_secs(1800),
            request_log_capacity: 10_000,
            auth: None,
            max_connections: connections::default_max_connections(),
            header_read_timeout: Duration::from_secs(32),
            body_read_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(5),
            tls: false,
            service_accounts: false,
        }
    }
}

/// Entry point: `ApiServer::start(config)`.
pub struct ApiServer;

impl ApiServer {
    /// Binds, loads persisted state if any, and serves in a background task.
    pub async fn start(config: Config) -> anyhow::Result<RunningApiServer> {
        let mut store = Store::new(config.history_limit);
        store.set_history_max_age(config.history_max_age);
        store.set_event_bounds(config.event_ttl, config.max_events);
        let persistence = match &config.data_dir {
            Some(dir) => Some(persistence::Persistence::open(dir, &mut store)?),
            None => None,
        };
        store.ensure_default_namespaces();
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
        let addr = listener.local_addr()?;
        let certs = match config.tls {
            true => Some(tls::generate(addr.ip())?),
            false => None,
        };
        let acceptor = match &certs {
            Some(c) => Some(tls::acceptor(c, config.header_read_timeout)?),
            None => None,
        };
        let mut shared = state::SharedStore::new(store, persistence, config.watch_buffer);
        if config.service_accounts {
            shared = shared.with_service_accounts(service_accounts::ServiceAccounts {
                ca_pem: certs.as_ref().map(|c| c.ca_pem.clone()),
            });
        }
        let state = Arc::new(AppState {
            store: shared,
            service_accounts: config.service_accounts,
            faults: Mutex::new(faults::FaultState::default()),
            log: request_log::RequestLog::new(config.request_log_capacity),
            server_address: addr.to_string(),
            bookmark_interval: config.bookmark_interval,
            default_watch_timeout: config.default_watch_timeout,
            auth: config.auth.clone(),
            body_read_timeout: config.body_read_timeout,
        });
        // Persist the default namespaces created above (and anything else pending), with
        // what the controllers keep in them.
        state.write(|_| Ok::<(), ApiError>(()))?;
        state.store.run_controllers()?;
        let app = axum::Router::new()
            .fallback(http::handle)
            .layer(axum::extract::DefaultBodyLimit::disable())
            .with_state(state.clone());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let limits = connections::ConnectionLimits {
            max_connections: config.max_connections,
            header_read_timeout: config.header_read_timeout,
            shutdown_grace: config.shutdown_grace,
        };
        let counters = connections::Counters::default();
        let task = tokio::spawn(connections::serve(
            listener,
            app,
            limits,
            counters.clone(),
            acceptor,
            stop_rx,
        ));
        tracing::info!(%addr, tls = config.tls, "embedded Kubernetes API server listening");
        Ok(RunningApiServer {
            addr,
            certs,
            state,
            counters,
            stop: Some(stop_tx),
            task: Some(task),
        })
    }
}

/// A running server. Dropping it stops it.
pub struct RunningApiServer {
    addr: SocketAddr,
    certs: Option<tls::ServingCerts>,
    state: Arc<AppState>,
    counters: connections::Counters,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RunningApiServer {
    /// The address the server listens on (port chosen at start when 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Client connections open right now.
    pub fn open_connections(&self) -> usize {
        self.counters
            .connections
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Requests being answered right now (watches included).
    pub fn requests_in_flight(&self) -> usize {
        self.counters
            .requests
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// `http://127.0.0.1:PORT`, or `https://127.0.0.1:PORT` with `Config::tls`.
    pub fn url(&self) -> String {
        match self.certs {
            Some(_) => format!("https://{}", self.addr),
            None => format!("http://{}", self.addr),
        }
    }

    /// With `Config::tls`: the PEM of the CA that signed the serving certificate (what a
    /// client must trust; in-cluster clients find it in `kube-root-ca.crt`). None: plain HTTP.
    pub fn ca_pem(&self) -> Option<&str> {
        self.certs.as_ref().map(|c| c.ca_pem.as_str())
    }

    /// A kubeconfig pointing at this server (with its CA under TLS), as YAML text.
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig::kubeconfig_yaml(&self.url(), self.ca_pem())
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path`, for kubectl and other processes.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        kubeconfig::write_kubeconfig(path, &self.url(), self.ca_pem())
    }

    /// Writes a kubeconfig whose user acts as `user` (impersonation; see
    /// [`kubeconfig::kubeconfig_yaml_as`]).
    pub fn write_kubeconfig_as(&self, path: &Path, user: &str) -> std::io::Result<()> {
        kubeconfig::write_kubeconfig_text(
            path,
            &kubeconfig::kubeconfig_yaml_as(&self.url(), self.ca_pem(), user),
        )
    }

    /// Fault injection.
    pub fn faults(&self) -> FaultHandle {
        FaultHandle {
            state: self.state.clone(),
        }
    }

    /// The requests answered so far (bounded; oldest dropped first).
    pub fn request_log(&self) -> Vec<RequestRecord> {
        self.state.log.records()
    }

    /// Empties the request log, so that a test sees only the requests it caused.
    pub fn clear_request_log(&self) {
        self.state.log.clear()
    }

    /// What the store holds (objects, Events, watch history) and the request log's length:
    /// for soaks and bounds tests.
    pub fn store_stats(&self) -> (store::StoreStats, usize) {
        (self.state.read(|s| s.stats()), self.state.log.len())
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.read(|s| s.resource_version())
    }

    /// Reads an object directly from the store (`api_version` like `v1` or `coordination.k8s.io/v1`).
    pub fn get_object(
        &self,
        api_version: &str,
        plural: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Value> {
        let (group, version) = split_api_version(api_version);
        let r = resources::lookup(group, version, plural)?;
        self.state
            .read(|s| s.get(r, namespace, name).ok())
            .map(|v| (*v).clone())
    }

    /// Creates an object directly (seeding tests), with the same semantics as a POST
    /// but without admission webhooks.
    pub fn create_object(
        &self,
        api_version: &str,
        plural: &str,
        namespace: Option<&str>,
        obj: Value,
    ) -> Result<Value, ApiError> {
        let (group, version) = split_api_version(api_version);
        let r = resources::lookup(group, version, plural).ok_or_else(ApiError::no_route)?;
        self.state
            .write(|s| s.create(r, namespace, obj))
            .map(|v| (*v).clone())
    }

    /// With authentication on: a token for the service account `namespace/name`, through
    /// the path Kubernetes offers (the service account, then a token Secret
    /// `<name>-token` that the token controller fills). Both are created if missing.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> Result<String, ApiError> {
        let ignore_exists = |r: Result<Value, ApiError>| match r {
            Err(e) if e.code != 409 => Err(e),
            _ => Ok(()),
        };
        ignore_exists(self.create_object(
            "v1",
            "serviceaccounts",
            Some(namespace),
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}),
        ))?;
        let secret_name = format!("{name}-token");
        ignore_exists(self.create_object(
            "v1",
            "secrets",
            Some(namespace),
            serde_json::json!({
                "apiVersion": "v1", "kind": "Secret", "type": authn::SA_TOKEN_TYPE,
                "metadata": {"name": secret_name, "namespace": namespace,
                             "annotations": {authn::SA_NAME_ANNOTATION: name}}
            }),
        ))?;
        let secret = self
            .get_object("v1", "secrets", namespace, &secret_name)
            .ok_or_else(|| ApiError::internal("the token Secret vanished"))?;
        let token: k8s_openapi::ByteString =
            serde_json::from_value(secret["data"]["token"].clone()).map_err(|e| {
                ApiError::internal(format!("token Secret {namespace}/{secret_name}: {e}"))
            })?;
        String::from_utf8(token.0).map_err(|_| ApiError::internal("the token is not UTF-8"))
    }

    /// Who `token` authenticates as (a pod-bound TokenRequest token, or a token Secret's;
    /// the admin token only with `Config::auth`), authentication on or off: None when it
    /// authenticates as nobody. For checking the token a kubelet wrote into a pod.
    pub fn token_user(&self, token: &str) -> Option<rbac::UserInfo> {
        let config = self.state.auth.clone().unwrap_or(authn::AuthConfig {
            admin_token: String::new(),
        });
        let header = format!("Bearer {token}");
        self.state
            .read(|s| authn::authenticate(s, &config, Some(&header)))
            .ok()
            .filter(|u| u.name != rbac::ANONYMOUS)
    }

    /// A kubeconfig for this server whose user authenticates with `token`.
    pub fn kubeconfig_yaml_with_token(&self, token: &str) -> String {
        kubeconfig::kubeconfig_yaml_with_token(&self.url(), self.ca_pem(), token)
    }

    /// Stops serving: ends open watches (and refuses new ones), then gives in-flight
    /// requests `shutdown_grace` before dropping their connections.
    pub async fn shutdown(mut self) {
        self.stop_now();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }

    fn stop_now(&mut self) {
        self.state.store.stop();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl Drop for RunningApiServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}

fn split_api_version(av: &str) -> (&str, &str) {
    match av.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", av),
    }
}

/// Fault injection on a running server.
#[derive(Clone)]
pub struct FaultHandle {
    state: Arc<AppState>,
}

impl FaultHandle {
    /// Fails the next `n` requests matching `verb` (`get`, `list`, `watch`, `create`,
    /// `update`, `patch`, `delete`, `deletecollection`) and `resource` (`pods`,
    /// `pods/binding`, ...) with `code`. None matches anything.
    pub fn fail_next(&self, verb: Option<&str>, resource: Option<&str>, n: u32, code: u16) {
        let mut f = self.state.faults.lock().unwrap_or_else(|p| p.into_inner());
        f.rules.push(faults::FailRule {
            verb: verb.map(String::from),
            resource: resource.map(String::from),
            remaining: n,
            code,
        });
    }

    /// Adds `latency` to every request (zero to stop).
    pub fn set_latency(&self, latency: Duration) {
        self.state
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .latency = latency;
    }

    /// Ends every open watch stream (clients see the connection end and re-watch).
    pub fn close_all_watches(&self) {
        self.state.close_all_watches();
    }

    /// Drops the watch history: watches resuming from an older resourceVersion get 410 Expired.
    pub fn expire_watch_history(&self) {
        self.state
            .write(|s| {
                s.expire_history();
                Ok::<(), ApiError>(())
            })
            .ok();
    }

    /// Removes all fail rules and latency.
    pub fn clear(&self) {
        *self.state.faults.lock().unwrap_or_else(|p| p.into_inner()) =
            faults::FaultState::default();
    }
}

/// Arguments of `hami apiserver`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to serve on; must be a loopback address (there is no authentication).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// Serve HTTPS with a CA made at start; the kubeconfig written by --kubeconfig-out
    /// carries the CA (as in-cluster clients and kubectl need it).
    #[arg(long)]
    pub tls: bool,
    /// Write a kubeconfig for this server here (kubectl and kube-rs accept it).
    #[arg(long)]
    pub kubeconfig_out: Option<PathBuf>,
    /// Keep objects and resourceVersions in this directory across restarts.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

/// Serves until Ctrl-C (SIGINT) or SIGTERM.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    if !args.listen.ip().is_loopback() {
        anyhow::bail!(
            "refusing to serve the unauthenticated API on {}: use a loopback address such as 127.0.0.1:{}",
            args.listen,
            args.listen.port()
        );
    }
    let server = ApiServer::start(Config {
        listen: args.listen,
        data_dir: args.data_dir.clone(),
        tls: args.tls,
        ..Config::default()
    })
    .await?;
    if let Some(path) = &args.kubeconfig_out {
        server
            .write_kubeconfig(path)
            .map_err(|e| anyhow::anyhow!("cannot write kubeconfig {}: {e}", path.display()))?;
    }
    eprintln!(
        "embedded Kubernetes API server listening on {}",
        server.url()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    server.shutdown().await;
    Ok(())
}
