//! The HTTPS client that calls admission webhooks: hyper with hyper-rustls (as the
//! scheduler's extender client), trusting only the webhook's `caBundle`, one deadline for
//! connect, request and response.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The roots to verify a webhook's certificate with: the certificates of its `caBundle`.
fn roots(ca_pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| format!("caBundle: {e}"))?;
        roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
    }
    if roots.is_empty() {
        return Err("no caBundle certificate to verify the webhook's TLS certificate with".into());
    }
    Ok(roots)
}

/// POSTs a JSON `body` to an `https` URL trusting only `ca_pem`, all within `timeout`;
/// the status and body as answered.
pub async fn post_https(
    url: &str,
    ca_pem: &[u8],
    body: Vec<u8>,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), String> {
    if !url.starts_with("https://") {
        return Err(format!("webhook URL {url:?} is not https"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(ca_pem)?)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let request = hyper::Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("user-agent", "hami-apiserver")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("bad webhook URL {url:?}: {e}"))?;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| {
            // The connect error (refused, TLS, certificate) is what an operator needs.
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg = format!("{msg}: {s}");
                source = s.source();
            }
            msg
        })?;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("read: {e}"))?
            .to_bytes();
        Ok::<_, String>((status, bytes.to_vec()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("context deadline exceeded (timeout {}s)", timeout.as_secs()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_what_it_cannot_trust() {
        let e = post_https("http://127.0.0.1:1/x", b"", vec![], Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(e.contains("not https"), "{e}");
        let e = post_https(
            "https://127.0.0.1:1/x",
            b"not pem",
            vec![],
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
        assert!(e.contains("caBundle"), "{e}");
    }
}
