//! Sessions on a real file, several per process (each has its own open file description, so
//! each is a separate owner for the kernel's locks, like separate processes).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use hami_region::layout::{LIMIT_NONE, MAGIC, MAX_PROCS, REGION_SIZE};
use hami_region::{Limits, RegionError, ReserveError, Session};
use proptest::prelude::*;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A fresh directory under the target dir, unique per call.
fn scratch() -> PathBuf {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("hami-region-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn limits(per_device: &[(usize, u64)]) -> Limits {
    let mut limits = Limits::default();
    for &(device, bytes) in per_device {
        limits.bytes[device] = bytes;
    }
    limits
}

#[test]
fn creates_a_versioned_region_of_the_documented_size() {
    let _spawns = crate::common::no_spawns();
    let path = scratch().join("r.cache");
    let session = Session::attach(&path, &limits(&[(0, 100)])).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), REGION_SIZE);
    assert_eq!(&bytes[0..4], &MAGIC.to_le_bytes());
    assert_eq!(u32::from_le_bytes(bytes[4..8].try_into().unwrap()), 1);
    // Device 0's limit sits at 64 (devices) + 16 (limit field).
    assert_eq!(u64::from_le_bytes(bytes[80..88].try_into().unwrap()), 100);
    assert_eq!(
        u64::from_le_bytes(bytes[144..152].try_into().unwrap()),
        LIMIT_NONE
    );
    assert_eq!(session.slot_index(), 0);
}

#[test]
fn reserves_up_to_the_limit_and_not_one_byte_more() {
    let _spawns = crate::common::no_spawns();
    let path = scratch().join("r.cache");
    let a = Session::attach(&path, &limits(&[(0, 1000), (3, 10)])).unwrap();
    let b = Session::attach(&path, &Limits::default()).unwrap();
    assert_eq!(b.limit_mismatches(&Limits::default()).len(), 2);
    a.reserve(0, 600).unwrap();
    b.reserve(0, 400).unwrap();
    let refused = b.reserve(0, 1).unwrap_err();
    assert!(
        matches!(refused, ReserveError::OverLimit { device: 0, over } if over.used == 1000 && over.requested == 1),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("1000 of 1000"), "{refused}");
    assert!(b.reserve(3, 11).is_err());
    b.reserve(3, 10).unwrap();
    b.reserve(1, u64::MAX / 2).unwrap(); // device 1 has no limit
    assert_eq!(a.release(0, 100), 100);
    b.reserve(0, 100).unwrap();
    // A release never takes more than the slot holds.
    assert_eq!(a.release(0, 10_000), 500);
    assert_eq!(a.device_usage(0).unwrap().used, 500);
    assert_eq!(a.device_usage(0).unwrap().peak, 1000);
    assert!(matches!(
        a.reserve(64, 1),
        Err(ReserveError::NoSuchDevice(64))
    ));
}

#[test]
fn a_lowered_limit_applies_to_the_next_reservation() {
    let _spawns = crate::common::no_spawns();
    let path = scratch().join("r.cache");
    let a = Session::attach(&path, &limits(&[(0, 1000)])).unwrap();
    a.reserve(0, 600).unwrap();
    a.set_limit(0, 500).unwrap();
    assert_eq!(a.device_usage(0).unwrap().limit, 500);
    assert!(a.reserve(0, 1).is_err());
    assert_eq!(a.release(0, 200), 200);
    a.reserve(0, 100).unwrap();
    assert!(a.set_limit(64, 1).is_err());
}

#[test]
fn a_zero_limit_refuses_everything() {
    let _spawns = crate::common::no_spawns();
    let path = scratch().join("r.cache");
    let a = Session::attach(&path, &limits(&[(0, 0)])).unwrap();
    assert!(a.reserve(0, 1).is_err());
    a.reserve(0, 0).unwrap();
}

#[test]
fn slots_are_stable_and_reused_lowest_first() {
    let _spawns = crate::common::no_spawns();
    let path = scratch().join("r.cache");
    let a = Session::attach(&path, &Limits::default()).unwrap();
    let b = Session::attach(&path, &Limits::default()).unwrap();
    let c = Session::attach(&path, &Limits::default()).unwrap();
    assert_eq!((a.slot_index(), b.slot_index(), c.slot_index()), (0, 1, 2));
    c.reserve(0, 5).unwrap();
    drop(b);
    assert_eq!((a.slot_index(), c.slot_index()), (0, 2));
    assert_eq!(c.own_used(0), 5);
    let d = Session::attach(&path, &Limits::default()).unwrap();
    assert_eq!(d.slot_index(), 1);
    let views = a.slots();
    assert_eq!(
        views.iter().map(|v| v.index).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert!(views.iter().all(|v| v.alive));
    assert_eq!(views[2].used, vec![(0, 5)]);
}

#[test]
fn a_detaching_process_returns_its_bytes() {
    let _spawns = crate::common::no_spawns();
    let path = scratch().join("r.cache");
    let a = Session::attach(&path, &limits(&[(0, 100)])).unwrap();
    let b = Session::attach(&path, &Limits::default()).unwrap();
    b.reserve(0, 100).unwrap();
    drop(b);
    assert_eq!(a.device_usage(0).unwrap().used, 0);
    a.reserve(0, 100).unwrap();
}

#[test]
fn a_dead_process_bytes_come_back_when_needed() {
    let _spawns = crate::common::no_spawns();
    let path = scratch().join("r.cache");
    let a = Session::attach(&path, &limits(&[(0, 100), (1, 50)])).unwrap();
    let b = Session::attach(&path, &Limits::default()).unwrap();
    b.reserve(0, 70).unwrap();
    b.reserve(1, 50).unwrap();
    b.abandon();
    let views = a.slots();
    assert_eq!(views.len(), 2);
    assert!(!views[1].alive);
    // 30 bytes are free; 31 need the dead process's bytes, which the reserve reclaims.
    a.reserve(0, 31).unwrap();
    assert_eq!(a.device_usage(0).unwrap().used, 31);
    assert_eq!(a.device_usage(1).unwrap().used, 0);
    assert_eq!(a.slots().len(), 1);
}

#[test]
fn reclaim_frees_a_dead_slot_and_reports_its_bytes() {
    let _spawns = crate::common::no_spawns();
    let path = scratch().join("r.cache");
    let a = Session::attach(&path, &Limits::default()).unwrap();
    let b = Session::attach(&path, &Limits::default()).unwrap();
    b.reserve(2, 7).unwrap();
    b.reserve(5, 8).unwrap();
    b.abandon();
    let reclaimed = a.reclaim_dead();
    assert_eq!((reclaimed.slots, reclaimed.bytes), (1, 15));
    assert_eq!(a.reclaim_dead().slots, 0);
    assert_eq!(
        Session::attach(&path, &Limits::default())
            .unwrap()
            .slot_index(),
        1
    );
}

#[test]
fn refuses_a_file_it_does_not_understand_and_leaves_it_alone() {
    let _spawns = crate::common::no_spawns();
    let dir = scratch();
    let short = dir.join("short.cache");
    let mut foreign = vec![0u8; 4096];
    foreign[0..4].copy_from_slice(&0x484D_4932u32.to_le_bytes()); // amd-hami-core's "HMI2"
    std::fs::write(&short, &foreign).unwrap();
    let err = Session::attach(&short, &Limits::default()).err().unwrap();
    assert!(matches!(err, RegionError::Incompatible { .. }), "{err}");
    assert!(err.to_string().contains("delete it"), "{err}");
    assert_eq!(std::fs::read(&short).unwrap(), foreign);

    let wrong_version = dir.join("v2.cache");
    let mut bytes = vec![0u8; REGION_SIZE];
    bytes[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(&wrong_version, &bytes).unwrap();
    let err = Session::attach(&wrong_version, &Limits::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("version 2.0"), "{err}");
    assert_eq!(std::fs::read(&wrong_version).unwrap(), bytes);

    let missing_dir = dir.join("no-such-dir").join("r.cache");
    let err = Session::attach(&missing_dir, &Limits::default())
        .err()
        .unwrap();
    assert!(matches!(err, RegionError::Open { .. }), "{err}");
    assert!(
        err.to_string().contains("HIP_DEVICE_MEMORY_SHARED_CACHE"),
        "{err}"
    );
}

#[test]
fn the_1025th_live_process_gets_a_clear_error() {
    let _spawns = crate::common::no_spawns();
    // Each session holds two descriptors.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    assert!(
        limit.rlim_cur as usize > 2 * MAX_PROCS + 64,
        "this test needs {} file descriptors, the hard limit is {}",
        2 * MAX_PROCS + 64,
        limit.rlim_cur
    );
    let path = scratch().join("r.cache");
    let sessions: Vec<Session> = (0..MAX_PROCS)
        .map(|_| Session::attach(&path, &Limits::default()).unwrap())
        .collect();
    let err = Session::attach(&path, &Limits::default()).err().unwrap();
    assert!(matches!(err, RegionError::Full { .. }), "{err}");
    assert!(err.to_string().contains("1024"), "{err}");
    // A dead process's slot is reclaimed for a newcomer.
    let mut sessions = sessions;
    sessions.swap_remove(500).abandon();
    assert_eq!(
        Session::attach(&path, &Limits::default())
            .unwrap()
            .slot_index(),
        500
    );
}

#[derive(Debug, Clone)]
enum Op {
    Attach,
    Reserve {
        who: usize,
        device: usize,
        size: u64,
    },
    Release {
        who: usize,
        device: usize,
        size: u64,
    },
    Kill {
        who: usize,
    },
    Detach {
        who: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Attach),
        (0usize..6, 0usize..2, 0u64..300).prop_map(|(who, device, size)| Op::Reserve {
            who,
            device,
            size
        }),
        (0usize..6, 0usize..2, 0u64..300).prop_map(|(who, device, size)| Op::Release {
            who,
            device,
            size
        }),
        (0usize..6).prop_map(|who| Op::Kill { who }),
        (0usize..6).prop_map(|who| Op::Detach { who }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Arbitrary interleavings of processes attaching, reserving, releasing, detaching and
    /// dying: the region's totals always equal what live processes hold, never exceed the
    /// limit, and refusals happen exactly when the model says the bytes do not fit.
    #[test]
    fn region_matches_the_model(limit in 0u64..800, ops in proptest::collection::vec(op(), 1..60)) {
        let _spawns = crate::common::no_spawns();
        let path = scratch().join("r.cache");
        let observer = Session::attach(&path, &limits(&[(0, limit), (1, limit)])).unwrap();
        let mut live: Vec<(Session, [u64; 2])> = Vec::new();
        let mut dead_bytes = [0u64; 2];
        for op in ops {
            match op {
                Op::Attach => live.push((Session::attach(&path, &Limits::default()).unwrap(), [0; 2])),
                Op::Reserve { who, device, size } if who < live.len() => {
                    let model_total: u64 = live.iter().map(|(_, held)| held[device]).sum();
                    let fits = model_total + size <= limit;
                    let (session, held) = &mut live[who];
                    let result = session.reserve(device, size);
                    prop_assert_eq!(result.is_ok(), fits, "{:?}", result);
                    if fits { held[device] += size; }
                }
                Op::Release { who, device, size } if who < live.len() => {
                    let (session, held) = &mut live[who];
                    let taken = session.release(device, size);
                    prop_assert_eq!(taken, held[device].min(size));
                    held[device] -= taken;
                }
                Op::Kill { who } if who < live.len() => {
                    let (session, held) = live.swap_remove(who);
                    dead_bytes[0] += held[0];
                    dead_bytes[1] += held[1];
                    session.abandon();
                }
                Op::Detach { who } if who < live.len() => { live.swap_remove(who); }
                _ => {}
            }
            for device in 0..2 {
                let live_total: u64 = live.iter().map(|(_, held)| held[device]).sum();
                let used = observer.device_usage(device).unwrap().used;
                // Dead bytes linger until someone needs them (or a reclaim pass runs).
                prop_assert!(used >= live_total && used <= live_total + dead_bytes[device]);
                prop_assert!(used <= limit);
            }
        }
        observer.reclaim_dead();
        for device in 0..2 {
            let live_total: u64 = live.iter().map(|(_, held)| held[device]).sum();
            prop_assert_eq!(observer.device_usage(device).unwrap().used, live_total);
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
