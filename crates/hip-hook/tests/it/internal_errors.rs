//! Every export of libamvgpu.so (the `la_*` callbacks) and every wrapper it hands out, made to
//! fail inside, answers its fallback in a real process that goes on running (issue 19). The
//! failure is the test build's fault switch (`AMVGPU_TEST_PANIC_IN`, src/ffi_guard.rs: a panic
//! inside the guard, compiled only into builds with debug assertions, as `cargo test`'s). The exports are read from the built library and the wrappers from the hook's symbol
//! table, so one without a case here fails the test.

use crate::common::*;
use amvgpu::symbols::Sym;
use hami_hook_checks::exported_functions;

/// A call made to fail: the probe's operations, the HIP codes they print (the first value of
/// each line), and a line the output must hold.
struct Case {
    fault: &'static str,
    args: &'static [&'static str],
    codes: &'static [i64],
    line: Option<&'static str>,
}

const fn case(fault: &'static str, args: &'static [&'static str], codes: &'static [i64]) -> Case {
    Case {
        fault,
        args,
        codes,
        line: None,
    }
}

/// 32 MiB: over the 16 MiB limit the probe runs under.
const OVER: &str = "33554432";

/// The fallbacks: out of memory (2) for allocations, `hipErrorUnknown` (999) for frees, pools
/// and queries, `hipErrorNotFound` (500) for `hipGetProcAddress` (the caller's pointer stays
/// NULL: -1), -1 for the environment changes (refused), NULL for the runtime's `getenv`. The
/// linker callbacks keep the process running: `la_objopen` and `la_symbind64` leave the call
/// where the linker bound it (the runtime's own, unlimited), `la_version` and `la_preinit`
/// leave the hook in place (the limit holds).
const CASES: &[Case] = &[
    case("la_version", &["malloc", OVER], &[2]),
    case("la_objopen", &["malloc", OVER], &[0]),
    case("la_preinit", &["malloc", OVER], &[2]),
    case("la_symbind64", &["malloc", OVER], &[0]),
    case("hipMalloc", &["malloc", "1024"], &[2]),
    case("hipFree", &["malloc", "1024", "free"], &[0, 999]),
    case("hipMallocAsync", &["async", "1024"], &[2]),
    case("hipFreeAsync", &["async", "1024", "freeasync"], &[0, 999]),
    case("hipMallocFromPoolAsync", &["pool", "0", "1024"], &[2]),
    case("hipMalloc3D", &["3d", "64", "64", "2"], &[2]),
    case("hipMallocPitch", &["pitch", "64", "64"], &[2]),
    case("hipMallocArray", &["array", "64", "64"], &[2]),
    case("hipMalloc3DArray", &["3darray", "16", "16", "16"], &[2]),
    case(
        "hipFreeArray",
        &["array", "64", "64", "freearray"],
        &[0, 999],
    ),
    case("hipMallocManaged", &["managed", "1024"], &[2]),
    case("hipExtMallocWithFlags", &["ext", "1024"], &[2]),
    case("hipMemCreate", &["memcreate", "0", "2097152"], &[2]),
    case(
        "hipMemRelease",
        &["memcreate", "0", "2097152", "release"],
        &[0, 999],
    ),
    case("hipMemPoolCreate", &["poolcreate", "0"], &[999]),
    case("hipDeviceGetDefaultMemPool", &["defaultpool", "0"], &[999]),
    case("hipMemGetInfo", &["meminfo"], &[999]),
    case("hipGetDeviceProperties", &["propslegacy", "0"], &[999]),
    case("hipGetDevicePropertiesR0600", &["props", "0"], &[999]),
    case("hipDeviceGetAttribute", &["attr", "0"], &[999]),
    case("hipDeviceTotalMem", &["totalmem", "0"], &[999]),
    Case {
        line: Some("procaddr 500 -1"),
        ..case("hipGetProcAddress", &["procaddr", "1024"], &[500])
    },
    case("hipMemAllocPitch", &["allocpitch", "64", "64"], &[2]),
    case("hipArrayCreate", &["arraycreate", "64", "64"], &[2]),
    case(
        "hipArray3DCreate",
        &["array3dcreate", "16", "16", "16"],
        &[2],
    ),
    case(
        "hipArrayDestroy",
        &["arraycreate", "64", "64", "arraydestroy"],
        &[0, 999],
    ),
    case(
        "hipMallocMipmappedArray",
        &["mipmalloc", "64", "64", "2"],
        &[2],
    ),
    case(
        "hipFreeMipmappedArray",
        &["mipmalloc", "64", "64", "2", "mipfree"],
        &[0, 999],
    ),
    case(
        "hipMipmappedArrayCreate",
        &["mipcreate", "64", "64", "2"],
        &[2],
    ),
    case(
        "hipMipmappedArrayDestroy",
        &["mipcreate", "64", "64", "2", "mipdestroy"],
        &[0, 999],
    ),
    case("hipGraphAddMemAllocNode", &["graphmem", "0", "1024"], &[2]),
    Case {
        line: Some("partgetenv 0 (unset)"),
        ..case(
            "getenv",
            &["part", "{part}", "partgetenv", "HSA_CU_MASK"],
            &[0, 0],
        )
    },
    Case {
        line: Some("partsecure 0 (unset)"),
        ..case(
            "secure_getenv",
            &["part", "{part}", "partsecure", "HSA_CU_MASK"],
            &[0, 0],
        )
    },
    case("setenv", &["setenv", "OTHER", "x"], &[-1]),
    case("putenv", &["putenv", "OTHER=x"], &[-1]),
    case("unsetenv", &["unsetenv", "OTHER"], &[-1]),
    case("clearenv", &["clearenv"], &[-1]),
];

/// The probe running `args` under the hook (16 MiB on device 0), with the fault switch on
/// `fault` if any; the stand-in's counters are in `dir/state`.
fn probe(dir: &std::path::Path, fault: Option<&str>, args: &[&str]) -> std::process::Output {
    // Lossy: a non-UTF-8 build path reaches the probe changed, its dlopen fails and the
    // case reports that, instead of a panic here.
    let part = runtime_part().to_string_lossy().into_owned();
    let args: Vec<&str> = args
        .iter()
        .map(|a| if *a == "{part}" { part.as_str() } else { a })
        .collect();
    let mut run = Run::new(Binding::Lazy, dir, true)
        .env("HIP_DEVICE_MEMORY_LIMIT_0", "16m")
        .env("HSA_CU_MASK", "0:0-3")
        .env("FAKE_HIP_SHARED_STATE", dir.join("state"));
    if let Some(fault) = fault {
        run = run.env("AMVGPU_TEST_PANIC_IN", fault);
    }
    run.run(&args)
}

#[test]
fn every_export_and_wrapper_has_a_case_and_every_case_exists() {
    let mut names = exported_functions(&hook_library());
    names.extend(
        Sym::all()
            .filter(|sym| sym.is_redirected())
            .map(|sym| sym.name().to_owned()),
    );
    let untested: Vec<_> = names
        .iter()
        .filter(|name| !CASES.iter().any(|c| c.fault == name.as_str()))
        .collect();
    assert!(
        untested.is_empty(),
        "exports and wrappers without an internal-error case: {untested:?} (add each to CASES)"
    );
    let stale: Vec<_> = CASES
        .iter()
        .map(|c| c.fault)
        .filter(|fault| !names.iter().any(|name| name == fault))
        .collect();
    assert!(stale.is_empty(), "neither exported nor wrapped: {stale:?}");
}

#[test]
fn every_export_and_wrapper_fails_closed_and_the_application_goes_on() {
    for case in CASES {
        let dir = scratch("fault");
        let out = probe(&dir, Some(case.fault), case.args);
        let (stdout, err) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
        let log = format!("internal error in {}; failing closed", case.fault);
        assert!(
            err.contains(&log),
            "{}: no {log:?} on stderr; was libamvgpu.so built without debug assertions (a release build has no fault switch)?\n{stdout}\n{err}",
            case.fault
        );
        assert!(
            out.status.success(),
            "{}: the application must go on: {:?}\n{stdout}\n{err}",
            case.fault,
            out.status
        );
        assert_eq!(codes(&out), case.codes, "{}: {stdout}\n{err}", case.fault);
        if let Some(line) = case.line {
            assert!(
                stdout.lines().any(|l| l == line),
                "{}: no {line:?}: {stdout}",
                case.fault
            );
        }
        if case.codes.first() == Some(&2) && case.fault.starts_with("hip") {
            // The stand-in writes its counters file on its first allocation.
            let state = dir.join("state");
            assert!(
                !state.exists() || stand_in_counters(&state, 0) == (0, 0),
                "{}: the refused allocation reached the runtime",
                case.fault
            );
        }
    }
}

#[test]
fn a_panic_with_the_records_locked_leaves_later_calls_working_and_the_books_conservative() {
    // The first allocation panics after its reservation, with the allocation records locked
    // (poisoning that lock): it answers out of memory, and its 1 KiB stays charged (the books
    // never show less than the device holds). Every later call works.
    let dir = scratch("poisoned");
    let out = probe(
        &dir,
        Some("tracker#1"),
        &["malloc", "1024", "malloc", "2048", "free", "meminfo"],
    );
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(
        err.contains("internal error in hipMalloc; failing closed"),
        "{stdout}\n{err}"
    );
    assert!(out.status.success(), "{stdout}\n{err}");
    assert_eq!(codes(&out), [2, 0, 0, 0], "{stdout}\n{err}");
    let limit = 16i64 << 20;
    assert_eq!(lines(&out)[3].1, [0, limit - 1024, limit], "{stdout}");
}

#[test]
fn an_internal_error_after_the_real_lookup_hands_out_no_function() {
    // `#2`: the second guard of the call, the one choosing the wrapper once the runtime has
    // written the real (unlimited) function. The probe calls what it got (-1: nothing).
    let dir = scratch("procaddr");
    let out = probe(&dir, Some("hipGetProcAddress#2"), &["procaddr", OVER]);
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(err.contains("internal error in hipGetProcAddress"), "{err}");
    assert!(out.status.success(), "{stdout}\n{err}");
    assert_eq!(lines(&out)[0].1, [500, -1], "{stdout}\n{err}");
    // Without the fault the wrapper comes back and limits the call.
    let out = probe(&dir, None, &["procaddr", OVER]);
    assert_eq!(lines(&out)[0].1, [0, 2], "{}", stderr(&out));
}

#[test]
fn without_the_switch_or_with_another_export_named_the_calls_work() {
    for fault in [None, Some("hipFree")] {
        let dir = scratch("no-fault");
        let part = ["part", "{part}", "partgetenv", "HSA_CU_MASK"];
        let out = probe(&dir, fault, &[&["malloc", "1024"][..], &part[..]].concat());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", stderr(&out));
        assert_eq!(codes(&out), [0, 0, 0], "{stdout}");
        assert!(
            stdout.contains("partgetenv 0 0:0-3"),
            "the runtime reads the pinned value: {stdout}"
        );
        assert!(!stderr(&out).contains("internal error"), "{}", stderr(&out));
        assert_eq!(stand_in_counters(&dir.join("state"), 0).1, 1024);
    }
}
