//! Real processes killed with SIGKILL while holding the region's locks or owning bytes: nobody
//! blocks, and their bytes come back. The helper is this crate's `region_holder` example,
//! which `cargo test` builds next to the test binaries.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use hami_region::{Limits, Session};

fn holder_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap();
    let holder = profile_dir.join("examples").join("region_holder");
    assert!(
        holder.exists(),
        "{} is missing: run the tests with cargo test, which builds the examples",
        holder.display()
    );
    holder
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hami-sigkill-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("r.cache")
}

/// Starts the holder and waits until it says it holds what it was asked to hold.
fn start_holder(path: &Path, args: &[&str]) -> Child {
    let mut child = Command::new(holder_binary())
        .arg(path)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("ready"), "holder said {line:?}");
    child
}

fn sigkill(mut child: Child) {
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

/// Runs `work` on a thread; panics if it takes longer than `limit`.
fn within<T: Send + 'static>(limit: Duration, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    rx.recv_timeout(limit)
        .expect("blocked: a dead process's lock was not released")
}

fn limits(device: usize, bytes: u64) -> Limits {
    let mut limits = Limits::default();
    limits.bytes[device] = bytes;
    limits
}

#[test]
fn a_process_killed_holding_a_device_lock_blocks_nobody_and_its_bytes_return() {
    let _spawns = crate::common::spawning();
    let path = scratch("device-lock");
    let observer = Session::attach(&path, &limits(0, 5000)).unwrap();
    let holder = start_holder(&path, &["hold-lock", "0"]);
    assert_eq!(observer.device_usage(0).unwrap().used, 1000);
    sigkill(holder);
    let path2 = path.clone();
    let (used_after_takeover, reclaimed, used_after_reclaim, full) =
        within(Duration::from_secs(20), move || {
            let session = Session::attach(&path2, &Limits::default()).unwrap();
            let used = {
                let _lock = session.lock_device(0).unwrap();
                session.device_usage(0).unwrap().used
            };
            let reclaimed = session.reclaim_dead();
            let after = session.device_usage(0).unwrap().used;
            let full = session.reserve(0, 5000);
            (used, reclaimed, after, full)
        });
    assert_eq!(used_after_takeover, 1000);
    assert_eq!((reclaimed.slots, reclaimed.bytes), (1, 1000));
    assert_eq!(used_after_reclaim, 0);
    full.unwrap();
}

#[test]
fn a_process_killed_owning_bytes_gives_them_back_to_the_next_allocation() {
    let _spawns = crate::common::spawning();
    let path = scratch("own-bytes");
    let observer = Session::attach(&path, &limits(2, 100)).unwrap();
    let holder = start_holder(&path, &["own-bytes", "2", "100"]);
    assert!(
        observer.reserve(2, 1).is_err(),
        "a live holder's bytes must not be taken"
    );
    assert_eq!(observer.device_usage(2).unwrap().used, 100);
    sigkill(holder);
    observer.reserve(2, 100).unwrap();
    assert_eq!(observer.device_usage(2).unwrap().used, 100);
    assert_eq!(observer.own_used(2), 100);
}

#[test]
fn a_process_killed_holding_the_claim_lock_blocks_nobody() {
    let _spawns = crate::common::spawning();
    let path = scratch("flock");
    drop(Session::attach(&path, &Limits::default()).unwrap());
    let holder = start_holder(&path, &["hold-flock", "0"]);
    let (tx, rx) = mpsc::channel();
    let path2 = path.clone();
    std::thread::spawn(move || {
        let _ = tx.send(Session::attach(&path2, &Limits::default()).map(|s| s.slot_index()));
    });
    // While the holder lives, attaching waits for it (the lock is real) ...
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    sigkill(holder);
    // ... and once it is killed, the kernel has released it.
    let slot = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("attach still blocked after the holder was killed")
        .unwrap();
    assert_eq!(slot, 0);
}
