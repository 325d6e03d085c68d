//! dmem limits of prepared claims: written to a pod cgroup that appears late, summed over
//! the pod's claims.

use crate::kubelet_support::*;

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
    // The pod cgroup appears only after Prepare returned (as with a real runtime), with its
    // dmem.max in one step as a cgroup mkdir makes it: made aside, then renamed into place
    // (made in two steps, the writer could meet the directory without the file — a quiet
    // CI run did — which no kernel shows).
    let pod = cgroups
        .join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1111_2222.slice");
    let staged = cgroups.join("staged-pod-cgroup");
    std::fs::create_dir_all(&staged).unwrap();
    std::fs::write(staged.join("dmem.max"), "").unwrap();
    std::fs::create_dir_all(pod.parent().unwrap()).unwrap();
    std::fs::rename(&staged, &pod).unwrap();
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
