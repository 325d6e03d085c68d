//! `status.devices` after Prepare, against the embedded API server: kubelet (a tonic client
//! over the plugin's unix socket) prepares claims the plugin reads through kube's dynamic
//! API; the claim's status then names driver, pool, device, share and the CU ranges and
//! bytes dra-core's plan chose; another driver's entries survive; unprepare leaves the
//! status; a claim recreated under the same name is refused, its status untouched.

use std::sync::Arc;
use std::time::Duration;

use hami_amd_discovery::discovery::discover;
use hami_amd_discovery::registration::{RegistrationSettings, register};
use hami_amdgpu_dra_plugin::claims::{KubeClaims, resource_claims};
use hami_amdgpu_dra_plugin::dra_v1::dra_plugin_client::DraPluginClient;
use hami_amdgpu_dra_plugin::dra_v1::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use hami_amdgpu_dra_plugin::driver::{Driver, DriverConfig};
use hami_amdgpu_dra_plugin::registration::{Sockets, serve};
use hami_deviceplugin_api::connect_unix;
use hami_dra_core::prepare::PrepareSettings;
use hami_protocol::cu_list::CuSet;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// Creates the claim, then allocates and reserves it through status as kube-scheduler does;
/// returns its UID.
async fn allocated_claim(api: &Api<DynamicObject>, name: &str, cus: &str) -> String {
    let claim: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu-slice", "allocationMode": "ExactCount", "count": 1}}]}}
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &claim).await.unwrap();
    let uid = created.metadata.uid.unwrap();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "allocation": {"devices": {"results": [{
                "request": "gpu", "driver": hami_dra_core::DRIVER, "pool": "node-a",
                "device": "gpu-0", "shareID": format!("share-{name}"),
                "consumedCapacity": {"memory": "4Gi", "computeUnits": cus, "shares": "1"}
            }]}},
            "reservedFor": [{"resource": "pods", "name": format!("pod-{name}"), "uid": format!("pod-{uid}")}],
            // what another driver of a multi-driver claim wrote before us
            "devices": [{"driver": "other.example.com", "pool": "node-a", "device": "nic-0"}]
        }})),
    )
    .await
    .unwrap();
    uid
}

fn kclaim(name: &str, uid: &str) -> Claim {
    Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// The MI210 XGMI capture as node "node-a" and the driver's config on it (files under the
/// capture's `node/` directory); the tree must outlive the driver.
fn node_config() -> (hami_sysfs_fixtures::FixtureTree, DriverConfig) {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let d = discover(&tree.sysfs_root()).unwrap();
    let reg = register(&d, &RegistrationSettings::default(), |_| true);
    let dir = tree.sysfs_root().parent().unwrap().join("node");
    let config = DriverConfig {
        settings: PrepareSettings {
            driver: hami_dra_core::DRIVER.into(),
            node: "node-a".into(),
            hook_host_path: "/usr/local/vgpu/libamvgpu.so".into(),
            hook_container_path: "/usr/local/vgpu/libamvgpu.so".into(),
            cache_host_root: dir.join("vgpu").display().to_string(),
        },
        devices: hami_dra_core::slice::registered_by_name(&d, &reg)
            .into_iter()
            .map(|(k, v)| (k, v.clone()))
            .collect(),
        cdi_dir: dir.join("cdi"),
        checkpoint: dir.join("plugin/checkpoint.json"),
        dmem: None,
    };
    (tree, config)
}

/// The embedded API server, a client of it, and its `default` ResourceClaims (the server
/// lives as long as the first element).
async fn api_server() -> (
    hami_apiserver::RunningApiServer,
    kube::Client,
    Api<DynamicObject>,
) {
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .expect("server starts");
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let api = Api::namespaced_with(client.clone(), "default", &resource_claims());
    (server, client, api)
}

async fn status(api: &Api<DynamicObject>, name: &str) -> Value {
    api.get_status(name).await.unwrap().data["status"].clone()
}

#[tokio::test]
async fn prepare_writes_status_devices_through_the_subresource() {
    let (_server, client, api) = api_server().await;
    let uid_a = allocated_claim(&api, "a", "40").await;
    let uid_b = allocated_claim(&api, "b", "30").await;

    let (tree, config) = node_config();
    let dir = tree.sysfs_root().parent().unwrap().join("node");
    let driver = Arc::new(
        Driver::new(
            config,
            KubeClaims {
                client: client.clone(),
            },
        )
        .unwrap(),
    );
    let sockets = Sockets::new(
        &dir.join("plugins_registry"),
        &dir.join("plugin"),
        hami_dra_core::DRIVER,
    );
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let (_state, handle) = serve(driver, hami_dra_core::DRIVER, &sockets, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let mut kubelet = DraPluginClient::new(connect_unix(&sockets.dra).await.unwrap());

    let resp = kubelet
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("a", &uid_a), kclaim("b", &uid_b)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims[&uid_a].error, "");
    assert_eq!(resp.claims[&uid_b].error, "");

    let mut ranges = Vec::new();
    for (name, cus) in [("a", 40), ("b", 30)] {
        let st = status(&api, name).await;
        let devices = st["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2, "{st}");
        assert_eq!(devices[0]["driver"], "other.example.com", "kept: {st}");
        let ours = &devices[1];
        assert_eq!(ours["driver"], hami_dra_core::DRIVER);
        assert_eq!(ours["pool"], "node-a");
        assert_eq!(ours["device"], "gpu-0");
        assert_eq!(ours["shareID"], format!("share-{name}"));
        assert_eq!(ours["data"]["memoryBytes"], 4u64 << 30);
        // MI210: 104 CUs
        let set = CuSet::parse(ours["data"]["cuRanges"].as_str().unwrap(), 104).unwrap();
        assert_eq!(set.len(), cus, "{ours}");
        // the allocation scheduler wrote is untouched
        assert_eq!(
            st["allocation"]["devices"]["results"][0]["consumedCapacity"]["computeUnits"],
            cus.to_string()
        );
        ranges.push(set);
    }
    assert!(!ranges[0].overlaps(&ranges[1]), "{ranges:?}");

    // a repeated prepare (kubelet retry) writes nothing new
    let rv = api.get_status("a").await.unwrap().metadata.resource_version;
    kubelet
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("a", &uid_a)],
        })
        .await
        .unwrap();
    assert_eq!(
        api.get_status("a").await.unwrap().metadata.resource_version,
        rv
    );

    // unprepare leaves the status (deallocation clears it, not the driver)
    let before = status(&api, "a").await;
    let un = kubelet
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![kclaim("a", &uid_a)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims[&uid_a].error, "");
    assert_eq!(status(&api, "a").await, before);

    // "b" recreated under its name (new UID) while kubelet still asks for the old UID: the
    // old claim is gone, so prepare fails; the new claim's status is not ours to write.
    kubelet
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![kclaim("b", &uid_b)],
        })
        .await
        .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    let uid_b2 = allocated_claim(&api, "b", "30").await;
    assert_ne!(uid_b2, uid_b);
    let resp = kubelet
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("b", &uid_b)],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!resp.claims[&uid_b].error.is_empty());
    let st = status(&api, "b").await;
    assert_eq!(st["devices"].as_array().unwrap().len(), 1, "{st}");

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .unwrap()
        .unwrap();
}

/// The status write against the claim as read (no second GET) when its version is current;
/// a stale read — another writer came between — is answered 409 and read again, losing
/// neither writer's entries; a claim replaced under the same name after the read is refused.
#[tokio::test]
async fn the_status_write_uses_the_read_version_and_rereads_when_it_is_stale() {
    use hami_amdgpu_dra_plugin::claims::ClaimSource;
    use hami_dra_core::api::AllocatedDeviceStatus;
    let (_server, client, api) = api_server().await;
    let claims = KubeClaims {
        client: client.clone(),
    };
    let ours = |device: &str| AllocatedDeviceStatus {
        driver: hami_dra_core::DRIVER.into(),
        pool: "node-a".into(),
        device: device.into(),
        data: Some(json!({"cuRanges": "0-7"})),
        ..Default::default()
    };
    let drop_other = json!({"status": {"devices": []}});

    // current version, only our entries (none yet): written as read
    allocated_claim(&api, "c", "8").await;
    api.patch_status(
        "c",
        &PatchParams::default(),
        &Patch::Merge(drop_other.clone()),
    )
    .await
    .unwrap();
    let seen = claims.get("default", "c").await.unwrap();
    claims
        .set_device_status(&seen, hami_dra_core::DRIVER, &[ours("gpu-0")])
        .await
        .unwrap();
    let st = status(&api, "c").await;
    assert_eq!(st["devices"].as_array().unwrap().len(), 1, "{st}");
    assert_eq!(st["devices"][0]["device"], "gpu-0");

    // stale: another driver writes after our read; ours must not erase its entry
    let seen = claims.get("default", "c").await.unwrap();
    api.patch_status(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"devices": [
            st["devices"][0].clone(),
            {"driver": "other.example.com", "pool": "node-a", "device": "nic-0"}
        ]}})),
    )
    .await
    .unwrap();
    claims
        .set_device_status(&seen, hami_dra_core::DRIVER, &[ours("gpu-1")])
        .await
        .unwrap();
    let st = status(&api, "c").await;
    let devices = st["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{st}");
    assert_eq!(devices[0]["driver"], "other.example.com", "{st}");
    assert_eq!(devices[1]["device"], "gpu-1", "{st}");

    // replaced after the read: the read version is stale, the reread has another UID
    allocated_claim(&api, "r", "8").await;
    api.patch_status("r", &PatchParams::default(), &Patch::Merge(drop_other))
        .await
        .unwrap();
    let seen = claims.get("default", "r").await.unwrap();
    api.delete("r", &DeleteParams::default()).await.unwrap();
    allocated_claim(&api, "r", "8").await;
    let err = claims
        .set_device_status(&seen, hami_dra_core::DRIVER, &[ours("gpu-0")])
        .await
        .unwrap_err();
    assert!(err.contains("was replaced"), "{err}");
    let st = status(&api, "r").await;
    assert_eq!(
        st["devices"].as_array().unwrap().len(),
        1,
        "untouched: {st}"
    );
    assert_eq!(st["devices"][0]["driver"], "other.example.com", "{st}");

    // a read without a resourceVersion is never patched unconditionally: it reads first
    let mut seen = claims.get("default", "c").await.unwrap();
    seen.metadata.resource_version = None;
    seen.status = None;
    claims
        .set_device_status(&seen, hami_dra_core::DRIVER, &[ours("gpu-2")])
        .await
        .unwrap();
    let st = status(&api, "c").await;
    assert_eq!(
        st["devices"].as_array().unwrap().len(),
        2,
        "other kept: {st}"
    );
}

/// A prepare whose files cannot be written (the CDI directory is a file) fails, and the
/// status it wrote alongside is taken back (status.devices never names CUs no checkpoint
/// holds), and so are the files it did write.
#[tokio::test]
async fn a_failed_file_write_takes_the_status_back() {
    let (_server, client, api) = api_server().await;
    let uid = allocated_claim(&api, "a", "40").await;
    let (tree, config) = node_config();
    let dir = tree.sysfs_root().parent().unwrap().join("node");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cdi"), "not a directory").unwrap();
    let driver = Driver::new(config, KubeClaims { client }).unwrap();
    let out = driver.prepare(&[kclaim("a", &uid)]).await;
    let err = out[&uid].as_ref().unwrap_err();
    assert!(err.contains("cdi"), "names the CDI path: {err}");
    let st = status(&api, "a").await;
    let devices = st["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "only the other driver's entry: {st}");
    assert_eq!(devices[0]["driver"], "other.example.com");
    assert!(driver.checkpoint().await.claims.is_empty());
    // ... and what the prepare wrote before the CDI spec failed is gone too.
    assert!(!dir.join(format!("vgpu/claims/{uid}")).exists());
    let hooks: Vec<_> = std::fs::read_dir(dir.join("vgpu/.hook-config"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(hooks.is_empty(), "{hooks:?}");
}

/// A claim allocated with `results` and reserved for one pod, with no other driver's
/// status entry (our entries are then the claim's whole `status.devices`); returns its UID.
async fn claim_with(api: &Api<DynamicObject>, name: &str, results: Value) -> String {
    let claim: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu-slice", "allocationMode": "ExactCount", "count": 1}}]}}
    }))
    .unwrap();
    let uid = api
        .create(&PostParams::default(), &claim)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": format!("pod-{name}"), "uid": format!("pod-{uid}")}],
        }})),
    )
    .await
    .unwrap();
    uid
}

fn share(request: &str, device: &str, share: &str, mem: &str, cus: &str) -> Value {
    json!({"request": request, "driver": hami_dra_core::DRIVER, "pool": "node-a",
        "device": device, "shareID": share,
        "consumedCapacity": {"memory": mem, "computeUnits": cus, "shares": "1"}})
}

/// This driver's `status.devices` entries of the claim `name`.
async fn ours(api: &Api<DynamicObject>, name: &str) -> Vec<Value> {
    status(api, name).await["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|d| d["driver"] == hami_dra_core::DRIVER)
        .collect()
}

/// Issue 26 item 7: a prepare that fails after its status write (here the checkpoint
/// append: the journal's place is taken) takes its `status.devices` entries back also
/// when they were the claim's only ones — the undo once merged against the claim as read
/// before the write, found nothing to change and sent nothing — so the next claim on that
/// GPU, which may get the same CUs, is the only one publishing them.
#[tokio::test]
async fn a_prepare_failing_after_the_status_write_takes_its_entries_back() {
    let (_server, client, api) = api_server().await;
    let uid_a = claim_with(
        &api,
        "a",
        json!([share("gpu", "gpu-0", "s-a", "4Gi", "40")]),
    )
    .await;
    let uid_b = claim_with(
        &api,
        "b",
        json!([share("gpu", "gpu-0", "s-b", "4Gi", "40")]),
    )
    .await;
    let (tree, config) = node_config();
    let journal = hami_amdgpu_dra_plugin::checkpoint_store::journal_path(&config.checkpoint);
    let driver = Driver::new(config, KubeClaims { client }).unwrap();
    std::fs::create_dir_all(&journal).unwrap();
    let out = driver.prepare(&[kclaim("a", &uid_a)]).await;
    let err = out[&uid_a].as_ref().unwrap_err();
    assert!(err.contains("saving checkpoint"), "{err}");
    assert!(driver.checkpoint().await.claims.is_empty());
    assert_eq!(ours(&api, "a").await, Vec::<Value>::new(), "taken back");
    let dir = tree.sysfs_root().parent().unwrap().join("node");
    assert!(!dir.join(format!("vgpu/claims/{uid_a}")).exists());

    // The journal's place free again: "b" gets the GPU's first CUs, published once.
    std::fs::remove_dir(&journal).unwrap();
    let out = driver.prepare(&[kclaim("b", &uid_b)]).await;
    assert!(out[&uid_b].is_ok(), "{:?}", out[&uid_b]);
    let b = ours(&api, "b").await;
    assert_eq!(b.len(), 1);
    let mut published = Vec::new();
    for name in ["a", "b"] {
        for d in ours(&api, name).await {
            published.push(CuSet::parse(d["data"]["cuRanges"].as_str().unwrap(), 104).unwrap());
        }
    }
    assert_eq!(
        published.len(),
        1,
        "one claim publishes gpu-0's CUs: {published:?}"
    );
    // kubelet's retry of "a" then gets CUs of its own
    let out = driver.prepare(&[kclaim("a", &uid_a)]).await;
    assert!(out[&uid_a].is_ok(), "{:?}", out[&uid_a]);
    let range = |d: &Value| CuSet::parse(d["data"]["cuRanges"].as_str().unwrap(), 104).unwrap();
    assert!(!range(&ours(&api, "a").await[0]).overlaps(&range(&b[0])));
}

/// Issue 27 item 6: an API error reaches kubelet's NodePrepareResources answer (which it
/// copies into the pod's Events) as one readable line — code, reason, the server's message
/// — not kube-rs's debug dump (`Status { status: Some(Failure), … }`).
#[tokio::test]
async fn an_api_error_reaches_kubelet_as_one_readable_line() {
    let (server, client, api) = api_server().await;
    let uid = claim_with(
        &api,
        "a",
        json!([share("gpu", "gpu-0", "s-a", "4Gi", "40")]),
    )
    .await;
    let (_tree, config) = node_config();
    let driver = Driver::new(config, KubeClaims { client }).unwrap();
    let out = driver.prepare(&[kclaim("gone", "uid-gone")]).await;
    let err = out["uid-gone"].as_ref().unwrap_err();
    assert!(
        err.starts_with(
            "reading ResourceClaim default/gone: the API server answered 404 NotFound: "
        ) && err.contains("not found"),
        "{err}"
    );
    assert!(!err.contains("Status {") && !err.contains('\n'), "{err}");
    // a failed status write likewise
    server
        .faults()
        .fail_next(Some("patch"), Some("resourceclaims/status"), 1, 500);
    let out = driver.prepare(&[kclaim("a", &uid)]).await;
    let err = out[&uid].as_ref().unwrap_err();
    assert!(
        err.starts_with("writing status.devices of ResourceClaim default/a: the API server answered 500 InternalError: injected fault"),
        "{err}"
    );
    assert!(!err.contains("Status {") && !err.contains('\n'), "{err}");
}

/// Issue 26 item 8: one claim with two shares of one GPU (two requests; consumable
/// capacity allows it without `distinctAttribute`) is prepared as one device — the CDI spec
/// names gpu-0 once, `ROCR_VISIBLE_DEVICES` one GPU, its memory limit the two shares'
/// sum and its CU mask their CUs joined — while each share's status entry publishes its own
/// CUs, and kubelet's answer lists each request.
#[tokio::test]
async fn two_shares_of_one_gpu_in_one_claim_are_prepared_as_one_device() {
    let (_server, client, api) = api_server().await;
    let uid = claim_with(
        &api,
        "two",
        json!([
            share("gpu", "gpu-0", "s1", "4Gi", "20"),
            share("more", "gpu-0", "s2", "2Gi", "30"),
        ]),
    )
    .await;
    let (tree, config) = node_config();
    let dir = tree.sysfs_root().parent().unwrap().join("node");
    let driver = Arc::new(Driver::new(config, KubeClaims { client }).unwrap());
    let sockets = Sockets::new(
        &dir.join("plugins_registry"),
        &dir.join("plugin"),
        hami_dra_core::DRIVER,
    );
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let (_state, handle) = serve(driver, hami_dra_core::DRIVER, &sockets, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let mut kubelet = DraPluginClient::new(connect_unix(&sockets.dra).await.unwrap());
    let resp = kubelet
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kclaim("two", &uid)],
        })
        .await
        .unwrap()
        .into_inner();
    let got = &resp.claims[&uid];
    assert_eq!(got.error, "");
    let requests: Vec<&str> = got
        .devices
        .iter()
        .flat_map(|d| d.request_names.iter().map(String::as_str))
        .collect();
    assert_eq!(requests, ["gpu", "more"]);
    let cdi_id = format!("k8s.amdgpu.hami-rs.io/claim={uid}-gpu-0");
    assert!(
        got.devices
            .iter()
            .all(|d| d.cdi_device_ids == [cdi_id.clone()])
    );

    let spec: Value = serde_json::from_slice(
        &std::fs::read(dir.join(format!("cdi/k8s.amdgpu.hami-rs.io-claim_{uid}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(spec["devices"].as_array().unwrap().len(), 1, "{spec}");
    let env: std::collections::BTreeMap<String, String> = spec["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let (k, v) = e.as_str().unwrap().split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    assert!(!env["ROCR_VISIBLE_DEVICES"].contains(','), "{env:?}");
    assert_eq!(env["HIP_VISIBLE_DEVICES"], "0");
    assert_eq!(env["HIP_DEVICE_MEMORY_LIMIT_0"], "6144m");
    assert!(!env.contains_key("HIP_DEVICE_MEMORY_LIMIT_1"), "{env:?}");

    let entries = ours(&api, "two").await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    let sets: Vec<CuSet> = entries
        .iter()
        .map(|d| CuSet::parse(d["data"]["cuRanges"].as_str().unwrap(), 104).unwrap())
        .collect();
    assert_eq!((sets[0].len(), sets[1].len()), (20, 30));
    assert!(!sets[0].overlaps(&sets[1]));
    assert_eq!(
        (entries[0]["shareID"].clone(), entries[1]["shareID"].clone()),
        (json!("s1"), json!("s2"))
    );
    let mask = hami_protocol::cu_list::HsaCuMask::parse(&env["HSA_CU_MASK"]).unwrap();
    assert_eq!(mask.entries().len(), 1, "{}", env["HSA_CU_MASK"]);
    assert_eq!(mask.get(0), Some(&sets[0].union(&sets[1])));

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .unwrap()
        .unwrap();
}
