//! Bad input on the running UI: an unreachable API server and an unreachable monitor give
//! clear banners (never a blank page), unknown nodes and pods a 404 page, a bad scenario
//! a 400 page that says why; hostile input (issue 27): a What-if scenario too large, posted
//! from another site, more at once than the limit, or abandoned by its client; clients that
//! never finish their request head or body; the security headers on every answer. All over
//! real HTTP and sockets.

use std::io::{Read, Write};
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
    let (status, _, body) = request_full(req).await;
    (status, body)
}

async fn request_full(req: hyper::Request<Full<Bytes>>) -> (u16, hyper::HeaderMap, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client.request(req).await.expect("the UI answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

/// The What-if form posted with `scenario` and the extra headers.
fn whatif_post(url: &str, scenario: &str, headers: &[(&str, &str)]) -> hyper::Request<Full<Bytes>> {
    let mut req = hyper::Request::post(format!("{url}whatif"))
        .header("content-type", "application/x-www-form-urlencoded");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Full::new(Bytes::from(form(scenario)))).unwrap()
}

/// `scenario=<text>`, form-encoded.
fn form(scenario: &str) -> String {
    let mut out = String::from("scenario=");
    for b in scenario.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A UI on the embedded API server, under `limits`, synced.
async fn ui_with(
    limits: hami_webui::Limits,
) -> (hami_webui::RunningUi, hami_apiserver::RunningApiServer) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ui = hami_webui::start_limited(
        client,
        listener,
        vec![],
        Duration::from_secs(5),
        hami_webui::DraWatch::Off,
        limits,
    )
    .unwrap();
    (ui, api)
}

/// A scenario that keeps the planner busy for many seconds (20000 pods over 1000 nodes,
/// each filter walking every node), one policy pair (one planning thread).
const BUSY: &str = "fleet:\n- name: n\n  count: 1000\n  gpus:\n  - {type: AMD Instinct MI300X, count: 8, memory_mib: 196608, cus: 304}\nworkloads:\n- count: 20000\n  pod:\n    metadata: {name: p}\n    spec:\n      containers:\n      - name: c\n        resources: {limits: {amd.com/gpu: 1, amd.com/gpumem: 1024}}\npolicies: {gpu: [binpack], node: [binpack]}\n";

/// A scenario planned in a moment.
const QUICK: &str = "fleet:\n- name: n\n  count: 1\n  gpus:\n  - {type: AMD Instinct MI300X, count: 1, memory_mib: 1024, cus: 304}\nworkloads:\n- count: 1\n  pod:\n    metadata: {name: p}\n    spec:\n      containers:\n      - name: c\n        resources: {limits: {amd.com/gpu: 1}}\n";

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
    let body = wait_for(&url, "The Kubernetes API server cannot be read since").await;
    // One banner for the API server, however many watches fail.
    assert_eq!(
        body.matches("Kubernetes API server cannot be read").count(),
        1,
        "{body}"
    );
    assert!(body.contains("<h1>Overview</h1>"), "{body}");
    assert!(body.contains("role=\"alert\""));
    let body = wait_for(&url, &format!("The monitor at {monitor} cannot be read")).await;
    assert!(!body.contains("panicked"));
    // Every page keeps its frame and banner.
    let (status, body) = get(&format!("{url}nodes/gpu-1")).await;
    assert_eq!(status, 404);
    assert!(
        body.contains("Node gpu-1 does not exist")
            && body.contains("The Kubernetes API server cannot be read since"),
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

/// Issue 27 item 1: the What-if endpoint. A model count far past what a node has is refused
/// with 413 before anything is built; a form posted from another site is refused with 403
/// (the UI has no login); past the concurrency limit the answer is 429 at once; a client
/// that goes away stops its plan (its slot frees); a plan past its deadline stops with 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatif_is_bounded_same_origin_limited_and_stops_for_nobody() {
    let mut limits = hami_webui::Limits::default();
    limits.whatif.max_running = 1;
    limits.whatif.deadline = Duration::from_secs(300);
    limits.whatif.max_work = u64::MAX;
    let (ui, api) = ui_with(limits).await;
    let url = ui.url();
    let host = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();

    // 100000 GPUs on one node: refused, naming the figure and the limit.
    let many = QUICK.replace("count: 1, memory_mib", "count: 100000, memory_mib");
    let (status, body) = request(whatif_post(&url, &many, &[])).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body.contains("100000 GPUs per node in fleet[0] (n)") && body.contains("at most 64"),
        "{body}"
    );
    assert!(body.contains("<textarea"), "the form comes back: {body}");

    // Another site's page submitting the form, as browsers send it: refused.
    for headers in [
        vec![
            ("origin", "http://evil.example"),
            ("sec-fetch-site", "cross-site"),
        ],
        vec![("origin", "http://evil.example")],
        vec![("sec-fetch-site", "cross-site")],
        vec![("origin", "null")],
    ] {
        let (status, body) = request(whatif_post(&url, QUICK, &headers)).await;
        assert_eq!(status, 403, "{headers:?}: {body}");
        assert!(
            body.contains("open the What-if page of this UI and submit the form there"),
            "{body}"
        );
    }
    // The UI's own page (and curl, which sends neither header) plans.
    let own = format!("http://{host}");
    let (status, body) = request(whatif_post(
        &url,
        QUICK,
        &[("origin", own.as_str()), ("sec-fetch-site", "same-origin")],
    ))
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Results: 1 nodes"), "{body}");

    // A busy plan whose client then goes away (a raw socket, closed after the form is sent).
    let send_busy = || {
        let body = form(BUSY);
        let mut busy = std::net::TcpStream::connect(&host).unwrap();
        write!(
            busy,
            "POST /whatif HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        busy.set_nonblocking(true).unwrap();
        busy
    };
    let mut busy = send_busy();
    // While it plans, another is refused at once with 429, saying to retry.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (headers, body) = loop {
        let (status, headers, body) = request_full(whatif_post(&url, QUICK, &[])).await;
        if status == 429 {
            break (headers, body);
        }
        assert_eq!(status, 200, "{body}");
        // A probe held the slot when the busy form came: it was refused; send it again.
        if busy.peek(&mut [0u8; 16]).is_ok() {
            busy = send_busy();
        }
        assert!(
            Instant::now() < deadline,
            "the busy plan never held the only slot"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(body.contains("retry in a few seconds"), "{body}");
    assert_eq!(headers["retry-after"], "5");
    // The client leaves: its plan stops, and the slot frees long before the plan would end.
    drop(busy);
    let left = Instant::now();
    loop {
        let (status, body) = request(whatif_post(&url, QUICK, &[])).await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 429, "{body}");
        assert!(
            left.elapsed() < Duration::from_secs(30),
            "the plan of a client that left still runs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ui.shutdown();

    // A plan past its deadline stops and says what to change.
    let mut limits = hami_webui::Limits::default();
    limits.whatif.deadline = Duration::from_secs(1);
    limits.whatif.max_work = u64::MAX;
    let (ui, _api2) = ui_with(limits).await;
    let started = Instant::now();
    let (status, body) = request(whatif_post(&ui.url(), BUSY, &[])).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body.contains("planning stopped after 1 s") && body.contains("compare fewer policies"),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    ui.shutdown();
    drop(api);
}

/// Issue 27 item 2: a hundred clients that never finish their request head are dropped
/// after the head timeout, and the UI keeps answering meanwhile, also past its connection
/// cap (new clients wait in the backlog for a slot); a form whose body never comes is
/// answered 408.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_finish_are_dropped() {
    let mut limits = hami_webui::Limits::default();
    limits.connections.max_connections = 16;
    limits.connections.header_read_timeout = Duration::from_secs(1);
    limits.whatif.body_timeout = Duration::from_secs(1);
    let (ui, _api) = ui_with(limits).await;
    let url = ui.url();
    let host = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut slow: Vec<std::net::TcpStream> = (0..100)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&host).unwrap();
            s.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\nX-Slow: 1\r\n").as_bytes())
                .unwrap();
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            s
        })
        .collect();
    // The UI answers a whole request while they hang on.
    let started = Instant::now();
    let (status, _) = tokio::time::timeout(Duration::from_secs(60), get(&format!("{url}healthz")))
        .await
        .expect("the UI answers while a hundred clients hold unfinished heads");
    assert_eq!(status, 200);
    assert!(started.elapsed() < Duration::from_secs(60));
    // Each of them is dropped: the server closes (EOF or reset), not the client.
    let slow = tokio::task::spawn_blocking(move || {
        let mut closed = 0;
        for s in &mut slow {
            let mut buf = [0u8; 512];
            match s.read(&mut buf) {
                Ok(0) => closed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => closed += 1,
                // hyper may answer 408 before closing; then EOF follows.
                Ok(_) => {
                    if matches!(s.read(&mut buf), Ok(0) | Err(_)) {
                        closed += 1;
                    }
                }
                Err(e) => panic!("a slow client was not dropped: {e}"),
            }
        }
        closed
    })
    .await
    .unwrap();
    assert_eq!(slow, 100);

    // A form whose body never comes: 408, saying to submit again.
    let mut s = std::net::TcpStream::connect(&host).unwrap();
    s.write_all(format!("POST /whatif HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\nscenario=").as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let answer = tokio::task::spawn_blocking(move || {
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&text).contains("</html>") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => text.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&text).into_owned()
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive within 1 s"), "{answer}");
    // A declared body past the limit is refused before it is read.
    let big = "x".repeat(1024 * 1024);
    let (status, body) = request(whatif_post(&url, &big, &[])).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("shorten the scenario"), "{body}");
    ui.shutdown();
}

/// Issue 27 item 3: every answer (pages, 404, assets, errors) carries the security headers,
/// and no page needs what the policy forbids (inline script, style or handlers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_the_security_headers() {
    let (ui, _api) = ui_with(hami_webui::Limits::default()).await;
    let url = ui.url();
    let get_req = |path: &str| {
        hyper::Request::get(format!("{url}{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let mut answers = Vec::new();
    for path in [
        "",
        "nodes/nope",
        "pods/default/nope",
        "whatif",
        "static/style.css",
        "static/live.js",
        "healthz",
        "no/such/page",
    ] {
        answers.push((path.to_owned(), request_full(get_req(path)).await));
    }
    answers.push((
        "POST whatif".into(),
        request_full(whatif_post(&url, QUICK, &[])).await,
    ));
    answers.push((
        "POST whatif (bad)".into(),
        request_full(whatif_post(&url, "fleet: 3", &[])).await,
    ));
    answers.push((
        "POST whatif (cross-site)".into(),
        request_full(whatif_post(
            &url,
            QUICK,
            &[("sec-fetch-site", "cross-site")],
        ))
        .await,
    ));
    for (path, (status, headers, body)) in &answers {
        let csp = headers
            .get("content-security-policy")
            .unwrap_or_else(|| panic!("{path} ({status}): no Content-Security-Policy"))
            .to_str()
            .unwrap();
        assert_eq!(csp, hami_webui::server::CONTENT_SECURITY_POLICY, "{path}");
        assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"));
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(headers["x-frame-options"], "DENY", "{path}");
        assert_eq!(headers["referrer-policy"], "same-origin", "{path}");
        if body.contains("<html") {
            // Nothing inline that the policy would block.
            assert!(!body.contains("style="), "{path}: an inline style: {body}");
            assert_eq!(
                body.matches("<script").count(),
                body.matches("<script src=\"/static/").count(),
                "{path}: an inline script"
            );
            assert!(!body.contains("<style"), "{path}");
            assert!(
                !body.contains(" onclick=") && !body.contains(" onload="),
                "{path}"
            );
        }
    }
    assert_eq!(answers[0].1.0, 200);
    ui.shutdown();
}
