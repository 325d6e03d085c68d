//! Allocation end to end: init and app containers get disjoint CU slices, four GPUs keep
//! the scheduler's order (whole WGPs on RDNA), CPX partitions are whole devices.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_and_two_app_containers_then_quarter_pods_are_disjoint() {
    // CU-sliced partitions: only with the explicit opt-in.
    let h = Harness::start_with(
        hami_sysfs_fixtures::mi300x_cpx().unwrap(),
        Opts {
            slice_partitions: true,
            ..Default::default()
        },
    )
    .await;
    let register = h.node_annotation(AMD.node_register).unwrap();
    assert_eq!(
        hami_protocol::node_register::decode_node_devices(&register)
            .unwrap()
            .len(),
        63
    );
    let d0 = &h.devices[0];
    let runs = vec![
        vec![dev(d0, 1024, 9)],
        vec![dev(d0, 2048, 9)],
        vec![dev(&h.devices[1], 4096, 19)],
    ];
    h.schedule(
        "p1",
        json!([gpu_container("app1", 1), gpu_container("app2", 1)]),
        json!([gpu_container("init", 1)]),
        &runs,
        true,
    );
    let pod = h.wait_phase("p1").await;
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    let init = env_of(&pod, "init");
    let app1 = env_of(&pod, "app1");
    let app2 = env_of(&pod, "app2");
    assert_eq!(init["HSA_CU_MASK"], "0:0-8");
    assert_eq!(init["HIP_DEVICE_MEMORY_LIMIT_0"], "1024m");
    assert_eq!(
        app1["HSA_CU_MASK"], "0:0-8",
        "the app container reuses the finished init container's CUs (init counts at its peak)"
    );
    assert_eq!(app1["HIP_DEVICE_MEMORY_LIMIT_0"], "2048m");
    assert_eq!(app2["HSA_CU_MASK"], "0:0-18");
    assert_eq!(app2["ROCR_VISIBLE_DEVICES"], h.devices[1].rocr_id);
    assert_eq!(app2["LD_AUDIT"], "/usr/local/vgpu/libamvgpu.so");
    assert_eq!(ann(&pod, pod_keys::BIND_PHASE), Some("success"));
    assert_eq!(ann(&pod, AMD.devices_to_allocate), Some(";;;"));
    assert_eq!(
        ann(&pod, pod_keys::AMD_CU_ALLOCATED).unwrap(),
        format!(
            r#"{{"{}":"0-8","{}":"0-18"}}"#,
            d0.info.id, h.devices[1].info.id
        )
    );
    assert_eq!(
        h.node_annotation(node_keys::MUTEX_LOCK),
        None,
        "lock released after the last container"
    );

    // Two 25 % pods on one device (no lock: found as the oldest allocating pod).
    for name in ["q1", "q2"] {
        h.schedule(
            name,
            json!([gpu_container("main", 1)]),
            json!([]),
            &[vec![dev(&h.devices[2], 1000, 9)]],
            false,
        );
        let pod = h.wait_phase(name).await;
        assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    }
    let m1 = env_of(
        &h.server.get_object("v1", "pods", "default", "q1").unwrap(),
        "main",
    )["HSA_CU_MASK"]
        .clone();
    let m2 = env_of(
        &h.server.get_object("v1", "pods", "default", "q2").unwrap(),
        "main",
    )["HSA_CU_MASK"]
        .clone();
    assert_eq!(
        (m1.as_str().unwrap(), m2.as_str().unwrap()),
        ("0:0-8", "0:9-17")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_gpus_on_mi210_keep_order_and_rdna_is_wgp_aligned() {
    let h = Harness::start(hami_sysfs_fixtures::mi210_xgmi().unwrap()).await;
    let order = [5usize, 0, 7, 2];
    let run: Vec<_> = order
        .iter()
        .map(|&i| dev(&h.devices[i], 8192, 52))
        .collect();
    h.schedule(
        "four",
        json!([gpu_container("main", 4)]),
        json!([]),
        &[run],
        true,
    );
    let pod = h.wait_phase("four").await;
    let env = env_of(&pod, "main");
    let rocr: Vec<&str> = order
        .iter()
        .map(|&i| h.devices[i].rocr_id.as_str())
        .collect();
    assert_eq!(env["ROCR_VISIBLE_DEVICES"], rocr.join(","));
    assert_eq!(env["HSA_CU_MASK"], "0:0-51;1:0-51;2:0-51;3:0-51");
    assert_eq!(env["HIP_VISIBLE_DEVICES"], "0,1,2,3");
    drop(h);

    let h = Harness::start(
        hami_sysfs_fixtures::rdna_node(&[hami_sysfs_fixtures::Rdna::Gfx11]).unwrap(),
    )
    .await;
    for (name, cores, mask) in [("r1", 24, "0:0-23"), ("r2", 31, "0:24-53")] {
        h.schedule(
            name,
            json!([gpu_container("main", 1)]),
            json!([]),
            &[vec![dev(&h.devices[0], 1000, cores)]],
            true,
        );
        let pod = h.wait_phase(name).await;
        assert_eq!(env_of(&pod, "main")["HSA_CU_MASK"], mask);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpx_partitions_are_whole_devices_and_two_share_one_container() {
    let h = Harness::start(hami_sysfs_fixtures::mi300x_cpx().unwrap()).await;
    assert!(h.devices.iter().all(|d| d.info.count == 1));
    let (p0, p1, p3) = (&h.devices[0], &h.devices[1], &h.devices[3]);
    // The init container and an app container on one partition (init at its peak), and a
    // second app container with two partitions of the same card.
    let runs = vec![
        vec![dev(p0, 1024, 9)],
        vec![dev(p0, 2048, 9)],
        vec![dev(p3, 4096, 19), dev(p1, 4096, 19)],
    ];
    h.schedule(
        "whole",
        json!([gpu_container("app1", 1), gpu_container("app2", 2)]),
        json!([gpu_container("init", 1)]),
        &runs,
        true,
    );
    let pod = h.wait_phase("whole").await;
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    for c in ["init", "app1", "app2"] {
        let env = env_of(&pod, c);
        assert!(!env.contains_key("HSA_CU_MASK"), "{c}: {env:?}");
        assert!(!env.contains_key("LD_AUDIT"), "{c}: {env:?}");
    }
    assert_eq!(env_of(&pod, "init")["ROCR_VISIBLE_DEVICES"], p0.rocr_id);
    // Two partitions sharing the card's unique_id: indices into what is mounted.
    assert_eq!(env_of(&pod, "app2")["ROCR_VISIBLE_DEVICES"], "1,0");
    assert_eq!(ann(&pod, pod_keys::BIND_PHASE), Some("success"));
    // Events: the missing dmem controller is reported once for the node.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let events: kube::Api<k8s_openapi::api::core::v1::Event> =
            kube::Api::namespaced(h.client.clone(), "default");
        let n = events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some("AMDGPUDmemUnavailable")
                    && e.involved_object.name.as_deref() == Some(NODE)
            })
            .count();
        if n == 1 {
            break;
        }
        assert!(
            n == 0 && std::time::Instant::now() < deadline,
            "{n} dmem events"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
