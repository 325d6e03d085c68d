//! Claims prepared at once: a claim GET that hangs delays only its own claim, and CUs a
//! prepare in flight chose are never given to another claim.

use crate::kubelet_support::*;

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
