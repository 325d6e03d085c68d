//! The file shell: creation, the bytes at the Appendix A offsets, refusal of foreign files,
//! and that a handle dropped (a process gone) frees its slot.

use hami_cuda_region::layout::{FILE_SIZE, offsets};
use hami_cuda_region::{InitValues, MAGIC, Region, RegionError};

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hami-cuda-region-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("cudevshr.cache")
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}
fn i32_at(bytes: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

#[test]
fn a_new_region_has_the_appendix_a_bytes() {
    let path = temp("bytes");
    let mut init = InitValues::default();
    init.limits[0] = 1 << 30;
    init.sm_limits[0] = 30;
    init.priority = 0;
    let region = Region::attach(&path, &init).unwrap();
    region.set_devices(&["GPU-11111111-2222-3333-4444-555555555555".into()]);
    region.reserve(0, 4096).unwrap();
    region.set_hostpid(4242);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), FILE_SIZE);
    assert_eq!(i32_at(&bytes, 0), MAGIC);
    assert_eq!(i32_at(&bytes, 4), 1);
    assert_eq!(i32_at(&bytes, 8), 2);
    assert_eq!(u64_at(&bytes, offsets::DEVICE_NUM), 1);
    assert_eq!(&bytes[64..68], b"GPU-");
    assert_eq!(u64_at(&bytes, offsets::LIMIT), 1 << 30);
    assert_eq!(u64_at(&bytes, offsets::SM_LIMIT), 30);
    assert_eq!(i32_at(&bytes, offsets::PROC_NUM), 1);
    assert_eq!(i32_at(&bytes, offsets::UTILIZATION_SWITCH), 1);
    assert_eq!(i32_at(&bytes, offsets::RECENT_KERNEL), 2);
    assert_eq!(i32_at(&bytes, offsets::PRIORITY), 0);
    let slot = offsets::PROCS;
    assert_eq!(i32_at(&bytes, slot), std::process::id() as i32);
    assert_eq!(i32_at(&bytes, slot + 4), 4242);
    assert_eq!(u64_at(&bytes, slot + 8 + 16), 4096, "data_size");
    assert_eq!(u64_at(&bytes, slot + 8 + 32), 4096, "total");
    assert_eq!(i32_at(&bytes, slot + offsets::SLOT_STATUS), 1);
    // The file is mode 0666 whatever the umask.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o666
    );
    drop(region);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        i32_at(&bytes, slot + offsets::SLOT_STATUS),
        0,
        "slot freed on drop"
    );
    assert_eq!(u64_at(&bytes, slot + 8 + 32), 0);
}

#[test]
fn two_handles_share_the_limit_and_the_first_creator_wins() {
    let path = temp("share");
    let mut init = InitValues::default();
    init.limits[0] = 1000;
    let a = Region::attach(&path, &init).unwrap();
    let mut other = init.clone();
    other.limits[0] = 5000;
    let b = Region::attach(&path, &other).unwrap();
    assert_eq!(b.limit_mismatches(&other), vec![(0, 1000, 5000)]);
    assert_ne!(a.slot_index(), b.slot_index());
    a.reserve(0, 700).unwrap();
    assert!(b.reserve(0, 301).is_err());
    b.reserve(0, 300).unwrap();
    assert_eq!(a.device_usage(0), 1000);
    drop(b);
    assert_eq!(a.device_usage(0), 700);
}

#[test]
fn foreign_files_are_refused_and_left_alone() {
    let path = temp("foreign");
    std::fs::write(&path, vec![7u8; 1_197_897]).unwrap();
    let err = Region::attach(&path, &InitValues::default()).err().unwrap();
    assert!(matches!(err, RegionError::WrongSize { .. }), "{err}");
    assert!(err.to_string().contains("delete it"));
    assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 1_197_897]);
    let mut bytes = vec![0u8; FILE_SIZE];
    bytes[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let err = Region::attach(&path, &InitValues::default()).err().unwrap();
    assert!(err.to_string().contains("version 2.0"), "{err}");
    let missing = std::path::Path::new("/nonexistent-dir/x.cache");
    let err = Region::attach(missing, &InitValues::default())
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("CUDA_DEVICE_MEMORY_SHARED_CACHE"),
        "{err}"
    );
}

/// A reservation takes the region lock word (`owner_pid`) and puts it back; a word left by a
/// holder that died (its file closed, as at SIGKILL: the slot's liveness lock is gone) is
/// taken over at once, and a stale word from a HAMi-core pid blocks nobody either.
#[test]
fn a_dead_holder_of_the_lock_word_blocks_nobody() {
    use hami_cuda_region::layout::lock_word;
    use std::sync::atomic::Ordering::Relaxed;
    let path = temp("lockword");
    let mut init = InitValues::default();
    init.limits[0] = 1000;
    let survivor = Region::attach(&path, &init).unwrap();
    survivor.reserve(0, 10).unwrap();
    assert_eq!(survivor.shared().owner_pid.load(Relaxed), 0, "released");

    let victim = Region::attach(&path, &init).unwrap();
    victim.reserve(0, 100).unwrap();
    let index = victim.slot_index();
    let generation = victim.shared().procs[index].generation.load(Relaxed);
    // The victim dies holding the word: its slot stays, its locks go with its file.
    victim
        .shared()
        .owner_pid
        .store(lock_word(index, generation), Relaxed);
    victim.forget();
    let started = std::time::Instant::now();
    survivor.reserve(0, 20).unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    assert_eq!(survivor.shared().owner_pid.load(Relaxed), 0);
    // The dead slot's bytes still count until reclaimed; over the limit they are reclaimed.
    assert_eq!(survivor.device_usage(0), 130);
    survivor.reserve(0, 900).unwrap();
    assert_eq!(survivor.device_usage(0), 930);

    // A pid HAMi-core left in owner_pid (its process gone) names no live slot.
    survivor.shared().owner_pid.store(31_337, Relaxed);
    survivor.reserve(0, 1).unwrap();
    assert_eq!(survivor.shared().owner_pid.load(Relaxed), 0);
}

/// Threads of one process and other handles reserve and release concurrently under the
/// lock word. Each success is an allocation on a simulated device (taken after the
/// reservation, given back before the release, as the hook does): the device never holds
/// more than the limit, and the accounting ends at zero.
#[test]
fn concurrent_reservations_under_the_lock_word_never_exceed_the_limit() {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    let path = temp("lockword-threads");
    let mut init = InitValues::default();
    init.limits[0] = 10_000;
    let handles: Vec<Region> = (0..4)
        .map(|_| Region::attach(&path, &init).unwrap())
        .collect();
    let (device, peak) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|scope| {
        for region in &handles {
            for _ in 0..2 {
                let (device, peak) = (&device, &peak);
                scope.spawn(move || {
                    for round in 0..20_000u64 {
                        let bytes = 1000 + (round % 7) * 300;
                        if region.reserve(0, bytes).is_ok() {
                            peak.fetch_max(device.fetch_add(bytes, SeqCst) + bytes, SeqCst);
                            device.fetch_sub(bytes, SeqCst);
                            region.release(0, bytes);
                        }
                    }
                });
            }
        }
    });
    assert!(peak.into_inner() <= 10_000);
    assert!(device.into_inner() == 0 && handles[0].device_usage(0) == 0);
}

fn mode_of(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

fn refused(path: &std::path::Path, says: &str) -> String {
    let err = Region::attach(path, &InitValues::default())
        .err()
        .unwrap_or_else(|| panic!("{} was attached", path.display()));
    let text = err.to_string();
    assert!(text.contains(says), "{text}");
    assert!(text.contains("CUDA_DEVICE_MEMORY_SHARED_CACHE"), "{text}");
    text
}

/// The cache directory belongs to the tenant: what is planted at the path is refused and
/// left exactly as it was (mode, size, target); nothing is created through a link.
#[test]
fn planted_paths_are_refused_and_left_alone() {
    use std::os::unix::fs::PermissionsExt;
    let path = temp("planted");
    let dir = path.parent().unwrap().to_path_buf();

    // A symbolic link to a small file (think /etc/ld.so.preload): not followed.
    let target = dir.join("precious");
    std::fs::write(&target, b"").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    refused(&path, "is a symbolic link");
    assert_eq!(std::fs::metadata(&target).unwrap().len(), 0, "not grown");
    assert_eq!(mode_of(&target), 0o600, "not made 0666");
    std::fs::remove_file(&path).unwrap();

    // A dangling link: its target is never created.
    let nowhere = dir.join("would-be-created");
    std::os::unix::fs::symlink(&nowhere, &path).unwrap();
    refused(&path, "is a symbolic link");
    assert!(!nowhere.exists());
    std::fs::remove_file(&path).unwrap();

    // A FIFO: refused without blocking, mode unchanged.
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    refused(&path, "is a FIFO");
    assert_eq!(mode_of(&path), 0o600);
    std::fs::remove_file(&path).unwrap();

    // A directory.
    std::fs::create_dir(&path).unwrap();
    refused(&path, "is a directory");
    std::fs::remove_dir(&path).unwrap();

    // A hard link to another file.
    let other = dir.join("other");
    std::fs::write(&other, vec![0u8; FILE_SIZE]).unwrap();
    std::fs::hard_link(&other, &path).unwrap();
    refused(&path, "hard links");
    std::fs::remove_file(&path).unwrap();

    // An empty or short regular file someone else made: never grown or re-moded.
    std::fs::write(&path, b"").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = Region::attach(&path, &InitValues::default()).err().unwrap();
    assert!(
        matches!(err, RegionError::WrongSize { size: 0, .. }),
        "{err}"
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    assert_eq!(mode_of(&path), 0o600);
    std::fs::remove_file(&path).unwrap();

    // The right size with a wrong magic: refused, bytes untouched.
    std::fs::write(&path, vec![9u8; FILE_SIZE]).unwrap();
    refused(&path, "not a HAMi-core 1.1/1.2 region");
    assert_eq!(std::fs::read(&path).unwrap(), vec![9u8; FILE_SIZE]);
    std::fs::remove_file(&path).unwrap();

    // What this hook creates itself is a 0666 region.
    drop(Region::attach(&path, &InitValues::default()).unwrap());
    assert_eq!(mode_of(&path), 0o666);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_SIZE as u64);
}

/// The plugin's file (`prepare_file`, its inode in the container's config) is the only one
/// a hook uses: deleted or replaced by the tenant, it is refused instead of re-created, so
/// no process can start a second, empty accounting beside the first.
#[test]
fn only_the_plugins_region_file_is_used() {
    use std::os::unix::fs::MetadataExt;
    let path = temp("prepared");
    let anchor = path.with_extension("anchor");
    let inode = hami_cuda_region::prepare_file(&path, &anchor).unwrap();
    assert_eq!(
        hami_cuda_region::prepare_file(&path, &anchor).unwrap(),
        inode,
        "a repeated Allocate keeps it"
    );
    assert_eq!(std::fs::metadata(&anchor).unwrap().ino(), inode);
    assert_eq!(mode_of(&path), 0o666);
    let mut init = InitValues::default();
    init.limits[0] = 1000;
    let first = Region::attach_expecting(&path, &init, Some(inode)).unwrap();
    first.reserve(0, 600).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode);
    // The tenant deletes it: nobody re-creates it.
    std::fs::remove_file(&path).unwrap();
    refused_expecting(&path, inode, "is missing");
    assert!(!path.exists());
    // ... or puts another file there: the anchor keeps the inode, so the new file's differs.
    std::fs::write(&path, vec![0u8; FILE_SIZE]).unwrap();
    refused_expecting(&path, inode, "was replaced");
    assert_ne!(std::fs::metadata(&path).unwrap().ino(), inode);
    drop(first);
}

fn refused_expecting(path: &std::path::Path, inode: u64, says: &str) {
    let err = Region::attach_expecting(path, &InitValues::default(), Some(inode))
        .err()
        .unwrap();
    assert!(err.to_string().contains(says), "{err}");
}

/// An Allocate retried after an interrupted try (the file created, not yet sized) or over a
/// planted link replaces what no hook could map; one a live process holds a lock on (the
/// tenant cut it short under it) is refused naming why, and a directory is not guessed at.
#[test]
fn a_retried_allocate_replaces_a_file_no_hook_could_map() {
    use std::os::unix::fs::MetadataExt;
    let path = temp("retried");
    let anchor = path.with_extension("anchor");
    std::fs::write(&path, b"").unwrap();
    let inode = hami_cuda_region::prepare_file(&path, &anchor).unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.is_file() && meta.len() == FILE_SIZE as u64 && meta.ino() == inode);
    assert_eq!(std::fs::metadata(&anchor).unwrap().ino(), inode);
    assert_eq!(mode_of(&path), 0o666);
    // A planted link: the link goes, its target is untouched.
    let target = path.with_extension("victim");
    std::fs::write(&target, b"keep").unwrap();
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let relinked = hami_cuda_region::prepare_file(&path, &anchor).unwrap();
    assert_eq!(std::fs::metadata(&anchor).unwrap().ino(), relinked);
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    // Cut short under a process that has it attached: refused, kept.
    let region = Region::attach_expecting(&path, &InitValues::default(), Some(relinked)).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(10)
        .unwrap();
    let err = hami_cuda_region::prepare_file(&path, &anchor).unwrap_err();
    assert!(err.to_string().contains("still have it attached"), "{err}");
    assert_eq!(std::fs::metadata(&path).unwrap().ino(), relinked);
    // (Its mapping is past the file's end now: leaked, never touched again.)
    std::mem::forget(region);
    // A directory in its place.
    let dir_path = temp("retried-dir");
    std::fs::create_dir(&dir_path).unwrap();
    let err =
        hami_cuda_region::prepare_file(&dir_path, &dir_path.with_extension("anchor")).unwrap_err();
    assert!(
        err.to_string()
            .contains("is a directory, not a region file; remove it"),
        "{err}"
    );
}
