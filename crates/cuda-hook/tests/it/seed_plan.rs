//! Seed 004's test plan as a test (issue 15), NVIDIA side, with real processes as pods:
//! several GPU-busy "pods" on one node, each in its own PID namespace and `/proc`
//! (`unshare`), under the real hook on the stand-in driver (which reports host pids, as a
//! driver does), each busy a known share of the time; `hami_monitor` reads their regions.
//! - each pod's exported utilization equals its true share within ±3 points;
//! - summed per device never above 100;
//! - a killed process's share is gone within one refresh;
//! - `CUDA_VISIBLE_DEVICES` reordering is attributed to the right device.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::*;
use hami_monitor::node_monitor::{MonitorConfig, NodeMonitor, Snapshot};
use hami_monitor::pods::{ContainerInfo, PodIndex, PodInfo};

/// `tests/c/duty.c`, compiled once per process (the tests share the driver directory).
fn duty_program() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(compile_duty).clone()
}

fn compile_duty() -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/duty.c");
    let dir = driver_dir();
    let out = dir.join("duty");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O1", "-o"])
        .arg(&out)
        .arg(&source)
        .arg(format!("-L{}", dir.display()))
        .arg("-lcuda")
        .status()
        .expect("a C compiler (cc) is needed");
    assert!(status.success(), "compiling {} failed", source.display());
    out
}

/// A pod's process; killed (with its namespace) when dropped, also when an assertion fails.
struct Pod {
    name: &'static str,
    uid: String,
    share: f64,
    visible: Option<&'static str>,
    child: Child,
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pod_info(uid: &str, name: &str) -> PodInfo {
    PodInfo {
        uid: uid.into(),
        namespace: "seed".into(),
        name: name.into(),
        containers: vec![ContainerInfo {
            name: "main".into(),
            kind: "app",
            container_id: None,
            amd: Default::default(),
            nvidia: Default::default(),
        }],
        cu_allocated: Vec::new(),
        problems: Vec::new(),
    }
}

/// Utilization of `pod` on the device with UUID prefix `uuid`.
fn util(snap: &Snapshot, pod: &str, uuid: &str) -> Option<f64> {
    snap.containers
        .iter()
        .find(|c| c.pod == pod)?
        .devices
        .iter()
        .find(|d| d.device_uuid.starts_with(uuid))?
        .utilization
        .map(|u| u.percent)
}

const DEV0: &str = "GPU-fa4e0000";
const DEV1: &str = "GPU-fa4e0001";

#[test]
fn each_pod_reports_its_true_share() {
    let status = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status();
    assert!(
        matches!(status, Ok(s) if s.success()),
        "`unshare --pid --fork --mount-proc` must work (util-linux, CAP_SYS_ADMIN): {status:?}"
    );
    let node = scratch("seed-plan");
    let socket = node.join("driver.sock");
    let stop_driver = serve_driver_socket(&socket);
    let hook = node.join("hook");
    let duty = duty_program();
    let plan: [(&str, f64, Option<&str>); 3] = [
        ("train-30", 30.0, None),
        ("infer-45", 45.0, None),
        // Sees device 1 as its CUDA device 0: must be reported on device 1.
        ("reordered-40", 40.0, Some("1,0")),
    ];
    let mut index = PodIndex::default();
    let mut pods = Vec::new();
    for (n, (name, share, visible)) in plan.into_iter().enumerate() {
        let uid = format!("{:08x}-0000-4000-8000-000000000000", n + 0xabc0);
        let dir = hook.join(format!("containers/{uid}_main"));
        std::fs::create_dir_all(&dir).unwrap();
        index
            .by_uid
            .insert(uid.clone(), Arc::new(pod_info(&uid, name)));
        let mut env = vec![
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                dir.join("cudevshr.cache").display().to_string(),
            ),
            ("FAKE_CUDA_DRIVER_SOCKET", socket.display().to_string()),
            ("FAKE_CUDA_DEVICE_COUNT", "2".into()),
        ];
        if let Some(v) = visible {
            env.push(("CUDA_VISIBLE_DEVICES", v.into()));
        }
        let base = command(&node, &env, &[&share.to_string()]);
        let mut cmd = Command::new("unshare");
        // --kill-child: the pod's process dies with its unshare (no leak when a test fails).
        cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(&duty)
            .arg(share.to_string())
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in base.get_envs() {
            if let Some(v) = v {
                cmd.env(k, v);
            }
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "started\n", "{name}");
        pods.push(Pod {
            name,
            uid,
            share,
            visible,
            child,
        });
    }
    let monitor = NodeMonitor::new(MonitorConfig {
        hook_path: hook.clone(),
        proc_root: "/proc".into(),
        sys_root: node.join("sys"),
        node_name: "seed".into(),
        gc_grace: Duration::from_secs(3600),
        nvml_library: None,
    });
    // Warm-up: every pod's host pid resolved and its utilization showing.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        monitor.refresh(index.clone());
        let snap = monitor.snapshot();
        let ready = pods.iter().all(|p| {
            let dev = if p.visible.is_some() { DEV1 } else { DEV0 };
            util(&snap, p.name, dev).unwrap_or(0.0) > 0.0
        });
        if ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pods never showed utilization: {snap:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Measure: mean of scrapes over 3 s (each scrape is one 100 ms NVML window).
    let mut sums: Vec<f64> = vec![0.0; pods.len()];
    let mut scrapes = 0.0;
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        monitor.refresh(index.clone());
        let snap = monitor.snapshot();
        let mut per_device = [0.0f64; 2];
        for (i, p) in pods.iter().enumerate() {
            let (dev, other) = if p.visible.is_some() {
                (DEV1, DEV0)
            } else {
                (DEV0, DEV1)
            };
            let u = util(&snap, p.name, dev).unwrap_or(0.0);
            sums[i] += u;
            per_device[usize::from(dev == DEV1)] += u;
            assert_eq!(
                util(&snap, p.name, other).unwrap_or(0.0),
                0.0,
                "{}: utilization on a device it does not use",
                p.name
            );
        }
        for (d, sum) in per_device.iter().enumerate() {
            assert!(*sum <= 100.0, "device {d}: pods sum to {sum}");
        }
        scrapes += 1.0;
        std::thread::sleep(Duration::from_millis(150));
    }
    for (i, p) in pods.iter().enumerate() {
        let mean = sums[i] / scrapes;
        assert!(
            (mean - p.share).abs() <= 3.0,
            "{} busy {}% of the time reported {mean:.1}% (mean of {scrapes} scrapes)",
            p.name,
            p.share
        );
    }
    // Kill one pod's process (by the host pid the monitor found): its share is gone after
    // one refresh.
    let victim = &pods[1];
    let region =
        std::fs::read(hook.join(format!("containers/{}_main/cudevshr.cache", victim.uid))).unwrap();
    let hostpid = i32::from_le_bytes(region[1860..1864].try_into().unwrap());
    assert!(hostpid > 1, "{}: no host pid in its slot", victim.name);
    // SAFETY: kill(2) on a pid of ours (the pod's process, pid 1 of its namespace).
    assert_eq!(unsafe { libc::kill(hostpid, libc::SIGKILL) }, 0);
    let mut victim = pods.remove(1);
    victim.child.wait().unwrap();
    monitor.refresh(index.clone());
    let snap = monitor.snapshot();
    assert_eq!(
        util(&snap, "infer-45", DEV0).unwrap_or(0.0),
        0.0,
        "a killed process's share still reported: {snap:?}"
    );
    assert!(
        util(&snap, "train-30", DEV0).unwrap_or(0.0) > 0.0,
        "the others stay"
    );
    drop(pods);
    stop_driver.store(true, Ordering::Relaxed);
}
