//! Golden tests: region files written byte by byte in the SPEC Appendix A layouts read back
//! exactly, and every bad input of issue 7 is refused with a clear error, never a panic.

use crate::common;

use common::{Proc, proc, v0_region, v1_region};
use hami_monitor::hami_core_region::{CoreRegionError, read_region};
use proptest::prelude::*;

const GIB: u64 = 1 << 30;

fn procs() -> Vec<Proc> {
    vec![
        proc(4001, 1, [(0, 3 * GIB), (1, GIB)], [(0, 30), (1, 5)]),
        proc(4002, 1, [(0, GIB), (1, 0)], [(0, 25), (1, 0)]),
        // Exited normally: status 0, its numbers must not count.
        proc(4003, 0, [(0, 7 * GIB), (1, 7 * GIB)], [(0, 90), (1, 90)]),
        // SIGKILLed: status still 1, but its host pid is gone (D-6).
        proc(4004, 1, [(0, 2 * GIB), (1, 0)], [(0, 40), (1, 0)]),
        // hostpid never resolved (0): counted.
        Proc {
            pid: 9,
            hostpid: 0,
            status: 1,
            used: [(0, 1, 2, 3, 100), (1, 0, 0, 0, 0)],
            sm: [(0, 0), (1, 0)],
        },
    ]
}

fn alive(pid: i32) -> bool {
    pid != 4004
}

#[test]
fn v1_2_and_v1_1_read_exactly_what_was_written() {
    for minor in [1, 2] {
        let bytes = v1_region(
            minor,
            &[
                "GPU-aaaaaaaa-1111-2222-3333-444444444444",
                "GPU-bbbbbbbb-1111-2222-3333-444444444444",
            ],
            &[8 * GIB, 4 * GIB],
            &procs(),
            1_700_000_123,
        );
        let r = read_region(bytes.as_slice(), &alive).unwrap();
        assert_eq!((r.layout, r.major, r.minor), ("v1", 1, minor));
        assert_eq!(r.live_processes, 3);
        assert_eq!(r.dead_processes, 1);
        assert_eq!(r.last_kernel_time, Some(1_700_000_123));
        assert_eq!(r.priority, 1);
        assert_eq!(r.devices.len(), 2);
        let d0 = &r.devices[0];
        assert_eq!(d0.uuid, "GPU-aaaaaaaa-1111-2222-3333-444444444444");
        assert_eq!(d0.limit, 8 * GIB);
        assert_eq!(d0.sm_limit, 100);
        assert_eq!(d0.memory.total, 3 * GIB + GIB + 100);
        assert_eq!(d0.memory.context, 3 * GIB / 4 + GIB / 4 + 1);
        assert_eq!(d0.memory.module, 3 * GIB / 4 + GIB / 4 + 2);
        assert_eq!(d0.memory.data, 3 * GIB / 2 + GIB / 2 + 3);
        assert_eq!(d0.sm_util_sum, 55);
        let d1 = &r.devices[1];
        assert_eq!(
            (d1.index, d1.limit, d1.memory.total, d1.sm_util_sum),
            (1, 4 * GIB, GIB, 5)
        );
    }
}

#[test]
fn v0_reads_exactly_what_was_written() {
    let bytes = v0_region(
        &["GPU-cccccccc-1111-2222-3333-444444444444"],
        &[2 * GIB],
        &procs(),
    );
    let r = read_region(bytes.as_slice(), &alive).unwrap();
    assert_eq!(r.layout, "v0");
    assert_eq!(r.last_kernel_time, None);
    assert_eq!(r.devices.len(), 1);
    assert_eq!(r.devices[0].limit, 2 * GIB);
    assert_eq!(r.devices[0].memory.total, 3 * GIB + GIB + 100);
    assert_eq!(r.devices[0].sm_util_sum, 55);
}

#[test]
fn unset_uuids_and_clamped_counts() {
    let mut bytes = v1_region(2, &["GPU-x", ""], &[1, 1], &[], 0);
    // device_num says 40: clamped to 16; proc_num negative: clamped to 0.
    bytes[56..64].copy_from_slice(&40u64.to_le_bytes());
    bytes[2_008_896..2_008_900].copy_from_slice(&(-5i32).to_le_bytes());
    let r = read_region(bytes.as_slice(), &alive).unwrap();
    assert_eq!(r.devices.len(), 1);
    assert_eq!(r.devices_without_uuid, 15);
    assert_eq!(r.live_processes, 0);
    assert_eq!(r.last_kernel_time, None, "0 means never");
}

#[test]
fn bad_inputs_are_refused_with_what_to_do() {
    let good = v1_region(2, &["GPU-x"], &[1], &[], 0);
    assert_eq!(
        read_region([].as_slice(), &alive),
        Err(CoreRegionError::Empty)
    );
    assert_eq!(
        read_region(&good[..11], &alive),
        Err(CoreRegionError::Truncated(11))
    );
    let e = read_region(&good[..2_000_000], &alive).unwrap_err();
    assert_eq!(
        e,
        CoreRegionError::BetweenLayouts { size: 2_000_000 },
        "a v1 file cut short is not v0"
    );
    let e = read_region(&good[..1_000_000], &alive).unwrap_err();
    assert_eq!(e, CoreRegionError::TooSmall { size: 1_000_000 });
    let e = read_region(&good[..804_681], &alive).unwrap_err();
    assert!(e.to_string().contains("pre-2024-04"), "{e}");
    let mut zero = good.clone();
    zero[0..4].fill(0);
    assert_eq!(
        read_region(zero.as_slice(), &alive),
        Err(CoreRegionError::NotInitialized)
    );
    let mut magic = good.clone();
    magic[0..4].copy_from_slice(&1234i32.to_le_bytes());
    let e = read_region(magic.as_slice(), &alive).unwrap_err();
    assert_eq!(e, CoreRegionError::WrongMagic { found: 1234 });
    assert!(e.to_string().contains("19920718"));
    for (major, minor) in [(1, 0), (1, 3), (2, 1)] {
        let mut v = good.clone();
        v[4..8].copy_from_slice(&(major as u32).to_le_bytes());
        v[8..12].copy_from_slice(&(minor as u32).to_le_bytes());
        let e = read_region(v.as_slice(), &alive).unwrap_err();
        assert!(
            matches!(e, CoreRegionError::UnknownVersion { .. }),
            "{major}.{minor}"
        );
        assert!(e.to_string().contains("upgrade"), "{e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_truncation_or_garbage_is_an_error_or_a_reading_never_a_panic(
        cut in 0usize..2_008_953,
        garbage in proptest::collection::vec((0usize..2_008_953, any::<u8>()), 0..64),
    ) {
        let mut bytes = v1_region(2, &["GPU-x", "GPU-y"], &[1, 2], &procs(), 5);
        for (at, b) in garbage {
            bytes[at] = b;
        }
        let _ = read_region(&bytes[..cut], &alive);
        let _ = read_region(bytes.as_slice(), &alive);
    }
}
