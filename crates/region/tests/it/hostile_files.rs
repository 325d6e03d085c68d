//! The accounting file lives in a directory the container can write (issue 14 item 8): a
//! tenant may plant a symbolic link (to `/etc/ld.so.preload`, say), a FIFO, a directory, a
//! hard link or a file of another size there. Each is refused with an error that says what
//! to do, and nothing it points at is created, chmod-ed, grown or written.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use hami_region::layout::REGION_SIZE;
use hami_region::{Limits, RegionError, Session};

static NEXT: AtomicU64 = AtomicU64::new(0);

fn scratch() -> PathBuf {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("hami-region-hostile-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn refused(path: &std::path::Path) -> String {
    let err = Session::attach(path, &Limits::default())
        .err()
        .expect("must be refused");
    let text = err.to_string();
    assert!(matches!(err, RegionError::Unsafe { .. }), "{text}");
    assert!(
        text.contains("HIP_DEVICE_MEMORY_SHARED_CACHE"),
        "the error must say what to change: {text}"
    );
    text
}

#[test]
fn a_symbolic_link_to_a_file_is_refused_and_the_target_left_alone() {
    let _spawns = crate::common::no_spawns();
    let dir = scratch();
    let target = dir.join("ld.so.preload");
    std::fs::write(&target, b"").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    let link = dir.join("hipdevshr.cache");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = refused(&link);
    assert!(err.contains("symbolic link"), "{err}");
    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!(meta.len(), 0, "the target must not be grown");
    assert_eq!(
        meta.mode() & 0o777,
        0o644,
        "the target must not be chmod-ed"
    );
}

#[test]
fn a_dangling_symbolic_link_does_not_create_its_target() {
    let _spawns = crate::common::no_spawns();
    let dir = scratch();
    let target = dir.join("etc-ld.so.preload");
    let link = dir.join("hipdevshr.cache");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = refused(&link);
    assert!(err.contains("symbolic link"), "{err}");
    assert!(!target.exists(), "the link's target was created");
}

#[test]
fn a_fifo_is_refused_without_hanging() {
    let _spawns = crate::common::no_spawns();
    let dir = scratch();
    let fifo = dir.join("hipdevshr.cache");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o666) }, 0);
    let err = refused(&fifo);
    assert!(err.contains("FIFO"), "{err}");
}

#[test]
fn a_directory_is_refused() {
    let _spawns = crate::common::no_spawns();
    let dir = scratch();
    let sub = dir.join("hipdevshr.cache");
    std::fs::create_dir(&sub).unwrap();
    let err = refused(&sub);
    assert!(err.contains("directory"), "{err}");
}

#[test]
fn a_hard_link_to_another_file_is_refused() {
    let _spawns = crate::common::no_spawns();
    let dir = scratch();
    let other = dir.join("someone-elses");
    std::fs::write(&other, vec![0u8; REGION_SIZE]).unwrap();
    let link = dir.join("hipdevshr.cache");
    std::fs::hard_link(&other, &link).unwrap();
    let err = refused(&link);
    assert!(err.contains("hard links"), "{err}");
    assert!(std::fs::read(&other).unwrap().iter().all(|b| *b == 0));
}

#[test]
fn a_file_of_another_size_is_neither_grown_nor_written() {
    let _spawns = crate::common::no_spawns();
    let dir = scratch();
    for size in [0usize, 100, REGION_SIZE + 1] {
        let path = dir.join(format!("size-{size}.cache"));
        std::fs::write(&path, vec![0u8; size]).unwrap();
        let err = Session::attach(&path, &Limits::default()).err().unwrap();
        assert!(matches!(err, RegionError::Incompatible { .. }), "{err}");
        assert!(err.to_string().contains(&format!("{size} bytes")), "{err}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size as u64);
    }
}

#[test]
fn an_existing_region_keeps_its_mode_and_a_new_one_is_0666() {
    let _spawns = crate::common::no_spawns();
    let dir = scratch();
    let path = dir.join("private.cache");
    std::fs::write(&path, vec![0u8; REGION_SIZE]).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let session = Session::attach(&path, &Limits::default()).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    drop(session);

    let fresh = dir.join("fresh.cache");
    let session = Session::attach(&fresh, &Limits::default()).unwrap();
    let meta = std::fs::metadata(&fresh).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o666);
    assert_eq!(meta.len(), REGION_SIZE as u64);
    assert_eq!(meta.nlink(), 1, "the temporary name is gone");
    drop(session);
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".new"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn processes_racing_to_create_share_one_region() {
    let _spawns = crate::common::no_spawns();
    let dir = scratch();
    let path = dir.join("race.cache");
    let mut limits = Limits::default();
    limits.bytes[0] = 1000;
    let sessions: Vec<Session> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| Session::attach(&path, &limits).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    sessions[0].reserve(0, 600).unwrap();
    assert!(
        sessions[1].reserve(0, 600).is_err(),
        "one region, one limit"
    );
}

#[test]
fn a_region_the_plugin_prepared_cannot_be_deleted_or_replaced_into_fresh_accounting() {
    let _spawns = crate::common::no_spawns();
    let dir = scratch();
    let path = dir.join("hipdevshr.cache");
    let mut limits = Limits::default();
    limits.bytes[0] = 1000;
    let inode = hami_region::prepare_file(&path, &limits).unwrap();
    assert!(
        hami_region::prepare_file(&path, &limits).is_err(),
        "never over an existing file"
    );
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (meta.len(), meta.mode() & 0o777),
        (REGION_SIZE as u64, 0o666)
    );
    // Its head (header, accounts, slot 0) is written, not a hole — a mapped write into a
    // hole allocates in the page fault, ~1 ms each on ext4 — and the rest stays sparse.
    let head = hami_region::layout::slot_offset(1) as u64;
    let allocated = meta.blocks() * 512;
    assert!(
        allocated >= head - 4096 && allocated < REGION_SIZE as u64 / 2,
        "{allocated} bytes allocated of {REGION_SIZE}, head {head}"
    );
    // The plugin's limits are in force, whatever the first process asks for.
    let first = Session::attach_expecting(&path, &Limits::default(), Some(inode)).unwrap();
    assert_eq!(first.device_usage(0).unwrap().limit, 1000);
    assert_eq!(
        first.slots().len(),
        1,
        "the plugin's own slot was freed again"
    );
    first.reserve(0, 800).unwrap();
    // The tenant deletes the file: the next process fails closed instead of creating one.
    std::fs::remove_file(&path).unwrap();
    let err = Session::attach_expecting(&path, &limits, Some(inode))
        .err()
        .unwrap();
    assert!(matches!(err, RegionError::Unsafe { .. }), "{err}");
    assert!(err.to_string().contains("missing"), "{err}");
    assert!(!path.exists(), "nothing was created");
    // ... or puts a copy there while the original lives on elsewhere: refused too. (A
    // file created right after a deletion may get the same inode number back on tmpfs or
    // ext4; the plugin's bind mount of the file is what makes deletion impossible.)
    let moved = dir.join("moved.cache");
    let inode = hami_region::prepare_file(&moved, &limits).unwrap();
    std::fs::copy(&moved, &path).unwrap();
    let err = Session::attach_expecting(&path, &limits, Some(inode))
        .err()
        .unwrap();
    assert!(err.to_string().contains("replaced"), "{err}");
    drop(first);
}
