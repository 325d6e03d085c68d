//! `hami-kubelet-sim` (what `hami kubelet-sim` runs) as a user runs it, with
//! `--cgroup-root` and `--cgroup-driver`: the real binary makes a pod's cgroup in a temp
//! cgroup tree with the chosen driver's names (kubelet's default, cgroupfs, without the
//! flag), warns of a tree without dmem, and refuses each bad flag (exit 2) saying what to
//! change, before it needs a cluster.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(30);

/// Kills the program if the test ends before it does.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A node's cgroup tree whose root lists `controllers`.
fn tree(dir: &Path, controllers: &str) -> PathBuf {
    let root = dir.join("sys/fs/cgroup");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("cgroup.controllers"), controllers).unwrap();
    root
}

/// `hami-kubelet-sim` for node `node` with `flags`, its stderr in `<dir>/<node>.stderr`.
fn kubelet(dir: &Path, kubeconfig: &Path, node: &str, flags: &[&str]) -> KillOnDrop {
    let stderr = std::fs::File::create(dir.join(format!("{node}.stderr"))).unwrap();
    KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_hami-kubelet-sim"))
            .args([
                "--node-name",
                node,
                "--sync-interval-ms",
                "20",
                "--socket-dir",
            ])
            .arg(dir.join(node).join("device-plugins"))
            .args(flags)
            .env("KUBECONFIG", kubeconfig)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start hami-kubelet-sim"),
    )
}

/// Polls `check` until it holds, at most [`TIMEOUT`]; `why` says what was seen instead.
async fn wait_until(what: &str, mut check: impl FnMut() -> bool, why: impl Fn() -> String) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {}",
            why()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Burstable pod (a cpu request, no limit) bound to `node`.
fn burstable(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [
            {"name": "main", "image": "i", "resources": {"requests": {"cpu": "100m"}}}]},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pods_cgroup_appears_with_the_drivers_names() {
    let dir = common::scratch("kubelet-sim-cgroup-flags");
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    // systemd, on a tree with dmem; the default driver on one without (warned).
    let sd_root = tree(&dir.join("sd"), "cpu memory pids dmem\n");
    let fs_root = tree(&dir.join("fs"), "cpu memory\n");
    let sd_flag = sd_root.to_str().unwrap();
    let fs_flag = fs_root.to_str().unwrap();
    let _sd = kubelet(
        &dir,
        &kubeconfig,
        "sd",
        &["--cgroup-root", sd_flag, "--cgroup-driver", "systemd"],
    );
    let _fs = kubelet(&dir, &kubeconfig, "fs", &["--cgroup-root", fs_flag]);

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let on_sd = pods
        .create(&PostParams::default(), &burstable("on-sd", "sd"))
        .await
        .unwrap();
    let on_fs = pods
        .create(&PostParams::default(), &burstable("on-fs", "fs"))
        .await
        .unwrap();
    let sd_pod = sd_root.join(format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        on_sd.uid().unwrap().replace('-', "_")
    ));
    let fs_pod = fs_root.join(format!("kubepods/burstable/pod{}", on_fs.uid().unwrap()));
    let stderr = |node: &str| {
        std::fs::read_to_string(dir.join(format!("{node}.stderr"))).unwrap_or_default()
    };
    for (pod, node) in [(&sd_pod, "sd"), (&fs_pod, "fs")] {
        wait_until(
            &format!("{}", pod.display()),
            || pod.is_dir(),
            || format!("{node}'s stderr:\n{}", stderr(node)),
        )
        .await;
    }
    // Each tree has its driver's names only (kubelet's QoS levels, not the other's).
    assert!(sd_root.join("kubepods.slice").is_dir() && !sd_root.join("kubepods").exists());
    assert!(fs_root.join("kubepods").is_dir() && !fs_root.join("kubepods.slice").exists());
    // dmem flows down where the root has it: the file the AMD drivers write.
    assert!(sd_pod.join("dmem.max").is_file());
    assert_eq!(
        std::fs::read_to_string(sd_pod.join("cgroup.controllers")).unwrap(),
        "cpu memory pids dmem\n"
    );
    assert!(!fs_pod.join("dmem.max").exists());
    let warned = stderr("fs");
    assert!(
        warned.contains("warning:") && warned.contains("no dmem controller"),
        "{warned}"
    );
    assert!(!stderr("sd").contains("warning:"), "{}", stderr("sd"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn each_bad_cgroup_flag_exits_2_saying_what_to_change() {
    let dir = common::scratch("kubelet-sim-cgroup-bad");
    let file = dir.join("a-file");
    std::fs::write(&file, "").unwrap();
    let bare = dir.join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    let missing = dir.join("missing");
    let (file, bare, missing) = (
        file.to_str().unwrap(),
        bare.to_str().unwrap(),
        missing.to_str().unwrap(),
    );
    let cases: [(&[&str], &[&str]); 5] = [
        (&["--cgroup-root", missing], &["does not exist", "mkdir -p"]),
        (&["--cgroup-root", file], &["is not a directory"]),
        (
            &["--cgroup-root", bare],
            &["does not look like a cgroup v2 tree", "cgroup.controllers"],
        ),
        (
            &["--cgroup-root", bare, "--cgroup-driver", "systemdd"],
            &["systemdd", "[possible values: cgroupfs, systemd]"],
        ),
        (&["--cgroup-driver", "systemd"], &["--cgroup-root"]),
    ];
    for (flags, said) in cases {
        // No cluster: the flags are refused before one is needed (else exit 1, "cannot
        // build a Kubernetes client").
        let out = Command::new(env!("CARGO_BIN_EXE_hami-kubelet-sim"))
            .args(["--node-name", "n1", "--socket-dir"])
            .arg(dir.join("device-plugins"))
            .args(flags)
            .env("KUBECONFIG", dir.join("no-kubeconfig"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        for s in said {
            assert!(err.contains(s), "{flags:?}: no {s:?} in {err}");
        }
    }
    // Nothing was made in the bare directory.
    assert_eq!(std::fs::read_dir(bare).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_help_lists_the_cgroup_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_hami-kubelet-sim"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    for s in [
        "--cgroup-root <DIR>",
        "--cgroup-driver <DRIVER>",
        "[default: cgroupfs]",
        "- cgroupfs: Plain directories (`kubepods/burstable/pod<uid>`)",
        "- systemd:  systemd slices and scopes",
    ] {
        assert!(help.contains(s), "no {s:?} in {help}");
    }
}
