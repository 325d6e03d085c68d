//! The scenarios' certificates: a CA, a serving certificate (serverAuth only, as
//! kube-webhook-certgen issues) and a client certificate, written to a directory of their own.

use std::path::PathBuf;

use hami_scheduler::extender_client::ClientIdentity;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

use super::SERVER_NAME;

pub(super) struct Pki {
    pub(super) dir: PathBuf,
    pub(super) ca_pem: String,
    /// A client certificate from the CA (clientAuth).
    pub(super) client: ClientIdentity,
    /// The serving certificate and key (serverAuth only, as kube-webhook-certgen issues).
    pub(super) server: ClientIdentity,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(super) fn pki(tag: &str) -> Pki {
    let dir = std::env::temp_dir().join(format!("hami-ha-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "hami test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |sans: Vec<String>, usage: ExtendedKeyUsagePurpose, name: &str| {
        let mut p = CertificateParams::new(sans).unwrap();
        p.extended_key_usages = vec![usage];
        p.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &ca).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server, server_key) = leaf(
        vec![SERVER_NAME.into()],
        ExtendedKeyUsagePurpose::ServerAuth,
        "hami-scheduler",
    );
    let (client, client_key) = leaf(
        vec![],
        ExtendedKeyUsagePurpose::ClientAuth,
        "system:kube-scheduler",
    );
    for (name, text) in [
        ("ca.crt", ca.pem()),
        ("tls.crt", server.clone()),
        ("tls.key", server_key.clone()),
        ("client.crt", client.clone()),
        ("client.key", client_key.clone()),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    Pki {
        dir,
        ca_pem: ca.pem(),
        client: ClientIdentity {
            cert_pem: client.into_bytes(),
            key_pem: client_key.into_bytes(),
        },
        server: ClientIdentity {
            cert_pem: server.into_bytes(),
            key_pem: server_key.into_bytes(),
        },
    }
}
