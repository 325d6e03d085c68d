//! Issue 15 item 1: the workload runs as in a pod, in its own PID namespace with its own
//! `/proc` (`unshare --pid --fork --mount-proc`), on stand-ins as faithful as a real driver:
//! the stand-in's "kernel side" (a unix socket served here, in the host PID namespace)
//! learns each process's host pid from the kernel (`SO_PEERCRED`), so the stand-in NVML
//! reports host pids, as the real one does. The hook cannot know its host pid there; the
//! monitor (host view) writes it into the slot, and then the SM limit throttles.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::common::*;
use hami_monitor::node_monitor::{MonitorConfig, NodeMonitor};
use hami_monitor::pods::{ContainerInfo, PodIndex, PodInfo};

/// The probe as a container process: its own PID namespace and /proc.
fn in_container(base: Command) -> Command {
    let status = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status();
    assert!(
        matches!(status, Ok(s) if s.success()),
        "`unshare --pid --fork --mount-proc` must work (util-linux, CAP_SYS_ADMIN): {status:?}"
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc"])
        .arg(base.get_program())
        .args(base.get_args())
        .env_clear()
        .stdin(Stdio::null());
    for (k, v) in base.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    cmd
}

fn launches(out: &[u8]) -> f64 {
    String::from_utf8_lossy(out)
        .lines()
        .find_map(|l| l.strip_prefix("launches="))
        .unwrap_or_else(|| panic!("no launches= line: {}", String::from_utf8_lossy(out)))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn the_sm_limit_throttles_in_a_private_pid_namespace() {
    let devices = scratch("pidns-devices");
    let socket = devices.join("driver.sock");
    let stop = serve_driver_socket(&socket);
    let uid = "cccccccc-0000-4000-8000-000000000000";
    let hook = devices.join("hook");
    let dir = hook.join(format!("containers/{uid}_main"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut index = PodIndex::default();
    index.by_uid.insert(
        uid.into(),
        Arc::new(PodInfo {
            uid: uid.into(),
            namespace: "t".into(),
            name: "busy".into(),
            containers: vec![ContainerInfo {
                name: "main".into(),
                kind: "app",
                container_id: None,
                amd: Default::default(),
                nvidia: Default::default(),
            }],
            cu_allocated: Vec::new(),
            problems: Vec::new(),
        }),
    );
    let monitor = Arc::new(NodeMonitor::new(MonitorConfig {
        hook_path: hook.clone(),
        proc_root: "/proc".into(),
        sys_root: devices.join("sys"),
        node_name: "n".into(),
        gc_grace: Duration::from_secs(3600),
        nvml_library: None,
    }));
    let refreshing = Arc::new(AtomicBool::new(true));
    // (pid, hostpid) of the limited process's slot once the monitor resolved it (read while
    // the process runs: its slot is released when it exits).
    let seen = Arc::new(std::sync::Mutex::new(None));
    let ticker = {
        let (monitor, refreshing, seen) = (monitor.clone(), refreshing.clone(), seen.clone());
        let region = dir.join("limited.cache");
        std::thread::spawn(move || {
            while refreshing.load(Ordering::Relaxed) {
                monitor.refresh(index.clone());
                if let Ok(bytes) = std::fs::read(&region)
                    && bytes.len() > 1864
                {
                    let pid = i32::from_le_bytes(bytes[1856..1860].try_into().unwrap());
                    let hostpid = i32::from_le_bytes(bytes[1860..1864].try_into().unwrap());
                    if hostpid != 0 {
                        seen.lock().unwrap().get_or_insert((pid, hostpid));
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let args = ["busy", "4", "5000"];
    let env = |limit: bool, cache: &str| {
        let mut env = vec![
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                dir.join(cache).display().to_string(),
            ),
            ("FAKE_CUDA_DRIVER_SOCKET", socket.display().to_string()),
        ];
        if limit {
            env.push(("CUDA_DEVICE_SM_LIMIT", "30".into()));
            env.push(("GPU_CORE_UTILIZATION_POLICY", "force".into()));
        }
        env
    };
    let limited = in_container(command(&devices, &env(true, "limited.cache"), &args))
        .output()
        .unwrap();
    assert!(
        limited.status.success(),
        "{}",
        String::from_utf8_lossy(&limited.stderr)
    );
    // The slot got its host pid from the monitor: not the pid the process saw in its
    // namespace (a small number: it is 1's child there).
    let (slot_pid, slot_hostpid) = seen
        .lock()
        .unwrap()
        .expect("the monitor never wrote a host pid into the namespaced process's slot");
    assert!(
        slot_pid > 0 && slot_pid < 10,
        "pid inside the namespace: {slot_pid}"
    );
    assert!(
        slot_hostpid != slot_pid,
        "host pid written by the monitor: {slot_hostpid}"
    );
    let free = in_container(command(&devices, &env(false, "free.cache"), &args))
        .output()
        .unwrap();
    refreshing.store(false, Ordering::Relaxed);
    ticker.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let ratio = launches(&limited.stdout) / launches(&free.stdout);
    // 30 % of the device: well under the unlimited run (ramp-up, the monitor's first
    // refresh and the 100 ms sampling lag included).
    assert!(
        ratio < 0.6,
        "limited/unlimited launches {ratio:.2}: the SM limit did not throttle in a PID namespace"
    );
    assert!(ratio > 0.05, "throttled too hard {ratio:.2}");
}
