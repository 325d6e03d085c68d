//! HTTPS serving (`Config::tls`): at start the server makes its own CA and a serving
//! certificate signed by it, as kubeadm does for kube-apiserver, with the names an
//! in-cluster client dials (`kubernetes.default.svc`, ...) and the loopback addresses. The CA
//! is what clients trust: the written kubeconfig carries it as `certificate-authority-data`,
//! and the root-CA publisher (see `service_accounts`) puts it in every namespace's
//! `kube-root-ca.crt` ConfigMap. Only rustls' ring provider is used (a second provider in
//! the process makes rustls' default-provider lookup panic).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The DNS names of the serving certificate besides the listen IP and loopback: the names
/// kube-apiserver's certificate carries for in-cluster clients.
pub const SERVING_DNS_NAMES: &[&str] = &[
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// The CA and the serving certificate of one server run.
pub struct ServingCerts {
    /// The CA certificate (PEM): what clients trust.
    pub ca_pem: String,
    /// The serving certificate (DER), signed by the CA.
    cert_der: Vec<u8>,
    /// The serving key (PKCS#8 DER).
    key_der: Vec<u8>,
}

impl std::fmt::Debug for ServingCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCerts").finish_non_exhaustive()
    }
}

/// Makes a fresh CA and a serving certificate for `listen_ip` (plus 127.0.0.1, ::1 and
/// [`SERVING_DNS_NAMES`]).
pub fn generate(listen_ip: IpAddr) -> anyhow::Result<ServingCerts> {
    let err = |what: &str, e: rcgen::Error| anyhow::anyhow!("cannot make the {what}: {e}");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(|e| err("CA", e))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "hami-embedded-apiserver-ca");
    ca_params.distinguished_name = dn;
    let ca_key = KeyPair::generate().map_err(|e| err("CA key", e))?;
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(|e| err("CA", e))?;

    let mut names: Vec<SanType> = Vec::new();
    for ip in [
        listen_ip,
        IpAddr::from([127, 0, 0, 1]),
        IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    ] {
        if !ip.is_unspecified() && !names.contains(&SanType::IpAddress(ip)) {
            names.push(SanType::IpAddress(ip));
        }
    }
    for dns in SERVING_DNS_NAMES {
        let name = (*dns)
            .try_into()
            .map_err(|e| err("serving certificate name", e))?;
        names.push(SanType::DnsName(name));
    }
    let mut params = CertificateParams::default();
    params.subject_alt_names = names;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "kube-apiserver");
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(|e| err("serving key", e))?;
    let cert = params
        .signed_by(&key, &ca)
        .map_err(|e| err("serving certificate", e))?;
    Ok(ServingCerts {
        ca_pem: ca.pem(),
        cert_der: cert.der().to_vec(),
        key_der: key.serialize_der(),
    })
}

/// The TLS acceptor of the accept loop: HTTP/1.1 only (the server speaks HTTP/1.1; ALPN
/// tells HTTP/2 clients such as kubectl so), the handshake bounded by `handshake_timeout`.
pub fn acceptor(
    certs: &ServingCerts,
    handshake_timeout: Duration,
) -> anyhow::Result<RustlsAcceptor> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("TLS protocol versions: {e}"))?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(certs.cert_der.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certs.key_der.clone())),
        )
        .map_err(|e| anyhow::anyhow!("the serving certificate is refused by rustls: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(
        RustlsAcceptor::new(RustlsConfig::from_config(Arc::new(config)))
            .handshake_timeout(handshake_timeout),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};

    /// The serving certificate as a client checks it: trusted through the CA for every name
    /// an in-cluster or loopback client dials, refused for any other.
    #[test]
    fn certificate_verifies_for_the_in_cluster_names_and_the_listen_ip() {
        let certs = generate("10.1.2.3".parse().unwrap()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(certs.ca_pem.as_bytes()).unwrap())
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
        let leaf = CertificateDer::from(certs.cert_der.clone());
        let check = |name: &str| {
            verifier.verify_server_cert(
                &leaf,
                &[],
                &ServerName::try_from(name.to_string()).unwrap(),
                &[],
                UnixTime::now(),
            )
        };
        let mut names = vec!["10.1.2.3", "127.0.0.1", "::1"];
        names.extend(SERVING_DNS_NAMES);
        for name in names {
            assert!(check(name).is_ok(), "{name}: {:?}", check(name));
        }
        for name in ["10.1.2.4", "example.com", "kubernetes.default.svc.cluster"] {
            assert!(check(name).is_err(), "{name} must not verify");
        }
        acceptor(&certs, Duration::from_secs(1)).unwrap();
    }
}
