//! Prepare latency as kubelet sees it: NodePrepareResources of one claim over the plugin's
//! unix socket (claim read, CU choice, hook config + CDI spec written atomically with
//! fsync, checkpoint saved), then NodeUnprepareResources, on the MI210 capture with up to
//! 9 claims held per GPU. The claim source is in memory (the API server round trips, the claim
//! read and the status.devices write, are not in the figure).
//! Run: `cargo bench -p hami-amdgpu-dra-plugin --bench prepare_latency` (CLAIMS=n).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hami_amd_discovery::discovery::discover;
use hami_amd_discovery::registration::{RegistrationSettings, register};
use hami_amdgpu_dra_plugin::claims::ClaimSource;
use hami_amdgpu_dra_plugin::dra_v1::dra_plugin_client::DraPluginClient;
use hami_amdgpu_dra_plugin::dra_v1::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use hami_amdgpu_dra_plugin::driver::{Driver, DriverConfig};
use hami_amdgpu_dra_plugin::registration::{Sockets, serve};
use hami_dra_core::api::*;
use hami_dra_core::prepare::PrepareSettings;

#[derive(Clone, Default)]
struct Claims(Arc<Mutex<BTreeMap<String, ResourceClaim>>>);

impl ClaimSource for Claims {
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
        _: &str,
        name: &str,
        _: &str,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), String> {
        let mut claims = self.0.lock().unwrap();
        let c = claims.get_mut(name).ok_or("not found")?;
        let status = c.status.get_or_insert_default();
        status.devices.retain(|d| d.driver != driver);
        status.devices.extend_from_slice(devices);
        Ok(())
    }
}

fn claim(i: usize, device: &str) -> ResourceClaim {
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
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: vec![DeviceRequestAllocationResult {
                        request: "gpu".into(),
                        driver: hami_dra_core::DRIVER.into(),
                        pool: "n".into(),
                        device: device.into(),
                        consumed_capacity: [
                            ("memory", "2Gi"),
                            ("computeUnits", "10"),
                            ("shares", "1"),
                        ]
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
        }),
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
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let d = discover(&tree.sysfs_root()).unwrap();
    let reg = register(&d, &RegistrationSettings::default(), |_| true);
    let devices: BTreeMap<_, _> = hami_dra_core::slice::registered_by_name(&d, &reg)
        .into_iter()
        .map(|(k, v)| (k, v.clone()))
        .collect();
    let names: Vec<String> = devices.keys().cloned().collect();
    let dir = tree.sysfs_root().parent().unwrap().join("node");
    let claims = Claims::default();
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
        dmem: None,
    };
    let driver = Arc::new(Driver::new(config, claims.clone()).unwrap());
    let sockets = Sockets::new(
        &dir.join("registry"),
        &dir.join("plugin"),
        hami_dra_core::DRIVER,
    );
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let (_s, handle) = serve(driver, hami_dra_core::DRIVER, &sockets, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let mut client = DraPluginClient::new(
        hami_deviceplugin_api::connect_unix(&sockets.dra)
            .await
            .unwrap(),
    );
    let kc = |i: usize| Claim {
        namespace: "default".into(),
        uid: format!("uid-{i}"),
        name: format!("c{i}"),
    };
    // Keep up to 9 claims per GPU prepared (a busy node), unpreparing the oldest.
    let window = 9 * names.len();
    let mut prepare = Vec::with_capacity(n);
    let mut unprepare = Vec::with_capacity(n);
    for i in 0..n {
        claims
            .0
            .lock()
            .unwrap()
            .insert(format!("c{i}"), claim(i, &names[i % names.len()]));
        let t = Instant::now();
        let r = client
            .node_prepare_resources(NodePrepareResourcesRequest {
                claims: vec![kc(i)],
            })
            .await
            .unwrap()
            .into_inner();
        prepare.push(t.elapsed());
        assert_eq!(r.claims[&format!("uid-{i}")].error, "");
        if i >= window {
            let j = i - window;
            let t = Instant::now();
            let r = client
                .node_unprepare_resources(NodeUnprepareResourcesRequest {
                    claims: vec![kc(j)],
                })
                .await
                .unwrap()
                .into_inner();
            unprepare.push(t.elapsed());
            assert_eq!(r.claims[&format!("uid-{j}")].error, "");
        }
    }
    report("NodePrepareResources", &mut prepare);
    report("NodeUnprepareResources", &mut unprepare);
    let _ = stop.send(());
    let _ = handle.await;
}

fn report(what: &str, v: &mut [Duration]) {
    v.sort();
    let q = |p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)];
    println!(
        "{what}: {} calls, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        v.len(),
        q(0.5).as_secs_f64() * 1e3,
        q(0.99).as_secs_f64() * 1e3,
        v[v.len() - 1].as_secs_f64() * 1e3
    );
}
