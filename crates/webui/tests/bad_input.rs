//! Bad input on the running UI: an unreachable API server and an unreachable monitor give
//! clear banners (never a blank page), unknown nodes and pods a 404 page, a bad scenario
//! a 400 page that says why; all over real HTTP.

use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

async fn get(url: &str) -> (u16, String) {
    request(
        hyper::Request::get(url)
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await
}

async fn request(req: hyper::Request<Full<Bytes>>) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client.request(req).await.expect("the UI answers");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Polls `url` until its body contains `needle` (bounded).
async fn wait_for(url: &str, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = get(url).await;
        if body.contains(needle) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{url} never showed {needle:?}:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A port nothing listens on: reserved, so nothing else gets it while the test runs.
fn closed_port() -> u16 {
    hami_local_ports::free_port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_api_server_and_monitor_are_banners() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = format!("http://127.0.0.1:{}", closed_port());
    let client = kube::Client::try_from(kube::Config::new(api.parse().unwrap())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let monitor = format!("http://127.0.0.1:{}/metrics", closed_port());
    let ui = hami_webui::start(
        client,
        listener,
        vec![monitor.clone()],
        Duration::from_millis(200),
    )
    .unwrap();
    let url = ui.url();
    let body = wait_for(&url, "The Kubernetes API server cannot be read (nodes)").await;
    assert!(body.contains("<h1>Overview</h1>"), "{body}");
    assert!(body.contains("role=\"alert\""));
    let body = wait_for(&url, &format!("The monitor at {monitor} cannot be read")).await;
    assert!(!body.contains("panicked"));
    // Every page keeps its frame and banner.
    let (status, body) = get(&format!("{url}nodes/gpu-1")).await;
    assert_eq!(status, 404);
    assert!(
        body.contains("Node gpu-1 does not exist") && body.contains("cannot be read (nodes)"),
        "{body}"
    );
    ui.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_objects_are_404_and_bad_scenarios_400() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ui = hami_webui::start(client, listener, vec![], Duration::from_secs(5)).unwrap();
    let url = ui.url();
    // Synced: the "still listing" banner goes; the missing-monitor banner stays honest.
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (status, body) = get(&url).await;
        assert_eq!(status, 200);
        if !body.contains("Still listing") {
            break body;
        }
        assert!(Instant::now() < deadline, "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(body.contains("No monitor is configured"), "{body}");
    assert!(body.contains("No node registers GPUs"), "{body}");
    for (path, needle) in [
        ("nodes/nope", "Node nope does not exist"),
        ("pods/default/nope", "Pod default/nope does not exist"),
        ("pods/a%3Cb%3E/x", "Pod a&lt;b&gt;/x does not exist"),
        ("no/such/page", "This page does not exist"),
    ] {
        let (status, body) = get(&format!("{url}{path}")).await;
        assert_eq!(status, 404, "{path}");
        assert!(body.contains(needle), "{path}: {body}");
    }
    let form = hyper::Request::post(format!("{url}whatif"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from("scenario=fleet%3A+3")))
        .unwrap();
    let (status, body) = request(form).await;
    assert_eq!(status, 400);
    assert!(body.contains("The scenario cannot be planned"), "{body}");
    assert!(
        body.contains("<textarea"),
        "the form comes back with the text: {body}"
    );
    ui.shutdown();
    drop(api);
}
