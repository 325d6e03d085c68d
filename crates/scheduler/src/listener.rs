//! The listeners: plain HTTP or TLS ([`serve`], [`serve_on`]), and the extender's mutual
//! TLS ([`serve_mtls`], [`mtls_config`], [`ClientAuth`]). Certificates are reloaded when
//! their files change ([`crate::reload_poll`] decides; this shell reads the stamps).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use tracing::{info, warn};

use crate::reload_poll::ReloadPoll;

/// Serves `app` on `addr`, with TLS when cert and key are given (reloaded every few
/// seconds when the files change, so certificate rotation needs no restart).
pub async fn serve(
    app: Router,
    addr: SocketAddr,
    tls: Option<(PathBuf, PathBuf)>,
) -> anyhow::Result<()> {
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    serve_on(app, listener, tls).await
}

/// How the extender listener authenticates its callers.
#[derive(Debug, Clone)]
pub enum ClientAuth {
    /// A client certificate chained to this CA (PEM file), valid for client authentication.
    Ca(PathBuf),
    /// Exactly the first certificate of this PEM file (the replicas' own serving
    /// certificate), reloaded into `pins` when the file changes (`cert_pin`).
    Pinned {
        /// The PEM file.
        file: PathBuf,
        /// The pins it is loaded into.
        pins: crate::cert_pin::SharedPins,
    },
}

impl ClientAuth {
    fn file(&self) -> &std::path::Path {
        match self {
            ClientAuth::Ca(f) | ClientAuth::Pinned { file: f, .. } => f,
        }
    }
}

/// The first certificate of a PEM file, as the pin.
pub fn pin_of(
    file: &std::path::Path,
) -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    let pem =
        std::fs::read(file).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    let certs = crate::extender_client::certs_from_pem(&pem)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    Ok(certs.into_iter().take(1).collect())
}

/// The extender listener's TLS: `cert`/`key` served, and a client certificate required of
/// every caller (kube-scheduler's extender `tlsConfig.certFile`, a follower forwarding to
/// the leader), checked as `auth` says. A connection without one fails the handshake.
pub fn mtls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
    auth: &ClientAuth,
) -> anyhow::Result<rustls::ServerConfig> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn rustls::server::danger::ClientCertVerifier> = match auth {
        ClientAuth::Ca(client_ca) => {
            let roots = crate::extender_client::roots_from_pem(&read(client_ca)?)
                .map_err(|e| anyhow::anyhow!("client CA {}: {e}", client_ca.display()))?;
            rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            )
            .build()
            .map_err(|e| anyhow::anyhow!("client CA {}: {e}", client_ca.display()))?
        }
        ClientAuth::Pinned { pins, .. } => Arc::new(crate::cert_pin::PinnedClients::new(
            pins.clone(),
            provider.clone(),
        )),
    };
    let certs = crate::extender_client::certs_from_pem(&read(cert)?)
        .map_err(|e| anyhow::anyhow!("certificate {}: {e}", cert.display()))?;
    let key_der = {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::PrivateKeyDer::from_pem_slice(&read(key)?)
            .map_err(|e| anyhow::anyhow!("key {}: not a PEM private key ({e})", key.display()))?
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key_der)
        .map_err(|e| {
            anyhow::anyhow!(
                "certificate {} / key {}: {e}",
                cert.display(),
                key.display()
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves `app` with [`mtls_config`], rebuilt (and the pins rotated) when any of the
/// three files changes.
pub async fn serve_mtls(
    app: Router,
    listener: std::net::TcpListener,
    cert: PathBuf,
    key: PathBuf,
    auth: ClientAuth,
) -> anyhow::Result<()> {
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let config = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(mtls_config(
        &cert, &key, &auth,
    )?));
    let reload = config.clone();
    tokio::spawn(async move {
        let files = [cert, key, auth.file().to_owned()];
        let mut poll = ReloadPoll::new(stamps(&files));
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if poll.poll(stamps(&files)) {
                if let ClientAuth::Pinned { file, pins } = &auth {
                    match pin_of(file) {
                        Ok(next) => pins
                            .write()
                            .unwrap_or_else(|p| p.into_inner())
                            .rotate(next, std::time::Instant::now()),
                        Err(e) => {
                            warn!(error = %e, "cannot reload the pinned certificate; keeping the old one")
                        }
                    }
                }
                match mtls_config(&files[0], &files[1], &auth) {
                    Ok(c) => {
                        reload.reload_from_config(Arc::new(c));
                        info!("reloaded the extender's TLS certificate and client CA");
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot reload the extender's TLS; keeping the old one")
                    }
                }
            }
        }
    });
    info!(%addr, "serving the extender over HTTPS with client certificates required");
    axum_server::from_tcp_rustls(listener, config)?
        .serve(app.into_make_service())
        .await?;
    Ok(())
}

/// The files' modification times (`None` for one that cannot be read), for [`ReloadPoll`].
fn stamps(files: &[PathBuf]) -> Vec<Option<SystemTime>> {
    files
        .iter()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

/// Like [`serve`], on a listener the caller bound (tests bind port 0).
pub async fn serve_on(
    app: Router,
    listener: std::net::TcpListener,
    tls: Option<(PathBuf, PathBuf)>,
) -> anyhow::Result<()> {
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    match tls {
        None => {
            info!(%addr, "serving plain HTTP");
            axum::serve(tokio::net::TcpListener::from_std(listener)?, app).await?;
        }
        Some((cert, key)) => {
            let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(&cert, &key)
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "cannot load TLS certificate {} / key {}: {e}",
                        cert.display(),
                        key.display()
                    )
                })?;
            let reload = config.clone();
            tokio::spawn(async move {
                let files = [cert, key];
                let mut poll = ReloadPoll::new(stamps(&files));
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    if poll.poll(stamps(&files)) {
                        let [cert, key] = &files;
                        match reload.reload_from_pem_file(cert, key).await {
                            Ok(()) => info!("reloaded the TLS certificate"),
                            Err(e) => {
                                warn!(error = %e, "cannot reload the TLS certificate; keeping the old one")
                            }
                        }
                    }
                }
            });
            info!(%addr, "serving HTTPS");
            axum_server::from_tcp_rustls(listener, config)?
                .serve(app.into_make_service())
                .await?;
        }
    }
    Ok(())
}
