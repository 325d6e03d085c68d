//! Issue 15 item 1, monitor side: a process in a private PID namespace stores its own pid
//! but no host pid in its HAMi-core slot; the monitor (hostPID) finds the host process that
//! maps that region file and has that innermost pid, and writes its host pid into the slot.

use crate::common;

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use common::v1_region;
use hami_monitor::node_monitor::{MonitorConfig, NodeMonitor};
use hami_monitor::pods::PodIndex;
use k8s_openapi::api::core::v1::Pod;

fn fake_proc(root: &std::path::Path, host: i32, nspid: &str, maps: &str) {
    let dir = root.join(host.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("status"),
        format!("Name:\tprobe\nNSpid:\t{nspid}\n"),
    )
    .unwrap();
    std::fs::write(dir.join("maps"), maps).unwrap();
}

#[test]
fn the_monitor_writes_the_host_pid_of_a_namespaced_slot() {
    let base = std::env::temp_dir().join(format!("hami-monitor-pidns-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let uid = "aaaaaaaa-0000-4000-8000-000000000000";
    let dir = base.join(format!("hook/containers/{uid}_main"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut p = common::proc(0, 1, [(0, 1 << 30), (1, 0)], [(0, 40), (1, 0)]);
    p.pid = 7;
    p.hostpid = 0;
    let mut other = p;
    other.pid = 8;
    let region = dir.join("cudevshr.cache");
    std::fs::write(
        &region,
        v1_region(
            2,
            &["GPU-aaaaaaaa-1111-2222-3333-444444444444"],
            &[8 << 30],
            &[p, other],
            1,
        ),
    )
    .unwrap();
    let meta = std::fs::metadata(&region).unwrap();
    let (major, minor) = hami_monitor::host_pids::dev_numbers(meta.dev());
    let mapping = format!(
        "7f0000000000-7f00001ea000 rw-s 00000000 {major:02x}:{minor:02x} {} /usr/local/vgpu/cudevshr.cache\n",
        meta.ino()
    );
    let proc_root = base.join("proc");
    // The container's process: host pid 4711, pid 7 in its namespace, maps the region.
    fake_proc(&proc_root, 4711, "4711\t7", &mapping);
    // Another container's pid 7 (does not map this region), and pid 8 in two namespaces
    // that both map it (ambiguous: left alone).
    fake_proc(&proc_root, 4800, "4800\t7", "");
    fake_proc(&proc_root, 4900, "4900\t8", &mapping);
    fake_proc(&proc_root, 4901, "4901\t8", &mapping);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "t", "uid": uid},
        "spec": {"containers": [{"name": "main"}]}
    }))
    .unwrap();
    let monitor = NodeMonitor::new(MonitorConfig {
        hook_path: base.join("hook"),
        proc_root: proc_root.clone(),
        sys_root: base.join("sys"),
        node_name: "n".into(),
        gc_grace: Duration::from_secs(3600),
        nvml_library: None,
    });
    monitor.refresh(PodIndex::from_pods([&pod], "hami-scheduler"));
    let bytes = std::fs::read(&region).unwrap();
    let hostpid = |slot: usize| {
        let at = 1856 + 1960 * slot + 4;
        i32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
    };
    assert_eq!(hostpid(0), 4711, "slot 0 resolved to its host pid");
    assert_eq!(hostpid(1), 0, "ambiguous slot left alone");
    // Now that the host pid is known, the process's death is seen: its usage goes.
    std::fs::remove_dir_all(proc_root.join("4711")).unwrap();
    let snap = monitor.snapshot();
    let used = snap.containers[0].devices[0].memory_used;
    assert_eq!(
        used,
        Some(1 << 30),
        "only the unresolved slot 1 still counts"
    );
    let _ = std::fs::remove_dir_all(&base);
}
