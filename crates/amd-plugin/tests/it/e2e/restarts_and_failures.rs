//! Restarts and failures end to end: kubelet and plugin restarts keep allocations; a failed
//! Allocate sets the bind phase failed, releases the node lock and leaks no CUs.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_and_plugin_restarts_keep_allocations() {
    let mut h = Harness::start(
        hami_sysfs_fixtures::rdna_node(&[hami_sysfs_fixtures::Rdna::Gfx11]).unwrap(),
    )
    .await;
    let d = h.devices[0].clone();
    h.schedule(
        "a",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&d, 1000, 24)]],
        true,
    );
    assert_eq!(
        env_of(&h.wait_phase("a").await, "main")["HSA_CU_MASK"],
        "0:0-23"
    );

    // kubelet restart: the socket directory is wiped and kubelet.sock re-created.
    let before = h.sim().registrations();
    h.sim.as_mut().unwrap().restart().await.unwrap();
    wait_registered_again(
        h.sim(),
        before,
        "amd.com/gpu",
        10,
        "plugin did not re-register",
    )
    .await;
    h.schedule(
        "b",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&d, 1000, 24)]],
        true,
    );
    assert_eq!(
        env_of(&h.wait_phase("b").await, "main")["HSA_CU_MASK"],
        "0:24-47"
    );

    // Plugin restart: state lives in annotations, so the next slice is still disjoint.
    h.stop_plugin().await;
    let before = h.sim().registrations();
    h.start_plugin();
    wait_registered_again(
        h.sim(),
        before,
        "amd.com/gpu",
        10,
        "restarted plugin did not register",
    )
    .await;
    h.schedule(
        "c",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&d, 1000, 24)]],
        true,
    );
    assert_eq!(
        env_of(&h.wait_phase("c").await, "main")["HSA_CU_MASK"],
        "0:48-71"
    );
    h.stop_plugin().await;
    h.sim.take().unwrap().shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_set_failed_release_the_lock_and_leak_no_cus() {
    let h = Harness::start(
        hami_sysfs_fixtures::rdna_node(&[hami_sysfs_fixtures::Rdna::Gfx11]).unwrap(),
    )
    .await;
    let d = h.devices[0].clone();
    // Runs that do not match the request: the run holds 2 devices, the container asks 1.
    h.schedule(
        "mismatch",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&d, 10, 2), dev(&d, 10, 2)]],
        true,
    );
    let pod = h.wait_phase("mismatch").await;
    assert_eq!(pod["status"]["phase"], "Failed");
    assert!(
        status_message(&pod).contains("holds 2 device(s) but kubelet asked for 1"),
        "{pod}"
    );
    assert_eq!(ann(&pod, pod_keys::BIND_PHASE), Some("failed"));
    assert_eq!(ann(&pod, pod_keys::AMD_CU_ALLOCATED), None);
    assert_eq!(h.node_annotation(node_keys::MUTEX_LOCK), None);

    // Malformed device list.
    h.server
        .create_object("v1", "pods", Some("default"), json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "garbled", "annotations": {AMD.devices_to_allocate: "x,y:;", pod_keys::BIND_PHASE: "allocating", pod_keys::VGPU_NODE: NODE}},
            "spec": {"nodeName": NODE, "containers": [gpu_container("main", 1)]},
        }))
        .unwrap();
    let pod = h.wait_phase("garbled").await;
    assert!(status_message(&pod).contains("malformed"), "{pod}");

    // API server fails mid-Allocate (the pod patch): nothing recorded, failed, lock released.
    h.server
        .faults()
        .fail_next(Some("patch"), Some("pods"), 1, 500);
    h.schedule(
        "apifail",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&d, 1000, 24)]],
        true,
    );
    let pod = h.wait_phase("apifail").await;
    assert_eq!(pod["status"]["phase"], "Failed");
    assert!(
        status_message(&pod).contains("cannot record the allocation"),
        "{pod}"
    );
    assert_eq!(ann(&pod, pod_keys::BIND_PHASE), Some("failed"));
    assert_eq!(
        ann(&pod, pod_keys::AMD_CU_ALLOCATED),
        None,
        "no CU bits leaked"
    );
    assert_eq!(h.node_annotation(node_keys::MUTEX_LOCK), None);

    // The hook is not installed on the host (issue 29): refused with the path and what to
    // install, instead of a container runtime mounting an empty directory in its place.
    std::fs::remove_file(h.hook_file()).unwrap();
    h.schedule(
        "nohook",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&d, 1000, 24)]],
        true,
    );
    let pod = h.wait_phase("nohook").await;
    assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
    let message = status_message(&pod);
    assert!(
        message.contains(&format!("{} does not exist", h.hook_file().display()))
            && message.contains("install the HAMi hook"),
        "{pod}"
    );
    assert_eq!(ann(&pod, pod_keys::BIND_PHASE), Some("failed"));
    assert_eq!(ann(&pod, pod_keys::AMD_CU_ALLOCATED), None);
    assert_eq!(h.node_annotation(node_keys::MUTEX_LOCK), None);
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    let books = h.hook_root().join(format!("vgpu/containers/{uid}_main"));
    assert!(!books.exists(), "{} left behind", books.display());
    install_stub_hook(&h.hook_root(), "libamvgpu.so");

    // The next pod starts from CU 0 again: nothing was leaked by the failures.
    h.schedule(
        "ok",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&d, 1000, 24)]],
        true,
    );
    assert_eq!(
        env_of(&h.wait_phase("ok").await, "main")["HSA_CU_MASK"],
        "0:0-23"
    );

    // A pod the scheduler did not place: whole-card hand-over.
    h.server
        .create_object(
            "v1",
            "pods",
            Some("default"),
            json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
                "spec": {"nodeName": NODE, "containers": [gpu_container("main", 1)]},
            }),
        )
        .unwrap();
    // The node's only card holds the "ok" pod's slice: never handed out whole.
    let pod = h.wait_phase("plain").await;
    assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
    assert!(
        status_message(&pod).contains("holds slices of HAMi pods"),
        "{pod}"
    );
}
