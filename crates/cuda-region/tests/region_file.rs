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
