//! Loopback TCP ports to hand to a server that binds them later: a child process a test
//! starts (`--http-bind=127.0.0.1:PORT`), or an in-process server whose config takes an
//! address rather than a listener.
//!
//! Why not bind port 0, read the port and close: that port comes from the kernel's
//! ephemeral range, which is also where every outgoing connection's local port and every
//! other `bind(0)` come from. Between the close and the server's own bind, a connection
//! (the server's own, to the API server) can take it, and the server dies with "Address
//! already in use" — a CI run failed that way. The ports here come from below the
//! ephemeral range, which `connect()` and `bind(0)` never pick, and each is reserved by an
//! `flock` on a file named for it, so no two live processes on the machine hand out the
//! same one. A port is handed out once per process; its reservation lasts until the
//! process exits (the kernel drops the lock with it).

use std::fs::{File, OpenOptions};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// How many ports below the ephemeral range are candidates.
const SPAN: u16 = 12_000;
/// The ephemeral range's low end when `/proc` cannot say (Linux's default).
const DEFAULT_EPHEMERAL_LOW: u16 = 32_768;

/// The reservations this process holds, kept open until it exits.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());
/// The next candidate's offset: each call starts where the last one stopped.
static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);

/// A loopback port that nothing listens on or connects from now, and that no other live
/// process got from this function. Panics (it serves tests and the demo) when the whole
/// span is taken or the lock directory cannot be made.
pub fn free_port() -> u16 {
    try_free_port().unwrap_or_else(|e| panic!("{e}"))
}

/// `127.0.0.1:`[`free_port`].
pub fn free_local_addr() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()))
}

/// [`free_port`], with the reason when there is none.
pub fn try_free_port() -> Result<u16, String> {
    let (low, high) = candidates();
    let span = u32::from(high - low);
    let dir = lock_dir();
    std::fs::create_dir_all(&dir).map_err(|e| {
        format!(
            "cannot create {} to reserve a local port: {e}; set TMPDIR to a writable directory",
            dir.display()
        )
    })?;
    let start = start_offset(span);
    let first = first_offset(
        NEXT.compare_exchange(u32::MAX, start, Ordering::SeqCst, Ordering::SeqCst),
        start,
    );
    for step in 0..span {
        let offset = (first + step) % span;
        // Truncation cannot happen: offset < span <= u16::MAX - low.
        let port = low + offset as u16;
        NEXT.store((offset + 1) % span, Ordering::SeqCst);
        if let Some(lock) = reserve(&dir, port) {
            HELD.lock().unwrap_or_else(|p| p.into_inner()).push(lock);
            return Ok(port);
        }
    }
    Err(format!(
        "every loopback port in {low}..{high} is in use or reserved by another process (locks in {})",
        dir.display()
    ))
}

/// The candidate range `[low, high)`: the `SPAN` ports just below the ephemeral range.
fn candidates() -> (u16, u16) {
    let high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_LOW)
        .max(1024 + SPAN);
    (high - SPAN, high)
}

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("hami-local-ports")
}

/// Where this process starts in the span: spread by pid and time so that processes
/// started together do not all probe the same ports first.
fn start_offset(span: u32) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    std::process::id().wrapping_mul(7919).wrapping_add(nanos) % span
}

/// Where a call starts: `start` when this call was the process's first (the exchange
/// succeeded: it returns the old `u32::MAX`, which is no offset — taking it overflowed
/// `first + step` the moment the first candidate was taken), else where the last call
/// stopped.
fn first_offset(exchanged: Result<u32, u32>, start: u32) -> u32 {
    match exchanged {
        Ok(_) => start,
        Err(current) => current,
    }
}

/// The lock for `port` when this process got it and nothing is bound to the port.
fn reserve(dir: &std::path::Path, port: u16) -> Option<File> {
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        // A planted symlink in a shared temporary directory is not followed.
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(dir.join(format!("{port}.lock")))
        .ok()?;
    lock.try_lock().ok()?;
    // Same socket options as the servers' own binds (std and tokio set SO_REUSEADDR), so
    // a port this accepts is one they can bind.
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).ok()?;
    Some(lock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_call_starts_at_its_start_offset_not_at_the_unset_marker() {
        let span = u32::from(SPAN);
        let start = start_offset(span);
        let first = first_offset(Ok(u32::MAX), start);
        assert_eq!(first, start);
        // Every step of a full scan stays in range without overflow.
        for step in 0..span {
            assert!((first + step) % span < span);
        }
        assert_eq!(first_offset(Err(17), start), 17);
    }

    #[test]
    fn ports_are_below_the_ephemeral_range_distinct_and_bindable() {
        let (low, high) = candidates();
        let ports: Vec<u16> = (0..64).map(|_| free_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            ports.len(),
            "a port was handed out twice: {ports:?}"
        );
        for port in ports {
            assert!(
                (low..high).contains(&port),
                "{port} is outside {low}..{high}"
            );
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("a handed-out port binds");
        }
    }

    #[test]
    fn a_port_someone_listens_on_is_skipped() {
        let port = free_port();
        let _taken = TcpListener::bind((Ipv4Addr::LOCALHOST, port + 1));
        let next = free_port();
        assert_ne!(next, port);
        // The listener (when it could bind) makes port + 1 unavailable to the next call.
        if _taken.is_ok() {
            assert_ne!(next, port + 1, "a port with a listener was handed out");
        }
    }

    /// The lock file for `port`, opened as another holder would.
    fn lock_file(dir: &std::path::Path, port: u16) -> File {
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{port}.lock")))
            .unwrap()
    }

    #[test]
    fn another_holders_reservation_is_respected() {
        // flock locks belong to the open file description, so a lock held through another
        // one stands in for another process's — and never blocks: every lock here is tried
        // (a blocking lock waited forever on a port a parallel test had reserved).
        let dir = lock_dir();
        std::fs::create_dir_all(&dir).unwrap();
        // This process's own reservation, held through HELD's description.
        let port = free_port();
        assert!(
            reserve(&dir, port).is_none(),
            "a reserved port was handed out again"
        );
        // One taken through a description of the test's own, from the top of the span.
        let (low, high) = candidates();
        let (p, other) = (low..high)
            .rev()
            .find_map(|p| {
                let f = lock_file(&dir, p);
                f.try_lock().ok()?;
                Some((p, f))
            })
            .expect("a port nobody holds");
        assert!(
            reserve(&dir, p).is_none(),
            "a port another holder reserved was taken"
        );
        drop(other);
        // Free again — unless it is bound, or a parallel test's free_port took it meanwhile
        // (the same rule at work).
        assert!(
            reserve(&dir, p).is_some()
                || TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_err()
                || lock_file(&dir, p).try_lock().is_err(),
            "a released, unbound port could not be reserved"
        );
    }

    #[test]
    fn a_symlinked_lock_file_is_refused() {
        let dir =
            std::env::temp_dir().join(format!("hami-local-ports-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("victim");
        std::fs::write(&target, b"keep").unwrap();
        let (low, _) = candidates();
        std::os::unix::fs::symlink(&target, dir.join(format!("{low}.lock"))).unwrap();
        assert!(reserve(&dir, low).is_none(), "the lock followed a symlink");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
