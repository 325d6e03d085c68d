//! Seed 004's test plan, automated: several GPU-busy containers on one simulated node; the
//! utilization metric of each pod's container equals what its processes produced.
//!
//! - NVIDIA pods: HAMi-core v1.2 region files written as HAMi-core's sampler writes them
//!   (per-process `sm_util` in the slot of the process's host pid), including a killed
//!   process (its host pid gone: excluded, D-6), an exited one (status 0), an over-100 sum
//!   (clamped, D-6), and an init container (reported too).
//! - AMD pods: real hami-region regions (this process attaches and reserves, as libamvgpu.so
//!   does), plus processes in a fake /proc whose cgroup names the container and whose DRM
//!   fdinfo busy counters advance at a known rate (D-7), including a duplicated descriptor.
//! - The pods live in the embedded API server; the monitor's node-scoped informer maps the
//!   directories to them; one pod is deleted mid-run and its directory goes away.
//!
//! Tolerance: NVIDIA values are exact (integers written into the region). AMD values are
//! the busy rate the writer thread produces (updated every 5 ms) measured over ≥ 1 s
//! sampling intervals: within ±3 percentage points.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{proc, v1_region};
use hami_local_ports::free_port;
use hami_monitor::node_monitor::MonitorConfig;
use hami_monitor::server::{ServeConfig, serve};
use hami_region::layout::{LIMIT_NONE, MAX_DEVICES};
use hami_region::{Limits, Session};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NODE: &str = "node-a";
const GIB: u64 = 1 << 30;

struct PodSpec {
    name: &'static str,
    init: Option<&'static str>,
    container: &'static str,
    annotations: Vec<(&'static str, String)>,
}

fn cid(n: u8) -> String {
    format!("{:02x}", n).repeat(32)
}

/// The pods the scheduler placed request a GPU of the vendor of their annotations (the
/// monitor believes allocation annotations only on such pods, D-4).
fn gpu_resource(spec: &PodSpec) -> &'static str {
    if spec
        .annotations
        .iter()
        .any(|(k, _)| k.starts_with("hami.io/amd-"))
    {
        "amd.com/gpu"
    } else {
        "nvidia.com/gpu"
    }
}

async fn create_pod(api: &Api<Pod>, spec: &PodSpec, node: &str, ids: &[(&str, String)]) -> String {
    let mut init = Vec::new();
    if let Some(name) = spec.init {
        init.push(serde_json::json!({"name": name, "image": "busybox"}));
    }
    let annotations: BTreeMap<&str, &str> = spec
        .annotations
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": spec.name, "namespace": "default", "annotations": annotations},
        "spec": {"nodeName": node, "initContainers": init, "schedulerName": "hami-scheduler",
                 "containers": [{"name": spec.container, "image": "cuda",
                     "resources": {"limits": {gpu_resource(spec): "1"}}}]}
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &pod).await.unwrap();
    let statuses: Vec<_> = ids
        .iter()
        .filter(|(n, _)| *n == spec.container)
        .map(|(n, id)| serde_json::json!({"name": n, "containerID": format!("containerd://{id}"), "image": "x", "imageID": "x", "ready": true, "restartCount": 0}))
        .collect();
    let init_statuses: Vec<_> = ids
        .iter()
        .filter(|(n, _)| Some(*n) == spec.init)
        .map(|(n, id)| serde_json::json!({"name": n, "containerID": format!("containerd://{id}"), "image": "x", "imageID": "x", "ready": false, "restartCount": 0}))
        .collect();
    api.patch_status(
        spec.name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"phase": "Running", "containerStatuses": statuses, "initContainerStatuses": init_statuses}})),
    )
    .await
    .unwrap();
    created.metadata.uid.unwrap()
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A fake host process of a container, with DRM clients.
fn fake_process(
    proc_root: &Path,
    pid: i32,
    pod_uid: &str,
    container_id: &str,
    fds: &[u32],
    render: u32,
) {
    let dir = proc_root.join(pid.to_string());
    std::fs::create_dir_all(dir.join("fd")).unwrap();
    std::fs::create_dir_all(dir.join("fdinfo")).unwrap();
    std::fs::write(
        dir.join("cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{container_id}.scope\n",
            pod_uid.replace('-', "_")
        ),
    )
    .unwrap();
    for fd in fds {
        std::os::unix::fs::symlink(
            format!("/dev/dri/renderD{render}"),
            dir.join("fd").join(fd.to_string()),
        )
        .unwrap();
    }
    // A non-DRM descriptor with a DRM-looking fdinfo must be ignored.
    std::os::unix::fs::symlink("/dev/null", dir.join("fd/0")).unwrap();
}

fn fdinfo_text(pdev: &str, client: u64, busy_ns: u64) -> String {
    format!(
        "pos:\t0\nflags:\t02100002\nmnt_id:\t24\ndrm-driver:\tamdgpu\ndrm-client-id:\t{client}\ndrm-pdev:\t{pdev}\ndrm-memory-vram:\t1024 KiB\ndrm-engine-gfx:\t0 ns\ndrm-engine-compute:\t{busy_ns} ns\ndrm-engine-dma:\t{busy_ns} ns\n"
    )
}

async fn scrape(port: u16) -> String {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    assert!(
        out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
        "{out}"
    );
    out.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// Scrapes until `done` holds for the samples (bounded: a few refresh intervals), and
/// returns that scrape's text.
async fn scrape_until(
    port: u16,
    what: &str,
    done: impl Fn(&[(String, BTreeMap<String, String>, f64)]) -> bool,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        // Until the monitor listens, there is nothing to scrape yet.
        let text = match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(_) => scrape(port).await,
            Err(_) => String::new(),
        };
        if !text.is_empty() && done(&samples(&text)) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `(name, labels, value)` of each sample line.
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (head, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}').unwrap()),
            None => (head, ""),
        };
        let mut map = BTreeMap::new();
        let mut rest = labels;
        while !rest.is_empty() {
            let (key, after) = rest.split_once("=\"").unwrap();
            let end = after.find('"').unwrap();
            map.insert(
                key.trim_start_matches(',').to_owned(),
                after[..end].to_owned(),
            );
            rest = &after[end + 1..];
        }
        out.push((name.to_owned(), map, value.parse().unwrap()));
    }
    out
}

fn value(
    all: &[(String, BTreeMap<String, String>, f64)],
    name: &str,
    want: &[(&str, &str)],
) -> Option<f64> {
    let found: Vec<f64> = all
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && want
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| *v)
        .collect();
    assert!(found.len() <= 1, "{name} {want:?} matched {found:?}");
    found.first().copied()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_busy_pods_on_one_node_report_what_they_used() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    let base = std::env::temp_dir().join(format!("hami-monitor-seed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let hook = base.join("hook");
    let containers = hook.join("containers");
    let proc_root = base.join("proc");
    std::fs::create_dir_all(&containers).unwrap();
    std::fs::create_dir_all(&proc_root).unwrap();

    // Host GPUs: 8 × MI210 sysfs built from a real KFD capture, with live counters.
    let sys = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let (gpus, registered) = hami_monitor::host_gpus::amd_host(&sys.sysfs_root()).unwrap();
    let card = gpus[0].clone();
    // The DRM node a process of the card opens (fdinfo clients are attributed by it).
    let render = registered[0].render;
    let driver_dir = format!("bus/pci/drivers/amdgpu/{}", card.pci_bdf);
    sys.write(
        &format!("{driver_dir}/mem_info_vram_used"),
        &format!("{}\n", 3 * GIB),
    )
    .unwrap();
    sys.write(&format!("{driver_dir}/gpu_busy_percent"), "70\n")
        .unwrap();

    let nv = |uuid: &str| format!("{uuid},NVIDIA,8192,50:;");
    let amd = format!("{},{},16384,26:;", card.uuid, card.device_type);
    let cu = format!("{{\"{}\":\"0-25\"}}", card.uuid);
    let specs = [
        PodSpec {
            name: "nv-a",
            init: None,
            container: "main",
            annotations: vec![("hami.io/vgpu-devices-allocated", nv("GPU-aaaa"))],
        },
        PodSpec {
            name: "nv-b",
            init: Some("setup"),
            container: "main",
            annotations: vec![(
                "hami.io/vgpu-devices-allocated",
                format!("GPU-bbbb,NVIDIA,1024,10:;{}", nv("GPU-bbbb")),
            )],
        },
        PodSpec {
            name: "nv-c",
            init: None,
            container: "main",
            annotations: vec![("hami.io/vgpu-devices-allocated", nv("GPU-cccc"))],
        },
        PodSpec {
            name: "amd-d",
            init: None,
            container: "train",
            annotations: vec![
                ("hami.io/amd-devices-allocated", amd.clone()),
                ("hami.io/amd-cu-allocated", cu.clone()),
            ],
        },
        PodSpec {
            name: "amd-e",
            init: None,
            container: "infer",
            annotations: vec![("hami.io/amd-devices-allocated", amd.clone())],
        },
        PodSpec {
            name: "bad",
            init: None,
            container: "main",
            annotations: vec![],
        },
    ];
    let ids = [("train", cid(0xd1)), ("infer", cid(0xe1))];
    let mut uid = BTreeMap::new();
    for spec in &specs {
        uid.insert(spec.name, create_pod(&pods, spec, NODE, &ids).await);
    }
    let elsewhere = PodSpec {
        name: "other-node",
        init: None,
        container: "main",
        annotations: vec![],
    };
    let other_uid = create_pod(&pods, &elsewhere, "node-b", &[]).await;

    let dir = |pod: &str, ctr: &str| -> PathBuf {
        let d = containers.join(format!("{}_{ctr}", uid[pod]));
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    // Live host processes of the NVIDIA containers (the killed one, 4004, has no entry).
    for pid in [4001, 4002, 4101, 4201, 4301, 4302] {
        std::fs::create_dir_all(proc_root.join(pid.to_string())).unwrap();
    }
    let region = |uuid: &str, procs: &[common::Proc]| v1_region(2, &[uuid], &[8 * GIB], procs, 0);
    std::fs::write(
        dir("nv-a", "main").join("a1b2.cache"),
        region(
            "GPU-aaaa",
            &[
                proc(4001, 1, [(0, 2 * GIB), (1, 0)], [(0, 30), (1, 0)]),
                proc(4002, 1, [(0, GIB), (1, 0)], [(0, 25), (1, 0)]),
                proc(4003, 0, [(0, 5 * GIB), (1, 0)], [(0, 90), (1, 0)]),
                proc(4004, 1, [(0, 5 * GIB), (1, 0)], [(0, 40), (1, 0)]),
            ],
        ),
    )
    .unwrap();
    std::fs::write(dir("nv-a", "main").join("libvgpu.so"), "not a region").unwrap();
    std::fs::write(
        dir("nv-b", "setup").join("x.cache"),
        region(
            "GPU-bbbb",
            &[proc(4101, 1, [(0, GIB), (1, 0)], [(0, 10), (1, 0)])],
        ),
    )
    .unwrap();
    std::fs::write(
        dir("nv-b", "main").join("y.cache"),
        region(
            "GPU-bbbb",
            &[proc(4201, 1, [(0, 4 * GIB), (1, 0)], [(0, 80), (1, 0)])],
        ),
    )
    .unwrap();
    std::fs::write(
        dir("nv-c", "main").join("z.cache"),
        region(
            "GPU-cccc",
            &[
                proc(4301, 1, [(0, GIB), (1, 0)], [(0, 70), (1, 0)]),
                proc(4302, 1, [(0, GIB), (1, 0)], [(0, 60), (1, 0)]),
            ],
        ),
    )
    .unwrap();
    // Bad inputs: a truncated file, a zero-length file in another dir, a name without a pod.
    std::fs::write(
        dir("bad", "main").join("t.cache"),
        &region("GPU-dddd", &[])[..5000],
    )
    .unwrap();
    std::fs::write(dir("bad", "side").join("e.cache"), b"").unwrap();
    std::fs::create_dir_all(containers.join("no-underscore")).unwrap();
    let orphan = containers.join("0b0b0b0b-0000-0000-0000-000000000000_main");
    std::fs::create_dir_all(&orphan).unwrap();
    let foreign = containers.join(format!("{other_uid}_main"));
    std::fs::create_dir_all(&foreign).unwrap();

    // AMD: real hami-region sessions (as libamvgpu.so in the container would hold).
    let mut limits = Limits {
        bytes: [LIMIT_NONE; MAX_DEVICES],
    };
    limits.bytes[0] = 16 * GIB;
    let train = Session::attach(&dir("amd-d", "train").join("hipdevshr.cache"), &limits).unwrap();
    train.reserve(0, 3 * GIB).unwrap();
    let infer = Session::attach(&dir("amd-e", "infer").join("hipdevshr.cache"), &limits).unwrap();
    infer.reserve(0, GIB).unwrap();
    // train: one process at 40 %; infer: two processes at 15 % each, one client shared by
    // two descriptors (dup) that must count once.
    fake_process(&proc_root, 5001, &uid["amd-d"], &ids[0].1, &[3], render);
    fake_process(&proc_root, 5101, &uid["amd-e"], &ids[1].1, &[3, 4], render);
    fake_process(&proc_root, 5102, &uid["amd-e"], &ids[1].1, &[3], render);
    std::fs::create_dir_all(proc_root.join("1")).unwrap();
    std::fs::write(proc_root.join("1/cgroup"), "0::/init.scope\n").unwrap();
    let clients: Vec<(PathBuf, u64, f64)> = vec![
        (proc_root.join("5001/fdinfo/3"), 11, 0.40),
        (proc_root.join("5101/fdinfo/3"), 21, 0.15),
        (proc_root.join("5101/fdinfo/4"), 21, 0.15),
        (proc_root.join("5102/fdinfo/3"), 22, 0.15),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let pdev = card.pci_bdf.clone();
        let clients = clients.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let elapsed = start.elapsed().as_nanos() as f64;
                for (path, client, rate) in &clients {
                    write_atomically(path, &fdinfo_text(&pdev, *client, (elapsed * rate) as u64));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    // The writer has written every descriptor once.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !clients.iter().all(|(path, _, _)| path.exists()) {
        assert!(Instant::now() < deadline, "fdinfo writer never wrote");
        std::thread::sleep(Duration::from_millis(5));
    }

    let port = free_port();
    let config = ServeConfig {
        monitor: MonitorConfig {
            hook_path: hook.clone(),
            proc_root: proc_root.clone(),
            sys_root: sys.sysfs_root(),
            node_name: NODE.into(),
            gc_grace: Duration::ZERO,
            nvml_library: None,
        },
        bind: format!("127.0.0.1:{port}").parse().unwrap(),
        legacy_metrics: hami_monitor::metrics::LegacyMetrics::All,
        scheduler_name: "hami-scheduler".into(),
        refresh_interval: Duration::from_secs(1),
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let monitor = tokio::spawn(serve(config, client.clone(), async {
        let _ = rx.await;
    }));
    // AMD utilization needs two samples (two refreshes): wait until both AMD pods show it.
    let text = scrape_until(port, "AMD utilization", |all| {
        [("amd-d", "train"), ("amd-e", "infer")]
            .iter()
            .all(|(pod, ctr)| {
                value(
                    all,
                    "hami_container_device_utilization_ratio",
                    &[("pod", pod), ("container", ctr), ("zone", "vGPU")],
                )
                .is_some()
            })
    })
    .await;
    let all = samples(&text);
    let util = |pod: &str, ctr: &str| {
        value(
            &all,
            "hami_container_device_utilization_ratio",
            &[("pod", pod), ("container", ctr), ("zone", "vGPU")],
        )
    };

    // NVIDIA: Σ sm_util of live slots; exact.
    assert_eq!(
        util("nv-a", "main"),
        Some(55.0),
        "30 + 25; exited and killed processes excluded\n{text}"
    );
    assert_eq!(util("nv-b", "main"), Some(80.0));
    assert_eq!(
        util("nv-b", "setup"),
        Some(10.0),
        "init containers are reported"
    );
    assert_eq!(util("nv-c", "main"), Some(100.0), "70 + 60 clamped");
    assert_eq!(
        value(
            &all,
            "hami_container_device_utilization_clamped",
            &[("pod", "nv-c")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &all,
            "hami_container_device_utilization_clamped",
            &[("pod", "nv-a")]
        ),
        Some(0.0)
    );
    assert_eq!(
        value(
            &all,
            "Device_utilization_desc_of_container",
            &[
                ("podname", "nv-a"),
                ("ctrname", "main"),
                ("vdeviceid", "0"),
                ("deviceuuid", "GPU-aaaa")
            ]
        ),
        Some(55.0)
    );
    assert_eq!(
        value(&all, "hami_vgpu_memory_used_bytes", &[("pod", "nv-a")]),
        Some(3.0 * GIB as f64)
    );
    assert_eq!(
        value(
            &all,
            "hami_vgpu_memory_limit_bytes",
            &[
                ("pod", "nv-a"),
                ("device_uuid", "GPU-aaaa"),
                ("vdevice_index", "0")
            ]
        ),
        Some(8.0 * GIB as f64)
    );
    assert_eq!(
        value(&all, "hami_vgpu_memory_buffer_bytes", &[("pod", "nv-a")]),
        Some(1.5 * GIB as f64)
    );

    // AMD: busy rate of the container's DRM clients, ±3 points.
    let train_util = util("amd-d", "train").expect("amd-d utilization");
    assert!((train_util - 40.0).abs() <= 3.0, "amd-d {train_util}");
    let infer_util = util("amd-e", "infer").expect("amd-e utilization");
    assert!(
        (infer_util - 30.0).abs() <= 3.0,
        "amd-e {infer_util} (dup descriptor counted once)"
    );
    assert_eq!(
        value(
            &all,
            "hami_vgpu_memory_used_bytes",
            &[
                ("pod", "amd-d"),
                ("device_uuid", &card.uuid),
                ("vdevice_index", "0")
            ]
        ),
        Some(3.0 * GIB as f64)
    );
    assert_eq!(
        value(&all, "hami_vgpu_memory_limit_bytes", &[("pod", "amd-e")]),
        Some(16.0 * GIB as f64)
    );
    assert_eq!(
        value(
            &all,
            "hami_container_device_allocated_cores",
            &[("pod", "amd-d"), ("vendor", "AMD")]
        ),
        Some(26.0)
    );
    assert_eq!(
        value(
            &all,
            "hami_container_device_cu_mask_info",
            &[("pod", "amd-d"), ("cu_mask", "0-25")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &all,
            "hami_container_device_allocated_memory_bytes",
            &[("pod", "nv-b"), ("container", "setup")]
        ),
        Some(GIB as f64)
    );

    // Host GPUs from sysfs.
    assert_eq!(
        value(
            &all,
            "hami_host_gpu_memory_used_bytes",
            &[("device_uuid", &card.uuid), ("node", NODE)]
        ),
        Some(3.0 * GIB as f64)
    );
    assert_eq!(
        value(
            &all,
            "hami_host_gpu_utilization_ratio",
            &[("device_uuid", &card.uuid)]
        ),
        Some(70.0)
    );
    assert_eq!(
        value(
            &all,
            "HostCoreUtilization",
            &[("deviceuuid", &card.uuid), ("nodeid", NODE)]
        ),
        Some(70.0)
    );

    // Bad inputs are counted and skipped; the scrape as a whole succeeded.
    let err =
        |kind: &str| value(&all, "hami_monitor_errors_total", &[("kind", kind)]).unwrap_or(0.0);
    assert!(err("cache_truncated") >= 1.0, "{text}");
    assert!(err("cache_empty") >= 1.0);
    assert!(err("dir_bad_name") >= 1.0);
    assert_eq!(
        value(&all, "hami_build_info", &[]).map(|v| v > 0.0),
        Some(true)
    );
    assert!(
        all.iter()
            .filter(|(n, _, _)| n.starts_with("hami_") && n != "hami_build_info")
            .all(|(_, l, _)| l.get("zone").map(String::as_str) == Some("vGPU"))
    );
    assert!(!orphan.exists(), "directory of an unknown pod removed");
    assert!(!foreign.exists(), "directory of another node's pod removed");

    // A pod deleted mid-run: its series and directory go away.
    pods.delete("nv-c", &DeleteParams::default()).await.unwrap();
    let nv_c_dir = containers.join(format!("{}_main", uid["nv-c"]));
    let text = scrape_until(port, "nv-c's series and directory gone", |all| {
        value(
            all,
            "hami_container_device_utilization_ratio",
            &[("pod", "nv-c")],
        )
        .is_none()
            && !nv_c_dir.exists()
    })
    .await;
    let all = samples(&text);
    assert_eq!(
        value(
            &all,
            "hami_container_device_utilization_ratio",
            &[("pod", "nv-c")]
        ),
        None
    );
    assert!(!containers.join(format!("{}_main", uid["nv-c"])).exists());
    assert_eq!(
        value(
            &all,
            "hami_container_device_utilization_ratio",
            &[("pod", "nv-a")]
        ),
        Some(55.0)
    );

    // A killed AMD process: its slot's bytes stop counting at once.
    infer.abandon();
    let all = samples(&scrape(port).await);
    assert_eq!(
        value(&all, "hami_vgpu_memory_used_bytes", &[("pod", "amd-e")]),
        Some(0.0)
    );

    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let _ = tx.send(());
    monitor.await.unwrap().unwrap();
    drop(train);
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&base);
}
