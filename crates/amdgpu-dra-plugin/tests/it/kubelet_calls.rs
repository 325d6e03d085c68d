//! The plugin over real unix sockets, with a tonic client in kubelet's role: registration,
//! prepare (files on disk, disjoint CUs), idempotence, unprepare after a plugin restart and
//! after the claim is deleted, per-claim errors.

use crate::kubelet_support::*;

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
