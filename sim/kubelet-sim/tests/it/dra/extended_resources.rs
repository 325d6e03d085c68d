//! KEP-5004: a pod asking only for `amd.com/gpu` gets the scheduler's claim and whole GPUs
//! through its `extendedResourceClaimStatus` mappings, and gives them back.

use super::*;

/// A plain-count pod: container `main` with `amd.com/gpu: <n>` in its limits, labelled so
/// the HAMi webhook leaves it alone, with no claims.
fn count_pod(name: &str, n: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
            "labels": {"hami.io/webhook": "ignore"}},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [{"name": "main", "image": "rocm",
                "resources": {"limits": {"amd.com/gpu": n.to_string()}}}],
        },
    })
}

/// The pod's extended-resource claim (KEP-5004), from its status.
async fn extended_claim_of(claims: &Api<ResourceClaim>, pod: &Pod) -> ResourceClaim {
    let st = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .expect("extendedResourceClaimStatus");
    claims.get(&st.resource_claim_name).await.unwrap()
}

async fn gone(claims: &Api<ResourceClaim>, name: &str) {
    wait(&format!("claim {name} deleted"), || {
        let claims = claims.clone();
        let name = name.to_owned();
        async move { claims.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_gpu_counts_get_whole_gpus_through_the_extended_resource_class() {
    let DraNode {
        _server,
        client,
        tree: _tree,
        dir,
        kubelet,
        gpus: _,
        driver: _driver,
        stop_plugin,
        plugin,
        scheduler,
    } = dra_node().await;
    // The chart's class (crates/manifests device_class with extendedResourceName on).
    let class_api: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(client.clone());
    create(
        &class_api,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "amdgpu.hami-rs.io"},
        "spec": {"extendedResourceName": "amd.com/gpu",
            "selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let slice_api: Api<ResourceSlice> = Api::all(client.clone());
    let slice = slice_api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .remove(0);
    let slice_devices = slice.spec.devices.clone().unwrap();

    // amd.com/gpu: 1 → the scheduler's claim, one whole MI210.
    create(&pods, count_pod("whole", 1)).await;
    let whole = running(&pods, "whole").await;
    let st = whole
        .status
        .as_ref()
        .unwrap()
        .extended_resource_claim_status
        .clone()
        .unwrap();
    assert_eq!(st.request_mappings.len(), 1);
    let m = &st.request_mappings[0];
    assert_eq!(
        (
            m.container_name.as_str(),
            m.resource_name.as_str(),
            m.request_name.as_str()
        ),
        ("main", "amd.com/gpu", "container-0-request-0")
    );
    let c = extended_claim_of(&claims, &whole).await;
    assert!(
        c.name_any().starts_with("whole-extended-resources-"),
        "{}",
        c.name_any()
    );
    assert_eq!(
        c.annotations()["resource.kubernetes.io/extended-resource-claim"],
        "true"
    );
    let owner = &c.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Pod", whole.uid().unwrap().as_str(), Some(true))
    );
    let req = &c.spec.devices.as_ref().unwrap().requests.as_ref().unwrap()[0];
    assert_eq!(req.name, "container-0-request-0");
    let exactly = req.exactly.as_ref().unwrap();
    assert_eq!(
        (exactly.device_class_name.as_str(), exactly.count),
        ("amdgpu.hami-rs.io", Some(1))
    );
    let status = c.status.clone().unwrap();
    assert_eq!(
        status.reserved_for.as_ref().unwrap()[0].uid,
        whole.uid().unwrap()
    );
    let results = status.allocation.unwrap().devices.unwrap().results.unwrap();
    assert_eq!(results.len(), 1);
    let r = &results[0];
    assert_eq!(r.request, "container-0-request-0");
    let dev = slice_devices.iter().find(|d| d.name == r.device).unwrap();
    let cap = dev.capacity.as_ref().unwrap();
    let used = r.consumed_capacity.as_ref().unwrap();
    // The whole device: its full memory and CUs (the request policies' defaults), one share.
    assert_eq!(used["memory"], cap["memory"].value, "{used:?}");
    assert_eq!(used["computeUnits"], cap["computeUnits"].value, "{used:?}");
    assert_eq!(used["shares"].0, "1", "{used:?}");
    // kubelet gave the container the request's CDI devices through the mapping: the GPU
    // whole, so no hook, no CU mask and no memory limit (the device plugin's whole-GPU env).
    let rec = record(&whole);
    let entry = &rec["main"][0];
    assert_eq!(entry["claim"], c.name_any(), "{rec}");
    assert_eq!(entry["request"], "container-0-request-0", "{rec}");
    let env = entry["envs"].as_object().unwrap();
    let uuid = dev.attributes.as_ref().unwrap()["uuid"]
        .string
        .clone()
        .unwrap();
    assert!(
        env["ROCR_VISIBLE_DEVICES"]
            .as_str()
            .is_some_and(|v| !v.is_empty() && !v.contains(',')),
        "{env:?}"
    );
    for absent in ["HSA_CU_MASK", "HIP_DEVICE_MEMORY_LIMIT_0", "LD_AUDIT"] {
        assert!(!env.contains_key(absent), "{absent} in {env:?}");
    }
    let dev_paths: Vec<&str> = entry["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["containerPath"].as_str().unwrap())
        .collect();
    assert!(dev_paths.contains(&"/dev/kfd"), "{dev_paths:?}");
    assert_eq!(
        dev_paths
            .iter()
            .filter(|p| p.starts_with("/dev/dri/renderD"))
            .count(),
        1,
        "{dev_paths:?}"
    );
    assert!(
        entry["mounts"].as_array().unwrap().is_empty(),
        "no hook mount for a whole GPU: {entry}"
    );

    // A slice pinned to that GPU cannot land on it while the pod holds it whole.
    create(&claims, json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "slice-on-it", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu.hami-rs.io", "count": 1,
            "selectors": [{"cel": {"expression": format!("device.attributes[\"{DRIVER}\"].uuid == \"{uuid}\"")}}],
            "capacity": {"requests": {"memory": "8Gi", "computeUnits": "8"}}}}]}}}))
    .await;
    create(
        &pods,
        pod(
            "slice",
            json!({"name": "gpu", "resourceClaimName": "slice-on-it"}),
        ),
    )
    .await;
    let message = wait("the slice pod unschedulable", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("slice").await.ok()?;
            let cond = p
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled")?;
            (cond.status == "False").then_some(cond.message)
        }
    })
    .await
    .unwrap();
    assert!(
        message.starts_with("0/1 nodes are available: 1 cannot allocate claim \"slice-on-it\""),
        "{message}"
    );

    // Deleting the pod: kubelet unprepares, the claim is freed and deleted, the GPU is free
    // again and the slice runs on it.
    let whole_claim = c.name_any();
    pods.delete("whole", &DeleteParams::default())
        .await
        .unwrap();
    gone(&claims, &whole_claim).await;
    let slice_pod = running(&pods, "slice").await;
    let sr = &claims
        .get("slice-on-it")
        .await
        .unwrap()
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap()[0];
    assert_eq!(sr.device, r.device);
    assert!(record(&slice_pod)["main"][0]["envs"]["HSA_CU_MASK"].is_string());

    // amd.com/gpu: 2 → one request of count 2, two distinct whole GPUs, both in the
    // container's CDI devices; not the one the slice holds.
    create(&pods, count_pod("two", 2)).await;
    let two = running(&pods, "two").await;
    let c2 = extended_claim_of(&claims, &two).await;
    let req = &c2.spec.devices.as_ref().unwrap().requests.as_ref().unwrap()[0];
    assert_eq!(req.exactly.as_ref().unwrap().count, Some(2));
    let results = c2
        .status
        .clone()
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap();
    assert_eq!(results.len(), 2);
    assert_ne!(results[0].device, results[1].device);
    assert!(results.iter().all(|x| x.device != r.device), "{results:?}");
    let rec = record(&two);
    let env = &rec["main"][0]["envs"];
    assert_eq!(
        env["ROCR_VISIBLE_DEVICES"]
            .as_str()
            .unwrap()
            .split(',')
            .count(),
        2,
        "{env}"
    );
    assert!(env.get("HSA_CU_MASK").is_none(), "{env}");
    assert_eq!(cdi_files(&dir).len(), 2, "the slice's and two's specs");
    pods.delete("two", &DeleteParams::default()).await.unwrap();
    gone(&claims, &c2.name_any()).await;
    // kubelet unprepared it: only the slice's CDI spec is left.
    wait("two's CDI spec removed", || {
        let n = cdi_files(&dir).len();
        async move { (n == 1).then_some(()) }
    })
    .await;

    kubelet.shutdown().await;
    scheduler.abort();
    let _ = stop_plugin.send(());
    tokio::time::timeout(TIMEOUT, plugin)
        .await
        .unwrap()
        .unwrap();
}
