//! HTTPS serving (`Config::tls`): a client configured as kube-rs configures itself in a pod
//! (token file, the CA from `ca.crt`, `https://` + the service host) lists and watches; a
//! client that does not trust the server's CA is refused; the real kubectl works with the
//! written kubeconfig; a client that never finishes its handshake loses its connection.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use hami_apiserver::{Config, RunningApiServer};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};

use crate::common;

/// A private temporary directory for one test.
pub(crate) fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hami-apiserver-tls-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(crate) fn tls_config() -> Config {
    Config {
        tls: true,
        auth: Some(hami_apiserver::authn::AuthConfig::default()),
        ..Config::default()
    }
}

/// The DER certificates of a PEM bundle (what kube-rs' in-cluster loader does with `ca.crt`).
fn pem_to_der(pem: &str) -> Vec<Vec<u8>> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.unwrap().to_vec())
        .collect()
}

/// A client built exactly as kube-rs' `Config::incluster_env` builds one, from a token file
/// and a `ca.crt` written under `dir` (the service-account mount of a pod) and
/// `https://<KUBERNETES_SERVICE_HOST>:<KUBERNETES_SERVICE_PORT>`.
pub(crate) fn in_cluster_client(
    server: &RunningApiServer,
    dir: &Path,
    token: &str,
    ca_pem: &str,
) -> kube::Client {
    std::fs::write(dir.join("token"), token).unwrap();
    std::fs::write(dir.join("ca.crt"), ca_pem).unwrap();
    let url = format!("https://{}:{}", server.addr().ip(), server.addr().port());
    let mut cfg = kube::Config::new(url.parse().unwrap());
    cfg.root_cert = Some(pem_to_der(ca_pem));
    cfg.root_cert_file = Some(dir.join("ca.crt"));
    cfg.auth_info = kube::config::AuthInfo {
        token_file: Some(dir.join("token").display().to_string()),
        ..Default::default()
    };
    kube::Client::try_from(cfg).expect("in-cluster client")
}

#[tokio::test]
async fn in_cluster_client_lists_and_watches_over_tls() {
    let server = common::start_with(tls_config()).await;
    assert!(server.url().starts_with("https://127.0.0.1:"));
    let ca = server.ca_pem().expect("a CA under TLS").to_string();
    let dir = temp_dir("in-cluster");
    let client = in_cluster_client(
        &server,
        &dir,
        hami_apiserver::kubeconfig::PLACEHOLDER_TOKEN,
        &ca,
    );
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut watch = pods
        .watch(&WatchParams::default().timeout(30), "0")
        .await
        .expect("watch over TLS")
        .boxed();
    pods.create(&PostParams::default(), &common::pod("p1"))
        .await
        .expect("create over TLS");
    let listed = pods.list(&ListParams::default()).await.expect("list");
    assert_eq!(listed.items.len(), 1);
    let event = tokio::time::timeout(Duration::from_secs(20), watch.try_next())
        .await
        .expect("a watch event within 20 s")
        .expect("watch stream")
        .expect("an event");
    match event {
        WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("p1")),
        other => panic!("expected ADDED p1, got {other:?}"),
    }
    // The serving certificate also names the in-cluster DNS names (kube-rs' incluster_dns).
    let mut cfg = kube::Config::new(server.url().parse().unwrap());
    cfg.root_cert = Some(pem_to_der(&ca));
    cfg.tls_server_name = Some("kubernetes.default.svc".into());
    cfg.auth_info.token = Some(
        hami_apiserver::kubeconfig::PLACEHOLDER_TOKEN
            .to_string()
            .into(),
    );
    let by_dns: Api<Pod> = Api::namespaced(kube::Client::try_from(cfg).unwrap(), "default");
    assert_eq!(
        by_dns
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn client_not_trusting_the_ca_is_refused() {
    let server = common::start_with(tls_config()).await;
    let other = common::start_with(tls_config()).await;
    let dir = temp_dir("untrusted");
    // Trusts another server's CA: the handshake fails, nothing is answered.
    let wrong_ca = other.ca_pem().unwrap().to_string();
    let client = in_cluster_client(
        &server,
        &dir,
        hami_apiserver::kubeconfig::PLACEHOLDER_TOKEN,
        &wrong_ca,
    );
    let err = Api::<Pod>::namespaced(client, "default")
        .list(&ListParams::default())
        .await
        .expect_err("an untrusted server certificate must be refused");
    let text = format!("{err:?}");
    assert!(text.contains("InvalidCertificate"), "{text}");
    // Plain HTTP to the HTTPS port gets no answer either.
    let plain = kube::Client::try_from(kube::Config::new(
        format!("http://{}", server.addr()).parse().unwrap(),
    ))
    .unwrap();
    assert!(
        Api::<Pod>::namespaced(plain, "default")
            .list(&ListParams::default())
            .await
            .is_err()
    );
    assert!(
        server
            .request_log()
            .iter()
            .all(|r| !r.path.contains("/pods")),
        "no request reached the server"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn kubectl_works_with_the_written_kubeconfig_over_tls() {
    let server = common::start_with(tls_config()).await;
    let dir = temp_dir("kubectl");
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(text.contains("certificate-authority-data: "), "{text}");
    assert!(
        text.contains(&format!("server: {}", server.url())),
        "{text}"
    );
    // tokio's Command: the server runs on this test's runtime and must keep serving.
    let kubectl = async |args: &[&str]| {
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .env("HOME", &dir)
            .output()
            .await
            .expect("kubectl is not on PATH: install the Google Cloud SDK's kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    kubectl(&["create", "configmap", "c1", "--from-literal=k=v"]).await;
    let got = kubectl(&["get", "configmap", "c1", "-o", "jsonpath={.data.k}"]).await;
    assert_eq!(got, "v");
    let cm = server.get_object("v1", "configmaps", "default", "c1");
    assert_eq!(cm.unwrap()["data"]["k"], "v");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_handshake_that_never_comes_loses_its_connection() {
    let server = common::start_with(Config {
        header_read_timeout: Duration::from_secs(1),
        ..tls_config()
    })
    .await;
    use tokio::io::AsyncReadExt;
    let mut s = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
        .await
        .expect("the server closes a silent connection after the header read timeout");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    common::eventually("the connection is no longer counted", async || {
        server.open_connections() == 0
    })
    .await;
}
