//! A watch the API server refuses for good (403: a role without the rights) is logged once,
//! not once per retry: the UI's watchers log the first error of each run themselves, and
//! `LOG_FILTER` (the filter of `hami-webui` and `hami ui`) keeps kube-runtime's per-retry
//! warning out. Real embedded API server with RBAC on, a service account with no role.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hami_apiserver::authn::AuthConfig;
use hami_apiserver::{ApiServer, Config};

/// The log lines written, shared with the subscriber.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

// One thread: the subscriber set for this thread sees every task of the runtime.
#[tokio::test(flavor = "current_thread")]
async fn a_refused_watch_logs_once_while_it_retries() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let logs = Capture::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(hami_webui::LOG_FILTER))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = ApiServer::start(Config {
        auth: Some(AuthConfig::default()),
        ..Config::default()
    })
    .await
    .unwrap();
    server
        .create_object(
            "v1",
            "namespaces",
            None,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ui"}}),
        )
        .unwrap();
    let token = server.service_account_token("ui", "no-rights").unwrap();
    let kc =
        kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml_with_token(&token)).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ui = hami_webui::start_with(
        client,
        listener,
        vec![],
        Duration::from_secs(5),
        hami_webui::DraWatch::On,
    )
    .unwrap();

    // Each watcher retried (three refused lists of each DRA resource) …
    let refused = |resource: &str| {
        server
            .request_log()
            .iter()
            .filter(|r| r.resource == resource && r.status == 403)
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while refused("resourceslices") < 3 || refused("resourceclaims") < 3 || refused("nodes") < 3 {
        assert!(Instant::now() < deadline, "no retries: {}", logs.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ui.shutdown();
    // … and each said so once.
    let text = logs.text();
    for what in [
        "nodes",
        "pods",
        "events",
        "events.k8s.io events",
        "resourceslices",
        "resourceclaims",
    ] {
        let line = format!("cannot watch {what}: ");
        assert_eq!(text.matches(&line).count(), 1, "{line}\n{text}");
    }
    assert!(text.contains("403"), "{text}");
    assert!(
        !text.contains("kube_runtime"),
        "kube-runtime's per-retry warning: {text}"
    );
}
