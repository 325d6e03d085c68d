//! Certificate pinning for the extender listener: a peer is accepted when it presents one
//! of the pinned certificates, byte for byte, and proves in the handshake that it holds its
//! key. The replicas pin their own serving certificate (one Secret for all of them), and
//! kube-scheduler's extender `tlsConfig.certFile`/`keyFile` name that same certificate.
//! That works where a CA check cannot: kube-webhook-certgen issues a server certificate
//! only (extendedKeyUsage serverAuth), which a CA-based client verifier refuses.
//!
//! On rotation (the Secret volume is updated pod by pod) the previous pins stay accepted
//! for [`ROTATION_GRACE`], so replicas that have not seen the new Secret yet still reach
//! each other.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rustls::DistinguishedName;
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};

/// The handshake-signature half of a rustls verifier (client or server side), which only
/// the certificate check differs in: checks with `self.<field>`, a `CryptoProvider`.
macro_rules! handshake_signatures {
    ($provider:tt) => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &::rustls::pki_types::CertificateDer<'_>,
            dss: &::rustls::DigitallySignedStruct,
        ) -> Result<::rustls::client::danger::HandshakeSignatureValid, ::rustls::Error> {
            ::rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.$provider.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &::rustls::pki_types::CertificateDer<'_>,
            dss: &::rustls::DigitallySignedStruct,
        ) -> Result<::rustls::client::danger::HandshakeSignatureValid, ::rustls::Error> {
            ::rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.$provider.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<::rustls::SignatureScheme> {
            self.$provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
}
pub(crate) use handshake_signatures;

/// How long replaced pins stay accepted.
pub const ROTATION_GRACE: Duration = Duration::from_secs(600);

/// The pinned certificates: the current ones and, for a while, the ones they replaced.
#[derive(Debug, Default)]
pub struct Pins {
    current: Vec<CertificateDer<'static>>,
    previous: Vec<(CertificateDer<'static>, Instant)>,
}

impl Pins {
    /// Pins exactly `current`, with nothing in grace.
    pub fn new(current: Vec<CertificateDer<'static>>) -> Self {
        Pins {
            current,
            previous: Vec::new(),
        }
    }

    /// Replaces the current pins at `now`; the replaced ones stay accepted until
    /// `now + ROTATION_GRACE`.
    pub fn rotate(&mut self, next: Vec<CertificateDer<'static>>, now: Instant) {
        let old = std::mem::replace(&mut self.current, next);
        for cert in old {
            if !self.current.contains(&cert) {
                self.previous.push((cert, now + ROTATION_GRACE));
            }
        }
        self.previous
            .retain(|(c, until)| *until > now && !self.current.contains(c));
    }

    /// Whether `cert` is pinned at `now`: current, or replaced less than [`ROTATION_GRACE`] ago.
    pub fn accepts(&self, cert: &CertificateDer<'_>, now: Instant) -> bool {
        self.current.iter().any(|c| c.as_ref() == cert.as_ref())
            || self
                .previous
                .iter()
                .any(|(c, until)| *until > now && c.as_ref() == cert.as_ref())
    }
}

/// Shared, reloadable pins.
pub type SharedPins = Arc<RwLock<Pins>>;

fn accepts(pins: &SharedPins, cert: &CertificateDer<'_>) -> bool {
    pins.read()
        .unwrap_or_else(|p| p.into_inner())
        .accepts(cert, Instant::now())
}

fn refused() -> rustls::Error {
    rustls::Error::General(
        "the peer's certificate is not the pinned one (the extender's own serving certificate)"
            .into(),
    )
}

/// Requires a client certificate that is pinned.
#[derive(Debug)]
pub struct PinnedClients {
    pins: SharedPins,
    provider: Arc<CryptoProvider>,
}

impl PinnedClients {
    /// A verifier for `pins`, checking handshake signatures with `provider`.
    pub fn new(pins: SharedPins, provider: Arc<CryptoProvider>) -> Self {
        PinnedClients { pins, provider }
    }
}

impl ClientCertVerifier for PinnedClients {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if accepts(&self.pins, end_entity) {
            Ok(ClientCertVerified::assertion())
        } else {
            Err(refused())
        }
    }

    handshake_signatures!(provider);
}

/// Accepts a server that presents a pinned certificate (whatever name it is reached by:
/// followers reach the leader by pod IP).
#[derive(Debug)]
pub struct PinnedServer {
    pins: SharedPins,
    provider: Arc<CryptoProvider>,
}

impl PinnedServer {
    /// A verifier for `pins`, checking handshake signatures with `provider`.
    pub fn new(pins: SharedPins, provider: Arc<CryptoProvider>) -> Self {
        PinnedServer { pins, provider }
    }
}

impl ServerCertVerifier for PinnedServer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if accepts(&self.pins, end_entity) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(refused())
        }
    }

    handshake_signatures!(provider);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_keeps_the_previous_pin_for_a_while() {
        let a = CertificateDer::from(vec![1u8, 2, 3]);
        let b = CertificateDer::from(vec![4u8, 5, 6]);
        let c = CertificateDer::from(vec![7u8]);
        let t0 = Instant::now();
        let mut pins = Pins::new(vec![a.clone()]);
        assert!(pins.accepts(&a, t0) && !pins.accepts(&b, t0));
        pins.rotate(vec![b.clone()], t0);
        assert!(pins.accepts(&b, t0));
        assert!(pins.accepts(&a, t0 + ROTATION_GRACE - Duration::from_secs(1)));
        assert!(!pins.accepts(&a, t0 + ROTATION_GRACE));
        assert!(!pins.accepts(&c, t0));
        // Rotating back to a previous pin makes it current, not doubly listed.
        pins.rotate(vec![a.clone()], t0 + Duration::from_secs(1));
        assert!(pins.accepts(&a, t0 + ROTATION_GRACE * 2));
    }
}
