//! The plugin over real unix sockets, with a tonic client in kubelet's role: registration,
//! prepare (files on disk, disjoint CUs), idempotence, unprepare after a plugin restart and
//! after the claim is deleted, per-claim errors.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hami_amd_discovery::discovery::discover;
use hami_amd_discovery::registration::{RegistrationSettings, register};
use hami_amdgpu_dra_plugin::claims::{ClaimSource, claim_key};
use hami_amdgpu_dra_plugin::dra_v1::dra_plugin_client::DraPluginClient;
use hami_amdgpu_dra_plugin::dra_v1::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use hami_amdgpu_dra_plugin::driver::{Driver, DriverConfig};
use hami_amdgpu_dra_plugin::pluginregistration::registration_client::RegistrationClient;
use hami_amdgpu_dra_plugin::pluginregistration::{InfoRequest, RegistrationStatus};
use hami_amdgpu_dra_plugin::registration::{Sockets, serve};
use hami_deviceplugin_api::connect_unix;
use hami_dra_core::api::*;
use hami_dra_core::prepare::PrepareSettings;
use hami_protocol::cu_list::CuSet;

/// The API server's claims as the test sets them (deletable, to test unprepare of a gone claim).
#[derive(Clone, Default)]
struct Claims(Arc<Mutex<BTreeMap<(String, String), ResourceClaim>>>);

impl ClaimSource for Claims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        self.0
            .lock()
            .unwrap()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| format!("resourceclaims \"{name}\" not found"))
    }

    async fn set_device_status(
        &self,
        seen: &ResourceClaim,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), String> {
        let (namespace, name, uid) = claim_key(seen)?;
        let mut claims = self.0.lock().unwrap();
        let c = claims
            .get_mut(&(namespace.to_string(), name.to_string()))
            .ok_or_else(|| format!("resourceclaims \"{name}\" not found"))?;
        if c.metadata.uid.as_deref() != Some(uid) {
            return Err(format!("resourceclaims \"{name}\" has another UID"));
        }
        let status = c.status.get_or_insert_default();
        status.devices.retain(|d| d.driver != driver);
        status.devices.extend_from_slice(devices);
        Ok(())
    }
}

fn claim(name: &str, uid: &str, device: &str, mem: &str, cus: &str) -> ResourceClaim {
    ResourceClaim {
        api_version: API_VERSION.into(),
        kind: "ResourceClaim".into(),
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: ResourceClaimSpec::default(),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: vec![DeviceRequestAllocationResult {
                        request: "gpu".into(),
                        driver: hami_dra_core::DRIVER.into(),
                        pool: "node-a".into(),
                        device: device.into(),
                        share_id: Some(format!("share-{uid}")),
                        consumed_capacity: [
                            ("memory", mem),
                            ("computeUnits", cus),
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
                name: format!("pod-{name}"),
                uid: format!("pod-{uid}"),
            }],
            devices: vec![],
        }),
    }
}

fn kclaim(name: &str, uid: &str) -> Claim {
    Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

struct Node {
    _tree: hami_sysfs_fixtures::FixtureTree,
    dir: std::path::PathBuf,
    devices: BTreeMap<String, hami_amd_discovery::registration::RegisteredDevice>,
}

fn node() -> Node {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let d = discover(&tree.sysfs_root()).unwrap();
    let reg = register(&d, &RegistrationSettings::default(), |_| true);
    let devices = hami_dra_core::slice::registered_by_name(&d, &reg)
        .into_iter()
        .map(|(k, v)| (k, v.clone()))
        .collect();
    let dir = tree.sysfs_root().parent().unwrap().join("node");
    Node {
        _tree: tree,
        dir,
        devices,
    }
}

fn config(n: &Node) -> DriverConfig {
    DriverConfig {
        settings: PrepareSettings {
            driver: hami_dra_core::DRIVER.into(),
            node: "node-a".into(),
            hook_host_path: "/usr/local/vgpu/libamvgpu.so".into(),
            hook_container_path: "/usr/local/vgpu/libamvgpu.so".into(),
            cache_host_root: n.dir.join("vgpu").display().to_string(),
        },
        devices: n.devices.clone(),
        cdi_dir: n.dir.join("cdi"),
        checkpoint: n.dir.join("plugin/checkpoint.json"),
        dmem: None,
    }
}

struct Running {
    sockets: Sockets,
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<()>,
    state: hami_amdgpu_dra_plugin::registration::RegistrationState,
}

async fn start<C: ClaimSource>(n: &Node, claims: C) -> Running {
    let driver = Arc::new(Driver::new(config(n), claims).unwrap());
    let sockets = Sockets::new(
        &n.dir.join("plugins_registry"),
        &n.dir.join("plugin"),
        hami_dra_core::DRIVER,
    );
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let (state, handle) = serve(driver, hami_dra_core::DRIVER, &sockets, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    Running {
        sockets,
        stop,
        handle,
        state,
    }
}

async fn stop(r: Running) {
    let _ = r.stop.send(());
    tokio::time::timeout(Duration::from_secs(10), r.handle)
        .await
        .unwrap()
        .unwrap();
}

async fn dra(path: &Path) -> DraPluginClient<tonic::transport::Channel> {
    DraPluginClient::new(connect_unix(path).await.unwrap())
}

#[tokio::test]
async fn kubelet_registers_prepares_and_unprepares_across_restarts() {
    let n = node();
    let claims = Claims::default();
    for (name, uid, mem, cus) in [("a", "uid-a", "4Gi", "40"), ("b", "uid-b", "2Gi", "30")] {
        claims.0.lock().unwrap().insert(
            ("default".into(), name.into()),
            claim(name, uid, "gpu-0", mem, cus),
        );
    }
    let mut run = start(&n, claims.clone()).await;

    // Registration as kubelet's plugin watcher does it.
    let mut reg = RegistrationClient::new(connect_unix(&run.sockets.registration).await.unwrap());
    let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, hami_dra_core::DRIVER);
    assert_eq!(info.endpoint, run.sockets.dra.display().to_string());
    assert_eq!(info.supported_versions, vec!["v1.DRAPlugin".to_string()]);
    reg.notify_registration_status(RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(5), run.state.wait_for(|s| s.is_some()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*run.state.borrow(), Some(Ok(())));

    let mut client = dra(&run.sockets.dra).await;
    let resp = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![
                kclaim("a", "uid-a"),
                kclaim("b", "uid-b"),
                kclaim("gone", "uid-x"),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims.len(), 3, "every claim gets an entry");
    assert!(
        resp.claims["uid-x"].error.contains("not found"),
        "{:?}",
        resp.claims["uid-x"]
    );
    let a = &resp.claims["uid-a"];
    assert_eq!(a.error, "");
    assert_eq!(a.devices[0].device_name, "gpu-0");
    assert_eq!(a.devices[0].pool_name, "node-a");
    assert_eq!(
        a.devices[0].cdi_device_ids,
        vec!["k8s.amdgpu.hami-rs.io/claim=uid-a-gpu-0".to_string()]
    );

    // The claim's status.devices names the device and its CU range.
    let st = claims.0.lock().unwrap()[&("default".to_string(), "a".to_string())]
        .status
        .clone()
        .unwrap();
    assert_eq!(st.devices.len(), 1, "{st:?}");
    assert_eq!(st.devices[0].device, "gpu-0");
    assert!(st.devices[0].data.as_ref().unwrap()["cuRanges"].is_string());

    // Files on disk: the CDI spec with the slice's env, the read-only hook config.
    let cdi_a = n.dir.join("cdi/k8s.amdgpu.hami-rs.io-claim_uid-a.json");
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&cdi_a).unwrap()).unwrap();
    let env: Vec<&str> = spec["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(env.contains(&"HIP_DEVICE_MEMORY_LIMIT_0=4096m"), "{env:?}");
    assert!(env.iter().any(|e| e.starts_with("HSA_CU_MASK=0:")));
    let hook = n.dir.join("vgpu/.hook-config/claim_uid-a.conf");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&hook).unwrap().permissions().mode() & 0o777,
        0o444
    );
    let conf = hami_protocol::hook_config::decode(&std::fs::read(&hook).unwrap()).unwrap();
    assert_eq!(conf.memory_limits[&0], 4 << 30);
    // The region file the CDI spec mounts exists (sized as a region), and the hook
    // config pins its inode (a missing mount source would fail the container's start).
    let mounted: Vec<&str> = spec["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["hostPath"].as_str())
        .filter(|p| p.ends_with("hipdevshr.cache"))
        .collect();
    assert_eq!(mounted.len(), 1, "{spec}");
    let region = std::fs::metadata(mounted[0]).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(region.is_file() && region.len() > 0, "{}", mounted[0]);
    assert_eq!(conf.shared_cache_inode, Some(region.ino()));

    // Disjoint CUs, recorded in the checkpoint.
    let cp: serde_json::Value = serde_json::to_value(checkpoint_on_disk(&n)).unwrap();
    let cus = |uid: &str| {
        CuSet::parse(
            cp["claims"][uid]["devices"][0]["cus"].as_str().unwrap(),
            u32::MAX,
        )
        .unwrap()
    };
    assert!(!cus("uid-a").overlaps(&cus("uid-b")));
    assert_eq!(cus("uid-a").len() + cus("uid-b").len(), 70);

    // Idempotent: the same answer again, nothing re-chosen.
    let again = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("a", "uid-a")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims["uid-a"], *a);
    let cp2: serde_json::Value = serde_json::to_value(checkpoint_on_disk(&n)).unwrap();
    assert_eq!(cp, cp2);

    // Plugin restart, claim a deleted from the API server: unprepare still works.
    stop(run).await;
    claims
        .0
        .lock()
        .unwrap()
        .remove(&("default".into(), "a".into()));
    claims.0.lock().unwrap().insert(
        ("default".into(), "c".into()),
        claim("c", "uid-c", "gpu-0", "1Gi", "40"),
    );
    let run = start(&n, claims.clone()).await;
    let mut client = dra(&run.sockets.dra).await;
    // What a prepare of "never" that failed (or never answered) before recording it left.
    let never = [
        n.dir.join("cdi/k8s.amdgpu.hami-rs.io-claim_uid-never.json"),
        n.dir.join("vgpu/.hook-config/claim_uid-never.conf"),
        n.dir.join("vgpu/claims/uid-never/hipdevshr.cache"),
    ];
    for f in &never {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, b"left over").unwrap();
    }
    let un = client
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![kclaim("a", "uid-a"), kclaim("never", "uid-never")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims.len(), 2);
    assert!(un.claims.values().all(|r| r.error.is_empty()), "{un:?}");
    assert!(!cdi_a.exists() && !hook.exists());
    for f in &never {
        assert!(!f.exists(), "{} left behind", f.display());
    }
    assert!(!n.dir.join("vgpu/claims/uid-never").exists());
    // Again: still fine (kubelet retries).
    let un2 = client
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![kclaim("a", "uid-a")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un2.claims["uid-a"].error, "");

    // After the restart, b's CUs are still known: c does not get them.
    let c = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("c", "uid-c")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(c.claims["uid-c"].error, "");
    let cp: serde_json::Value = serde_json::to_value(checkpoint_on_disk(&n)).unwrap();
    assert!(!cus("uid-b").is_empty());
    let b_cus = CuSet::parse(
        cp["claims"]["uid-b"]["devices"][0]["cus"].as_str().unwrap(),
        u32::MAX,
    )
    .unwrap();
    let c_cus = CuSet::parse(
        cp["claims"]["uid-c"]["devices"][0]["cus"].as_str().unwrap(),
        u32::MAX,
    )
    .unwrap();
    assert!(!b_cus.overlaps(&c_cus));

    // A crash lost c's CDI spec (only the checkpoint is fsynced): kubelet's retry restores it.
    let cdi_c = n.dir.join("cdi/k8s.amdgpu.hami-rs.io-claim_uid-c.json");
    let text = std::fs::read(&cdi_c).unwrap();
    std::fs::write(&cdi_c, b"").unwrap();
    let again = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("c", "uid-c")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims["uid-c"], c.claims["uid-c"]);
    assert_eq!(std::fs::read(&cdi_c).unwrap(), text);

    // ... or its region file (created, never synced): made anew, and the hook config (and
    // the checkpoint's copy of it) names the new file's inode, or the hook would refuse it.
    let region_c = n.dir.join("vgpu/claims/uid-c/hipdevshr.cache");
    let hook_c = n.dir.join("vgpu/.hook-config/claim_uid-c.conf");
    let old_inode = std::fs::metadata(&region_c).unwrap().ino();
    // Held open so the new file cannot get the same inode number back.
    let _held = std::fs::File::open(&region_c).unwrap();
    std::fs::remove_file(&region_c).unwrap();
    let again = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("c", "uid-c")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims["uid-c"], c.claims["uid-c"]);
    let inode = std::fs::metadata(&region_c).unwrap().ino();
    assert_ne!(inode, old_inode);
    let conf = hami_protocol::hook_config::decode(&std::fs::read(&hook_c).unwrap()).unwrap();
    assert_eq!(conf.shared_cache_inode, Some(inode));
    let recorded = checkpoint_on_disk(&n).claims["uid-c"]
        .hook_config
        .clone()
        .unwrap();
    assert_eq!(recorded.as_bytes(), std::fs::read(&hook_c).unwrap());

    // A tenant cut the region short under a process that still has it attached (its slot's
    // liveness lock held): kept as it is — that process fails closed on it, and a fresh
    // region beside it would count the pod's memory twice.
    let holder = std::fs::File::options()
        .read(true)
        .write(true)
        .open(&region_c)
        .unwrap();
    assert!(
        hami_kernel_locks::file_lock::try_lock_record(&holder, hami_region::layout::slot_offset(3))
            .unwrap()
    );
    holder.set_len(0).unwrap();
    let again = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("c", "uid-c")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims["uid-c"], c.claims["uid-c"]);
    let kept = std::fs::metadata(&region_c).unwrap();
    assert_eq!(
        (kept.ino(), kept.len()),
        (inode, 0),
        "replaced under a live process"
    );
    assert_eq!(recorded.as_bytes(), std::fs::read(&hook_c).unwrap());
    drop(holder);

    // ... once it has exited, or after a power loss before the file's blocks were written
    // (no process survives that): an empty file is one the hook could only refuse, so it
    // is replaced like a lost one.
    let old_inode = inode;
    let _held_too = std::fs::File::open(&region_c).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&region_c)
        .unwrap()
        .set_len(0)
        .unwrap();
    let again = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("c", "uid-c")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims["uid-c"], c.claims["uid-c"]);
    let region = std::fs::metadata(&region_c).unwrap();
    assert_ne!(region.ino(), old_inode);
    assert_eq!(
        hami_region::plugin_file::check(&region_c).unwrap(),
        hami_region::plugin_file::RegionFile::Usable(region.ino())
    );
    let conf = hami_protocol::hook_config::decode(&std::fs::read(&hook_c).unwrap()).unwrap();
    assert_eq!(conf.shared_cache_inode, Some(region.ino()));
    hami_region::Session::attach_expecting(
        &region_c,
        &hami_region::Limits::default(),
        conf.shared_cache_inode,
    )
    .expect("the hook can attach to the replaced region");

    // A prepare interrupted between creating a claim's region file and sizing it left an
    // empty one (and a torn hook config); the claim was never answered, so kubelet's retry
    // must succeed, not stop at "exists and is not a region file".
    claims.0.lock().unwrap().insert(
        ("default".into(), "d".into()),
        claim("d", "uid-d", "gpu-0", "1Gi", "10"),
    );
    let region_d = n.dir.join("vgpu/claims/uid-d/hipdevshr.cache");
    std::fs::create_dir_all(region_d.parent().unwrap()).unwrap();
    std::fs::write(&region_d, b"").unwrap();
    std::fs::write(n.dir.join("vgpu/.hook-config/claim_uid-d.conf"), b"torn").unwrap();
    let d = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("d", "uid-d")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.claims["uid-d"].error, "", "{d:?}");
    let region = std::fs::metadata(&region_d).unwrap();
    let conf = hami_protocol::hook_config::decode(
        &std::fs::read(n.dir.join("vgpu/.hook-config/claim_uid-d.conf")).unwrap(),
    )
    .unwrap();
    assert_eq!(conf.shared_cache_inode, Some(region.ino()));
    assert_eq!(
        hami_region::plugin_file::check(&region_d).unwrap(),
        hami_region::plugin_file::RegionFile::Usable(region.ino())
    );

    // A directory where the region file goes is not guessed at: the error says what to do.
    claims.0.lock().unwrap().insert(
        ("default".into(), "e".into()),
        claim("e", "uid-e", "gpu-0", "1Gi", "10"),
    );
    std::fs::create_dir_all(n.dir.join("vgpu/claims/uid-e/hipdevshr.cache")).unwrap();
    let e = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("e", "uid-e")],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        e.claims["uid-e"]
            .error
            .contains("is a directory, not a region file; remove it"),
        "{e:?}"
    );
    stop(run).await;
}

#[tokio::test]
async fn a_claim_for_two_pods_or_not_reserved_is_refused_per_claim() {
    let n = node();
    let claims = Claims::default();
    let mut shared = claim("s", "uid-s", "gpu-1", "1Gi", "4");
    let r = shared.status.as_mut().unwrap();
    r.reserved_for.push(ResourceClaimConsumerReference {
        api_group: None,
        resource: "pods".into(),
        name: "p2".into(),
        uid: "u2".into(),
    });
    let mut unreserved = claim("u", "uid-u", "gpu-1", "1Gi", "4");
    unreserved.status.as_mut().unwrap().reserved_for.clear();
    claims
        .0
        .lock()
        .unwrap()
        .insert(("default".into(), "s".into()), shared);
    claims
        .0
        .lock()
        .unwrap()
        .insert(("default".into(), "u".into()), unreserved);
    let run = start(&n, claims).await;
    let mut client = dra(&run.sockets.dra).await;
    let resp = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("s", "uid-s"), kclaim("u", "uid-u")],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        resp.claims["uid-s"].error.contains("2 consumers"),
        "{:?}",
        resp.claims["uid-s"]
    );
    assert!(
        resp.claims["uid-u"].error.contains("reservedFor"),
        "{:?}",
        resp.claims["uid-u"]
    );
    assert!(resp.claims.values().all(|c| c.devices.is_empty()));
    stop(run).await;
}

#[tokio::test]
async fn a_first_available_result_is_reported_under_its_parent_request() {
    // The scheduler names a firstAvailable result `<request>/<sub>`; kubelet matches the
    // container's `resources.claims[].request` (`gpu`) against request_names exactly.
    let n = node();
    let claims = Claims::default();
    let mut c = claim("f", "uid-f", "gpu-0", "2Gi", "8");
    let alloc = c.status.as_mut().unwrap().allocation.as_mut().unwrap();
    alloc.devices.as_mut().unwrap().results[0].request = "gpu/s1".into();
    claims
        .0
        .lock()
        .unwrap()
        .insert(("default".into(), "f".into()), c);
    let run = start(&n, claims).await;
    let mut client = dra(&run.sockets.dra).await;
    // Twice: the first prepares, the second answers from the checkpoint.
    for _ in 0..2 {
        let resp = client
            .node_prepare_resources(NodePrepareResourcesRequest {
                claims: vec![kclaim("f", "uid-f")],
            })
            .await
            .unwrap()
            .into_inner();
        let f = &resp.claims["uid-f"];
        assert_eq!(f.error, "");
        assert_eq!(f.devices.len(), 1, "{f:?}");
        assert_eq!(f.devices[0].request_names, vec!["gpu".to_string()]);
    }
    stop(run).await;
}

#[test]
fn a_corrupt_checkpoint_is_refused_with_what_to_do() {
    let n = node();
    let cfg = config(&n);
    std::fs::create_dir_all(cfg.checkpoint.parent().unwrap()).unwrap();
    std::fs::write(&cfg.checkpoint, b"{\"version\": 1, \"claims\": ").unwrap();
    let err = Driver::new(cfg, Claims::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("drain the node"), "{err}");

    // A journal damaged before its last line (a torn last line is an unacknowledged
    // append, dropped): refused too, naming the journal and the line.
    let n = node();
    let cfg = config(&n);
    std::fs::create_dir_all(cfg.checkpoint.parent().unwrap()).unwrap();
    let journal = hami_amdgpu_dra_plugin::checkpoint_store::journal_path(&cfg.checkpoint);
    std::fs::write(
        &journal,
        b"{\"remove\":{\"uid\":\"a\"}}\ngarbage\n{\"remove\":{\"uid\":\"b\"}}\n",
    )
    .unwrap();
    let err = Driver::new(cfg, Claims::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("checkpoint.json.journal")
            && err.contains("line 2")
            && err.contains("drain the node"),
        "{err}"
    );
}

/// The driver's checkpoint as a restarted plugin reads it (snapshot + journal).
fn checkpoint_on_disk(n: &Node) -> hami_amdgpu_dra_plugin::checkpoint::Checkpoint {
    hami_amdgpu_dra_plugin::checkpoint::Checkpoint::load(&n.dir.join("plugin/checkpoint.json"))
        .unwrap()
}

/// Waits (bounded) until `path` holds `want`.
async fn wait_for_file(path: &Path, want: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if std::fs::read_to_string(path).ok().as_deref() == Some(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never became {want:?}: {:?}",
            path.display(),
            std::fs::read_to_string(path)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn dmem_limit_reaches_a_late_pod_cgroup_and_sums_the_pods_claims() {
    let n = node();
    let claims = Claims::default();
    for (name, uid, mem) in [("a", "uid-a", "4Gi"), ("b", "uid-b", "2Gi")] {
        let mut c = claim(name, uid, "gpu-0", mem, "20");
        // Both claims belong to one pod (one claim per container).
        c.status.as_mut().unwrap().reserved_for[0].uid = "1111-2222".into();
        claims
            .0
            .lock()
            .unwrap()
            .insert(("default".into(), name.into()), c);
    }
    let cgroups = n.dir.join("cgroup");
    std::fs::create_dir_all(&cgroups).unwrap();
    std::fs::write(cgroups.join("cgroup.controllers"), "cpu memory dmem\n").unwrap();
    let mut cfg = config(&n);
    cfg.dmem = Some(hami_amd_plugin::dmem::spawn_writer(
        cgroups.clone(),
        Duration::from_secs(10),
    ));
    let bdf = n.devices["gpu-0"].pci_bdf.clone();
    let driver = Arc::new(Driver::new(cfg, claims).unwrap());
    let sockets = Sockets::new(
        &n.dir.join("plugins_registry"),
        &n.dir.join("plugin"),
        hami_dra_core::DRIVER,
    );
    let (stop_tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (_state, handle) = serve(driver, hami_dra_core::DRIVER, &sockets, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let mut client = dra(&sockets.dra).await;
    let r = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("a", "uid-a")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.claims["uid-a"].error, "");
    // The pod cgroup appears only after Prepare returned (as with a real runtime).
    let pod = cgroups
        .join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1111_2222.slice");
    std::fs::create_dir_all(&pod).unwrap();
    std::fs::write(pod.join("dmem.max"), "").unwrap();
    wait_for_file(
        &pod.join("dmem.max"),
        &format!("drm/{bdf}/vram0 {}\n", 4u64 << 30),
    )
    .await;
    let r = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("b", "uid-b")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.claims["uid-b"].error, "");
    // The pod cgroup was there before this prepare (kubelet's order): the limit is written
    // before the answer, not after it — no container of the pod starts without it.
    assert_eq!(
        std::fs::read_to_string(pod.join("dmem.max")).unwrap(),
        format!("drm/{bdf}/vram0 {}\n", 6u64 << 30)
    );
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .unwrap()
        .unwrap();
}

/// Claims whose GET of `held` (or status write of `held_status`) waits until `release`
/// gets a permit (a call the API server never answers); counts those GETs and says when
/// one such call started.
#[derive(Clone)]
struct Held {
    claims: Claims,
    held: String,
    held_status: String,
    release: Arc<tokio::sync::Semaphore>,
    started: Arc<tokio::sync::Notify>,
    gets: Arc<std::sync::atomic::AtomicUsize>,
    /// Every `namespace/name` a GET asked for.
    asked: Arc<Mutex<Vec<String>>>,
}

impl ClaimSource for Held {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        self.asked
            .lock()
            .unwrap()
            .push(format!("{namespace}/{name}"));
        if name == self.held {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.started.notify_one();
            self.release.acquire().await.unwrap().forget();
        }
        self.claims.get(namespace, name).await
    }

    async fn set_device_status(
        &self,
        seen: &ResourceClaim,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), String> {
        if seen.metadata.name.as_deref() == Some(self.held_status.as_str()) {
            self.started.notify_one();
            self.release.acquire().await.unwrap().forget();
        }
        self.claims.set_device_status(seen, driver, devices).await
    }
}

/// Issue 27 item 6: a claim GET that hangs holds no lock another claim needs — a second
/// claim's prepare on the same GPU is answered meanwhile — while a second prepare of the
/// same claim still waits for the first (one GET, one checkpoint entry, same answer), and
/// the two claims' CUs are disjoint (the held claim planned after the other was recorded).
#[tokio::test]
async fn a_claim_get_that_hangs_does_not_block_other_claims() {
    let n = node();
    let claims = Claims::default();
    for (name, uid) in [("slow", "uid-slow"), ("fast", "uid-fast")] {
        claims.0.lock().unwrap().insert(
            ("default".into(), name.into()),
            claim(name, uid, "gpu-0", "2Gi", "40"),
        );
    }
    let held = Held {
        claims: claims.clone(),
        held: "slow".into(),
        held_status: String::new(),
        release: Arc::new(tokio::sync::Semaphore::new(0)),
        started: Arc::new(tokio::sync::Notify::new()),
        gets: Arc::default(),
        asked: Arc::default(),
    };
    let run = start(&n, held.clone()).await;
    let prepare = |name: &'static str, uid: &'static str| {
        let path = run.sockets.dra.clone();
        tokio::spawn(async move {
            dra(&path)
                .await
                .node_prepare_resources(NodePrepareResourcesRequest {
                    claims: vec![kclaim(name, uid)],
                })
                .await
                .unwrap()
                .into_inner()
                .claims
                .remove(uid)
                .unwrap()
        })
    };
    let slow = prepare("slow", "uid-slow");
    tokio::time::timeout(Duration::from_secs(30), held.started.notified())
        .await
        .expect("the held GET started");
    let slow_again = prepare("slow", "uid-slow");
    let fast = tokio::time::timeout(Duration::from_secs(30), prepare("fast", "uid-fast"))
        .await
        .expect("another claim's prepare is answered while one claim's GET hangs")
        .unwrap();
    assert_eq!(fast.error, "");
    assert!(!slow.is_finished() && !slow_again.is_finished());

    held.release.add_permits(1);
    let slow = tokio::time::timeout(Duration::from_secs(30), slow)
        .await
        .unwrap()
        .unwrap();
    let slow_again = tokio::time::timeout(Duration::from_secs(30), slow_again)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(slow.error, "");
    assert_eq!(slow_again, slow, "the repeat answered from the checkpoint");
    assert_eq!(held.gets.load(std::sync::atomic::Ordering::SeqCst), 1);
    let cp = checkpoint_on_disk(&n);
    assert_eq!(cp.claims.len(), 2);
    let cus = |uid: &str| CuSet::parse(&cp.claims[uid].devices[0].cus, 104).unwrap();
    assert!(!cus("uid-slow").overlaps(&cus("uid-fast")));
    stop(run).await;
}

/// Issue 27 item 6: a claim name or namespace that is no DNS name is refused before any
/// call — never read, so a name like `c?watch=true` cannot turn the GET into a watch — with
/// an error naming the field and the rule; the request's other claims are prepared.
#[tokio::test]
async fn claim_names_that_are_not_dns_names_are_refused_before_any_call() {
    let n = node();
    let claims = Claims::default();
    claims.0.lock().unwrap().insert(
        ("default".into(), "ok".into()),
        claim("ok", "uid-ok", "gpu-0", "2Gi", "8"),
    );
    let held = Held {
        claims,
        held: String::new(),
        held_status: String::new(),
        release: Arc::new(tokio::sync::Semaphore::new(0)),
        started: Arc::new(tokio::sync::Notify::new()),
        gets: Arc::default(),
        asked: Arc::default(),
    };
    let run = start(&n, held.clone()).await;
    let mut client = dra(&run.sockets.dra).await;
    let bad = |ns: &str, name: &str, uid: &str| Claim {
        namespace: ns.into(),
        name: name.into(),
        uid: uid.into(),
    };
    let resp = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![
                bad("default", "c?watch=true", "u1"),
                bad("default/../kube-system", "c", "u2"),
                bad("default", &"a".repeat(254), "u3"),
                bad("Default", "c", "u4"),
                bad("default", "c", "../u5"),
                kclaim("ok", "uid-ok"),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let err = |uid: &str| resp.claims[uid].error.clone();
    assert!(
        err("u1").contains("claim name \"c?watch=true\"")
            && err("u1").contains("RFC 1123 subdomain"),
        "{}",
        err("u1")
    );
    assert!(
        err("u2").contains("claim namespace") && err("u2").contains("RFC 1123 label"),
        "{}",
        err("u2")
    );
    assert!(
        err("u3").contains("254 characters long; at most 253"),
        "{}",
        err("u3")
    );
    assert!(
        err("u4").contains("claim namespace \"Default\""),
        "{}",
        err("u4")
    );
    assert!(err("../u5").contains("claim UID"), "{}", err("../u5"));
    assert_eq!(err("uid-ok"), "");
    // Only the valid claim was read, and nothing of the refused claims was written.
    assert_eq!(*held.asked.lock().unwrap(), ["default/ok"]);
    let cp = checkpoint_on_disk(&n);
    assert_eq!(cp.claims.keys().collect::<Vec<_>>(), ["uid-ok"]);
    stop(run).await;
}

/// Issue 27 item 6: a FIFO at the checkpoint's path (or the journal's) is refused at start
/// with what to remove, without waiting for a writer that never comes.
#[test]
fn a_fifo_at_the_checkpoint_is_refused_without_blocking() {
    for journal in [false, true] {
        let n = node();
        let cfg = config(&n);
        std::fs::create_dir_all(cfg.checkpoint.parent().unwrap()).unwrap();
        let path = if journal {
            hami_amdgpu_dra_plugin::checkpoint_store::journal_path(&cfg.checkpoint)
        } else {
            cfg.checkpoint.clone()
        };
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        let (tx, rx) = std::sync::mpsc::channel();
        // A thread: on the landed code the open blocks forever (the test then fails on
        // the timeout below; the stuck thread ends with the test process).
        std::thread::spawn(move || {
            let _ = tx.send(
                Driver::new(cfg, Claims::default())
                    .err()
                    .map(|e| e.to_string()),
            );
        });
        let err = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the start did not block on the FIFO")
            .expect("refused");
        assert!(
            err.contains(&path.display().to_string())
                && err.contains("a FIFO, not a regular file")
                && err.contains("remove it"),
            "{err}"
        );
    }
}

/// The CUs a prepare chose are its own from its plan on, also while its status write is in
/// flight (no lock held then): a second claim on the same GPU planned meanwhile gets other
/// CUs, and once the first is released both are recorded, disjoint.
#[tokio::test]
async fn cus_chosen_by_a_prepare_in_flight_are_not_given_to_another_claim() {
    let n = node();
    let claims = Claims::default();
    for (name, uid) in [("first", "uid-first"), ("second", "uid-second")] {
        claims.0.lock().unwrap().insert(
            ("default".into(), name.into()),
            claim(name, uid, "gpu-0", "2Gi", "40"),
        );
    }
    let held = Held {
        claims: claims.clone(),
        held: String::new(),
        held_status: "first".into(),
        release: Arc::new(tokio::sync::Semaphore::new(0)),
        started: Arc::new(tokio::sync::Notify::new()),
        gets: Arc::default(),
        asked: Arc::default(),
    };
    let run = start(&n, held.clone()).await;
    let path = run.sockets.dra.clone();
    let first = tokio::spawn(async move {
        dra(&path)
            .await
            .node_prepare_resources(NodePrepareResourcesRequest {
                claims: vec![kclaim("first", "uid-first")],
            })
            .await
            .unwrap()
            .into_inner()
    });
    tokio::time::timeout(Duration::from_secs(30), held.started.notified())
        .await
        .expect("the first claim's status write started");
    let second = tokio::time::timeout(
        Duration::from_secs(30),
        dra(&run.sockets.dra)
            .await
            .node_prepare_resources(NodePrepareResourcesRequest {
                claims: vec![kclaim("second", "uid-second")],
            }),
    )
    .await
    .expect("answered while the first claim's status write hangs")
    .unwrap()
    .into_inner();
    assert_eq!(second.claims["uid-second"].error, "");
    held.release.add_permits(1);
    let first = tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.claims["uid-first"].error, "");
    let cp = checkpoint_on_disk(&n);
    let cus = |uid: &str| CuSet::parse(&cp.claims[uid].devices[0].cus, 104).unwrap();
    assert_eq!((cus("uid-first").len(), cus("uid-second").len()), (40, 40));
    assert!(
        !cus("uid-first").overlaps(&cus("uid-second")),
        "{:?} {:?}",
        cus("uid-first"),
        cus("uid-second")
    );
    stop(run).await;
}
