//! Issue 15 item 3: on a partitioned AMD card (MI300X in CPX mode: 8 partitions on one PCI
//! function, so every DRM client reports the same `drm-pdev`), each container's engine
//! busy time is attributed to the partition its descriptor is open on (the render minor of
//! `/proc/<pid>/fd/<n>`), not to partition 0.

use std::path::Path;
use std::time::Duration;

use crate::common::kubepods_cgroup;
use hami_monitor::node_monitor::{MonitorConfig, NodeMonitor};
use hami_monitor::pods::PodIndex;
use k8s_openapi::api::core::v1::Pod;

fn fake_process(proc_root: &Path, pid: i32, pod_uid: &str, cid: &str, render: u32) {
    let dir = proc_root.join(pid.to_string());
    std::fs::create_dir_all(dir.join("fd")).unwrap();
    std::fs::create_dir_all(dir.join("fdinfo")).unwrap();
    std::fs::write(dir.join("cgroup"), kubepods_cgroup(pod_uid, cid)).unwrap();
    std::os::unix::fs::symlink(format!("/dev/dri/renderD{render}"), dir.join("fd/5")).unwrap();
}

fn set_busy(proc_root: &Path, pid: i32, pdev: &str, client: u64, busy_ns: u64) {
    std::fs::write(
        proc_root.join(format!("{pid}/fdinfo/5")),
        format!(
            "pos:\t0\nflags:\t02100002\ndrm-driver:\tamdgpu\ndrm-client-id:\t{client}\ndrm-pdev:\t{pdev}\ndrm-engine-gfx:\t0 ns\ndrm-engine-compute:\t{busy_ns} ns\n"
        ),
    )
    .unwrap();
}

#[test]
fn each_partition_gets_its_own_containers_busy_time() {
    let sys = hami_sysfs_fixtures::mi300x_cpx().unwrap();
    let (gpus, devices) = hami_monitor::host_gpus::amd_host(&sys.sysfs_root()).unwrap();
    // Two partitions of the first card: same PCI address, different render minors.
    let p0 = devices[0].clone();
    let p3 = devices
        .iter()
        .find(|d| d.pci_bdf == p0.pci_bdf && d.partition_index == 3)
        .expect("partition 3 of the first card")
        .clone();
    assert_ne!(p0.render, p3.render);
    let device_type = gpus
        .iter()
        .find(|g| g.uuid == p3.info.id)
        .unwrap()
        .device_type
        .clone();

    let base = std::env::temp_dir().join(format!("hami-monitor-xcp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let proc_root = base.join("proc");
    std::fs::create_dir_all(base.join("hook/containers")).unwrap();
    let mut pods = Vec::new();
    for (name, dev, cid) in [
        ("on-p0", &p0, "a1".repeat(32)),
        ("on-p3", &p3, "b2".repeat(32)),
    ] {
        let uid = format!("{:0<8}-0000-4000-8000-000000000000", &cid[..8]);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": {
                "hami.io/amd-devices-allocated": format!("{},{device_type},16384,38:;", dev.info.id)}},
            "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "main",
                "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            "status": {"containerStatuses": [{"name": "main", "containerID": format!("containerd://{cid}"),
                "image": "x", "imageID": "x", "ready": true, "restartCount": 0}]}
        }))
        .unwrap();
        pods.push(pod);
        let pid = if name == "on-p0" { 100 } else { 300 };
        fake_process(&proc_root, pid, &uid, &cid, dev.render);
        set_busy(&proc_root, pid, &dev.pci_bdf, 7, 0);
    }
    let monitor = NodeMonitor::new(MonitorConfig {
        hook_path: base.join("hook"),
        proc_root: proc_root.clone(),
        sys_root: sys.sysfs_root(),
        node_name: "n".into(),
        gc_grace: Duration::from_secs(3600),
        nvml_library: None,
    });
    let index = PodIndex::from_pods(pods.iter(), "hami-scheduler");
    monitor.refresh(index.clone());
    // Deliberate: utilization is busy time over wall time, so the two samples need an
    // interval between them (this is not waiting for anything).
    std::thread::sleep(Duration::from_millis(100));
    // Only the container on partition 3 is busy (far beyond the interval: reads 100).
    set_busy(&proc_root, 300, &p3.pci_bdf, 7, 60_000_000_000);
    monitor.refresh(index);

    let snap = monitor.snapshot();
    let of = |pod: &str| {
        snap.containers
            .iter()
            .find(|c| c.pod == pod)
            .unwrap_or_else(|| panic!("{pod} not reported: {:?}", snap.containers))
            .devices
            .clone()
    };
    let busy = of("on-p3");
    assert_eq!(busy.len(), 1, "{busy:?}");
    assert_eq!(busy[0].device_uuid, p3.info.id, "attributed to partition 3");
    assert_eq!(
        busy[0].vdevice_index,
        Some(0),
        "the container's granted device"
    );
    assert_eq!(busy[0].utilization.unwrap().percent, 100.0);
    let idle = of("on-p0");
    assert_eq!(idle[0].device_uuid, p0.info.id);
    assert_eq!(idle[0].utilization.unwrap().percent, 0.0);
    assert!(
        !snap.errors.contains_key("fdinfo_unattributed"),
        "{:?}",
        snap.errors
    );
    let _ = std::fs::remove_dir_all(&base);
}
