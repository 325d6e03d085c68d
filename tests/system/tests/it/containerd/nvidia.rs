//! A sliced NVIDIA pod in a real container (see `mod.rs`): the real NVIDIA device plugin
//! on the stand-in NVML (loaded in this process, as the plugin loads the driver's), the
//! real `libvgpu.so` installed where the plugin mounts it from, and a pod of the test
//! busybox image running `hami-workload` on the stand-in CUDA driver and NVML (copies in
//! `/opt/app/lib` under their sonames), the hook preloaded through the `/etc/ld.so.preload`
//! the plugin's Allocate answer mounts.

use super::monitor::{HOOK_UNKNOWN, UNHOOKED, hook_key, wait_hook_series};
use std::path::PathBuf;
use std::time::Duration;

use hami_apiserver::RunningApiServer;
use hami_containerd_host::shared::TEST_BUSYBOX;
use hami_kubelet_sim::KubeletSim;
use hami_plugin_harness::api_with_node;
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::names::{NVIDIA, pod as pod_keys};
use hami_protocol::node_register::decode_node_devices;
use serde_json::json;
use tokio::sync::watch;

use super::{NODE, built, containerd, install};

/// A pod as uid 1000 with a 1 GiB slice of the stand-in's 16 GiB GPU: under the real hook
/// its 3 GiB allocation is refused (the driver alone would grant it) and the smaller
/// fallback fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliced_nvidia_pod_as_uid_1000_stops_at_its_limit_under_the_real_hook()
-> Result<(), String> {
    let _machine = crate::MACHINE.read().await;
    let Some(shared) = containerd() else {
        return Ok(());
    };
    use std::os::unix::fs::PermissionsExt;
    let dir: PathBuf = std::env::temp_dir().join(format!("sys-cri-nv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    std::fs::create_dir_all(dir.join("dev")).map_err(|e| e.to_string())?;
    // The container runs as uid 1000.
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777))
        .map_err(|e| e.to_string())?;
    install(
        std::path::Path::new(env!("CARGO_BIN_EXE_system-workload")),
        &dir.join("app/hami-workload"),
    )?;
    let nvml = built("libnvidia_ml.so")?;
    install(&built("libcuda.so")?, &dir.join("app/lib/libcuda.so.1"))?;
    install(&nvml, &dir.join("app/lib/libnvidia-ml.so.1"))?;
    let hook_root = dir.join("hook");
    install(&built("libvgpu.so")?, &hook_root.join("vgpu/libvgpu.so"))?;

    let (server, client) = api_with_node(NODE).await;
    let sockets = dir.join("device-plugins");
    let sim =
        super::start_kubelet_sim(&dir, &shared.socket, &shared.archives, None, client.clone())
            .await?;

    use clap::Parser;
    let mut args = hami_nvidia_plugin::cli::Args::parse_from(["nvidia-device-plugin"]);
    // The driver's NVML for the plugin, under its soname (the built library linked).
    args.nvml_library = hami_plugin_harness::nvml_driver_dir(&dir)
        .join("libnvidia-ml.so.1")
        .display()
        .to_string();
    args.device_plugin_dir = sockets.clone();
    args.node_name = Some(NODE.into());
    args.hook_path = hook_root.clone();
    args.register_interval = 1;
    args.pulse = 1;
    let settings = args.settings()?;
    let (stop, stop_rx) = watch::channel(false);
    let plugin = tokio::spawn(hami_nvidia_plugin::plugin::serve(
        args,
        settings,
        client.clone(),
        stop_rx,
    ));
    let result = run(&server, &client, &sim, &dir).await;
    sim.shutdown().await;
    let _ = stop.send(true);
    let _ = plugin.await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The plugin's registration, the pod as the scheduler leaves it at bind, and the checks.
async fn run(
    server: &RunningApiServer,
    client: &kube::Client,
    sim: &KubeletSim,
    dir: &std::path::Path,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let gpu = loop {
        let annotation = server
            .get_object("v1", "nodes", "", NODE)
            .and_then(|n| {
                n["metadata"]["annotations"][NVIDIA.node_register]
                    .as_str()
                    .map(str::to_owned)
            })
            .and_then(|a| decode_node_devices(&a).ok())
            .and_then(|d| d.into_iter().next());
        if let Some(gpu) = annotation
            && sim.allocatable("nvidia.com/gpu") > 0
        {
            break gpu;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "the NVIDIA plugin never registered: kubelet sees {} nvidia.com/gpu",
                sim.allocatable("nvidia.com/gpu")
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let list = encode_pod_devices(&[vec![ContainerDevice {
        uuid: gpu.id.clone(),
        device_type: "NVIDIA".into(),
        mem_mib: 1024,
        cores: 30,
    }]])
    .map_err(|e| e.to_string())?;
    hami_plugin_harness::take_node_lock(client, NODE, "cuda").await;
    let host = |p: PathBuf| json!({"path": p.display().to_string()});
    let script = "id -u > /out/uid; cat /etc/ld.so.preload > /out/preload; \
        exec /opt/app/hami-workload --runtime cuda --memory-mib 3072 --fallback-mib 512 \
        --busy-percent 1 > /out/cuda.log 2>&1";
    server
        .create_object(
            "v1",
            "pods",
            Some("default"),
            json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "cuda", "annotations": {
                NVIDIA.devices_to_allocate: list, NVIDIA.devices_allocated: list,
                pod_keys::VGPU_NODE: NODE, pod_keys::BIND_PHASE: "allocating",
                pod_keys::BIND_TIME: "1700000000"}},
            "spec": {
                "nodeName": NODE, "schedulerName": "hami-scheduler",
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
                "volumes": [
                    {"name": "out", "hostPath": host(dir.join("out"))},
                    {"name": "app", "hostPath": host(dir.join("app"))},
                    {"name": "libc", "hostPath": {"path": "/lib/x86_64-linux-gnu"}},
                    {"name": "lib64", "hostPath": {"path": "/lib64"}},
                ],
                "containers": [{"name": "main", "image": TEST_BUSYBOX,
                    "command": ["/bin/sh", "-c", script],
                    "env": [
                        {"name": "LD_LIBRARY_PATH", "value": "/opt/app/lib"},
                        {"name": "FAKE_CUDA_SHARED_STATE", "value": "/out/cuda.state"},
                    ],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "volumeMounts": [
                        {"name": "out", "mountPath": "/out"},
                        {"name": "app", "mountPath": "/opt/app", "readOnly": true},
                        {"name": "libc", "mountPath": "/lib/x86_64-linux-gnu", "readOnly": true},
                        {"name": "lib64", "mountPath": "/lib64", "readOnly": true},
                    ]}],
            }}),
        )
        .map_err(|e| format!("cannot create pod cuda: {e:?}"))?;
    let log_path = dir.join("out/cuda.log");
    let deadline = tokio::time::Instant::now() + super::TIMEOUT;
    let log = loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if text.contains("512 MiB") {
            break text;
        }
        if tokio::time::Instant::now() > deadline {
            let pod = server
                .get_object("v1", "pods", "default", "cuda")
                .unwrap_or_default();
            return Err(format!(
                "the workload never said 512 MiB: {text:?}; pod {pod:#}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let read = |f: &str| std::fs::read_to_string(dir.join("out").join(f)).unwrap_or_default();
    assert_eq!(read("uid"), "1000\n");
    assert_eq!(read("preload").trim(), "/usr/local/vgpu/libvgpu.so");
    // The hook's view of the device: the slice, not the stand-in's 16 GiB.
    assert!(
        log.contains("device 0: 1024 MiB of 1024 MiB free (cuMemGetInfo)")
            && log.contains("device 0: cuMemAlloc of 3072 MiB refused: out of memory")
            && log.contains("device 0: allocated 512 MiB instead"),
        "{log}"
    );
    monitor_resolves_host_pids(server, dir).await
}

/// `(pid, hostpid)` of the slots in use of a HAMi-core region.
fn slots(bytes: &[u8]) -> Result<Vec<(i32, i32)>, String> {
    use hami_monitor::hami_core_region::detect_layout;
    use hami_monitor::region_bytes::RegionBytes;
    let layout = detect_layout(bytes).map_err(|e| format!("the region: {e:?}"))?;
    let n = bytes.i32_at(layout.proc_num).clamp(0, 1024) as usize;
    Ok((0..n)
        .map(|i| layout.procs + i * layout.slot.size)
        .filter(|base| bytes.i32_at(base + layout.slot.status) != 0)
        .map(|base| {
            (
                bytes.i32_at(base + layout.slot.pid),
                bytes.i32_at(base + layout.slot.hostpid),
            )
        })
        .collect())
}

/// The node monitor as its DaemonSet runs it, over the real `/proc`: the container's
/// process has a PID namespace of its own, so its HAMi-core slot holds its pid there and no
/// host pid; the monitor finds the host process (mapping that region, innermost `NSpid` the
/// slot's pid), writes its host pid into the slot — a file of the container's uid 1000,
/// with no capability but SYS_PTRACE — and reports the container's memory.
async fn monitor_resolves_host_pids(
    server: &RunningApiServer,
    dir: &std::path::Path,
) -> Result<(), String> {
    let containers = dir.join("hook/vgpu/containers");
    let region = std::fs::read_dir(&containers)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .map(|f| f.path())
        .find(|p| p.extension().is_some_and(|e| e == "cache"))
        .ok_or_else(|| format!("no region file under {}", containers.display()))?;
    let read = || std::fs::read(&region).map_err(|e| format!("{}: {e}", region.display()));
    let before = slots(&read()?)?;
    assert!(
        before.iter().any(|&(pid, host)| pid > 0 && host == 0),
        "the hook's slot names a pid of the container's namespace only: {before:?}"
    );
    let kubeconfig = dir.join("kubeconfig");
    server
        .write_kubeconfig(&kubeconfig)
        .map_err(|e| e.to_string())?;
    let addr = hami_local_ports::free_local_addr();
    let _monitor = super::start_monitor(
        &addr,
        &dir.join("hook/vgpu"),
        std::path::Path::new("/proc"),
        std::path::Path::new("/sys"),
        &kubeconfig,
    )?;
    let deadline = tokio::time::Instant::now() + super::TIMEOUT;
    let resolved = loop {
        let now = slots(&read()?)?;
        if !now.is_empty() && now.iter().all(|&(_, host)| host > 0) {
            break now;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("the monitor never wrote the host pids: {now:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (pid, host) in resolved {
        let status = std::fs::read_to_string(format!("/proc/{host}/status")).unwrap_or_default();
        let nspid = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .unwrap_or_default();
        let inner = nspid.split_whitespace().last().unwrap_or_default();
        assert_eq!(inner, pid.to_string(), "host pid {host}: NSpid {nspid}");
    }
    let url = format!("http://{addr}/metrics");
    let key = (
        "default".to_owned(),
        "cuda".to_owned(),
        "main".to_owned(),
        "0".to_owned(),
    );
    let deadline = tokio::time::Instant::now() + super::TIMEOUT;
    loop {
        let url = url.clone();
        let live = tokio::task::spawn_blocking(move || hami_webui::live::fetch(&url))
            .await
            .map_err(|e| e.to_string())?;
        if let Ok(live) = &live
            && live.memory.get(&key) == Some(&(512.0 * 1024.0 * 1024.0))
        {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("the monitor never reported 512 MiB: {live:?}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The process, another user's, checked for its hook (issue 29): libvgpu.so mapped, its
    // environment read (from its memory: the monitor cannot open uid 1000's environ).
    let cuda = |family: &str| hook_key(family, "cuda", "libvgpu.so");
    wait_hook_series(&url, &[(cuda(UNHOOKED), 0.0), (cuda(HOOK_UNKNOWN), 0.0)]).await
}
