//! `hami-demo --runtime containerd` (what `hami demo --runtime containerd` runs): the demo's
//! pods in real containers of a private containerd, and the refusals (exit 2) where this
//! machine cannot start one.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

/// The demo's program, with the API server and the UI on free ports.
fn demo(kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hami-demo"));
    cmd.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args(["--api-listen", "127.0.0.1:0", "--ui-listen", "127.0.0.1:0"])
        .arg("--kubeconfig-out")
        .arg(kubeconfig);
    cmd
}

/// The word after `prefix` in `text` (up to a space).
fn after<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = &text[text.find(prefix)? + prefix.len()..];
    rest.split_whitespace().next()
}

#[test]
fn without_containerd_the_demo_exits_2_naming_root_and_the_packages() {
    let dir = common::scratch("demo-no-containerd");
    let kubeconfig = dir.join("kubeconfig");
    // No containerd on the PATH (an empty directory is the whole PATH).
    let empty = dir.join("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let out = demo(&kubeconfig)
        .args(["--once", "--runtime", "containerd"])
        .env("PATH", &empty)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // SAFETY: geteuid(2) has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert_eq!(out.status.code(), Some(2), "{err}");
    if root {
        assert!(
            err.contains("containerd is not on the PATH")
                && err.contains("apt-get install containerd runc buildah busybox-static"),
            "{err}"
        );
    } else {
        assert!(err.contains("needs root") && err.contains("sudo"), "{err}");
    }
    assert!(!kubeconfig.exists(), "nothing started: {err}");
    // Not root (nobody, when this test is root): refused for that, naming sudo and the
    // packages, before anything starts.
    if root && Path::new("/usr/bin/setpriv").exists() {
        let out = Command::new("/usr/bin/setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_hami-demo"))
            .args(["--once", "--runtime", "containerd", "--kubeconfig-out"])
            .arg(&kubeconfig)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("needs root")
                && err.contains("sudo hami demo --runtime containerd")
                && err.contains("apt-get install containerd runc buildah busybox-static"),
            "{err}"
        );
        assert!(!kubeconfig.exists(), "nothing started: {err}");
    }
    // --dra is refused with it (CDI over CRI is beyond Debian's containerd 1.6).
    let out = demo(&kubeconfig)
        .args(["--once", "--runtime", "containerd", "--dra"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--dra"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The PID of a container's task (`ctr tasks ls`: TASK PID STATUS), when it runs.
fn task_pid(socket: &str, id: &str) -> Option<u32> {
    let out = Command::new("ctr")
        .args(["--address", socket, "--namespace", "k8s.io", "tasks", "ls"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.len() == 3 && w[0] == id && w[2] == "RUNNING").then(|| w[1].parse().ok())?
    })
}

#[test]
fn the_demo_on_containerd_runs_a_sliced_pod_in_a_real_container() {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "skipped: hami demo --runtime containerd needs root and Debian's packages ({})",
            hami_containerd_host::INSTALL
        );
        return;
    }
    if let Err(e) = hami_demo::real_runtime::check() {
        panic!("this root machine cannot run the demo on containerd: {e}");
    }
    let _one_cluster = common::ONE_CLUSTER.blocking_lock();
    let started = Instant::now();
    let dir = common::scratch("demo-containerd");
    let mut child = demo(&dir.join("kubeconfig"))
        .args(["--runtime", "containerd", "--examples"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    while !text.contains("Web UI: ") {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                text.push_str(&line);
                text.push('\n');
            }
            Err(_) => {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "no tables within 240 s:\n{text}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    let socket = after(&text, "containerd at ")
        .unwrap_or_else(|| panic!("no containerd socket in:\n{text}"))
        .trim_end_matches(':')
        .to_owned();
    let api = after(&text, "embedded API server at ").unwrap().to_owned();
    assert!(text.contains("pod share-a is Running"), "{text}");
    // share-a's container is a real one: containerd's id, a runc task whose process is
    // hami-workload from the demo's image (not on this host's filesystem) with the slice's
    // CU mask and the hook's audit library in its environment.
    let pod: serde_json::Value = {
        let out = Command::new("curl")
            .args([
                "-sf",
                &format!("{api}/api/v1/namespaces/default/pods/share-a"),
            ])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("pod share-a from {api}: {e}: {:?}", out))
    };
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let id = id
        .strip_prefix("containerd://")
        .unwrap_or_else(|| panic!("not a containerd container: {pod:#}"))
        .to_owned();
    let pid = task_pid(&socket, &id).unwrap_or_else(|| panic!("no running task {id}"));
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    assert!(
        root.join("usr/local/bin/hami-workload").is_file()
            && !Path::new("/usr/local/bin/hami-workload").exists(),
        "process {pid} is not in the demo's image"
    );
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(
        environ.contains("HSA_CU_MASK=") && environ.contains("LD_AUDIT="),
        "{environ}"
    );
    // The hook is loaded (`LD_AUDIT` set is not enough: ld.so ignores a hook it cannot
    // load, as it did while the image lacked the loader under its soname's path).
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        maps.contains("/usr/local/vgpu/libamvgpu.so"),
        "the hook is not mapped into process {pid}"
    );
    // Ctrl-C: the demo stops its containers and containerd and removes its directory.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let instance = Path::new(&socket).parent().unwrap().to_path_buf();
    assert!(
        !instance.exists() || !Path::new(&socket).exists(),
        "{} left behind",
        instance.display()
    );
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the container's process {pid} outlived the demo"
    );
    eprintln!("demo on containerd: {:?}", started.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}
