//! Shared helpers of the integration tests: an in-process server and a kube-rs client.
#![allow(dead_code)]

use hami_apiserver::{ApiServer, Config, RunningApiServer};

pub(crate) async fn start() -> RunningApiServer {
    start_with(Config::default()).await
}

pub(crate) async fn start_with(config: Config) -> RunningApiServer {
    ApiServer::start(config).await.expect("server starts")
}

pub(crate) fn client(server: &RunningApiServer) -> kube::Client {
    let cfg = kube::Config::new(server.url().parse().expect("url"));
    kube::Client::try_from(cfg).expect("client")
}

pub(crate) fn pod(name: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "demo"}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "env": [{"name": "A", "value": "1"}]}]}
    }))
    .expect("pod")
}

/// Polls `f` until it returns true or 10 s pass.
pub(crate) async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// One raw HTTP/1.1 request (`Connection: close`): the status and the body. For what
/// kube-rs cannot send (wrong JSON types, protobuf, hand-made patches).
pub(crate) async fn http(
    server: &RunningApiServer,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
        server.addr(),
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.expect("send head");
    s.write_all(body).await.expect("send body");
    let mut raw = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(20), s.read_to_end(&mut raw))
        .await
        .expect("response within 20 s")
        .expect("read response");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    let mut rest = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = Vec::new();
        while let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") {
            let len =
                usize::from_str_radix(String::from_utf8_lossy(&rest[..nl]).trim(), 16).unwrap_or(0);
            if len == 0 {
                break;
            }
            out.extend_from_slice(&rest[nl + 2..nl + 2 + len]);
            rest = rest[nl + 4 + len..].to_vec();
        }
        rest = out;
    }
    (status, rest)
}

/// `http` with a JSON body; the answer parsed as JSON (Null if it is not JSON).
pub(crate) async fn http_json(
    server: &RunningApiServer,
    method: &str,
    path: &str,
    content_type: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let (code, out) = http(
        server,
        method,
        path,
        &[("Content-Type", content_type)],
        body.to_string().as_bytes(),
    )
    .await;
    (code, serde_json::from_slice(&out).unwrap_or_default())
}
