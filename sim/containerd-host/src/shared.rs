//! One containerd per test process (kubelet-sim's CRI tests, the system tests on the real
//! runtime): started by the first test that needs it, torn down at process exit
//! (containers, shims, mounts, its directory). The images are built once, from the host's
//! static busybox with buildah: a workload image ([`TEST_BUSYBOX`]) and a pause image
//! whose process is busybox `sleep` ([`busybox_pause`]). Needs root and Debian's packages
//! ([`crate::INSTALL`]); without root [`containerd`] says so and the test returns.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::images::{BusyboxImage, archive_path, busybox_pause};
use crate::{Containerd, Options};

/// The workload image of the tests (`/bin/sh` and busybox's applets).
pub const TEST_BUSYBOX: &str = "localhost/hami-test-busybox:1";
/// The pause image containerd runs the tests' sandboxes from.
pub const TEST_PAUSE: &str = "localhost/hami-test-pause:1";

/// The containerd shared by this process's tests.
pub struct Shared {
    host: Mutex<Option<Containerd>>,
    /// Its socket.
    pub socket: PathBuf,
    /// Where archives are built (`archive_path(dir, image)`).
    pub archives: PathBuf,
}

impl Shared {
    /// Imports an archive (tests that import late).
    pub fn import(&self, archive: &Path) -> Result<String, String> {
        let host = self.host.lock().unwrap_or_else(|p| p.into_inner());
        host.as_ref()
            .ok_or("containerd is stopped")?
            .import(archive)
    }
}

static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();

extern "C" fn stop_at_exit() {
    if let Some(Ok(shared)) = SHARED.get()
        && let Some(host) = shared.host.lock().unwrap_or_else(|p| p.into_inner()).take()
    {
        if let Err(e) = host.stop() {
            eprintln!("containerd tests: containerd teardown: {e}");
        }
        let _ = std::fs::remove_dir_all(&shared.archives);
    }
}

fn start_shared() -> Result<Shared, String> {
    crate::check_host()?;
    let archives = std::env::temp_dir().join(format!("hami-cri-images-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&archives);
    std::fs::create_dir_all(&archives).map_err(|e| e.to_string())?;
    let images = [
        BusyboxImage {
            name: TEST_BUSYBOX.into(),
            cmd: vec!["/bin/sh".into()],
        },
        busybox_pause(TEST_PAUSE),
    ];
    for image in &images {
        image.build(
            &archives.join("work"),
            &archive_path(&archives, &image.name),
        )?;
    }
    let host = Containerd::start(Options::new(TEST_PAUSE))?;
    // SAFETY: registering a plain extern "C" function with atexit(3).
    unsafe { libc::atexit(stop_at_exit) };
    for image in &images {
        host.import(&archive_path(&archives, &image.name))?;
    }
    eprintln!(
        "containerd tests: containerd at {} (snapshotter {})",
        host.socket().display(),
        host.snapshotter()
    );
    Ok(Shared {
        socket: host.socket(),
        host: Mutex::new(Some(host)),
        archives,
    })
}

/// The shared containerd, started on first use; `None` (after saying why) when this host
/// cannot run one because it is not root.
///
/// # Panics
/// On any other failure to start it (the test fails, naming why).
pub fn containerd() -> Option<&'static Shared> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "skipped: the containerd tests need root and Debian's packages ({})",
            crate::INSTALL
        );
        return None;
    }
    match SHARED.get_or_init(start_shared) {
        Ok(s) => Some(s),
        Err(e) => panic!("cannot start containerd for the tests: {e}"),
    }
}
