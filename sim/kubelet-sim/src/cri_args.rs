//! The flags of the containerd runtime (`--runtime containerd`, see `cri_runtime/`), and
//! the check the program runs before anything starts: a containerd that is not there is
//! the user's to start (exit 2, naming the socket and the command that starts it).

use std::path::PathBuf;

/// Which runtime starts a pod's containers (with `--run-containers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RuntimeKind {
    /// kubelet-sim's own: `unshare` namespaces on the host filesystem, no images
    /// (`container_runtime.rs`).
    #[default]
    Unshare,
    /// A real containerd over CRI v1: images, sandboxes, runc (`cri_runtime/`).
    Containerd,
}

/// The containerd runtime's settings.
#[derive(Debug, Clone, clap::Args)]
pub struct CriArgs {
    /// Container runtime with --run-containers: `unshare` (kubelet-sim's own, no images)
    /// or `containerd` (a real containerd over CRI, images imported from OCI archives).
    #[arg(long = "runtime", value_enum, default_value_t = RuntimeKind::Unshare)]
    pub kind: RuntimeKind,
    /// containerd's CRI socket (with --runtime containerd).
    #[arg(long, default_value = hami_cri_api::CONTAINERD_SOCKET)]
    pub containerd_socket: PathBuf,
    /// The pod sandbox image containerd is configured with (its `sandbox_image`): checked
    /// to be imported before a sandbox is run, since it cannot be pulled.
    #[arg(long, default_value = "registry.k8s.io/pause:3.6")]
    pub pause_image: String,
    /// Where images' OCI archives are, as `scripts/build-images.sh` writes them
    /// (`target/images`: `localhost/hami-rs/hami-node:dev` is `node.oci.tar`): the reason of
    /// a pod whose image is missing names the file to build and import.
    #[arg(long)]
    pub image_archive_dir: Option<PathBuf>,
    /// A CNI network config containerd is set up with: pods without hostNetwork get their
    /// own network namespace. Without it every pod uses the node's network.
    #[arg(long)]
    pub cni_config: Option<PathBuf>,
    /// The API server's URL as the pods reach it: every container gets
    /// `KUBERNETES_SERVICE_HOST`/`_PORT` (and the `KUBERNETES_PORT*` links) from it, as
    /// kubelet gives them the `kubernetes` Service's (host-network pods reach the API
    /// server where kubelet-sim does). `hami-kubelet-sim` takes its kubeconfig's server
    /// when not given; none: no such variables.
    #[arg(long)]
    pub kubernetes_service: Option<String>,
}

impl Default for CriArgs {
    fn default() -> Self {
        Self {
            kind: RuntimeKind::Unshare,
            containerd_socket: hami_cri_api::CONTAINERD_SOCKET.into(),
            pause_image: "registry.k8s.io/pause:3.6".into(),
            image_archive_dir: None,
            cni_config: None,
            kubernetes_service: None,
        }
    }
}

pub use hami_containerd_host::start_hint;

impl CriArgs {
    /// With `--runtime containerd` (and containers run at all): the socket accepts a
    /// connection and the CNI config exists. The error names the socket and the command
    /// that starts containerd.
    pub fn check(&self, run_containers: bool) -> Result<(), String> {
        if self.kind != RuntimeKind::Containerd || !run_containers {
            return Ok(());
        }
        if let Some(cni) = &self.cni_config
            && !cni.is_file()
        {
            return Err(format!(
                "--cni-config {}: no such file (give containerd's CNI network config, or leave it out for host-network pods)",
                cni.display()
            ));
        }
        std::os::unix::net::UnixStream::connect(&self.containerd_socket)
            .map(drop)
            .map_err(|e| self.unreachable(&e.to_string()))
    }

    /// The message for a containerd that cannot be reached.
    pub fn unreachable(&self, why: &str) -> String {
        format!(
            "--runtime containerd: cannot reach containerd at {} ({why}); start it with `{}`, or pass --containerd-socket PATH",
            self.containerd_socket.display(),
            start_hint(&self.containerd_socket)
        )
    }

    /// The `kubernetes` Service's variables kubelet gives every container (its
    /// `getServiceEnvVarMap` for the master service: host, port, port named `https`, and the
    /// Docker-style links), from `--kubernetes-service`; empty without it or for a URL
    /// without a host.
    pub fn service_env(&self) -> Vec<(String, String)> {
        let Some(url) = &self.kubernetes_service else {
            return Vec::new();
        };
        let (scheme, rest) = url.split_once("://").unwrap_or(("https", url.as_str()));
        let authority = rest.split('/').next().unwrap_or("");
        let default_port = if scheme == "http" { "80" } else { "443" };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && !p.contains(']') => (h, p),
            _ => (authority, default_port),
        };
        if host.is_empty() {
            return Vec::new();
        }
        let link = format!("KUBERNETES_PORT_{port}_TCP");
        let tcp = format!("tcp://{host}:{port}");
        let host = host.trim_start_matches('[').trim_end_matches(']');
        vec![
            ("KUBERNETES_SERVICE_HOST".into(), host.into()),
            ("KUBERNETES_SERVICE_PORT".into(), port.into()),
            ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.into()),
            ("KUBERNETES_PORT".into(), tcp.clone()),
            (link.clone(), tcp),
            (format!("{link}_PROTO"), "tcp".into()),
            (format!("{link}_PORT"), port.into()),
            (format!("{link}_ADDR"), host.into()),
        ]
    }

    /// The archive an image is imported from, when `--image-archive-dir` is given
    /// (`scripts/build-images.sh`'s layout: `<dir>/<name>.oci.tar`).
    pub fn archive_of(&self, image: &str) -> Option<PathBuf> {
        self.image_archive_dir
            .as_ref()
            .map(|d| hami_containerd_host::images::archive_path(d, image))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn an_absent_socket_is_named_with_the_command_that_starts_containerd() {
        let args = CriArgs {
            kind: RuntimeKind::Containerd,
            containerd_socket: "/nonexistent/hami/containerd.sock".into(),
            ..Default::default()
        };
        let err = args.check(true).unwrap_err();
        assert!(err.contains("/nonexistent/hami/containerd.sock"), "{err}");
        assert!(
            err.contains("sudo containerd --address /nonexistent/hami/containerd.sock"),
            "{err}"
        );
        assert!(
            args.check(false).is_ok(),
            "no containers, no containerd needed"
        );
        assert!(CriArgs::default().check(true).is_ok(), "unshare needs none");
        assert_eq!(
            start_hint(Path::new("/run/containerd/containerd.sock")),
            "sudo systemctl start containerd (or: sudo containerd)"
        );
        let args = CriArgs {
            image_archive_dir: Some("/a".into()),
            kubernetes_service: Some("http://127.0.0.1:6443".into()),
            ..Default::default()
        };
        let env: std::collections::BTreeMap<_, _> = args.service_env().into_iter().collect();
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "127.0.0.1");
        assert_eq!(env["KUBERNETES_SERVICE_PORT"], "6443");
        assert_eq!(env["KUBERNETES_PORT"], "tcp://127.0.0.1:6443");
        assert_eq!(env["KUBERNETES_PORT_6443_TCP_ADDR"], "127.0.0.1");
        let https = CriArgs {
            kubernetes_service: Some("https://api.example/".into()),
            ..Default::default()
        };
        let env: std::collections::BTreeMap<_, _> = https.service_env().into_iter().collect();
        assert_eq!(
            (
                env["KUBERNETES_SERVICE_HOST"].as_str(),
                env["KUBERNETES_PORT"].as_str()
            ),
            ("api.example", "tcp://api.example:443")
        );
        assert!(CriArgs::default().service_env().is_empty());
        assert_eq!(
            args.archive_of("localhost/hami-rs/hami-node:dev"),
            Some(PathBuf::from("/a/node.oci.tar"))
        );
    }
}
