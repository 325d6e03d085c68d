//! Whether pod cgroups can get `dmem.max` is checked on the node (issue 26 item 10): the
//! real plugin over cgroup trees laid out as kubelet makes them, with the embedded API
//! server. A tree whose `kubepods.slice` does not delegate dmem gets a Node Event and the
//! node annotation naming the directory to fix; once fixed, both say so; a fully delegated
//! tree gets no warning.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hami_amd_plugin::cli::Args;
use hami_amd_plugin::dmem_delegation::{ANNOTATION, REASON_DELEGATED, REASON_NOT_DELEGATED};
use hami_apiserver::RunningApiServer;
use hami_plugin_harness::{api_with_node, node_annotation};
use hami_sysfs_fixtures::FixtureTree;
use k8s_openapi::api::core::v1::Event;
use tokio::sync::watch;

const NODE: &str = "node-a";
const ALL: &str = "cpuset cpu io memory hugetlb pids rdma misc dmem";
const NO_DMEM: &str = "cpuset cpu io memory hugetlb pids rdma misc";

/// A systemd-driver tree: the root, `kubepods.slice` (subtree_control `kubepods`), its QoS
/// slices and one pod slice.
fn systemd_tree(root: &Path, kubepods: &str) {
    let slice = root.join("kubepods.slice");
    for dir in [
        root.to_path_buf(),
        slice.join("kubepods-burstable.slice/kubepods-burstable-podabc.slice"),
        slice.join("kubepods-besteffort.slice"),
    ] {
        std::fs::create_dir_all(&dir).unwrap();
    }
    std::fs::write(root.join("cgroup.controllers"), ALL).unwrap();
    std::fs::write(root.join("cgroup.subtree_control"), ALL).unwrap();
    std::fs::write(slice.join("cgroup.subtree_control"), kubepods).unwrap();
    for qos in ["kubepods-burstable.slice", "kubepods-besteffort.slice"] {
        std::fs::write(slice.join(qos).join("cgroup.subtree_control"), ALL).unwrap();
    }
}

struct Plugin {
    server: RunningApiServer,
    client: kube::Client,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _tree: FixtureTree,
}

async fn start(tree: FixtureTree, cgroup_root: PathBuf) -> Plugin {
    use clap::Parser;
    let (server, client) = api_with_node(NODE).await;
    let mut args = Args::parse_from(["k8s-device-plugin"]);
    args.sysfs_root = tree.sysfs_root();
    args.dev_root = tree.dev_root();
    args.device_plugin_dir = tree.sysfs_root().parent().unwrap().join("device-plugins");
    args.node_name = Some(NODE.into());
    args.register_interval = 1;
    args.cgroup_root = cgroup_root;
    args.exporter_socket = args.device_plugin_dir.join("no-exporter.socket");
    let settings = args.registration_settings().unwrap();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(hami_amd_plugin::plugin::serve(
        args,
        settings,
        client.clone(),
        rx,
    ));
    Plugin {
        server,
        client,
        stop,
        task,
        _tree: tree,
    }
}

impl Plugin {
    /// The node's dmem Events as (reason, type, message).
    async fn dmem_events(&self) -> Vec<(String, String, String)> {
        let events: kube::Api<Event> = kube::Api::namespaced(self.client.clone(), "default");
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some(NODE)
                    && e.reason.as_deref().is_some_and(|r| r.contains("Dmem"))
            })
            .map(|e| {
                (
                    e.reason.unwrap_or_default(),
                    e.type_.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Waits (bounded) until the node annotation says `want`.
    async fn wait_annotation(&self, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = node_annotation(&self.server, NODE, ANNOTATION);
            if now.as_deref() == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{ANNOTATION} is {now:?}, not {want}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (bounded) until a dmem Event with `reason` exists; returns its type and message.
    async fn wait_event(&self, reason: &str) -> (String, String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some((_, kind, message)) =
                self.dmem_events().await.into_iter().find(|e| e.0 == reason)
            {
                return (kind, message);
            }
            assert!(Instant::now() < deadline, "no {reason} event");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the plugin stops")
            .unwrap()
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubepods_without_dmem_is_reported_on_the_node_until_fixed() {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let root = tree.sysfs_root().join("fs/cgroup");
    systemd_tree(&root, NO_DMEM);
    let plugin = start(tree, root.clone()).await;
    plugin.wait_annotation("not-delegated:kubepods.slice").await;
    let (kind, message) = plugin.wait_event(REASON_NOT_DELEGATED).await;
    assert_eq!(kind, "Warning");
    let dir = root.join("kubepods.slice").display().to_string();
    assert!(
        message.contains(&format!(
            "cgroup.subtree_control of {dir} does not list dmem"
        )),
        "{message}"
    );
    assert!(message.contains("write +dmem"), "{message}");
    // The QoS slices are fine: only the directory to fix is named.
    assert!(!message.contains("kubepods-burstable.slice"), "{message}");
    // The next checks (every second) find the same: no second Event.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let warnings = plugin
        .dmem_events()
        .await
        .into_iter()
        .filter(|e| e.0 == REASON_NOT_DELEGATED)
        .count();
    assert_eq!(warnings, 1);
    // The administrator enables it: the node says so.
    std::fs::write(
        root.join("kubepods.slice/cgroup.subtree_control"),
        format!("{NO_DMEM} dmem"),
    )
    .unwrap();
    plugin.wait_annotation("delegated").await;
    let (kind, _) = plugin.wait_event(REASON_DELEGATED).await;
    assert_eq!(kind, "Normal");
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fully_delegated_tree_gets_no_warning() {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let root = tree.sysfs_root().join("fs/cgroup");
    systemd_tree(&root, ALL);
    let plugin = start(tree, root).await;
    plugin.wait_annotation("delegated").await;
    // A few more checks, then: no dmem Event at all.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(plugin.dmem_events().await, Vec::new());
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroupfs_qos_level_without_dmem_is_named() {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let root = tree.sysfs_root().join("fs/cgroup");
    for dir in ["kubepods/burstable/podabc", "kubepods/besteffort"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::write(root.join("cgroup.controllers"), ALL).unwrap();
    std::fs::write(root.join("cgroup.subtree_control"), ALL).unwrap();
    std::fs::write(root.join("kubepods/cgroup.subtree_control"), ALL).unwrap();
    std::fs::write(
        root.join("kubepods/burstable/cgroup.subtree_control"),
        NO_DMEM,
    )
    .unwrap();
    std::fs::write(root.join("kubepods/besteffort/cgroup.subtree_control"), ALL).unwrap();
    let plugin = start(tree, root.clone()).await;
    plugin
        .wait_annotation("not-delegated:kubepods/burstable")
        .await;
    let (_, message) = plugin.wait_event(REASON_NOT_DELEGATED).await;
    let dir = root.join("kubepods/burstable").display().to_string();
    assert!(message.contains(&dir), "{message}");
    plugin.stop().await;
}
