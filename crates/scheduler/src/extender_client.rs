//! An HTTP(S) client for the extender API, as kube-scheduler's HTTP extender client calls
//! it: `POST <urlPrefix>/<verb>` with a JSON body, 30 s timeout, TLS optionally without
//! verification (`tlsConfig.insecure: true`) or against a given CA, optionally with a
//! client certificate (`tlsConfig.certFile`/`keyFile`) and a fixed server name
//! (`tlsConfig.serverName`). Followers use the same client to forward to the leader.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// How to trust the extender's certificate.
#[derive(Debug, Clone)]
pub enum Trust {
    /// Skip verification (what the reference chart configures for the loopback sidecar).
    Insecure,
    /// Verify against this CA (PEM).
    Ca(Vec<u8>),
    /// Accept exactly these certificates, whatever the name (followers forwarding to the
    /// leader's pod IP; see `cert_pin`).
    Pinned(crate::cert_pin::SharedPins),
}

/// A client certificate and its key (PEM), presented to the extender (mutual TLS).
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    /// The certificate chain (PEM).
    pub cert_pem: Vec<u8>,
    /// Its private key (PEM).
    pub key_pem: Vec<u8>,
}

impl ClientIdentity {
    /// Reads the two PEM files.
    pub fn from_files(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<Self> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))
        };
        Ok(ClientIdentity {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        })
    }
}

/// An HTTP(S) client of an extender (what kube-scheduler does): followers forward with it,
/// the simulated kube-scheduler and the tests call with it.
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

    crate::cert_pin::handshake_signatures!(0);
}

impl ExtenderClient {
    /// `base` is kube-scheduler's `urlPrefix`, e.g. `https://127.0.0.1:443`.
    pub fn new(base: &str, trust: Trust) -> anyhow::Result<Self> {
        Self::with_tls(base, trust, None, None)
    }

    /// Like [`ExtenderClient::new`], presenting `identity` and checking the server's
    /// certificate against `server_name` instead of the URL's host (`tlsConfig.serverName`).
    pub fn with_tls(
        base: &str,
        trust: Trust,
        identity: Option<ClientIdentity>,
        server_name: Option<String>,
    ) -> anyhow::Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let verifying = match trust {
            Trust::Insecure => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAny(provider))),
            Trust::Ca(pem) => builder.with_root_certificates(roots_from_pem(&pem)?),
            Trust::Pinned(pins) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(crate::cert_pin::PinnedServer::new(
                    pins, provider,
                ))),
        };
        let tls = match identity {
            None => verifying.with_no_client_auth(),
            Some(id) => {
                let certs = certs_from_pem(&id.cert_pem)?;
                let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(&id.key_pem)
                    .map_err(|e| anyhow::anyhow!("client key: not a PEM private key ({e})"))?;
                verifying.with_client_auth_cert(certs, key)?
            }
        };
        let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        if let Some(name) = server_name {
            let name = ServerName::try_from(name.clone())
                .map_err(|e| anyhow::anyhow!("server name {name:?}: {e}"))?;
            builder =
                builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
        }
        let connector = builder.enable_http1().build();
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
        let (status, bytes) = self
            .post(&format!("{}/{verb}", self.base), verb, body, &[])
            .await?;
        if !status.is_success() {
            return Err(format!(
                "{verb}: extender answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| format!("{verb}: the extender's answer is not valid JSON: {e}"))
    }

    /// `GET url`; the status and body as answered (health and readiness probes).
    pub async fn get(&self, url: &str) -> Result<(hyper::StatusCode, Bytes), String> {
        let request = hyper::Request::get(url)
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let response = tokio::time::timeout(self.timeout, self.http.request(request))
            .await
            .map_err(|_| format!("GET {url}: no answer within {:?}", self.timeout))?
            .map_err(|e| format!("GET {url}: {e}"))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?
            .to_bytes();
        Ok((status, bytes))
    }

    /// `POST url` with a JSON `body` and extra `headers`; the status and body as answered.
    pub async fn post(
        &self,
        url: &str,
        verb: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<(hyper::StatusCode, Bytes), String> {
        let mut request = hyper::Request::post(url).header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
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
            .map_err(|e| format!("{verb}: cannot reach the extender at {url}: {e}"))?;
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
        Ok((status, bytes))
    }
}

/// Certificates of a PEM bundle.
pub fn certs_from_pem(pem: &[u8]) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = rustls::pki_types::pem::PemObject::pem_slice_iter(pem)
        .collect::<Result<Vec<CertificateDer<'static>>, _>>()
        .map_err(|e| anyhow::anyhow!("not a PEM certificate bundle ({e})"))?;
    if certs.is_empty() {
        anyhow::bail!("the PEM bundle holds no certificate");
    }
    Ok(certs)
}

/// A root store of a PEM CA bundle.
pub fn roots_from_pem(pem: &[u8]) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs_from_pem(pem).map_err(|e| anyhow::anyhow!("CA: {e}"))? {
        roots.add(cert)?;
    }
    Ok(roots)
}
