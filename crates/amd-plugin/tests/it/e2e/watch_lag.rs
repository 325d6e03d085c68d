//! The plugin's pod watch lags behind the cluster (frozen by a proxy, as a watch being
//! re-established after an API server restart or a dropped watch lags, its store kept as it
//! last was): the pods it allocates meanwhile, which its watch never showed, still hold
//! their CUs for the next pod. Found by the chaos run (two, then four pods on one GPU with the
//! same CUs after a watch fault).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cus_handed_out_while_the_pod_watch_lags_are_not_handed_out_again() {
    let h = Harness::start_with(
        hami_sysfs_fixtures::mi210_xgmi().unwrap(),
        Opts {
            lagging_watch: true,
            ..Default::default()
        },
    )
    .await;
    let d = &h.devices[0];
    let slice = || vec![vec![dev(d, 1000, 10)]];
    // One pod while the watch delivers: the plugin's store shows it.
    h.schedule(
        "w1",
        json!([gpu_container("main", 1)]),
        json!([]),
        &slice(),
        true,
    );
    assert_eq!(h.wait_phase("w1").await["status"]["phase"], "Running");
    // The watch stops delivering; two pods are placed on the same GPU, one after the other,
    // each the node lock's owner (read by itself: the watch never shows it).
    h.lag.as_ref().unwrap().freeze(true);
    for name in ["w2", "w3"] {
        h.schedule(
            name,
            json!([gpu_container("main", 1)]),
            json!([]),
            &slice(),
            true,
        );
        let pod = h.wait_phase(name).await;
        assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    }
    h.lag.as_ref().unwrap().freeze(false);
    let masks: Vec<String> = ["w1", "w2", "w3"]
        .iter()
        .map(|name| {
            let pod = h.server.get_object("v1", "pods", "default", name).unwrap();
            env_of(&pod, "main")["HSA_CU_MASK"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let cus: Vec<hami_protocol::cu_list::CuSet> = masks
        .iter()
        .map(|m| hami_protocol::cu_list::CuSet::parse(m.split_once(':').unwrap().1, 1024).unwrap())
        .collect();
    for (i, a) in cus.iter().enumerate() {
        for (j, b) in cus.iter().enumerate().skip(i + 1) {
            assert!(
                !a.overlaps(b),
                "pods w{} and w{} share CUs: {masks:?}",
                i + 1,
                j + 1
            );
        }
    }
}
