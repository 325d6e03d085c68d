//! A private containerd from start to stop: it serves its socket under its own
//! directory, takes an image archive built with buildah into `k8s.io`, runs a container
//! from it, and on stop leaves nothing: no daemon, no shim, no container process, no
//! mount under its directory, no directory. Bounded: start ≤ 60 s, the rest seconds.

use std::process::Command;
use std::time::{Duration, Instant};

use hami_containerd_host::images::{BusyboxImage, archive_path};
use hami_containerd_host::{Containerd, Options, teardown};

#[test]
fn starts_imports_runs_and_leaves_nothing_behind() {
    if let Err(e) = hami_containerd_host::check_host() {
        eprintln!("skipped: {e}");
        return;
    }
    let work = std::env::temp_dir().join(format!("hami-ch-lifecycle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let image = "localhost/hami-ch-test:1";
    let archive = archive_path(&work, image);
    BusyboxImage {
        name: image.into(),
        cmd: vec!["/bin/sh".into()],
    }
    .build(&work.join("build"), &archive)
    .unwrap();
    let host = Containerd::start(Options::new(image)).unwrap();
    let dir = host.layout().dir.clone();
    let socket = host.socket();
    assert!(socket.starts_with(&dir), "{}", socket.display());
    let imported = host.import(&archive).unwrap();
    assert!(imported.contains(image), "{imported}");
    let err = host.import(&work.join("absent.tar")).unwrap_err();
    assert!(err.contains("absent.tar"), "{err}");
    // A running container (ctr here: the CRI side is kubelet-sim's tests): a shim, a
    // rootfs mount under the directory, a process.
    let ctr = |args: &[&str]| {
        Command::new("ctr")
            .arg("--address")
            .arg(&socket)
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .unwrap()
    };
    let run = ctr(&["run", "-d", image, "lifecycle", "/bin/sleep", "3600"]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let shims = teardown::shims_of(&socket);
    assert_eq!(shims.len(), 1, "one shim for the one container");
    assert!(
        !teardown::mounts_under(&dir).is_empty(),
        "its rootfs is mounted"
    );
    // `ctr run -d` returns once the task started; the command may still be runc's init.
    let deadline = Instant::now() + Duration::from_secs(30);
    let sleeper = loop {
        let found = teardown::pids_with_arg("/bin/sleep", "3600");
        if found.len() == 1 {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "the container's process: {found:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    host.stop().unwrap();
    assert!(!dir.exists(), "{} left", dir.display());
    assert!(teardown::mounts_under(&dir).is_empty());
    assert!(
        shims.iter().all(|p| !teardown::alive(*p)),
        "a shim lives on"
    );
    assert!(
        !teardown::alive(sleeper[0]),
        "the container's process lives on"
    );
    let _ = std::fs::remove_dir_all(&work);
}
