//! `hami-kubelet-sim --run-containers --runtime containerd` where no containerd listens:
//! exit 2 before anything starts, naming the socket and the command that starts
//! containerd (the runtime itself is tested against a real containerd in
//! `sim/kubelet-sim/tests/it/cri`).

use std::process::Command;

use crate::common;

#[test]
fn an_unreachable_containerd_exits_2_naming_the_socket_and_how_to_start_it() {
    let dir = common::scratch("kubelet-sim-no-containerd");
    let not_a_socket = dir.join("plain-file.sock");
    std::fs::write(&not_a_socket, "").unwrap();
    for socket in [dir.join("absent.sock"), not_a_socket] {
        // No cluster: refused before one is needed (else exit 1, "cannot build a
        // Kubernetes client").
        let out = Command::new(env!("CARGO_BIN_EXE_hami-kubelet-sim"))
            .args(["--node-name", "n1", "--socket-dir"])
            .arg(dir.join("device-plugins"))
            .args([
                "--run-containers",
                "--runtime",
                "containerd",
                "--containerd-socket",
            ])
            .arg(&socket)
            .env("KUBECONFIG", dir.join("no-kubeconfig"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", socket.display());
        let socket = socket.display().to_string();
        assert!(err.contains(&socket), "no socket in {err}");
        assert!(
            err.contains(&format!("sudo containerd --address {socket}")),
            "no start command in {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
