//! A kubeconfig file pointing at this server, accepted by kubectl and kube-rs.

use std::path::Path;

/// The kubeconfig YAML for a server at `server_url` (e.g. `http://127.0.0.1:6443`, or
/// `https://…` with `ca_pem`, the CA the client must trust, as `certificate-authority-data`).
/// The user entry carries a placeholder bearer token: a server without authentication needs
/// no credentials, but some clients refuse a user with no auth method at all.
pub fn kubeconfig_yaml(server_url: &str, ca_pem: Option<&str>) -> String {
    kubeconfig_yaml_with_token(server_url, ca_pem, PLACEHOLDER_TOKEN)
}

/// The token of the default kubeconfig; with authentication on it is the admin token.
pub const PLACEHOLDER_TOKEN: &str = "hami-embedded-apiserver";

/// A kubeconfig whose user authenticates with `token` (a service account's, with
/// authentication on).
pub fn kubeconfig_yaml_with_token(server_url: &str, ca_pem: Option<&str>, token: &str) -> String {
    let ca = match ca_pem {
        Some(pem) => {
            let b64 = serde_json::to_value(k8s_openapi::ByteString(pem.as_bytes().to_vec()))
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default();
            format!("    certificate-authority-data: {b64}\n")
        }
        None => String::new(),
    };
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: hami-embedded
  cluster:
    server: {server_url}
{ca}contexts:
- name: hami-embedded
  context:
    cluster: hami-embedded
    user: hami-embedded
    namespace: default
current-context: hami-embedded
preferences: {{}}
users:
- name: hami-embedded
  user:
    token: {token}
"
    )
}

/// [`kubeconfig_yaml`] whose user acts as `user` (`as:`: the `Impersonate-User` header), how
/// a stack without authentication gives a component its own identity.
pub fn kubeconfig_yaml_as(server_url: &str, ca_pem: Option<&str>, user: &str) -> String {
    let quoted = serde_json::Value::String(user.to_string()).to_string();
    format!("{}    as: {quoted}\n", kubeconfig_yaml(server_url, ca_pem))
}

/// Writes the kubeconfig atomically (temporary file, then rename), mode 0600.
pub fn write_kubeconfig(
    path: &Path,
    server_url: &str,
    ca_pem: Option<&str>,
) -> std::io::Result<()> {
    write_kubeconfig_text(path, &kubeconfig_yaml(server_url, ca_pem))
}

/// Writes `text` as a kubeconfig file atomically (temporary file, then rename), mode 0600.
pub fn write_kubeconfig_text(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp-kubeconfig");
    std::fs::write(&tmp, text)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_as_yaml_with_server() {
        let y = kubeconfig_yaml("http://127.0.0.1:1234", None);
        let v: serde_json::Value = serde_saphyr::from_str(&y).unwrap();
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "http://127.0.0.1:1234"
        );
        assert!(v["clusters"][0]["cluster"]["certificate-authority-data"].is_null());
        assert_eq!(v["current-context"], "hami-embedded");
        let pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let y = kubeconfig_yaml("https://127.0.0.1:1234", Some(pem));
        let v: serde_json::Value = serde_saphyr::from_str(&y).unwrap();
        let data: k8s_openapi::ByteString = serde_json::from_value(
            v["clusters"][0]["cluster"]["certificate-authority-data"].clone(),
        )
        .unwrap();
        assert_eq!(data.0, pem.as_bytes());
        let y = kubeconfig_yaml_as("http://127.0.0.1:1234", None, "system:serviceaccount:a:b");
        let v: serde_json::Value = serde_saphyr::from_str(&y).unwrap();
        assert_eq!(v["users"][0]["user"]["as"], "system:serviceaccount:a:b");
        assert_eq!(v["users"][0]["user"]["token"], PLACEHOLDER_TOKEN);
    }
}
