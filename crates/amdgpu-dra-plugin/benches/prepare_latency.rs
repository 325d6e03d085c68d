//! Prepare latency as kubelet sees it: NodePrepareResources of one claim over the plugin's
//! unix socket (claim read, CU choice, hook config + CDI spec written atomically, claim
//! status.devices written, checkpoint saved with fsync), then NodeUnprepareResources, on the
//! MI210 capture with up to 9 claims held per GPU.
//!
//! `SOURCE=memory` (default): claims in an in-memory source, no API server round trip.
//! `SOURCE=api`: the claims live in the embedded API server (its own runtime and threads, as
//! a separate process would be), created and then allocated + reserved through the status
//! subresource the way the simulated kube-scheduler writes them, and the driver reads and
//! writes them with the production `KubeClaims` over a kube Client; each claim is deleted
//! after its unprepare, as its pod's deletion would.
//!
//! Each prepare is split into phases by timing the claim source's calls: request in (gRPC,
//! driver lock, checkpoint lookup), claim GET, status write (KubeClaims: a merge PATCH
//! against the version the GET read; it runs alongside the file writes), and everything
//! after the GET (CU choice, hook config, region file and CDI spec ∥ the status write,
//! checkpoint rewrite and fsync, gRPC answer).
//! `DMEM=1`: also the dmem limit, as on a node whose cgroup root lists the controller: a
//! cgroup tree in the bench's directory (systemd driver layout), each claim's pod cgroup
//! made before its prepare (kubelet's order) and removed after its unprepare; the limit is
//! written into the pod's `dmem.max` before the answer, and checked. (A plain directory
//! tree, not cgroupfs: the walk and write cost the same system calls; the kernel's own work
//! behind a cgroupfs write is not in it.)
//! Run: `[SOURCE=api] [DMEM=1] cargo bench -p hami-amdgpu-dra-plugin --bench prepare_latency`
//! (CLAIMS=n, default 2000).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hami_amd_discovery::discovery::discover;
use hami_amd_discovery::registration::{RegistrationSettings, register};
use hami_amdgpu_dra_plugin::claims::{ClaimSource, KubeClaims, claim_key, resource_claims};
use hami_amdgpu_dra_plugin::dra_v1::dra_plugin_client::DraPluginClient;
use hami_amdgpu_dra_plugin::dra_v1::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use hami_amdgpu_dra_plugin::driver::{Driver, DriverConfig};
use hami_amdgpu_dra_plugin::registration::{Sockets, serve};
use hami_dra_core::api::*;
use hami_dra_core::prepare::PrepareSettings;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

#[derive(Clone, Default)]
struct MemoryClaims(Arc<Mutex<BTreeMap<String, ResourceClaim>>>);

impl ClaimSource for MemoryClaims {
    async fn get(&self, _: &str, name: &str) -> Result<ResourceClaim, String> {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .ok_or_else(|| "not found".into())
    }

    async fn set_device_status(
        &self,
        seen: &ResourceClaim,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), String> {
        let (_, name, _) = claim_key(seen)?;
        let mut claims = self.0.lock().unwrap();
        let c = claims.get_mut(name).ok_or("not found")?;
        let status = c.status.get_or_insert_default();
        status.devices.retain(|d| d.driver != driver);
        status.devices.extend_from_slice(devices);
        Ok(())
    }
}

/// When the last prepare's claim source calls started and ended.
#[derive(Default, Clone, Copy)]
struct Marks {
    get: Option<(Instant, Instant)>,
    set: Option<(Instant, Instant)>,
}

/// A claim source that records when its calls ran (prepare calls are serialised by the
/// driver, so the marks are those of the one prepare in flight).
#[derive(Clone)]
struct Timed<C> {
    inner: C,
    marks: Arc<Mutex<Marks>>,
}

impl<C: ClaimSource> ClaimSource for Timed<C> {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        let t = Instant::now();
        let r = self.inner.get(namespace, name).await;
        self.marks.lock().unwrap().get = Some((t, Instant::now()));
        r
    }

    async fn set_device_status(
        &self,
        seen: &ResourceClaim,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), String> {
        let t = Instant::now();
        let r = self.inner.set_device_status(seen, driver, devices).await;
        self.marks.lock().unwrap().set = Some((t, Instant::now()));
        r
    }
}

/// The allocation and reservation kube-scheduler writes for claim `i` on `device`.
fn scheduled_status(i: usize, device: &str) -> ResourceClaimStatus {
    ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: vec![DeviceRequestAllocationResult {
                    request: "gpu".into(),
                    driver: hami_dra_core::DRIVER.into(),
                    pool: "n".into(),
                    device: device.into(),
                    share_id: Some(format!("5f0c3e2a-0000-4000-8000-{i:012}")),
                    consumed_capacity: [("memory", "2Gi"), ("computeUnits", "10"), ("shares", "1")]
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    ..Default::default()
                }],
                config: vec![],
            }),
            ..Default::default()
        }),
        reserved_for: vec![ResourceClaimConsumerReference {
            api_group: None,
            resource: "pods".into(),
            name: format!("p{i}"),
            uid: format!("pod-{i}"),
        }],
        devices: vec![],
    }
}

fn memory_claim(i: usize, device: &str) -> ResourceClaim {
    ResourceClaim {
        api_version: API_VERSION.into(),
        kind: "ResourceClaim".into(),
        metadata: ObjectMeta {
            name: Some(format!("c{i}")),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{i}")),
            ..Default::default()
        },
        spec: ResourceClaimSpec::default(),
        status: Some(scheduled_status(i, device)),
    }
}

/// Where the claims live.
enum Source {
    Memory(MemoryClaims),
    Api {
        /// The simulated kube-scheduler's own client (claim writes are not timed).
        scheduler: Box<Api<DynamicObject>>,
        /// Keeps the server's runtime alive; dropping it stops the server.
        _server: ServerThread,
    },
}

impl Source {
    /// Creates claim `i`, allocated on `device` and reserved; returns its UID.
    async fn add(&self, i: usize, device: &str) -> String {
        match self {
            Source::Memory(m) => {
                m.0.lock()
                    .unwrap()
                    .insert(format!("c{i}"), memory_claim(i, device));
                format!("uid-{i}")
            }
            Source::Api { scheduler, .. } => {
                let name = format!("c{i}");
                let claim: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": API_VERSION, "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                        "deviceClassName": "amdgpu-slice", "allocationMode": "ExactCount",
                        "count": 1}}]}}
                }))
                .unwrap();
                let uid = scheduler
                    .create(&PostParams::default(), &claim)
                    .await
                    .unwrap()
                    .metadata
                    .uid
                    .unwrap();
                // Status on create is dropped (as upstream): allocation and reservation go
                // through the status subresource, as kube-scheduler writes them.
                let status = serde_json::to_value(scheduled_status(i, device)).unwrap();
                scheduler
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": status})),
                    )
                    .await
                    .unwrap();
                uid
            }
        }
    }

    /// The claim's pod is gone: the claim is deleted (after its unprepare).
    async fn remove(&self, i: usize) {
        match self {
            Source::Memory(m) => {
                m.0.lock().unwrap().remove(&format!("c{i}"));
            }
            Source::Api { scheduler, .. } => {
                scheduler
                    .delete(&format!("c{i}"), &DeleteParams::default())
                    .await
                    .unwrap();
            }
        }
    }
}

/// The embedded API server on its own runtime and threads, as a separate process would be.
struct ServerThread {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerThread {
    fn start() -> (Self, String) {
        let (url_tx, url_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
                    .await
                    .expect("server starts");
                url_tx.send(server.url()).unwrap();
                let _ = stop_rx.await;
                drop(server);
            });
        });
        let url = url_rx.recv().expect("the server thread sends its URL");
        (
            ServerThread {
                stop: Some(stop),
                thread: Some(thread),
            },
            url,
        )
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bench());
}

async fn bench() {
    let n: usize = std::env::var("CLAIMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let mode = std::env::var("SOURCE").unwrap_or_else(|_| "memory".into());
    let marks = Arc::new(Mutex::new(Marks::default()));
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let d = discover(&tree.sysfs_root()).unwrap();
    let reg = register(&d, &RegistrationSettings::default(), |_| true);
    let devices: BTreeMap<_, _> = hami_dra_core::slice::registered_by_name(&d, &reg)
        .into_iter()
        .map(|(k, v)| (k, v.clone()))
        .collect();
    let names: Vec<String> = devices.keys().cloned().collect();
    let dir = tree.sysfs_root().parent().unwrap().join("node");
    let dmem = std::env::var("DMEM").is_ok_and(|v| v == "1");
    let cgroups = dir.join("cgroup");
    let burstable = cgroups.join("kubepods.slice/kubepods-burstable.slice");
    if dmem {
        std::fs::create_dir_all(&burstable).unwrap();
        std::fs::write(cgroups.join("cgroup.controllers"), "cpu memory dmem\n").unwrap();
    }
    // The pod cgroup of claim i's pod (`pod-{i}`), as kubelet's systemd driver names it.
    let pod_cgroup = |i: usize| burstable.join(format!("kubepods-burstable-podpod_{i}.slice"));
    let config = DriverConfig {
        settings: PrepareSettings {
            driver: hami_dra_core::DRIVER.into(),
            node: "n".into(),
            hook_host_path: "/usr/local/vgpu/libamvgpu.so".into(),
            hook_container_path: "/usr/local/vgpu/libamvgpu.so".into(),
            cache_host_root: dir.join("vgpu").display().to_string(),
        },
        devices,
        cdi_dir: dir.join("cdi"),
        checkpoint: dir.join("plugin/checkpoint.json"),
        dmem: dmem
            .then(|| hami_amd_plugin::dmem::spawn_writer(cgroups.clone(), Duration::from_secs(10))),
    };
    let sockets = Sockets::new(
        &dir.join("registry"),
        &dir.join("plugin"),
        hami_dra_core::DRIVER,
    );
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = rx.await;
    };
    let (source, handle) = match mode.as_str() {
        "memory" => {
            let claims = MemoryClaims::default();
            let timed = Timed {
                inner: claims.clone(),
                marks: marks.clone(),
            };
            let driver = Arc::new(Driver::new(config, timed).unwrap());
            let (_s, handle) = serve(driver, hami_dra_core::DRIVER, &sockets, shutdown)
                .await
                .unwrap();
            (Source::Memory(claims), handle)
        }
        "api" => {
            let (server, url) = ServerThread::start();
            let client =
                || kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
            let timed = Timed {
                inner: KubeClaims { client: client() },
                marks: marks.clone(),
            };
            let driver = Arc::new(Driver::new(config, timed).unwrap());
            let (_s, handle) = serve(driver, hami_dra_core::DRIVER, &sockets, shutdown)
                .await
                .unwrap();
            let scheduler = Api::namespaced_with(client(), "default", &resource_claims());
            (
                Source::Api {
                    scheduler: Box::new(scheduler),
                    _server: server,
                },
                handle,
            )
        }
        other => panic!("SOURCE={other:?}: expected memory or api"),
    };
    println!(
        "claim source: {mode}, {n} claims, fixture MI210 XGMI ({} GPUs), dmem {}",
        names.len(),
        if dmem { "on" } else { "off" }
    );
    let mut client = DraPluginClient::new(
        hami_deviceplugin_api::connect_unix(&sockets.dra)
            .await
            .unwrap(),
    );
    let kc = |i: usize, uid: &str| Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: format!("c{i}"),
    };
    // Keep up to 9 claims per GPU prepared (a busy node), unpreparing the oldest.
    let window = 9 * names.len();
    let mut uids = Vec::with_capacity(n);
    let mut prepare = Vec::with_capacity(n);
    let mut phases: [Vec<Duration>; 4] = Default::default();
    let mut unprepare = Vec::with_capacity(n);
    for i in 0..n {
        let uid = source.add(i, &names[i % names.len()]).await;
        if dmem {
            std::fs::create_dir_all(pod_cgroup(i)).unwrap();
            std::fs::write(pod_cgroup(i).join("dmem.max"), "").unwrap();
        }
        *marks.lock().unwrap() = Marks::default();
        let t = Instant::now();
        let r = client
            .node_prepare_resources(NodePrepareResourcesRequest {
                claims: vec![kc(i, &uid)],
            })
            .await
            .unwrap()
            .into_inner();
        let end = Instant::now();
        prepare.push(end - t);
        assert_eq!(r.claims[&uid].error, "", "claim c{i}");
        if dmem {
            let limit = std::fs::read_to_string(pod_cgroup(i).join("dmem.max")).unwrap();
            assert!(
                limit.contains(&format!(" {}\n", 2u64 << 30)),
                "claim c{i}'s pod: dmem.max {limit:?}"
            );
        }
        let m = *marks.lock().unwrap();
        let (g, s) = (m.get.expect("claim read"), m.set.expect("status written"));
        for (v, (a, b)) in phases.iter_mut().zip([(t, g.0), g, s, (g.1, end)]) {
            v.push(b - a);
        }
        uids.push(uid);
        if i >= window {
            let j = i - window;
            let t = Instant::now();
            let r = client
                .node_unprepare_resources(NodeUnprepareResourcesRequest {
                    claims: vec![kc(j, &uids[j])],
                })
                .await
                .unwrap()
                .into_inner();
            unprepare.push(t.elapsed());
            assert_eq!(r.claims[&uids[j]].error, "", "claim c{j}");
            source.remove(j).await;
            if dmem {
                std::fs::remove_dir_all(pod_cgroup(j)).unwrap();
            }
        }
    }
    report("NodePrepareResources", &mut prepare);
    for (what, v) in [
        "  request in (gRPC, lock)",
        "  claim GET",
        "  status write (alongside the files)",
        "  after the GET: plan, files ∥ status, checkpoint, reply",
    ]
    .into_iter()
    .zip(phases.iter_mut())
    {
        report(what, v);
    }
    report("NodeUnprepareResources", &mut unprepare);
    let _ = stop.send(());
    let _ = handle.await;
    drop(source);
}

fn report(what: &str, v: &mut [Duration]) {
    v.sort();
    let q = |p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)];
    println!(
        "{what}: {} calls, p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        v.len(),
        q(0.5).as_secs_f64() * 1e3,
        q(0.99).as_secs_f64() * 1e3,
        v[v.len() - 1].as_secs_f64() * 1e3
    );
}
