//! Issue 26 item 1 on the AMD plugin, end to end on the embedded API server: the real
//! plugin and the simulated kubelet over real unix sockets. Pods HAMi did not place (plain
//! `amd.com/gpu`, `spec.nodeName` set, webhook opt-out) get whole cards recorded on the pod
//! (`hami.io/amd-whole-cards`): a second plain pod gets another card, a HAMi slice decided
//! on a held card is refused at Allocate, and when only held cards are left kubelet's
//! insistence is refused too. (The scheduler and `hami status` side, which is the same for
//! both vendors, runs in the NVIDIA plugin's `whole_card_holdings` full-stack test.)

use std::time::Duration;

use hami_amd_plugin::cli::Args;
use hami_amd_plugin::registration::RegisteredDevice;
use hami_plugin_harness::{Decision, api_with_node, env_of, start_kubelet, status_message};
use hami_protocol::device_list::ContainerDevice;
use hami_protocol::names::{AMD, pod as pod_keys};
use serde_json::{Value, json};
use tokio::sync::watch;

const NODE: &str = "node-a";
const KEY: &str = "hami.io/amd-whole-cards";

fn plain(name: &str, gpus: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"hami.io/webhook": "ignore"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "rocm/dev:latest",
            "resources": {"limits": {"amd.com/gpu": gpus.to_string()}}}]},
    })
}

/// The registered ids of the cards a container got, from its `ROCR_VISIBLE_DEVICES`.
fn cards_of(pod: &Value, devices: &[RegisteredDevice]) -> Vec<String> {
    let env = env_of(pod, "main");
    env["ROCR_VISIBLE_DEVICES"]
        .as_str()
        .unwrap()
        .split(',')
        .map(|rocr| {
            devices
                .iter()
                .find(|d| d.rocr_id == rocr)
                .unwrap_or_else(|| panic!("{rocr} is no card of this node"))
                .info
                .id
                .clone()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_pods_get_recorded_cards_nobody_holds_and_slices_never_share_them() {
    use clap::Parser;
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let (server, client) = api_with_node(NODE).await;
    let sockets = tree.sysfs_root().parent().unwrap().join("device-plugins");
    let devices = hami_amd_plugin::discover_report::build_report(
        &tree.sysfs_root(),
        &tree.dev_root(),
        &Default::default(),
    )
    .unwrap()
    .registration
    .devices;
    assert_eq!(devices.len(), 8);
    let sim = start_kubelet(sockets.clone(), NODE, client.clone()).await;
    let mut args = Args::parse_from(["k8s-device-plugin"]);
    args.sysfs_root = tree.sysfs_root();
    args.dev_root = tree.dev_root();
    args.device_plugin_dir = sockets.clone();
    args.node_name = Some(NODE.into());
    args.register_interval = 1;
    args.pulse = 1;
    args.cgroup_root = tree.sysfs_root().join("fs/cgroup");
    args.exporter_socket = sockets.join("no-exporter.socket");
    let settings = args.registration_settings().unwrap();
    let (stop, stopped) = watch::channel(false);
    let plugin = tokio::spawn(hami_amd_plugin::plugin::serve(
        args,
        settings,
        client.clone(),
        stopped,
    ));
    let shares: usize = devices.iter().map(|d| d.info.count as usize).sum();
    assert!(
        sim.wait_for_allocatable("amd.com/gpu", shares, Duration::from_secs(30))
            .await
    );
    let create = |pod: Value| {
        server
            .create_object("v1", "pods", Some("default"), pod)
            .unwrap();
    };
    let wait = |name: &'static str| hami_plugin_harness::wait_phase(&server, name);

    // Two plain pods, one after the other: each card recorded, never the same card.
    let mut held = Vec::new();
    for name in ["plain-1", "plain-2"] {
        create(plain(name, 1));
        let pod = wait(name).await;
        assert_eq!(pod["status"]["phase"], "Running", "{pod}");
        let cards = cards_of(&pod, &devices);
        assert_eq!(
            pod["metadata"]["annotations"][KEY].as_str(),
            Some(cards.join(",").as_str()),
            "{name}: the holding is recorded on the pod: {pod}"
        );
        held.extend(cards);
    }
    assert_ne!(
        held[0], held[1],
        "the second plain pod got the first one's card"
    );

    // A HAMi slice (20 % of the first held card) decided before the scheduler saw the
    // holding: refused at Allocate, naming the holder; no CU handed out.
    let card = devices.iter().find(|d| d.info.id == held[0]).unwrap();
    let slice = ContainerDevice {
        uuid: card.info.id.clone(),
        device_type: card.info.device_type.clone(),
        mem_mib: 1000,
        cores: card.info.devcore / 5,
    };
    hami_plugin_harness::schedule(
        &server,
        &client,
        &AMD,
        NODE,
        Decision {
            name: "slice",
            containers: json!([{"name": "main", "image": "rocm/dev:latest",
                "resources": {"limits": {"amd.com/gpu": "1"}}}]),
            init: json!([]),
            runs: &[vec![slice]],
        },
        true,
    )
    .await;
    let pod = wait("slice").await;
    assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
    let why = status_message(&pod);
    assert!(
        why.contains("held whole by pod default/plain-1") && why.contains(KEY),
        "{why}"
    );
    assert_eq!(
        pod["metadata"]["annotations"][pod_keys::BIND_PHASE],
        "failed"
    );
    assert!(
        pod["metadata"]["annotations"][pod_keys::AMD_CU_ALLOCATED]
            .as_str()
            .is_none_or(|t| !t.contains(&held[0])),
        "{pod}"
    );

    // The six cards left go to one plain pod; then only held cards are left, and a fourth
    // plain pod is refused whatever kubelet offers.
    create(plain("plain-3", 6));
    let pod = wait("plain-3").await;
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    let cards = cards_of(&pod, &devices);
    assert_eq!(cards.len(), 6);
    assert!(
        cards.iter().all(|c| !held.contains(c)),
        "{cards:?} {held:?}"
    );
    create(plain("plain-4", 1));
    let pod = wait("plain-4").await;
    assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
    let why = status_message(&pod);
    assert!(why.contains("holds whole") && why.contains(KEY), "{why}");
    assert!(pod["metadata"]["annotations"][KEY].is_null(), "{pod}");

    stop.send(true).unwrap();
    plugin.await.unwrap().unwrap();
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_not_placed_by_hami_get_exactly_the_free_whole_cards_they_ask_for() {
    use super::{Harness, NODE, dev, gpu_container};
    let h = Harness::start(hami_sysfs_fixtures::mi210_xgmi().unwrap()).await;
    let d0 = h.devices[0].clone();
    h.schedule(
        "slice",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&d0, 1000, 26)]],
        true,
    );
    assert_eq!(h.wait_phase("slice").await["status"]["phase"], "Running");
    h.server
        .create_object(
            "v1",
            "pods",
            Some("default"),
            json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain3"},
                "spec": {"nodeName": NODE, "containers": [gpu_container("main", 3)]},
            }),
        )
        .unwrap();
    let pod = h.wait_phase("plain3").await;
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    let env = env_of(&pod, "main");
    assert_eq!(env.keys().collect::<Vec<_>>(), vec!["ROCR_VISIBLE_DEVICES"]);
    let rocr: Vec<&str> = env["ROCR_VISIBLE_DEVICES"]
        .as_str()
        .unwrap()
        .split(',')
        .collect();
    assert_eq!(
        rocr.len(),
        3,
        "exactly the 3 GPUs kubelet asked for: {rocr:?}"
    );
    assert!(
        !rocr.contains(&d0.rocr_id.as_str()),
        "never the card holding a slice"
    );
}
