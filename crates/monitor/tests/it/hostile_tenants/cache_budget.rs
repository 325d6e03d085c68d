//! A container's cache directory is mounted read-write into it (so the hook finds its
//! region there), so what a tenant writes through it lands on the node's disk (issue 27
//! item 10). The monitor holds each tracked directory — a container's and a DRA claim's —
//! to a budget besides its region files: past it, the tenant's files are removed (emptied
//! first, so one kept open frees its blocks too) and a region grown past its allowance is
//! cut back, counted as `cache_over_budget`; a directory within it is left alone.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hami_monitor::cache_budget::{CACHE_DIR_BUDGET, REGION_ALLOWANCE};
use hami_monitor::dra_claims::{ClaimRegion, DraPod};
use hami_monitor::node_monitor::{MonitorConfig, NodeMonitor};
use hami_monitor::pods::PodIndex;
use k8s_openapi::api::core::v1::Pod;

const MIB: u64 = 1 << 20;

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
    let base = std::env::temp_dir().join(format!("hami-budget-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    for dir in ["proc", "sys", "hook/containers", "hook/dra/claims"] {
        std::fs::create_dir_all(base.join(dir)).unwrap();
    }
    let monitor = NodeMonitor::new(MonitorConfig {
        hook_path: base.join("hook"),
        proc_root: base.join("proc"),
        sys_root: base.join("sys"),
        node_name: "n".into(),
        gc_grace: Duration::from_secs(3600),
        nvml_library: None,
    });
    Node { base, monitor }
}

/// Pods `uids` (one container `main` each); `claim` is a DRA claim of the first.
fn pods(uids: &[&str], claim: &str) -> PodIndex {
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
    let mut dra = DraPod::default();
    dra.regions.insert(
        claim.to_owned(),
        ClaimRegion {
            pod_uid: uids[0].to_owned(),
            container: "main".into(),
            devices: Vec::new(),
        },
    );
    PodIndex::from_pods_with_dra(
        pods.iter(),
        "hami-scheduler",
        &HashMap::from([(uids[0].to_owned(), dra)]),
    )
}

/// Writes `bytes` of real (non-sparse) data to `path`.
fn fill(path: &Path, bytes: u64) -> std::fs::File {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![7u8; MIB as usize];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(MIB);
        file.write_all(&chunk[..n as usize]).unwrap();
        left -= n;
    }
    file.sync_all().unwrap();
    file
}

fn allocated(path: &Path) -> u64 {
    std::fs::symlink_metadata(path).unwrap().blocks() * 512
}

#[test]
fn what_a_tenant_writes_past_the_budget_is_taken_back_and_its_region_kept() {
    let node = node("over");
    let containers = node.base.join("hook/containers");
    let evil = containers.join("evil_main");
    let calm = containers.join("calm_main");
    let claim = node.base.join("hook/dra/claims/c-1");
    for dir in [&evil, &calm, &claim] {
        std::fs::create_dir_all(dir).unwrap();
    }
    // The plugin's region, grown by the tenant well past any layout.
    fill(&evil.join("hipdevshr.cache"), REGION_ALLOWANCE + 8 * MIB);
    // A file the tenant keeps writing to and holds open, a directory, a FIFO.
    let held = fill(&evil.join("dump.bin"), CACHE_DIR_BUDGET + MIB);
    std::fs::create_dir_all(evil.join("nested/deeper")).unwrap();
    fill(&evil.join("nested/deeper/more.bin"), MIB);
    nix_mkfifo(&evil.join("pipe"));
    // Another tenant within the budget: its region and a small file stay.
    fill(&calm.join("hipdevshr.cache"), 2 * MIB);
    fill(&calm.join("notes.txt"), MIB);
    // A DRA claim's directory is held to the same budget.
    fill(&claim.join("hipdevshr.cache"), 2 * MIB);
    fill(&claim.join("fill.bin"), CACHE_DIR_BUDGET + MIB);

    node.monitor.refresh(pods(&["evil", "calm"], "c-1"));

    let errors = node.monitor.errors().counts();
    assert_eq!(errors.get("cache_over_budget"), Some(&2), "{errors:?}");
    assert_eq!(errors.get("cache_remove"), None, "{errors:?}");
    let left: Vec<String> = std::fs::read_dir(&evil)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["hipdevshr.cache"]);
    assert_eq!(
        std::fs::metadata(evil.join("hipdevshr.cache"))
            .unwrap()
            .len(),
        REGION_ALLOWANCE
    );
    // The file the tenant still holds open no longer holds its blocks.
    let meta = held.metadata().unwrap();
    assert_eq!((meta.len(), meta.blocks()), (0, 0));
    assert!(!claim.join("fill.bin").exists());
    assert!(allocated(&claim.join("hipdevshr.cache")) >= 2 * MIB);
    assert!(calm.join("notes.txt").exists());
    assert!(allocated(&calm.join("hipdevshr.cache")) >= 2 * MIB);

    // Nothing more to take back at the next scan.
    node.monitor.refresh(pods(&["evil", "calm"], "c-1"));
    let errors = node.monitor.errors().counts();
    assert_eq!(errors.get("cache_over_budget"), Some(&2), "{errors:?}");
}

#[test]
fn more_entries_than_a_directory_may_hold_are_taken_back_however_small() {
    let node = node("entries");
    let dir = node.base.join("hook/containers/evil_main");
    std::fs::create_dir_all(&dir).unwrap();
    fill(&dir.join("hipdevshr.cache"), 2 * MIB);
    for i in 0..2000 {
        std::fs::write(dir.join(format!("junk{i}")), b"").unwrap();
    }
    node.monitor.refresh(pods(&["evil"], "none"));
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["hipdevshr.cache"]);
    let errors = node.monitor.errors().counts();
    assert_eq!(errors.get("cache_over_budget"), Some(&1), "{errors:?}");
}

fn nix_mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo reads it only.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}
