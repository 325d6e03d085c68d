//! The hook check's cost per pass (issue 29) with 200 real hooked processes in one sliced
//! container: every pass reading them all (a fresh `HookWatch` each time, as before the
//! processes found hooked were remembered) against later passes of one `HookWatch`, which
//! read only `cgroup` and `stat` of a process already found hooked.
//!
//! `CARGO_TARGET_DIR=target-monitor cargo bench -p hami-monitor --bench hook_check`
//!
//! The processes are `sleep`s with the workspace's real `libamvgpu.so` in `LD_AUDIT` and
//! the slice's environment; a proc-shaped tree gives each its pod's cgroup, a `/dev/kfd`
//! descriptor and links to its real `maps`, `environ`, `comm` and `stat`. Besides the time,
//! it reports the bytes a pass reads (this process's `rchar` in `/proc/self/io`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hami_monitor::hook_check::HookWatch;
use hami_monitor::pods::PodIndex;
use hami_monitor::procfs::ProcRoot;
use k8s_openapi::api::core::v1::Pod;

const PROCESSES: usize = 200;
const PASSES: usize = 50;
const UID: &str = "aaaaaaaa-0000-4000-8000-0000000000b1";

fn hook_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    [dir.join("libamvgpu.so"), dir.join("../libamvgpu.so")]
        .into_iter()
        .find(|p| p.exists())
        .expect("libamvgpu.so was not built (hami-hip-hook is a dev-dependency)")
}

struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn rchar() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .unwrap()
        .parse()
        .unwrap()
}

/// Median time and mean bytes read of a pass: with one `HookWatch` over all passes
/// (`remember`: its first pass, untimed, found every process hooked) or a fresh one each.
fn passes(proc: &ProcRoot, pods: &PodIndex, remember: bool) -> (Duration, u64) {
    let kept = HookWatch::default();
    kept.check(proc, pods);
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..PASSES {
        let fresh = HookWatch::default();
        let watch = if remember { &kept } else { &fresh };
        let before = rchar();
        let start = Instant::now();
        watch.check(proc, pods);
        times.push(start.elapsed());
        bytes += rchar() - before;
        let tallies = watch.tallies();
        assert_eq!(tallies.len(), 1);
        assert_eq!(tallies[0].1.hooked as usize, PROCESSES, "{tallies:?}");
    }
    times.sort();
    (times[times.len() / 2], bytes / PASSES as u64)
}

fn main() {
    let base = std::env::temp_dir().join(format!("hami-monitor-hook-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let proc_root = base.join("proc");
    std::fs::create_dir_all(&proc_root).unwrap();
    let cid = "b1".repeat(32);
    let hook = hook_library();
    let mut children = Children(Vec::new());
    for _ in 0..PROCESSES {
        children.0.push(
            Command::new("sleep")
                .arg("600")
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .env("HIP_DEVICE_MEMORY_LIMIT_0", "1024m")
                .env("LD_AUDIT", &hook)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for c in &children.0 {
        let pid = c.id();
        while !std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap_or_default()
            .contains("libc.so")
        {
            assert!(Instant::now() < deadline, "sleep {pid} never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        let dir = proc_root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("fd")).unwrap();
        std::fs::write(
            dir.join("cgroup"),
            format!(
                "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{cid}.scope\n",
                UID.replace('-', "_")
            ),
        )
        .unwrap();
        std::os::unix::fs::symlink("/dev/kfd", dir.join("fd/3")).unwrap();
        for entry in ["maps", "environ", "comm", "stat"] {
            std::os::unix::fs::symlink(format!("/proc/{pid}/{entry}"), dir.join(entry)).unwrap();
        }
    }
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "bench", "namespace": "default", "uid": UID,
            "annotations": {"hami.io/amd-devices-allocated": "G0,AMD Instinct MI210,1024,10:;"}},
        "spec": {"nodeName": "n", "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "main",
            "containerID": format!("containerd://{cid}"), "image": "x", "imageID": "x",
            "ready": true, "restartCount": 0}]}
    }))
    .unwrap();
    let pods = PodIndex::from_pods([&pod], "hami-scheduler");
    let proc = ProcRoot::new(&proc_root);

    let maps_bytes: usize = children
        .0
        .iter()
        .map(|c| {
            std::fs::read(format!("/proc/{}/maps", c.id()))
                .unwrap()
                .len()
        })
        .sum();
    let (every, every_bytes) = passes(&proc, &pods, false);
    let (later, later_bytes) = passes(&proc, &pods, true);
    println!(
        "hook check, {PROCESSES} hooked processes (maps {maps_bytes} B in all), median of {PASSES} passes:"
    );
    println!(
        "  every process read (environ, maps, fds, comm): {every:?}, {every_bytes} B read per pass"
    );
    println!(
        "  hooked processes remembered (cgroup, stat):    {later:?}, {later_bytes} B read per pass"
    );
    drop(children);
    let _ = std::fs::remove_dir_all(&base);
}
