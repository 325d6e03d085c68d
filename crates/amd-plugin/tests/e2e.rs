//! End to end on the embedded API server: plugin + simulated kubelet over real unix
//! sockets, with the scheduler's decision written as the HAMi scheduler writes it
//! (device lists, bind phase, node lock).

use std::path::PathBuf;
use std::time::Duration;

use hami_amd_plugin::cli::Args;
use hami_amd_plugin::registration::RegisteredDevice;
use hami_apiserver::RunningApiServer;
use hami_kubelet_sim::KubeletSim;
use hami_kubelet_sim::records::RECORD_ANNOTATION;
use hami_plugin_harness::{
    Decision, annotation as ann, api_with_node, env_of, start_kubelet, status_message,
    wait_registered_again,
};
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::names::{AMD, node as node_keys, pod as pod_keys};
use hami_sysfs_fixtures::FixtureTree;
use serde_json::{Value, json};
use tokio::sync::watch;

const NODE: &str = "node-a";

struct Harness {
    server: RunningApiServer,
    client: kube::Client,
    tree: FixtureTree,
    sockets: PathBuf,
    sim: Option<KubeletSim>,
    plugin: Option<(
        watch::Sender<bool>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
    devices: Vec<RegisteredDevice>,
    /// `--slice-partitions` (the explicit opt-in to CU-slice hard partitions).
    slice_partitions: bool,
    /// `--cdi` with the spec in this directory.
    cdi: Option<PathBuf>,
    /// `--exporter-socket`.
    exporter: Option<PathBuf>,
}

/// Plugin options of a harness.
#[derive(Default)]
struct Opts {
    slice_partitions: bool,
    cdi: Option<PathBuf>,
    exporter: Option<PathBuf>,
}

impl Harness {
    async fn start(tree: FixtureTree) -> Self {
        Self::start_with(tree, Opts::default()).await
    }

    async fn start_with(tree: FixtureTree, opts: Opts) -> Self {
        let Opts {
            slice_partitions,
            cdi,
            exporter,
        } = opts;
        let (server, client) = api_with_node(NODE).await;
        let sockets = tree.sysfs_root().parent().unwrap().join("device-plugins");
        let devices = hami_amd_plugin::discover_report::build_report(
            &tree.sysfs_root(),
            &tree.dev_root(),
            &hami_amd_plugin::registration::RegistrationSettings {
                slice_partitions,
                ..Default::default()
            },
        )
        .unwrap()
        .registration
        .devices;
        let sim = start_kubelet(sockets.clone(), NODE, client.clone()).await;
        let mut h = Self {
            server,
            client,
            tree,
            sockets,
            sim: Some(sim),
            plugin: None,
            devices,
            slice_partitions,
            cdi,
            exporter,
        };
        h.start_plugin();
        let shares: usize = h.devices.iter().map(|d| d.info.count as usize).sum();
        assert!(
            h.sim()
                .wait_for_allocatable("amd.com/gpu", shares, Duration::from_secs(20))
                .await,
            "kubelet sees {} of {shares} devices",
            h.sim().allocatable("amd.com/gpu")
        );
        h
    }

    fn sim(&self) -> &KubeletSim {
        self.sim.as_ref().unwrap()
    }

    fn start_plugin(&mut self) {
        use clap::Parser;
        let mut args = Args::parse_from(["k8s-device-plugin"]);
        args.sysfs_root = self.tree.sysfs_root();
        args.dev_root = self.tree.dev_root();
        args.device_plugin_dir = self.sockets.clone();
        args.node_name = Some(NODE.into());
        args.register_interval = 1;
        args.pulse = 1;
        args.cgroup_root = self.tree.sysfs_root().join("fs/cgroup");
        args.slice_partitions = self.slice_partitions;
        args.exporter_socket = self
            .exporter
            .clone()
            .unwrap_or_else(|| self.sockets.join("no-exporter.socket"));
        if let Some(dir) = &self.cdi {
            args.cdi = true;
            args.cdi_spec_dir = dir.clone();
        }
        let settings = args.registration_settings().unwrap();
        let (tx, rx) = watch::channel(false);
        let client = self.client.clone();
        let task = tokio::spawn(hami_amd_plugin::plugin::serve(args, settings, client, rx));
        self.plugin = Some((tx, task));
    }

    async fn stop_plugin(&mut self) {
        if let Some((tx, task)) = self.plugin.take() {
            tx.send(true).unwrap();
            task.await.unwrap().unwrap();
        }
    }

    /// Writes what the HAMi scheduler writes at filter + bind, with the node lock.
    fn schedule(
        &self,
        name: &str,
        containers: Value,
        init: Value,
        runs: &[Vec<ContainerDevice>],
        take_lock: bool,
    ) {
        let decision = Decision {
            name,
            containers,
            init,
            runs,
        };
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(hami_plugin_harness::schedule(
                &self.server,
                &self.client,
                &AMD,
                NODE,
                decision,
                take_lock,
            ))
        });
    }

    async fn wait_phase(&self, name: &str) -> Value {
        hami_plugin_harness::wait_phase(&self.server, name).await
    }

    fn node_annotation(&self, key: &str) -> Option<String> {
        hami_plugin_harness::node_annotation(&self.server, NODE, key)
    }
}

fn gpu_container(name: &str, gpus: u32) -> Value {
    json!({"name": name, "image": "rocm/dev:latest", "resources": {"limits": {"amd.com/gpu": gpus.to_string()}}})
}

fn dev(d: &RegisteredDevice, mem: u64, cores: u32) -> ContainerDevice {
    ContainerDevice {
        uuid: d.info.id.clone(),
        device_type: d.info.device_type.clone(),
        mem_mib: mem,
        cores,
    }
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_not_placed_by_hami_get_exactly_the_free_whole_cards_they_ask_for() {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdi_option_answers_with_cdi_names_and_keeps_the_spec() {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let dir = tree.sysfs_root().parent().unwrap().join("cdi");
    let h = Harness::start_with(
        tree,
        Opts {
            cdi: Some(dir.clone()),
            ..Default::default()
        },
    )
    .await;
    let d = h.devices[2].clone();
    h.schedule(
        "cdi",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&d, 1024, 26)]],
        true,
    );
    let pod = h.wait_phase("cdi").await;
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    let record: Value = serde_json::from_str(ann(&pod, RECORD_ANNOTATION).unwrap()).unwrap();
    let main = &record["main"][0];
    assert_eq!(
        main["cdiDevices"],
        json!([format!("amd.com/gpu=card{}", d.card)])
    );
    assert_eq!(main["devices"], json!([]), "devices come from the CDI spec");
    assert_eq!(main["envs"]["HSA_CU_MASK"], "0:0-25");
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(hami_amd_plugin::cdi::SPEC_FILE)).unwrap(),
    )
    .unwrap();
    hami_amd_plugin::cdi::validate(&spec).unwrap();
    let entry = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == format!("card{}", d.card))
        .unwrap();
    assert_eq!(
        entry["containerEdits"]["deviceNodes"][1]["path"],
        format!("/dev/dri/renderD{}", d.render)
    );
}

mod fake_exporter {
    use hami_amd_plugin::exporter::metricssvc::metrics_service_server::{
        MetricsService, MetricsServiceServer,
    };
    use hami_amd_plugin::exporter::metricssvc::{GpuGetRequest, GpuState, GpuStateResponse};
    use std::sync::{Arc, Mutex};

    /// A stand-in for the AMD device-metrics exporter: serves `List` over its unix socket
    /// with whatever health the test sets.
    #[derive(Clone, Default)]
    pub struct Exporter(pub Arc<Mutex<Vec<(String, String)>>>);

    #[tonic::async_trait]
    impl MetricsService for Exporter {
        async fn get_gpu_state(
            &self,
            _: tonic::Request<GpuGetRequest>,
        ) -> Result<tonic::Response<GpuStateResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("not used"))
        }
        async fn list(
            &self,
            _: tonic::Request<()>,
        ) -> Result<tonic::Response<GpuStateResponse>, tonic::Status> {
            let gpus = self.0.lock().unwrap().clone();
            Ok(tonic::Response::new(GpuStateResponse {
                gpu_state: gpus
                    .into_iter()
                    .map(|(device, health)| GpuState {
                        id: device.clone(),
                        uuid: String::new(),
                        health,
                        associated_workload: vec![],
                        device,
                    })
                    .collect(),
            }))
        }
    }

    pub fn serve(path: &std::path::Path, exporter: Exporter) -> tokio::task::JoinHandle<()> {
        let incoming = hami_deviceplugin_api::bind_unix(path).unwrap();
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(MetricsServiceServer::new(exporter))
                .serve_with_incoming(incoming)
                .await;
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporter_health_marks_gpus_unhealthy_and_recovered() {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let socket = tree.sysfs_root().parent().unwrap().join("exporter.socket");
    let exporter = fake_exporter::Exporter::default();
    let server = fake_exporter::serve(&socket, exporter.clone());
    let h = Harness::start_with(
        tree,
        Opts {
            exporter: Some(socket.clone()),
            ..Default::default()
        },
    )
    .await;
    let sick = h.devices[5].clone();
    let all: Vec<(String, String)> = h
        .devices
        .iter()
        .map(|d| (d.device_key.clone(), "healthy".to_owned()))
        .collect();
    *exporter.0.lock().unwrap() = all.clone();
    // The exporter calls one GPU unhealthy: kubelet loses its 10 shares, and an Event says so.
    let mut one_sick = all.clone();
    one_sick[5].1 = "unhealthy".into();
    *exporter.0.lock().unwrap() = one_sick;
    assert!(
        h.sim()
            .wait_for_allocatable("amd.com/gpu", 70, Duration::from_secs(10))
            .await,
        "{}",
        h.sim().allocatable("amd.com/gpu")
    );
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(h.client.clone(), "default");
    let reasons = || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.message.as_deref().unwrap_or("").contains(&sick.info.id))
            .filter_map(|e| e.reason)
            .collect::<Vec<_>>()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !reasons().await.contains(&"AMDGPUUnhealthy".to_owned()) {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            reasons().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let register = h.node_annotation(AMD.node_register).unwrap();
    let entry = hami_protocol::node_register::decode_node_devices(&register)
        .unwrap()
        .into_iter()
        .find(|d| d.id == sick.info.id)
        .unwrap();
    assert!(!entry.health, "the register annotation says unhealthy too");
    // Healthy again: shares back and AMDGPURecovered.
    *exporter.0.lock().unwrap() = all;
    assert!(
        h.sim()
            .wait_for_allocatable("amd.com/gpu", 80, Duration::from_secs(10))
            .await
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !reasons().await.contains(&"AMDGPURecovered".to_owned()) {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            reasons().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.abort();
}

#[path = "e2e/whole_card_holdings.rs"]
mod whole_card_holdings;

#[path = "e2e/dmem_delegation.rs"]
mod dmem_delegation;
