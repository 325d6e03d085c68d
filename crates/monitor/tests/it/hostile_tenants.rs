//! Tenants own their cache directories (issue 15 item 4): whatever they leave at a `.cache`
//! name — a file truncated while the monitor reads it, a FIFO, a symlink to another tenant's
//! region, a huge sparse file, thousands of entries — must neither crash nor block the
//! monitor; it costs that directory's series and an error count, and every other
//! container keeps being reported exactly.

use crate::common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{proc, v1_region};
use hami_monitor::node_monitor::{MonitorConfig, NodeMonitor, Snapshot};
use hami_monitor::pods::PodIndex;
use k8s_openapi::api::core::v1::Pod;

const GIB: u64 = 1 << 30;

struct Node {
    base: PathBuf,
    monitor: Arc<NodeMonitor>,
    pods: PodIndex,
}

fn uid(name: &str) -> String {
    let mut hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    hex.truncate(8);
    format!("{hex:0<8}-0000-4000-8000-000000000000")
}

fn node(test: &str, names: &[&str]) -> Node {
    let base = std::env::temp_dir().join(format!("hami-hostile-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(base.join("proc/4242")).unwrap();
    std::fs::create_dir_all(base.join("sys")).unwrap();
    let pods: Vec<Pod> = names
        .iter()
        .map(|n| {
            std::fs::create_dir_all(base.join(format!("hook/containers/{}_main", uid(n)))).unwrap();
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": n, "namespace": "t", "uid": uid(n)},
                "spec": {"containers": [{"name": "main"}]}
            }))
            .unwrap()
        })
        .collect();
    let monitor = Arc::new(NodeMonitor::new(MonitorConfig {
        hook_path: base.join("hook"),
        proc_root: base.join("proc"),
        sys_root: base.join("sys"),
        node_name: "n".into(),
        gc_grace: Duration::from_secs(3600),
        nvml_library: None,
    }));
    Node {
        base,
        monitor,
        pods: PodIndex::from_pods(pods.iter(), "hami-scheduler"),
    }
}

impl Node {
    fn dir(&self, name: &str) -> PathBuf {
        self.base
            .join(format!("hook/containers/{}_main", uid(name)))
    }

    /// One refresh on another thread, which must finish within `limit` (a FIFO opened
    /// for reading without O_NONBLOCK blocks forever).
    fn refresh_within(&self, limit: Duration) {
        let (tx, rx) = std::sync::mpsc::channel();
        let monitor = self.monitor.clone();
        let pods = self.pods.clone();
        std::thread::spawn(move || {
            monitor.refresh(pods);
            let _ = tx.send(());
        });
        rx.recv_timeout(limit)
            .expect("the refresh pass blocked on a tenant's file");
    }

    fn snapshot_within(&self, limit: Duration) -> Snapshot {
        let (tx, rx) = std::sync::mpsc::channel();
        let monitor = self.monitor.clone();
        std::thread::spawn(move || {
            let _ = tx.send(monitor.snapshot());
        });
        rx.recv_timeout(limit)
            .expect("the scrape blocked on a tenant's file")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn good_region(used: u64) -> Vec<u8> {
    v1_region(
        2,
        &["GPU-aaaaaaaa-1111-2222-3333-444444444444"],
        &[8 * GIB],
        &[proc(4242, 1, [(0, used), (1, 0)], [(0, 40), (1, 0)])],
        1_700_000_000,
    )
}

/// The memory used reported for pod `name`'s device 0, if any.
fn used_of(snap: &Snapshot, name: &str) -> Option<u64> {
    snap.containers
        .iter()
        .find(|c| c.pod == name)
        .and_then(|c| c.devices.first())
        .and_then(|d| d.memory_used)
}

fn errors(snap: &Snapshot, kind: &str) -> u64 {
    snap.errors.get(kind).copied().unwrap_or(0)
}

#[test]
fn truncating_a_region_while_it_is_read_costs_only_its_own_series() {
    let node = node("truncate", &["good", "evil"]);
    std::fs::write(node.dir("good").join("r.cache"), good_region(3 * GIB)).unwrap();
    let evil = node.dir("evil").join("r.cache");
    let full = good_region(GIB);
    std::fs::write(&evil, &full).unwrap();
    node.refresh_within(Duration::from_secs(10));
    assert_eq!(used_of(&node.monitor.snapshot(), "evil"), Some(GIB));

    // The tenant truncates and regrows its file as fast as it can while we scrape.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, evil) = (stop.clone(), evil.clone());
        std::thread::spawn(move || {
            let file = std::fs::OpenOptions::new().write(true).open(&evil).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                file.set_len([0, 5, 4096, 2_000_000][n as usize % 4])
                    .unwrap();
                file.set_len(2_008_953).unwrap();
                n += 1;
            }
            n
        })
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut scrapes = 0;
    while Instant::now() < deadline {
        let snap = node.monitor.snapshot();
        assert_eq!(used_of(&snap, "good"), Some(3 * GIB), "the other tenant");
        scrapes += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let truncations = writer.join().unwrap();
    assert!(
        scrapes > 10 && truncations > 10,
        "{scrapes} scrapes, {truncations} truncations"
    );
    // Left truncated: the series goes, an error is counted, nothing else changes.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&evil)
        .unwrap()
        .set_len(100)
        .unwrap();
    let snap = node.monitor.snapshot();
    assert_eq!(used_of(&snap, "evil"), None);
    assert_eq!(used_of(&snap, "good"), Some(3 * GIB));
    assert!(errors(&snap, "cache_truncated") >= 1, "{:?}", snap.errors);
}

#[test]
fn a_fifo_named_cache_blocks_neither_the_scan_nor_the_scrape() {
    let node = node("fifo", &["good", "evil"]);
    std::fs::write(node.dir("good").join("r.cache"), good_region(2 * GIB)).unwrap();
    let fifo = std::ffi::CString::new(
        node.dir("evil")
            .join("r.cache")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
    node.refresh_within(Duration::from_secs(10));
    let snap = node.snapshot_within(Duration::from_secs(10));
    assert_eq!(used_of(&snap, "good"), Some(2 * GIB));
    assert_eq!(used_of(&snap, "evil"), None);
    assert!(errors(&snap, "cache_not_regular") >= 1, "{:?}", snap.errors);
}

#[test]
fn a_symlink_to_another_tenants_region_is_not_followed() {
    let node = node("symlink", &["good", "evil"]);
    let target = node.dir("good").join("r.cache");
    std::fs::write(&target, good_region(5 * GIB)).unwrap();
    std::os::unix::fs::symlink(&target, node.dir("evil").join("r.cache")).unwrap();
    node.refresh_within(Duration::from_secs(10));
    let snap = node.snapshot_within(Duration::from_secs(10));
    assert_eq!(used_of(&snap, "good"), Some(5 * GIB));
    assert_eq!(
        used_of(&snap, "evil"),
        None,
        "another tenant's usage reported under the link's pod"
    );
    assert!(errors(&snap, "cache_not_regular") >= 1, "{:?}", snap.errors);
}

#[test]
fn a_huge_sparse_region_costs_what_a_real_one_costs() {
    let node = node("sparse", &["good", "evil"]);
    std::fs::write(node.dir("good").join("r.cache"), good_region(GIB)).unwrap();
    let evil = node.dir("evil").join("r.cache");
    std::fs::write(&evil, good_region(GIB / 2)).unwrap();
    // A terabyte, and every process slot claimed in use.
    let file = std::fs::OpenOptions::new().write(true).open(&evil).unwrap();
    file.set_len(1 << 40).unwrap();
    std::os::unix::fs::FileExt::write_at(&file, &1024i32.to_le_bytes(), 2_008_896).unwrap();
    node.refresh_within(Duration::from_secs(10));
    let t = Instant::now();
    let snap = node.snapshot_within(Duration::from_secs(10));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(used_of(&snap, "good"), Some(GIB));
    // Read as the v1 region its header says it is: the one real slot, the rest zeros.
    assert_eq!(used_of(&snap, "evil"), Some(GIB / 2));
}

#[test]
fn a_directory_with_thousands_of_entries_is_taken_back_and_reported_again() {
    let node = node("many", &["good", "evil"]);
    std::fs::write(node.dir("good").join("r.cache"), good_region(GIB)).unwrap();
    std::fs::write(node.dir("evil").join("r.cache"), good_region(GIB)).unwrap();
    for i in 0..2000 {
        std::fs::write(node.dir("evil").join(format!("junk{i}")), b"").unwrap();
    }
    node.refresh_within(Duration::from_secs(10));
    let snap = node.snapshot_within(Duration::from_secs(10));
    assert_eq!(used_of(&snap, "good"), Some(GIB));
    // More entries than a cache directory may hold (cache_budget): the junk is removed in
    // the scan, before the directory is read, so its region is reported.
    assert_eq!(used_of(&snap, "evil"), Some(GIB));
    assert!(errors(&snap, "cache_over_budget") >= 1, "{:?}", snap.errors);
    assert_eq!(std::fs::read_dir(node.dir("evil")).unwrap().count(), 1);
}

mod cache_budget;
