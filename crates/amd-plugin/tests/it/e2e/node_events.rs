//! The node's annotation and Events end to end: no GPU removes the register annotation, an
//! unhealthy GPU and a compute-partition mismatch are Events, one unreadable CU annotation
//! is skipped with an Event while the node keeps serving.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotation_removed_when_no_gpu_and_unhealthy_event() {
    let h = Harness::start(
        hami_sysfs_fixtures::rdna_node(&[hami_sysfs_fixtures::Rdna::Gfx11]).unwrap(),
    )
    .await;
    assert!(h.node_annotation(AMD.node_register).is_some());
    // The register heartbeat: written with the register annotation, announcing the
    // refresh period (1 s here), and a new value at every refresh (issue 17 item 13).
    hami_plugin_harness::assert_heartbeat_refreshes(
        &h.server,
        NODE,
        hami_protocol::names::Vendor::Amd,
    )
    .await;
    // The render node disappears: unhealthy in ListAndWatch and an Event on the node.
    h.tree.remove_dev("dri/renderD128").unwrap();
    assert!(
        h.sim()
            .wait_for_allocatable("amd.com/gpu", 0, Duration::from_secs(10))
            .await
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let events: kube::Api<k8s_openapi::api::core::v1::Event> =
            kube::Api::namespaced(h.client.clone(), "default");
        let list = events.list(&Default::default()).await.unwrap();
        if list
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("AMDGPUUnhealthy"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no AMDGPUUnhealthy event"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The GPU vanishes from sysfs: the annotation is removed.
    h.tree
        .remove("bus/pci/drivers/amdgpu/0000:03:00.0")
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h.node_annotation(AMD.node_register).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "register annotation not removed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Removed in the same patch: nothing offered, nothing to keep alive.
    let beat_key = hami_protocol::handshake::key(hami_protocol::names::Vendor::Amd);
    assert_eq!(h.node_annotation(beat_key), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_cu_annotation_is_skipped_with_an_event_and_the_node_keeps_serving() {
    let h = Harness::start(hami_sysfs_fixtures::mi210_xgmi().unwrap()).await;
    let (d0, d1) = (h.devices[0].clone(), h.devices[1].clone());
    // A running pod placed by HAMi whose CU annotation was damaged.
    let list = encode_pod_devices(&[vec![dev(&d0, 1000, 26)]]).unwrap();
    h.server
        .create_object("v1", "pods", Some("default"), json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "damaged", "annotations": {
                AMD.devices_allocated: list, AMD.devices_to_allocate: ";",
                pod_keys::AMD_CU_ALLOCATED: "{not json", pod_keys::BIND_PHASE: "success"}},
            "spec": {"schedulerName": "hami-scheduler", "containers": [gpu_container("main", 1)]},
        }))
        .unwrap();
    // Running on this node (status first, so kubelet-sim does not admit it again).
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(h.client.clone(), "default");
    pods.patch_status(
        "damaged",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    pods.create_subresource::<_, Value>(
        "binding",
        "damaged",
        &kube::api::PostParams::default(),
        &json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "damaged"}, "target": {"kind": "Node", "name": NODE}}),
    )
    .await
    .unwrap();
    // The other pods of the node are still served (a slice on another card); the damaged
    // pod's card counts as fully used, since which of its CUs it holds is unknown.
    for (name, d, phase) in [("next1", &d1, "Running"), ("next0", &d0, "Failed")] {
        h.schedule(
            name,
            json!([gpu_container("main", 1)]),
            json!([]),
            &[vec![dev(d, 1000, 26)]],
            true,
        );
        let pod = h.wait_phase(name).await;
        assert_eq!(pod["status"]["phase"], phase, "{pod}");
        if phase == "Failed" {
            assert!(
                status_message(&pod).contains("not enough free CUs"),
                "{pod}"
            );
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let events: kube::Api<k8s_openapi::api::core::v1::Event> =
            kube::Api::namespaced(h.client.clone(), "default");
        let named: Vec<_> = events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("AMDCuAllocatedMalformed"))
            .collect();
        if !named.is_empty() {
            assert_eq!(named.len(), 1, "one Event per bad annotation: {named:?}");
            assert_eq!(named[0].involved_object.name.as_deref(), Some("damaged"));
            assert!(
                named[0]
                    .message
                    .as_deref()
                    .unwrap()
                    .contains("default/damaged"),
                "{named:?}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no Event names the damaged pod"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compute_partition_mismatch_is_an_event_once() {
    let h = Harness::start(hami_sysfs_fixtures::mi308x_qpx().unwrap()).await;
    assert_eq!(h.devices.len(), 32);
    // The node should run CPX; its cards run QPX.
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(h.client.clone());
    nodes
        .patch(
            NODE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {node_keys::AMD_COMPUTE_PARTITION: "CPX"}}}),
            ),
        )
        .await
        .unwrap();
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(h.client.clone(), "default");
    let count = || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("AMDGPUPartitionMismatch"))
            .map(|e| e.message.unwrap_or_default())
            .collect::<Vec<_>>()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let first = loop {
        let seen = count().await;
        if seen.len() >= 8 {
            break seen;
        }
        assert!(std::time::Instant::now() < deadline, "{seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(first.len(), 8, "one per card: {first:?}");
    assert!(
        first
            .iter()
            .all(|m| m.contains("runs compute partition QPX but the node expects CPX"))
    );
    // Published every second (register interval 1 s): still one Event per card. The sleep
    // is deliberate: a non-event (no second Event) has no condition to wait on.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(count().await.len(), 8);
}
