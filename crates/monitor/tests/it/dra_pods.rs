//! DRA pods (issue 20): a pod whose GPU slice is a ResourceClaim (no `hami.io/*`
//! annotation) is reported with the same metric names and labels as a device-plugin pod.
//! The embedded API server holds the driver's ResourceSlice, the claim (allocated by the
//! scheduler, reserved for the pod, `status.devices` with the CU ranges the driver chose)
//! and the pod (its `resourceClaimStatuses`); the region is a real hami-region file at the
//! path the driver mounts (`<HOOK_PATH>/dra/claims/<claim uid>/hipdevshr.cache`,
//! `hami_dra_core::prepare`), attached and reserved as libamvgpu.so does. The monitor's own
//! informer, claim fetcher and HTTP server run; the fetcher lists only this node's slices
//! (by field selector, which the embedded server applies), never the other node's.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::scrape;
use hami_local_ports::free_port;
use hami_monitor::node_monitor::MonitorConfig;
use hami_monitor::server::{ServeConfig, serve};
use hami_region::layout::{LIMIT_NONE, MAX_DEVICES};
use hami_region::{Limits, Session};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

const NODE: &str = "node-d";
const DRIVER: &str = "amdgpu.hami-rs.io";
const GIB: u64 = 1 << 30;

/// A query string with `%XX` escapes (and `+`) decoded.
fn percent_decoded(query: &str) -> String {
    let bytes = query.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
                continue;
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

/// The value of the one sample of `name` whose labels are exactly `labels` (in any order).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    want.sort();
    let found: Vec<f64> = text
        .lines()
        .filter_map(|l| {
            let (head, value) = l.rsplit_once(' ')?;
            let (n, rest) = head.split_once('{')?;
            let mut got: Vec<String> = rest
                .strip_suffix('}')?
                .split(',')
                .map(str::to_owned)
                .collect();
            got.sort();
            (n == name && got == want).then(|| value.parse().unwrap())
        })
        .collect();
    assert!(found.len() <= 1, "{name} {labels:?}: {found:?}");
    found.first().copied()
}

async fn create_claim(api: &Api<ResourceClaim>, name: &str, pod_uid: &str, device: &str) -> String {
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
    }))
    .unwrap();
    let uid = api
        .create(&PostParams::default(), &claim)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let status = json!({"status": {
        "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE,
            "device": device, "shareID": "0f9c3b1e-2c4d-4e5f-8a6b-7c8d9e0f1a2b",
            "consumedCapacity": {"memory": "8Gi", "computeUnits": "20", "shares": "1"}}]}},
        "reservedFor": [{"resource": "pods", "name": "train", "uid": pod_uid}],
        "devices": [{"driver": DRIVER, "pool": NODE, "device": device,
            "shareID": "0f9c3b1e-2c4d-4e5f-8a6b-7c8d9e0f1a2b",
            "data": {"cuRanges": "20-39", "memoryBytes": 8 * GIB}}]
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    uid
}

fn attach(dir: &Path, limit: u64) -> Session {
    std::fs::create_dir_all(dir).unwrap();
    let mut limits = Limits {
        bytes: [LIMIT_NONE; MAX_DEVICES],
    };
    limits.bytes[0] = limit;
    Session::attach(&dir.join("hipdevshr.cache"), &limits).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_pods_claim_region_is_reported_with_the_slices_uuid() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();

    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let slice = |node: &str, uuid: &str| -> ResourceSlice {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-amdgpu-hami-rs-io-0")},
            "spec": {"driver": DRIVER, "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-1", "allowMultipleAllocations": true,
                    "attributes": {"uuid": {"string": uuid},
                        "productName": {"string": "AMD Instinct MI210"}},
                    "capacity": {"memory": {"value": "64Gi"}, "computeUnits": {"value": "104"},
                        "shares": {"value": "10"}}}]}
        }))
        .unwrap()
    };
    for (node, uuid) in [(NODE, "0xa1b2c3d4e5f60718"), ("node-other", "0xffff")] {
        slices
            .create(&PostParams::default(), &slice(node, uuid))
            .await
            .unwrap();
    }

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"nodeName": NODE,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "slice-8g"}],
            "containers": [
                {"name": "main", "image": "rocm", "resources": {"claims": [{"name": "gpu"}]}},
                {"name": "log", "image": "busybox"}]}
    }))
    .unwrap();
    let pod_uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim_uid = create_claim(&claims, "train-gpu-x7k2p", &pod_uid, "gpu-1").await;
    pods.patch_status(
        "train",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "train-gpu-x7k2p"}]}})),
    )
    .await
    .unwrap();

    let base = std::env::temp_dir().join(format!("hami-monitor-dra-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let hook = base.join("hook");
    std::fs::create_dir_all(hook.join("containers")).unwrap();
    std::fs::create_dir_all(base.join("proc")).unwrap();
    std::fs::create_dir_all(base.join("sys")).unwrap();
    let claims_dir = hook.join("dra/claims");
    // The claim's region, as the hook in the container holds it: 3 GiB of the 8 GiB.
    let session = attach(&claims_dir.join(&claim_uid), 8 * GIB);
    session.reserve(0, 3 * GIB).unwrap();
    // A claim directory no pod of this node uses (another pod's, already gone): not
    // reported, and not removed (the driver removes it at unprepare).
    let stranger = claims_dir.join("5c1a7e2b-0000-4000-8000-000000000000");
    let other = attach(&stranger, GIB);
    other.reserve(0, GIB / 2).unwrap();

    let port = free_port();
    let config = ServeConfig {
        monitor: MonitorConfig {
            hook_path: hook.clone(),
            proc_root: base.join("proc"),
            sys_root: base.join("sys"),
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

    let container = [
        ("namespace", "default"),
        ("pod", "train"),
        ("container", "main"),
        ("vdevice_index", "0"),
        ("device_uuid", "0xa1b2c3d4e5f60718"),
        ("zone", "vGPU"),
    ];
    let deadline = Instant::now() + Duration::from_secs(15);
    let text = loop {
        if let Some(text) = scrape(port).await
            && sample(&text, "hami_vgpu_memory_used_bytes", &container).is_some()
        {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the DRA container was never reported"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        sample(&text, "hami_vgpu_memory_used_bytes", &container),
        Some((3 * GIB) as f64)
    );
    assert_eq!(
        sample(&text, "hami_container_device_memory_bytes", &container),
        Some((3 * GIB) as f64)
    );
    assert_eq!(
        sample(&text, "hami_vgpu_memory_limit_bytes", &container),
        Some((8 * GIB) as f64)
    );
    // Seed names carry the same reading.
    assert_eq!(
        sample(
            &text,
            "vGPU_device_memory_usage_in_bytes",
            &[
                ("podnamespace", "default"),
                ("podname", "train"),
                ("ctrname", "main"),
                ("vdeviceid", "0"),
                ("deviceuuid", "0xa1b2c3d4e5f60718"),
                ("zone", "vGPU"),
            ]
        ),
        Some((3 * GIB) as f64)
    );
    // What the claim granted, from allocation time, and the CU ranges the driver chose.
    let mut granted = container.to_vec();
    granted.push(("vendor", "AMD"));
    assert_eq!(
        sample(
            &text,
            "hami_container_device_allocated_memory_bytes",
            &granted
        ),
        Some((8 * GIB) as f64)
    );
    assert_eq!(
        sample(&text, "hami_container_device_allocated_cores", &granted),
        Some(20.0)
    );
    let mut mask = granted.clone();
    mask.push(("cu_mask", "20-39"));
    assert_eq!(
        sample(&text, "hami_container_device_cu_mask_info", &mask),
        Some(1.0)
    );
    // Neither the other container, nor the stranger's region, nor the other node's uuid.
    assert!(!text.contains("container=\"log\""), "{text}");
    assert!(!text.contains("0xffff"), "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("hami_vgpu_memory_used_bytes{"))
            .count(),
        1,
        "{text}"
    );
    assert!(stranger.join("hipdevshr.cache").exists());
    assert!(!text.contains("kind=\"dra_claim\""), "{text}");
    // The slices were listed, and only through this node's and driver's field selector:
    // the server never sent the other node's slice (its uuid above is not merely hidden).
    let lists: Vec<String> = server
        .request_log()
        .into_iter()
        .filter(|r| r.resource == "resourceslices" && r.verb != "create")
        .map(|r| format!("{} {}", r.verb, percent_decoded(&r.query)))
        .collect();
    assert!(!lists.is_empty(), "the slices were never listed");
    for l in &lists {
        assert!(
            l.starts_with("list ")
                && l.contains(&format!(
                    "fieldSelector=spec.nodeName={NODE},spec.driver={DRIVER}"
                )),
            "{lists:?}"
        );
    }

    let _ = tx.send(());
    monitor.await.unwrap().unwrap();
    drop(session);
    drop(other);
    let _ = std::fs::remove_dir_all(&base);
}

/// A claim whose `consumedCapacity` is not a whole quantity (here `1500m` bytes, a valid
/// Kubernetes quantity) is refused by the driver's prepare; the monitor reports it as
/// unreadable (`hami_monitor_errors_total{kind="dra_claim_unreadable"}`), never as the
/// whole GPU held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_consumed_capacity_cannot_be_read_is_reported_unreadable_not_held() {
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let slice: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{NODE}-amdgpu-hami-rs-io-0")},
        "spec": {"driver": DRIVER, "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-1", "allowMultipleAllocations": true,
                "attributes": {"uuid": {"string": "0xa1b2c3d4e5f60718"},
                    "productName": {"string": "AMD Instinct MI210"}},
                "capacity": {"memory": {"value": "64Gi"}, "computeUnits": {"value": "104"},
                    "shares": {"value": "10"}}}]}
    }))
    .unwrap();
    slices.create(&PostParams::default(), &slice).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "odd", "namespace": "default"},
        "spec": {"nodeName": NODE,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "odd-gpu"}],
            "containers": [{"name": "main", "image": "rocm", "resources": {"claims": [{"name": "gpu"}]}}]}
    }))
    .unwrap();
    let pod_uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    pods.patch_status(
        "odd",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Pending"}})),
    )
    .await
    .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "odd-gpu", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let status = json!({"status": {
        "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE,
            "device": "gpu-1", "shareID": "0f9c3b1e-2c4d-4e5f-8a6b-7c8d9e0f1a2b",
            "consumedCapacity": {"memory": "1500m", "computeUnits": "20", "shares": "1"}}]}},
        "reservedFor": [{"resource": "pods", "name": "odd", "uid": pod_uid}]
    }});
    claims
        .patch_status("odd-gpu", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();

    let base = std::env::temp_dir().join(format!("hami-monitor-dra-odd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    for dir in ["hook/containers", "proc", "sys"] {
        std::fs::create_dir_all(base.join(dir)).unwrap();
    }
    let port = free_port();
    let config = ServeConfig {
        monitor: MonitorConfig {
            hook_path: base.join("hook"),
            proc_root: base.join("proc"),
            sys_root: base.join("sys"),
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
    let unreadable = [("zone", "vGPU"), ("kind", "dra_claim_unreadable")];
    let deadline = Instant::now() + Duration::from_secs(15);
    let text = loop {
        let text = scrape(port).await.unwrap_or_default();
        // Either answer the monitor may give: the claim counted unreadable, or held.
        if sample(&text, "hami_monitor_errors_total", &unreadable).is_some()
            || text.contains("pod=\"odd\"")
        {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the unreadable claim was never reported:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("hami_container_device_allocated") && l.contains("pod=\"odd\"")),
        "a claim the driver refuses is reported as held:\n{text}"
    );
    assert!(
        sample(&text, "hami_monitor_errors_total", &unreadable).is_some(),
        "{text}"
    );
    let _ = tx.send(());
    monitor.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&base);
}
