//! Leaving nothing behind: a containerd's containers, shims, mounts and directory. A
//! killed containerd leaves its shims running (by design: containers outlive a containerd
//! restart) and its rootfs and `/dev/shm` mounts mounted; a directory with mounts under it
//! breaks later runs and `git clean`. Used by [`crate::Containerd`]'s stop and for an
//! instance whose owning process died without stopping it (found at the next start).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::Layout;

/// runc's default state directory: containers made through containerd's own API (`ctr
/// run`) rather than CRI use it whatever the CRI plugin's `Root` says.
const DEFAULT_RUNC_ROOT: &str = "/run/containerd/runc";

/// Kills every container of this instance: all in its runc root, and those in runc's
/// default root whose bundle is under its directory (`runc delete --force` kills the
/// processes and removes the state).
pub fn kill_containers(layout: &Layout) {
    for (root, mine_only) in [
        (layout.runc_root(), false),
        (PathBuf::from(DEFAULT_RUNC_ROOT), true),
    ] {
        let Ok(namespaces) = std::fs::read_dir(&root) else {
            continue;
        };
        for ns in namespaces.flatten() {
            for (id, bundle) in runc_list(&ns.path()) {
                if mine_only && !Path::new(&bundle).starts_with(&layout.dir) {
                    continue;
                }
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(ns.path())
                    .args(["delete", "--force", &id])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

/// (id, bundle) of the containers in a runc root.
fn runc_list(root: &Path) -> Vec<(String, String)> {
    let Ok(out) = Command::new("runc")
        .arg("--root")
        .arg(root)
        .args(["list", "--format", "json"])
        .output()
    else {
        return Vec::new();
    };
    let Ok(serde_json::Value::Array(items)) = serde_json::from_slice(&out.stdout) else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|c| {
            Some((
                c.get("id")?.as_str()?.to_owned(),
                c.get("bundle")?.as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// Host pids whose command line holds `needle` as one argument (after `flag`).
pub fn pids_with_arg(flag: &str, needle: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.windows(2)
                .any(|w| w[0] == flag.as_bytes() && w[1] == needle.as_bytes())
        })
        .collect()
}

/// The containerd shims serving the containerd at `socket`.
pub fn shims_of(socket: &Path) -> Vec<i32> {
    pids_with_arg("-address", &socket.display().to_string())
}

/// The containerd processes started with `config`.
pub fn daemons_of(config: &Path) -> Vec<i32> {
    pids_with_arg("--config", &config.display().to_string())
}

/// SIGKILLs `pids` and waits (bounded) until they are gone.
pub fn kill_and_wait(pids: &[i32]) {
    for pid in pids {
        // SAFETY: kill(2) with a pid read from /proc; no memory is touched.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a pid exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// Mount points under `dir` (this mount namespace), deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Lazily unmounts everything mounted under `dir`, deepest first (repeated: a mount may
/// be stacked on another at the same point).
pub fn unmount_under(dir: &Path) -> Result<(), String> {
    for _ in 0..8 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return Ok(());
        }
        for m in mounts {
            let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: umount2(2) with a NUL-terminated path that outlives the call.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let left = mounts_under(dir);
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!("still mounted: {left:?}"))
    }
}

/// containerd 1.6 puts shim sockets in `/run/containerd/s` whatever its config says; a
/// killed shim leaves its socket there. Removes those made since the instance started that
/// nothing listens on any more.
fn remove_dead_shim_sockets(layout: &Layout) {
    let Ok(started) = std::fs::metadata(layout.config_file()).and_then(|m| m.modified()) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir("/run/containerd/s") else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let new = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= started);
        if new
            && let Err(err) = std::os::unix::net::UnixStream::connect(&path)
            && err.kind() == std::io::ErrorKind::ConnectionRefused
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Everything of the instance in `layout` gone: containers, the daemon, its shims, the
/// mounts, the directory. Errors name what is left.
pub fn remove_instance(layout: &Layout) -> Result<(), String> {
    kill_containers(layout);
    kill_and_wait(&daemons_of(&layout.config_file()));
    kill_and_wait(&shims_of(&layout.socket()));
    remove_dead_shim_sockets(layout);
    unmount_under(&layout.dir)?;
    std::fs::remove_dir_all(&layout.dir)
        .or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Ok(()),
            _ => Err(e),
        })
        .map_err(|e| format!("cannot remove {}: {e}", layout.dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mountinfo(r"/x\134y"), r"/x\y");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/end\04"), r"/end\04");
    }
}
