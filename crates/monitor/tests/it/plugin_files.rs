//! What the device plugins keep beside the containers' cache directories is the monitor's
//! to recognise, not to report (issue 27 item 9): the AMD plugin's `.hook-config/` in the
//! containers directory is no bad input, and its hook configs of pods that are gone are
//! pruned with the rule of the cache directories (unknown pod, past the grace period).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hami_monitor::node_monitor::{MonitorConfig, NodeMonitor};
use hami_monitor::pods::PodIndex;
use k8s_openapi::api::core::v1::Pod;

const GRACE: Duration = Duration::from_secs(3600);

struct Node {
    base: PathBuf,
    monitor: NodeMonitor,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn node(test: &str) -> Node {
    let base =
        std::env::temp_dir().join(format!("hami-plugin-files-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(base.join("proc")).unwrap();
    std::fs::create_dir_all(base.join("sys")).unwrap();
    std::fs::create_dir_all(base.join("hook/containers")).unwrap();
    let monitor = NodeMonitor::new(MonitorConfig {
        hook_path: base.join("hook"),
        proc_root: base.join("proc"),
        sys_root: base.join("sys"),
        node_name: "n".into(),
        gc_grace: GRACE,
        nvml_library: None,
    });
    Node { base, monitor }
}

fn pods(uids: &[&str]) -> PodIndex {
    let pods: Vec<Pod> = uids
        .iter()
        .map(|uid| {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p-{uid}"), "namespace": "t", "uid": uid},
                "spec": {"containers": [{"name": "main"}]}
            }))
            .unwrap()
        })
        .collect();
    PodIndex::from_pods(pods.iter(), "hami-scheduler")
}

/// Writes `path` (a file, or a directory when `text` is `None`) last modified `age` ago.
fn put(path: &Path, text: Option<&str>, age: Duration) {
    match text {
        Some(text) => {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        None => std::fs::create_dir_all(path).unwrap(),
    }
    std::fs::File::open(path)
        .unwrap()
        .set_modified(SystemTime::now() - age)
        .unwrap()
}

#[test]
fn the_amd_plugins_hook_configs_are_ours_and_those_of_gone_pods_are_pruned() {
    let node = node("hook-config");
    let containers = node.base.join("hook/containers");
    // Where the AMD plugin writes them (allocate_plan::HOOK_CONFIG_DIR under its cache root).
    let configs = containers.join(".hook-config");
    let old = GRACE * 2;
    let conf = "hami-hook-config/1\nmemory-limit=1\n";
    put(&containers.join("live_main"), None, old);
    put(&configs.join("live_main.conf"), Some(conf), old);
    // A pod that is gone: its directory and config past the grace, a write cut short.
    put(&containers.join("gone_main"), None, old);
    put(&configs.join("gone_main.conf"), Some(conf), old);
    put(&configs.join("gone_main.tmp4242"), Some(conf), old);
    // One just written for a pod the informer does not show yet.
    put(&configs.join("new_main.conf"), Some(conf), Duration::ZERO);
    // The DRA driver's, should its cache root be this directory: its own to remove.
    put(&configs.join("claim_c-1.conf"), Some(conf), old);
    put(&configs.join(".hook-config"), None, old);

    let index = pods(&["live"]);
    node.monitor.refresh(index.clone());
    node.monitor.refresh(index);

    let errors = node.monitor.errors().counts();
    assert_eq!(errors.get("dir_bad_name"), None, "{errors:?}");
    assert!(!configs.join("gone_main.conf").exists());
    assert!(!configs.join("gone_main.tmp4242").exists());
    assert!(
        !containers.join("gone_main").exists(),
        "the same rule for both"
    );
    for kept in ["live_main.conf", "new_main.conf", "claim_c-1.conf"] {
        assert!(configs.join(kept).exists(), "{kept} was removed");
    }
    assert!(containers.join("live_main").exists());
    // Something in there the plugin never writes is reported, once per scan, not removed.
    assert_eq!(errors.get("hook_config_bad_name"), Some(&2), "{errors:?}");
    assert!(configs.join(".hook-config").exists());
}
