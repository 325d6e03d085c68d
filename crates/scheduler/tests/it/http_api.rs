//! The HTTP surface as kube-scheduler and the API server see it, bad input included.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use hami_scheduler::config::Settings;
use hami_scheduler::leader::Leadership;
use hami_scheduler::runtime::Scheduler;
use kube::Client;
use serde_json::{Value, json};

/// One HTTP/1.1 request over a fresh connection: (status, body).
pub(crate) fn request(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    // The server may answer and close before reading a refused body.
    let _ = stream.write_all(body);
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

pub(crate) fn json_body(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_reviews_are_answered_in_kind() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let scheduler = Scheduler::start(client, Settings::default(), Arc::new(Leadership::always()));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(hami_scheduler::http::serve_on(
        hami_scheduler::http::router(scheduler.clone()),
        listener,
        None,
    ));
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics_port = metrics.local_addr().unwrap().port();
    tokio::spawn(hami_scheduler::http::serve_on(
        hami_scheduler::http::metrics_router(scheduler.clone()),
        metrics,
        None,
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !scheduler.ready() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let result = tokio::task::spawn_blocking(move || {
        assert_eq!(request(port, "GET", "/healthz", b"").0, 200);
        assert_eq!(request(port, "GET", "/readyz", b"").0, 200);

        let (status, body) = request(port, "POST", "/filter", b"{not json");
        assert_eq!(status, 200, "kube-scheduler reads errors from the body");
        assert!(json_body(&body)["error"].as_str().unwrap().contains("not JSON"), "{body}");

        let (status, body) = request(port, "POST", "/filter", br#"{"nodenames": ["a"]}"#);
        assert_eq!(status, 200);
        assert!(json_body(&body)["error"].as_str().unwrap().contains("no pod"), "{body}");

        let huge = vec![b' '; (1 << 20) + 10];
        let (status, body) = request(port, "POST", "/filter", &huge);
        assert_eq!(status, 413, "{body}");
        assert!(json_body(&body)["error"].as_str().unwrap().contains("larger than 1048576 bytes"), "{body}");

        let (status, body) = request(port, "POST", "/bind", br#"{"podName": "ghost", "podNamespace": "default", "podUID": "u", "node": "n"}"#);
        assert_eq!(status, 200);
        assert!(json_body(&body)["error"].as_str().unwrap().contains("ghost"), "{body}");

        let (status, body) = request(port, "POST", "/bind", br#"{"node": "n"}"#);
        assert_eq!(status, 200);
        assert!(json_body(&body)["error"].as_str().unwrap().contains("does not match the extender API"), "{body}");

        // A pod without GPU requests passes filter untouched.
        let args = json!({"pod": {"metadata": {"name": "p", "uid": "u"}, "spec": {"containers": [{"name": "c"}]}}, "nodenames": ["a", "b"]});
        let (_, body) = request(port, "POST", "/filter", args.to_string().as_bytes());
        assert_eq!(json_body(&body)["nodenames"], json!(["a", "b"]));

        // AdmissionReview v1: answered as v1, uid echoed, patch base64.
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"limits": {"amd.com/gpumem": "1024"}}}]}});
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "abc", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE", "object": pod}});
        let (status, body) = request(port, "POST", "/webhook", review.to_string().as_bytes());
        assert_eq!(status, 200);
        let answer = json_body(&body);
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["response"]["uid"], "abc");
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
        let patch: k8s_openapi::ByteString = serde_json::from_value(answer["response"]["patch"].clone()).unwrap();
        let ops: Value = serde_json::from_slice(&patch.0).unwrap();
        assert!(ops.as_array().unwrap().iter().any(|op| op["path"] == "/spec/containers/0/resources/limits/amd.com~1gpu"), "{ops}");

        // v1beta1 denial.
        let bad = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpucores": "0"}}}]}});
        let review = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
            "request": {"uid": "def", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": bad}});
        let (_, body) = request(port, "POST", "/webhook", review.to_string().as_bytes());
        let answer = json_body(&body);
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1beta1");
        assert_eq!(answer["response"]["allowed"], false);
        assert_eq!(answer["response"]["status"]["code"], 403);
        assert!(answer["response"]["status"]["message"].as_str().unwrap().contains("from 1 to 100"));

        // A pod that does not decode is refused with 400 inside the review.
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "x", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": {"spec": {"containers": 7}}}});
        let (_, body) = request(port, "POST", "/webhook", review.to_string().as_bytes());
        assert_eq!(json_body(&body)["response"]["status"]["code"], 400, "{body}");

        for bad in [&b"[]"[..], b"{\"apiVersion\": \"v2\"}", b"{\"apiVersion\": \"admission.k8s.io/v1\"}", b"\xff"] {
            let (status, body) = request(port, "POST", "/webhook", bad);
            assert_eq!(status, 400, "{body}");
            assert!(json_body(&body)["error"].is_string());
        }

        let (status, body) = request(metrics_port, "GET", "/metrics", b"");
        assert_eq!(status, 200);
        assert!(body.contains("hami_scheduler_filter_duration_seconds"), "{body}");
        assert!(body.contains(r#"result="error""#), "failed filters are counted: {body}");
    })
    .await;
    result.unwrap();
}
