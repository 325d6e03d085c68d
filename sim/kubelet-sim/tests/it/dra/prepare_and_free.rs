//! Two 40-CU claims on one MI210, a pending third, deletion freeing capacity, a pod deleted
//! while kubelet-sim is down unprepared from its checkpoint, a restarted driver keeping its
//! prepared claims' CUs.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dra_pods_are_allocated_prepared_and_freed() {
    let DraNode {
        _server,
        client,
        tree: _tree,
        dir,
        kubelet,
        gpus,
        driver,
        stop_plugin,
        plugin,
        scheduler,
    } = dra_node().await;
    let class_api: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(client.clone());
    create(&class_api, json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "amdgpu-slice"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}}))
    .await;
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(client.clone(), "default");
    create(
        &templates,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "slice-40", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu-slice", "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": "16Gi", "computeUnits": "40"}}}}]}}}}),
    )
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let template = json!({"name": "gpu", "resourceClaimTemplateName": "slice-40"});
    create(&pods, pod("a", template.clone())).await;
    let a = running(&pods, "a").await;
    create(&pods, pod("b", template.clone())).await;
    let b = running(&pods, "b").await;

    let mut cu_sets = Vec::new();
    let mut devices = Vec::new();
    for p in [&a, &b] {
        let c = claim_of(&claims, p).await;
        // generated from the template, owned by the pod, reserved for it, allocated on node-a
        assert!(
            c.name_any().starts_with(&format!("{}-gpu-", p.name_any())),
            "{}",
            c.name_any()
        );
        let owner = &c.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Pod", p.uid().unwrap().as_str(), Some(true))
        );
        let st = c.status.clone().unwrap();
        assert_eq!(st.reserved_for.as_ref().unwrap()[0].uid, p.uid().unwrap());
        let alloc = st.allocation.as_ref().unwrap();
        let sel = serde_json::to_value(alloc.node_selector.as_ref().unwrap()).unwrap();
        assert_eq!(
            sel["nodeSelectorTerms"][0]["matchFields"][0]["values"][0],
            "node-a"
        );
        let r = &alloc.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
        assert_eq!(
            r.consumed_capacity.as_ref().unwrap()["computeUnits"].0,
            "40"
        );
        assert_eq!(r.consumed_capacity.as_ref().unwrap()["memory"].0, "16Gi");
        devices.push(r.device.clone());

        // the container got the prepared device's CDI edits
        let rec = record(p);
        let entry = &rec["main"][0];
        assert_eq!(entry["claim"], c.name_any(), "{rec}");
        let env = &entry["envs"];
        assert_eq!(env["HIP_DEVICE_MEMORY_LIMIT_0"], "16384m", "{env}");
        assert!(
            env["ROCR_VISIBLE_DEVICES"]
                .as_str()
                .is_some_and(|v| !v.is_empty()),
            "{env}"
        );
        let mask = env["HSA_CU_MASK"].as_str().unwrap();
        let ranges = mask.strip_prefix("0:").expect("one device: 0:<ranges>");
        let set = CuSet::parse(ranges, 104).unwrap();
        assert_eq!(set.len(), 40, "{mask}");
        let dev_paths: Vec<&str> = entry["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["containerPath"].as_str().unwrap())
            .collect();
        assert!(dev_paths.contains(&"/dev/kfd"), "{dev_paths:?}");
        assert!(
            dev_paths.iter().any(|p| p.starts_with("/dev/dri/renderD")),
            "{dev_paths:?}"
        );
        assert!(
            entry["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["containerPath"] == "/usr/local/vgpu/libamvgpu.so"
                    && m["readOnly"] == true),
            "{entry}"
        );
        cu_sets.push(set);
    }
    assert_eq!(devices[0], devices[1], "first fit packs both on one GPU");
    assert!(!cu_sets[0].overlaps(&cu_sets[1]), "{cu_sets:?}");
    assert_eq!(cdi_files(&dir).len(), 2);

    // A third 40-CU claim pinned to that GPU does not fit (40 + 40 + 40 > 104 CUs).
    let slice_api: Api<ResourceSlice> = Api::all(client.clone());
    let slice = slice_api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .remove(0);
    let dev = slice
        .spec
        .devices
        .as_ref()
        .unwrap()
        .iter()
        .find(|d| d.name == devices[0])
        .unwrap();
    let uuid = dev.attributes.as_ref().unwrap()["uuid"]
        .string
        .clone()
        .unwrap();
    create(&claims, json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "pinned", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu-slice", "count": 1,
            "selectors": [{"cel": {"expression": format!("device.attributes[\"{DRIVER}\"].uuid == \"{uuid}\"")}}],
            "capacity": {"requests": {"memory": "8Gi", "computeUnits": "40"}}}}]}}}))
    .await;
    create(
        &pods,
        pod("c", json!({"name": "gpu", "resourceClaimName": "pinned"})),
    )
    .await;
    let reason = wait("pod c unschedulable", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("c").await.ok()?;
            let cond = p
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled")?;
            (cond.status == "False").then_some((cond.reason, cond.message))
        }
    })
    .await;
    assert_eq!(reason.0.as_deref(), Some("Unschedulable"));
    let message = reason.1.unwrap();
    assert!(
        message.starts_with("0/1 nodes are available: 1 cannot allocate claim \"pinned\""),
        "{message}"
    );
    assert!(
        pods.get("c")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none()
    );

    // Deleting a: kubelet unprepares (its CDI spec goes), the claim is freed and deleted,
    // and c fits now.
    let claim_a = claim_of(&claims, &a).await.name_any();
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    let c = running(&pods, "c").await;
    let pinned = claims.get("pinned").await.unwrap();
    let r = &pinned
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap()[0];
    assert_eq!(r.device, devices[0]);
    wait("a's claim deleted", || {
        let claims = claims.clone();
        let name = claim_a.clone();
        async move { claims.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    let c_mask = record(&c)["main"][0]["envs"]["HSA_CU_MASK"]
        .as_str()
        .unwrap()
        .to_owned();
    let c_set = CuSet::parse(c_mask.strip_prefix("0:").unwrap(), 104).unwrap();
    assert!(!c_set.overlaps(&cu_sets[1]), "c and b disjoint: {c_mask}");
    assert_eq!(cdi_files(&dir).len(), 2, "a's spec removed, c's written");

    // kubelet-sim goes away; b is deleted meanwhile; the next kubelet-sim unprepares b's
    // claim from its checkpoint.
    let claim_b = claim_of(&claims, &b).await;
    let claim_b_uid = claim_b.uid().unwrap();
    kubelet.shutdown().await;
    pods.delete("b", &DeleteParams::default()).await.unwrap();
    assert!(driver.checkpoint().await.claims.contains_key(&claim_b_uid));
    let kubelet = KubeletSim::start_with_dra(kubelet_args(&dir), client.clone(), dra_config(&dir))
        .await
        .unwrap();
    wait("b's claim unprepared after the restart", || {
        let driver = driver.clone();
        let uid = claim_b_uid.clone();
        async move { (!driver.checkpoint().await.claims.contains_key(&uid)).then_some(()) }
    })
    .await;
    assert_eq!(cdi_files(&dir).len(), 1, "only c's spec is left");

    // The driver restarts (a new process: what it holds is its checkpoint on disk);
    // kubelet-sim registers its new socket, and a new pod on that GPU gets CUs apart from
    // c's, which the reloaded checkpoint still holds.
    let _ = stop_plugin.send(());
    tokio::time::timeout(TIMEOUT, plugin)
        .await
        .unwrap()
        .unwrap();
    let (_driver, stop_plugin, plugin) = start_plugin(&client, &dir, &gpus).await;
    wait("b's claim freed and deleted", || {
        let claims = claims.clone();
        let name = claim_b.name_any();
        async move { claims.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    create(&pods, pod("d", template.clone())).await;
    let d = running(&pods, "d").await;
    let d_claim = claim_of(&claims, &d).await;
    let d_result = &d_claim
        .clone()
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap()[0];
    assert_eq!(d_result.device, devices[0], "first fit: the GPU c is on");
    let d_mask = record(&d)["main"][0]["envs"]["HSA_CU_MASK"]
        .as_str()
        .unwrap()
        .to_owned();
    let d_set = CuSet::parse(d_mask.strip_prefix("0:").unwrap(), 104).unwrap();
    assert!(!d_set.overlaps(&c_set), "d {d_mask} and c {c_mask}");

    // d is deleted with no other pod scheduled in between: its capacity comes back too
    // (64 CUs on that GPU fit only without d's 40).
    pods.delete("d", &DeleteParams::default()).await.unwrap();
    wait("d's claim freed and deleted", || {
        let claims = claims.clone();
        let name = d_claim.name_any();
        async move { claims.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    create(&claims, json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "pinned-64", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu-slice", "count": 1,
            "selectors": [{"cel": {"expression": format!("device.attributes[\"{DRIVER}\"].uuid == \"{uuid}\"")}}],
            "capacity": {"requests": {"memory": "8Gi", "computeUnits": "64"}}}}]}}}))
    .await;
    create(
        &pods,
        pod(
            "e",
            json!({"name": "gpu", "resourceClaimName": "pinned-64"}),
        ),
    )
    .await;
    running(&pods, "e").await;

    kubelet.shutdown().await;
    scheduler.abort();
    let _ = stop_plugin.send(());
    tokio::time::timeout(TIMEOUT, plugin)
        .await
        .unwrap()
        .unwrap();
}
