//! Every export of libvgpu.so, made to fail inside, answers its fallback in a real process
//! that goes on running (issue 19). The failure is the test build's fault switch
//! (`VGPU_TEST_PANIC_IN`, src/ffi_guard.rs: a panic inside the export's guard, compiled only
//! into builds with debug assertions, as `cargo test`'s). The exports are read from
//! the built library, so an export without a line in [`FALLBACKS`] fails the test.

use crate::common::*;
use hami_hook_checks::exported_functions;

/// Each export and what the application gets when the hook fails inside it: out of memory
/// for allocations (2), NULL from `dlsym` (printed as 0), `CUDA_ERROR_NOT_FOUND` (500) from
/// the entry-point lookups, `CUDA_ERROR_NOT_INITIALIZED` (3) from `cuInit`,
/// `CUDA_ERROR_UNKNOWN` / `NVML_ERROR_UNKNOWN` (999) from frees, queries and launches.
const FALLBACKS: &[(&str, i64)] = &[
    ("dlsym", 0),
    ("cuInit", 3),
    ("cuGetProcAddress", 500),
    ("cuGetProcAddress_v2", 500),
    ("cuMemAlloc_v2", 2),
    ("cuMemAllocManaged", 2),
    ("cuMemAllocPitch_v2", 2),
    ("cuMemAllocAsync", 2),
    ("cuMemAllocAsync_ptsz", 2),
    ("cuMemAllocFromPoolAsync", 2),
    ("cuMemAllocFromPoolAsync_ptsz", 2),
    ("cuMemCreate", 2),
    ("cuArrayCreate_v2", 2),
    ("cuArray3DCreate_v2", 2),
    ("cuMemFree_v2", 999),
    ("cuMemFreeAsync", 999),
    ("cuMemFreeAsync_ptsz", 999),
    ("cuMemRelease", 999),
    ("cuArrayDestroy", 999),
    ("cuMemGetInfo_v2", 999),
    ("cuDeviceTotalMem_v2", 999),
    ("nvmlDeviceGetMemoryInfo", 999),
    ("nvmlDeviceGetMemoryInfo_v2", 999),
    ("cuLaunchKernel", 999),
    ("cuLaunchKernel_ptsz", 999),
    ("cuLaunchCooperativeKernel", 999),
    ("cuLaunchCooperativeKernel_ptsz", 999),
    ("cuLaunchKernelEx", 999),
    ("cuLaunchKernelEx_ptsz", 999),
    ("cuGraphLaunch", 999),
    ("cuGraphLaunch_ptsz", 999),
];

/// The fault probe calling `export`, with the fault switch set to `fault` (if any).
fn call(export: &str, fault: Option<&str>) -> (std::process::ExitStatus, String, String, u64) {
    let s = scratch("fault");
    let mut env = vec![("CUDA_DEVICE_MEMORY_LIMIT_0", "64m".to_owned())];
    if let Some(fault) = fault {
        env.push(("VGPU_TEST_PANIC_IN", fault.to_owned()));
    }
    let output = command_for(&fault_probe(), &s, &env, &[export])
        .output()
        .unwrap();
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        device_peak(&s),
    )
}

#[test]
fn every_export_is_in_the_table_and_every_entry_is_exported() {
    let exports = exported_functions(&hook_library());
    let untested: Vec<_> = exports
        .iter()
        .filter(|e| !FALLBACKS.iter().any(|(name, _)| name == e))
        .collect();
    assert!(
        untested.is_empty(),
        "exports without an internal-error test: {untested:?} (add each to FALLBACKS and to tests/c/fault_probe.c)"
    );
    let stale: Vec<_> = FALLBACKS
        .iter()
        .filter(|(name, _)| !exports.iter().any(|e| e == name))
        .collect();
    assert!(stale.is_empty(), "not exported any more: {stale:?}");
}

#[test]
fn every_export_fails_closed_and_the_application_goes_on() {
    for (export, fallback) in FALLBACKS {
        let (status, out, err, peak) = call(export, Some(export));
        let log = format!("internal error in {export}; failing closed");
        assert!(
            err.contains(&log),
            "{export}: no {log:?} on stderr; was libvgpu.so built without debug assertions (a release build has no fault switch)?\n{out}\n{err}"
        );
        assert!(
            status.success()
                && out.contains(&format!("{export} {fallback}\n"))
                && out.ends_with("survived\n"),
            "{export} must answer {fallback} and the application go on: {status}\n{out}\n{err}"
        );
        if export.starts_with("cuGetProcAddress") {
            assert!(out.contains("entry null\n"), "{export}: {out}");
        }
        if *fallback == 2 {
            // Only the probe's own 4 KiB from before (none when cuMemAlloc_v2 itself fails).
            assert!(
                peak <= 4096,
                "{export}: the refused allocation reached the driver ({peak} bytes)"
            );
        }
    }
}

#[test]
fn a_panic_with_the_records_locked_leaves_later_calls_working_and_the_books_conservative() {
    // The first allocation panics after its reservation, with the allocation records locked
    // (poisoning that lock): it answers out of memory, and its 4 KiB stay charged (the books
    // never show less than the device holds). Every later call works.
    let (status, out, err, _) = call("allocations", Some("allocations#1"));
    assert!(
        err.contains("internal error in cuMemAlloc_v2; failing closed"),
        "{out}\n{err}"
    );
    assert!(status.success(), "{status}\n{out}\n{err}");
    let total = 64u64 << 20;
    assert!(
        out.contains(&format!(
            "held=2 alloc=0 free=0 info=0 free={} total={total}\n",
            total - 4096
        )),
        "{out}\n{err}"
    );
}

#[test]
fn an_internal_error_after_the_real_lookup_hands_out_no_function() {
    // `#2`: the second guard of the call, the one choosing the wrapper once the driver has
    // written the real (unlimited) entry point.
    for export in ["cuGetProcAddress", "cuGetProcAddress_v2"] {
        let (status, out, err, _) = call(export, Some(&format!("{export}#2")));
        assert!(
            err.contains(&format!("internal error in {export}")),
            "{err}"
        );
        assert!(status.success(), "{status}\n{out}\n{err}");
        assert!(
            out.contains(&format!("{export} 500\nentry null\n")),
            "{out}\n{err}"
        );
        let (_, out, err, _) = call(export, None);
        assert!(
            out.contains(&format!("{export} 0\nentry set\n")),
            "{out}\n{err}"
        );
    }
}

#[test]
fn without_the_switch_or_with_another_export_named_the_calls_work() {
    for fault in [None, Some("cuMemFree_v2")] {
        let (status, out, err, peak) = call("cuMemAlloc_v2", fault);
        assert!(status.success(), "{out}\n{err}");
        assert!(out.contains("cuMemAlloc_v2 0\nsurvived\n"), "{out}\n{err}");
        assert!(!err.contains("internal error"), "{err}");
        assert_eq!(
            peak,
            4096 + (1 << 20),
            "both allocations reached the driver"
        );
    }
}
