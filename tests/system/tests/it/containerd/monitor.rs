//! The node monitor and `hami status` on the real runtime (issue 29 item 4): a sliced pod
//! as uid 1000 in its containerd + runc container runs kernels on the stand-in HIP runtime
//! under the real hook; the monitor (its own code, as the DaemonSet runs it) reports the
//! container's device memory from the hook's region and its utilization from the DRM
//! clients of the container's processes — found by their real cgroup, which runc made
//! (host pids: the container has its own PID namespace) — and `hami status --monitor`
//! shows the same pod, slice and readings.
//!
//! The kernel side of the stand-in runtime's DRM files is the demo's `AmdgpuDriver`
//! (fdinfo and fd links in a proc-shaped tree, the monitor's proc root; each process's
//! cgroup copied from the kernel's `/proc/<pid>/cgroup`), reached through a socket in the
//! pod's `/out`.

use std::process::Command;
use std::time::Duration;

use hami_webui::live::{DeviceKey, Live};
use serde_json::{Value, json};

use super::{AmdNode, NODE, TIMEOUT, containerd, program, start_monitor};

/// The workload keeps its device busy this share of the time.
const BUSY_PERCENT: u32 = 40;

/// The monitor's readings once `done` holds for the pod's device (at most [`TIMEOUT`]).
async fn wait_live(
    url: &str,
    key: &DeviceKey,
    done: impl Fn(&Live) -> bool,
) -> Result<Live, String> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let url = url.to_owned();
        let live = tokio::task::spawn_blocking(move || hami_webui::live::fetch(&url))
            .await
            .map_err(|e| e.to_string())?;
        if let Ok(live) = &live
            && done(live)
        {
            return Ok(live.clone());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "the monitor never reported {key:?} as expected: {live:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_and_hami_status_see_a_real_containers_memory_and_utilization()
-> Result<(), String> {
    let _machine = crate::MACHINE.read().await;
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let hami = program("hami")?;
    let node = AmdNode::start(shared, "monitor").await?;
    let result = run(&node, &hami).await;
    node.stop().await;
    result
}

async fn run(node: &AmdNode, hami: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let socket = node.dir.join("out/amdgpu.sock");
    let proc_root = node.dir.join("proc");
    let sys_root = node._tree.sysfs_root();
    let driver = hami_demo::amdgpu_driver::AmdgpuDriver::start(
        &socket,
        &proc_root,
        &sys_root,
        Default::default(),
    )
    .map_err(|e| format!("the stand-in amdgpu driver: {e}"))?;
    // A render node is open to every user of the container (mode 0666 on a real node).
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| e.to_string())?;

    let hook_path = node.dir.join("hook/vgpu");
    std::fs::create_dir_all(hook_path.join("containers")).map_err(|e| e.to_string())?;
    let kubeconfig = node.dir.join("kubeconfig");
    node.server
        .write_kubeconfig(&kubeconfig)
        .map_err(|e| e.to_string())?;
    let addr = hami_local_ports::free_local_addr();
    let monitor = start_monitor(&addr, &hook_path, &proc_root, &sys_root, &kubeconfig)?;
    let result = observe(node, hami, &kubeconfig, &format!("http://{addr}/metrics")).await;
    drop(monitor);
    driver.stop();
    result
}

async fn observe(
    node: &AmdNode,
    hami: &std::path::Path,
    kubeconfig: &std::path::Path,
    url: &str,
) -> Result<(), String> {
    let script = format!(
        "export FAKE_AMDGPU_DRIVER_SOCKET=/out/amdgpu.sock; \
         exec /opt/app/hami-workload --runtime hip --memory-mib 3072 --fallback-mib 512 \
         --busy-percent {BUSY_PERCENT} > /out/mon.log 2>&1"
    );
    node.schedule(
        "mon",
        node.slice(1024, 24),
        &script,
        json!({"securityContext": {"runAsUser": 1000, "runAsGroup": 1000}}),
    )
    .await?;
    node.wait_out("mon.log", "512 MiB").await?;
    let key: DeviceKey = ("default".into(), "mon".into(), "main".into(), "0".into());
    const MIB: f64 = 1024.0 * 1024.0;
    let live = wait_live(url, &key, |l| {
        l.memory.get(&key) == Some(&(512.0 * MIB)) && l.util.get(&key).is_some_and(|u| *u > 0.0)
    })
    .await?;
    assert_eq!(live.limit.get(&key), Some(&(1024.0 * MIB)), "{live:?}");
    assert_eq!(
        live.device.get(&key),
        Some(&node.devices[0].info.id),
        "{live:?}"
    );
    let util = live.util[&key];
    assert!(util <= 100.0, "{live:?}");

    // `hami status`, against the same API server and monitor.
    // The monitor publishes a new utilization each refresh: every value it shows while
    // `hami status` runs is watched, the one status printed must be among them.
    let kubeconfig = kubeconfig.to_owned();
    let (hami, url2) = (hami.to_owned(), url.to_owned());
    let status = tokio::task::spawn_blocking(move || {
        Command::new(hami)
            .args(["status", "-o", "json", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["--monitor", &url2])
            .output()
    });
    let mut seen = vec![live.util[&key]];
    while !status.is_finished() {
        let u = url.to_owned();
        if let Ok(Ok(l)) = tokio::task::spawn_blocking(move || hami_webui::live::fetch(&u)).await
            && let Some(v) = l.util.get(&key)
        {
            seen.push(*v);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = status
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot run hami status: {e}"))?;
    seen.push(wait_live(url, &key, |_| true).await?.util[&key]);
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "hami status failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let status: Value =
        serde_json::from_str(&text).map_err(|e| format!("hami status -o json: {e}: {text}"))?;
    let usage = status["usage"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["pod"] == "default/mon"))
        .ok_or_else(|| format!("no live row for default/mon: {status:#}"))?;
    assert_eq!(usage["container"], "main", "{status:#}");
    assert_eq!(usage["device_uuid"], node.devices[0].info.id, "{status:#}");
    assert_eq!(usage["memory_used_bytes"], 512 << 20, "{status:#}");
    assert_eq!(usage["memory_limit_bytes"], 1024 << 20, "{status:#}");
    let shown = usage["utilization_percent"].as_f64().unwrap_or(-1.0);
    assert!(
        seen.contains(&shown),
        "hami status says {shown}%, the monitor said {seen:?}"
    );
    // The slice itself, as the scheduler's state counts it.
    let gpu = status["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["name"] == NODE)
        .flat_map(|n| n["gpus"].as_array().into_iter().flatten())
        .find(|g| g["id"] == node.devices[0].info.id)
        .ok_or_else(|| format!("no GPU row: {status:#}"))?;
    assert_eq!(gpu["holders"], json!(["default/mon"]), "{status:#}");
    assert_eq!(gpu["memory_used_mib"], 1024, "{status:#}");
    assert_eq!(gpu["cores_used"], 24, "{status:#}");
    Ok(())
}
