//! Notification of changes in kubelet's device-plugin directory (Linux inotify), so the
//! session loop looks at `kubelet.sock` and our socket when one of them changes instead of
//! `stat`-ing both every 500 ms. What the loop then does is `session_rules`' decision.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A watch of one directory: files created, removed, renamed or re-attributed in it, and
/// the directory itself removed or moved.
pub struct DirWatch {
    fd: AsyncFd<OwnedFd>,
}

impl DirWatch {
    /// Watches `dir` (inside a tokio runtime).
    pub fn new(dir: &Path) -> io::Result<Self> {
        let path = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
        // SAFETY: inotify_init1 takes flags only and returns a new fd or -1.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new fd owned by nobody else; OwnedFd closes it once.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mask = libc::IN_CREATE
            | libc::IN_DELETE
            | libc::IN_MOVED_FROM
            | libc::IN_MOVED_TO
            | libc::IN_ATTRIB
            | libc::IN_DELETE_SELF
            | libc::IN_MOVE_SELF;
        // SAFETY: `fd` is an inotify fd and `path` a NUL-terminated string that outlives
        // the call.
        if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), mask) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the AsyncFd owns `fd` (an OwnedFd: valid and open, the same descriptor
        // for as long as it lives, closed only when the AsyncFd drops it).
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Self { fd })
    }

    /// Waits for the next change(s) and consumes them. An error (the watch is gone, e.g.
    /// the directory was removed) is returned; the caller then polls instead.
    pub async fn changed(&self) -> io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut buf = [0u8; 4096];
            let read = guard.try_io(|fd| {
                // SAFETY: reads at most `buf.len()` bytes into `buf`, which outlives the call.
                let n = unsafe {
                    libc::read(fd.get_ref().as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match read {
                Ok(Ok(0)) => return Err(io::Error::other("the inotify watch ended")),
                Ok(Ok(n)) => {
                    if gone(&buf[..n]) {
                        return Err(io::Error::other("the watched directory went away"));
                    }
                    // Drain what else is queued, so one burst wakes the loop once.
                    while let Ok(Ok(more)) = guard.try_io(|fd| {
                        // SAFETY: as above.
                        let n = unsafe {
                            libc::read(fd.get_ref().as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
                        };
                        if n <= 0 {
                            Err(io::Error::last_os_error())
                        } else {
                            Ok(n as usize)
                        }
                    }) {
                        if gone(&buf[..more]) {
                            return Err(io::Error::other("the watched directory went away"));
                        }
                    }
                    return Ok(());
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

/// Whether a batch of inotify events says the watch itself ended (the directory removed or
/// moved away, or the watch dropped).
fn gone(events: &[u8]) -> bool {
    const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
    let mut at = 0;
    while at + HEADER <= events.len() {
        // mask at offset 4, len at offset 12 (wd: i32, mask: u32, cookie: u32, len: u32).
        let word = |o: usize| {
            u32::from_ne_bytes([
                events[at + o],
                events[at + o + 1],
                events[at + o + 2],
                events[at + o + 3],
            ])
        };
        let (mask, len) = (word(4), word(12) as usize);
        if mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_IGNORED) != 0 {
            return true;
        }
        at += HEADER + len;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_socket_created_or_removed_in_the_directory_wakes_the_watch() {
        let dir = std::env::temp_dir().join(format!("hami-dir-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let watch = DirWatch::new(&dir).unwrap();
        let limit = Duration::from_secs(10);
        // Nothing happened: no wake.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), watch.changed())
                .await
                .is_err()
        );
        let sock = dir.join("kubelet.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        tokio::time::timeout(limit, watch.changed())
            .await
            .expect("a created socket wakes the watch")
            .unwrap();
        drop(listener);
        std::fs::remove_file(&sock).unwrap();
        tokio::time::timeout(limit, watch.changed())
            .await
            .expect("a removed socket wakes the watch")
            .unwrap();
        // The directory itself removed: the watch says so, and the loop polls instead.
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            tokio::time::timeout(limit, watch.changed())
                .await
                .expect("the removal wakes the watch")
                .is_err()
        );
    }
}
