//! An HTTP(S) client for the extender API, as kube-scheduler's HTTP extender client calls
//! it: `POST <urlPrefix>/<verb>` with a JSON body, 30 s timeout, TLS optionally without
//! verification (`tlsConfig.insecure: true` in the chart) or against a given CA.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// How to trust the extender's certificate.
#[derive(Debug, Clone)]
pub enum Trust {
    /// Skip verification (what the reference chart configures for the loopback sidecar).
    Insecure,
    /// Verify against this CA (PEM).
    Ca(Vec<u8>),
}

#[derive(Clone)]
pub struct ExtenderClient {
    base: String,
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
}

#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl ExtenderClient {
    /// `base` is kube-scheduler's `urlPrefix`, e.g. `https://127.0.0.1:443`.
    pub fn new(base: &str, trust: Trust) -> anyhow::Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let tls = match trust {
            Trust::Insecure => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
                .with_no_client_auth(),
            Trust::Ca(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
                    let cert: CertificateDer<'static> =
                        cert.map_err(|e| anyhow::anyhow!("bad CA PEM: {e:?}"))?;
                    roots.add(cert)?;
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            http: Client::builder(TokioExecutor::new()).build(connector),
            timeout: Duration::from_secs(30),
        })
    }

    /// `POST <base>/<verb>` with `args`; the answer decoded as `R`.
    pub async fn call<A: Serialize, R: DeserializeOwned>(
        &self,
        verb: &str,
        args: &A,
    ) -> Result<R, String> {
        let body = serde_json::to_vec(args).map_err(|e| e.to_string())?;
        let request = hyper::Request::post(format!("{}/{verb}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let response = tokio::time::timeout(self.timeout, self.http.request(request))
            .await
            .map_err(|_| {
                format!(
                    "{verb}: no answer from the extender within {:?}",
                    self.timeout
                )
            })?
            .map_err(|e| format!("{verb}: cannot reach the extender at {}: {e}", self.base))?;
        let status = response.status();
        let bytes = tokio::time::timeout(self.timeout, response.into_body().collect())
            .await
            .map_err(|_| {
                format!(
                    "{verb}: the extender's answer did not finish within {:?}",
                    self.timeout
                )
            })?
            .map_err(|e| format!("{verb}: reading the extender's answer: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "{verb}: extender answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| format!("{verb}: the extender's answer is not valid JSON: {e}"))
    }
}
