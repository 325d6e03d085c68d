//! The stand-in's DRM clients: what the amdgpu kernel driver sees of this process.
//!
//! A real HIP runtime opens `/dev/dri/renderD<minor>` for each device it uses, and the
//! kernel keeps, per open DRM file, the engine time of the work submitted through it; it
//! shows it in `/proc/<pid>/fdinfo/<fd>` (`drm-engine-compute: <ns> ns`), which the
//! monitor reads (D-7). A stand-in cannot make the kernel write fdinfo, so with
//! `FAKE_AMDGPU_DRIVER_SOCKET` set the "kernel side" is a unix socket served on the host
//! (the demo's `amdgpu_driver.rs`): one connection per device used is the open DRM file,
//! the server learns the caller's **host** pid from `SO_PEERCRED` (as the kernel knows it,
//! whatever PID namespace the caller is in) and renders a proc-shaped tree from what it
//! is told. The connection closing (file closed, process exited or killed) ends the client,
//! as closing the file does.
//!
//! Lines sent (text, one per line):
//! - `open renderD<minor>`: first line, the render node this client is open on;
//! - `busy <ns>`: engine time of kernels that completed since the last line.
//!
//! The devices are the render nodes visible in this process's `/dev/dri` (a container sees
//! the ones kubelet gave it), in minor order, as ROCr enumerates its GPUs.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Busy time is reported at most this often per device (kernels of 1 ms would otherwise
/// cost a write each).
const REPORT_EVERY: Duration = Duration::from_millis(20);

/// Render minors under `dev_dri` (`renderD<minor>` entries), sorted.
pub fn render_minors(dev_dri: &Path) -> Vec<u32> {
    let mut out: Vec<u32> = std::fs::read_dir(dev_dri)
        .map(|entries| {
            entries
                .filter_map(|e| {
                    e.ok()?
                        .file_name()
                        .to_str()?
                        .strip_prefix("renderD")?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    out
}

struct Client {
    stream: Option<UnixStream>,
    unreported_ns: u64,
    last_report: Instant,
}

/// One DRM client per device, opened on first use.
pub struct DrmClients {
    socket: Option<std::path::PathBuf>,
    minors: Vec<u32>,
    clients: Mutex<Vec<Option<Client>>>,
}

impl DrmClients {
    /// Without a socket, kernels run but no driver records them.
    pub fn new(socket: Option<std::path::PathBuf>, minors: Vec<u32>) -> DrmClients {
        let slots = minors.len();
        DrmClients {
            socket,
            minors,
            clients: Mutex::new((0..slots).map(|_| None).collect()),
        }
    }

    /// Records `ns` of engine time on `device`.
    pub fn record_busy(&self, device: usize, ns: u64) {
        let Some(socket) = &self.socket else { return };
        let Some(&minor) = self.minors.get(device) else {
            return;
        };
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let Some(slot) = clients.get_mut(device) else {
            return;
        };
        let client = slot.get_or_insert_with(|| {
            let stream = UnixStream::connect(socket).ok().and_then(|mut s| {
                writeln!(s, "open renderD{minor}").ok()?;
                Some(s)
            });
            if stream.is_none() {
                eprintln!(
                    "libamdhip64 (stand-in): cannot reach the amdgpu driver at {}: kernel time is not recorded",
                    socket.display()
                );
            }
            Client {
                stream,
                unreported_ns: 0,
                last_report: Instant::now() - REPORT_EVERY,
            }
        });
        client.unreported_ns = client.unreported_ns.saturating_add(ns);
        if client.last_report.elapsed() < REPORT_EVERY {
            return;
        }
        if let Some(stream) = &mut client.stream
            && writeln!(stream, "busy {}", client.unreported_ns).is_err()
        {
            client.stream = None;
        }
        client.unreported_ns = 0;
        client.last_report = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};

    #[test]
    fn minors_come_from_render_nodes_in_order() {
        let dir = std::env::temp_dir().join(format!("hip-dri-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["renderD130", "card2", "renderD128", "renderDx"] {
            std::fs::write(dir.join(name), "").unwrap();
        }
        assert_eq!(render_minors(&dir), vec![128, 130]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_client_opens_its_node_then_reports_busy_time() {
        let dir = std::env::temp_dir().join(format!("hip-drv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("driver.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let clients = DrmClients::new(Some(path), vec![128, 129]);
        clients.record_busy(1, 5000);
        clients.record_busy(7, 5000); // no such device: ignored
        let (stream, _) = listener.accept().unwrap();
        let mut lines = BufReader::new(stream).lines();
        assert_eq!(lines.next().unwrap().unwrap(), "open renderD129");
        assert_eq!(lines.next().unwrap().unwrap(), "busy 5000");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
