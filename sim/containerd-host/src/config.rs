//! containerd's `config.toml` (version 2) for a private instance: every path it would
//! otherwise take from the host (`/var/lib/containerd`, `/run/containerd`, `/opt/containerd`,
//! runc's state, CNI, network namespaces) under one directory, so several instances and a
//! system containerd never meet. Pure: the text from the settings.

use std::path::{Path, PathBuf};

/// Where the instance keeps everything, and what its CRI plugin is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The instance's directory (everything else is under it).
    pub dir: PathBuf,
    /// The image the CRI plugin runs every pod sandbox from (`sandbox_image`; kubelet has
    /// no say in it over CRI). It must be imported: this containerd cannot pull.
    pub sandbox_image: String,
    /// `overlayfs` or `native` (see [`crate::snapshotter_for`]).
    pub snapshotter: String,
    /// CNI plugin binaries and network configs; `None`: none (pods must use the host
    /// network, as kubelet-sim's pods do without a CNI config).
    pub cni: Option<(PathBuf, PathBuf)>,
}

impl Layout {
    /// containerd's gRPC socket (CRI and containerd's own API).
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }
    /// The config file.
    pub fn config_file(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
    /// containerd's output.
    pub fn log_file(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }
    /// runc's state directory (`runc --root`), one subdirectory per containerd namespace.
    pub fn runc_root(&self) -> PathBuf {
        self.dir.join("runc")
    }
    /// Persistent data (content store, snapshots, metadata).
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }
    /// Runtime state (task bundles, rootfs mounts, sandbox `/dev/shm`).
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn p(path: &Path) -> String {
    toml_str(&path.display().to_string())
}

/// The config text for `layout`.
pub fn render(layout: &Layout) -> String {
    let d = &layout.dir;
    let (cni_bin, cni_conf) = layout
        .cni
        .clone()
        .unwrap_or_else(|| (d.join("cni/bin"), d.join("cni/net.d")));
    format!(
        r#"version = 2
root = {root}
state = {state}
# Snapshotters and plugins this host cannot use or a test does not need: less start-up
# time and no warnings about them.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {sandbox}
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  # No oom_score_adj below containerd's own: the CRI plugin gives sandboxes -998, which
  # needs CAP_SYS_RESOURCE, absent in many CI containers (runc init then dies with "can't
  # get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = {snapshotter}
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "runc"
        Root = {runc_root}
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
"#,
        root = p(&layout.root()),
        state = p(&layout.state()),
        socket = p(&layout.socket()),
        ttrpc = p(&d.join("containerd.sock.ttrpc")),
        opt = p(&d.join("opt")),
        sandbox = toml_str(&layout.sandbox_image),
        snapshotter = toml_str(&layout.snapshotter),
        runc_root = p(&layout.runc_root()),
        cni_bin = p(&cni_bin),
        cni_conf = p(&cni_conf),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_host_path_is_under_the_directory() {
        let layout = Layout {
            dir: "/tmp/x \"q\"".into(),
            sandbox_image: "localhost/pause:1".into(),
            snapshotter: "native".into(),
            cni: None,
        };
        let text = render(&layout);
        for line in text
            .lines()
            .filter(|l| l.contains('/') && l.contains(" = \""))
        {
            let value = line.split_once(" = ").unwrap().1;
            assert!(
                value.starts_with("\"/tmp/x \\\"q\\\"") || value == "\"localhost/pause:1\"",
                "{line}"
            );
        }
        assert!(text.contains("snapshotter = \"native\""), "{text}");
        assert!(text.contains("Root = \"/tmp/x \\\"q\\\"/runc\""), "{text}");
    }
}
