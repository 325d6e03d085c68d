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
//! cgroup copied from the kernel's `/proc/<pid>/cgroup`, its `maps`, `environ` and `comm`
//! linked to the kernel's), reached through a socket in the pod's `/out`.
//!
//! The memory-hook check on the real runtime (issue 29): a tenant's container that makes
//! ld.so miss the hook (its own `LD_AUDIT`, naming a path the container lacks) and then uses
//! the GPU is counted unhooked by the monitor — found by the cgroup runc made — and told
//! once by a `SliceNotEnforced` Event; a hooked pod beside it reads 0.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use hami_monitor::hook_presence::REASON_SLICE_NOT_ENFORCED;
use hami_webui::live::{DeviceKey, Live};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
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

/// The stand-in amdgpu driver (its socket in the pods' `/out`, its tree the monitor's
/// proc root) and the node monitor over it, as the DaemonSet runs it; `observe` runs
/// between their start and stop, given the monitor's `/metrics` URL and a kubeconfig.
async fn with_monitor<F: std::future::Future<Output = Result<(), String>>>(
    node: &AmdNode,
    observe: impl FnOnce(std::path::PathBuf, String) -> F,
) -> Result<(), String> {
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
    let result = observe(kubeconfig, format!("http://{addr}/metrics")).await;
    drop(monitor);
    driver.stop();
    result
}

async fn run(node: &AmdNode, hami: &std::path::Path) -> Result<(), String> {
    with_monitor(node, |kubeconfig, url| async move {
        observe(node, hami, &kubeconfig, &url).await
    })
    .await
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
    // Its process, another user's, checked for the hook (issue 29): hooked, not unknown.
    let mon = |family: &str| hook_key(family, "mon", "libamvgpu.so");
    wait_hook_series(url, &[(mon(UNHOOKED), 0.0), (mon(HOOK_UNKNOWN), 0.0)]).await?;

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

pub(super) const UNHOOKED: &str = "hami_container_unhooked_processes";
pub(super) const HOOK_UNKNOWN: &str = "hami_container_hook_unknown_processes";

/// The monitor's `/metrics` text at `url` (`http://host:port/metrics`).
fn metrics_text(url: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let authority = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .ok_or_else(|| format!("{url:?} is not an http:// URL"))?;
    let mut stream =
        std::net::TcpStream::connect(authority).map_err(|e| format!("{authority}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| format!("{url}: {e}"))?;
    let raw = String::from_utf8_lossy(&raw);
    match raw.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_owned()),
        _ => Err(format!("{url}: not a 200 response: {raw}")),
    }
}

/// A hook series: (family, pod, container, hook).
pub(super) type HookSeries = (String, String, String, String);

/// The hook series of `family` for `pod`'s container `main` and `hook`.
pub(super) fn hook_key(family: &str, pod: &str, hook: &str) -> HookSeries {
    (
        family.to_owned(),
        pod.to_owned(),
        "main".to_owned(),
        hook.to_owned(),
    )
}

/// The hook check's series of a metrics text, with their values (read by the protocol
/// crate's exposition reader, as `hami status` reads the monitor).
fn hook_series(text: &str) -> BTreeMap<HookSeries, f64> {
    hami_protocol::scrape::parse_samples(text)
        .0
        .into_iter()
        .filter(|s| s.name == UNHOOKED || s.name == HOOK_UNKNOWN)
        .map(|s| {
            let label = |key: &str| s.label(key).unwrap_or_default().to_owned();
            (
                (
                    s.name.clone(),
                    label("pod"),
                    label("container"),
                    label("hook"),
                ),
                s.value,
            )
        })
        .collect()
}

/// Waits until each of `wanted` (hook series → value) holds (at most [`TIMEOUT`]).
pub(super) async fn wait_hook_series(
    url: &str,
    wanted: &[(HookSeries, f64)],
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let u = url.to_owned();
        let text = tokio::task::spawn_blocking(move || metrics_text(&u))
            .await
            .map_err(|e| e.to_string())??;
        let series = hook_series(&text);
        if wanted.iter().all(|(k, v)| series.get(k) == Some(v)) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "the monitor's hook series never read {wanted:?}: {series:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The `SliceNotEnforced` Events in the pods' namespace.
async fn slice_not_enforced(client: &kube::Client) -> Result<Vec<Event>, String> {
    Ok(Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("cannot list Events: {e}"))?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(REASON_SLICE_NOT_ENFORCED))
        .collect())
}

/// A tenant's container makes ld.so miss the hook: its command sets its own `LD_AUDIT`
/// (inside the container, where the plugin's Allocate cannot refuse it) naming a library
/// the container does not have. ld.so warns and runs the workload without the hook, so its
/// 3 GiB allocation is not held to the 1 GiB slice. The monitor finds the process by the
/// cgroup runc made and its host pid, counts it unhooked (1) and tells the pod once, over
/// many refreshes; the hooked pod on the same card reads 0 and is told nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_that_bypasses_the_hook_is_counted_unhooked_and_told_once() -> Result<(), String>
{
    let _machine = crate::MACHINE.read().await;
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let node = AmdNode::start(shared, "unhooked").await?;
    let at = &node;
    let result = with_monitor(at, |_, url| async move { observe_unhooked(at, &url).await }).await;
    node.stop().await;
    result
}

async fn observe_unhooked(node: &AmdNode, url: &str) -> Result<(), String> {
    let uid = json!({"securityContext": {"runAsUser": 1000, "runAsGroup": 1000}});
    let workload = |name: &str| {
        format!(
            "export FAKE_AMDGPU_DRIVER_SOCKET=/out/amdgpu.sock; \
             exec /opt/app/hami-workload --runtime hip --memory-mib 3072 --fallback-mib 512 \
             --busy-percent 10 > /out/{name}.log 2>&1"
        )
    };
    node.schedule(
        "hooked",
        node.slice(1024, 24),
        &workload("hooked"),
        uid.clone(),
    )
    .await?;
    node.wait_out("hooked.log", "allocated 512 MiB instead")
        .await?;
    // The hook is where the plugin mounted it; the tenant names a path that is not.
    let bypass = format!(
        "export LD_AUDIT=/opt/app/lib/libamvgpu.so; {}",
        workload("bypass")
    );
    node.schedule("bypass", node.slice(1024, 24), &bypass, uid)
        .await?;
    let log = node.wait_out("bypass.log", "allocated 3072 MiB").await?;
    assert!(
        log.contains("cannot be loaded as audit interface"),
        "ld.so did not say it ignored the tenant's LD_AUDIT: {log}"
    );

    // Both containers checked: the bypass counted unhooked, the hooked one not.
    let key = |family: &str, pod: &str| hook_key(family, pod, "libamvgpu.so");
    let wanted = [
        (key(UNHOOKED, "bypass"), 1.0),
        (key(HOOK_UNKNOWN, "bypass"), 0.0),
        (key(UNHOOKED, "hooked"), 0.0),
        (key(HOOK_UNKNOWN, "hooked"), 0.0),
    ];
    let matches = |series: &BTreeMap<_, f64>| wanted.iter().all(|(k, v)| series.get(k) == Some(v));
    wait_hook_series(url, &wanted).await?;

    // One Event on the bypass pod, naming the process the kernel knows (host pid, in the
    // cgroup runc made for the bypass container).
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let told = loop {
        let told = slice_not_enforced(&node.client).await?;
        if !told.is_empty() {
            break told;
        }
        if tokio::time::Instant::now() > deadline {
            return Err("the monitor posted no SliceNotEnforced Event".into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let event = &told[0];
    let object = &event.involved_object;
    assert_eq!(object.name.as_deref(), Some("bypass"), "{told:#?}");
    assert_eq!(
        object.field_path.as_deref(),
        Some("spec.containers{main}"),
        "{told:#?}"
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"), "{told:#?}");
    let message = event.message.clone().unwrap_or_default();
    assert!(message.contains("libamvgpu.so"), "{message}");
    let pid: i32 = message
        .strip_prefix("process ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|pid| pid.parse().ok())
        .ok_or_else(|| format!("no pid in the Event: {message}"))?;
    let pod = node
        .server
        .get_object("v1", "pods", "default", "bypass")
        .ok_or("pod bypass is gone")?;
    let container_id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("containerd://"))
        .ok_or_else(|| format!("no containerd id in bypass's status: {pod:#}"))?
        .to_owned();
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| format!("/proc/{pid}/cgroup: {e}"))?;
    assert!(
        cgroup.contains(&container_id),
        "the Event's pid {pid} is not in the bypass container ({container_id}): {cgroup}"
    );

    // Told once: the next refreshes still count it, and post nothing more.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let u = url.to_owned();
        let text = tokio::task::spawn_blocking(move || metrics_text(&u))
            .await
            .map_err(|e| e.to_string())??;
        let series = hook_series(&text);
        assert!(matches(&series), "{series:?}");
    }
    let told = slice_not_enforced(&node.client).await?;
    assert_eq!(told.len(), 1, "{told:#?}");
    Ok(())
}
