//! libvgpu.so in real processes against the stand-in driver: limits to the byte, entry
//! points through cuGetProcAddress and dlsym, virtualized queries, concurrency without
//! overshoot, SIGKILL without leak or stuck lock, fail-closed settings.

mod common;

use common::*;
use hami_cuda_region::layout::offsets;

fn limit(v: &str) -> Vec<(&'static str, String)> {
    vec![("CUDA_DEVICE_MEMORY_LIMIT_0", v.to_owned())]
}

#[test]
fn the_limit_holds_to_the_byte() {
    let s = scratch("limit");
    let (out, _) = run(&s, &limit("64m"), &["alloc", &(64u64 << 20).to_string()]);
    assert!(out.contains("rc=0\n"), "{out}");
    let (out, _) = run(
        &s,
        &limit("64m"),
        &["alloc", &((64u64 << 20) + 1).to_string()],
    );
    assert!(
        out.contains("rc=2\n"),
        "limit + 1 byte must be CUDA_ERROR_OUT_OF_MEMORY: {out}"
    );
    assert_eq!(
        device_peak(&s),
        64 << 20,
        "the refused allocation never reached the driver"
    );
    assert_eq!(device_used(&s), 0);
}

#[test]
fn memory_info_is_virtualized_and_checks_null() {
    let s = scratch("meminfo");
    let (out, _) = run(&s, &limit("100m"), &["meminfo", &(30u64 << 20).to_string()]);
    assert!(
        out.contains(&format!(
            "info=0 free={} total={}",
            70u64 << 20,
            100u64 << 20
        )),
        "{out}"
    );
    assert!(out.contains("null=1"), "{out}");
    // Without a limit (a fresh region) the physical figures pass through.
    let (out, _) = run(&scratch("meminfo-free"), &[], &["meminfo", "1024"]);
    assert!(out.contains(&format!("total={}", 1u64 << 30)), "{out}");
}

#[test]
fn entry_points_from_get_proc_address_and_dlsym_are_hooked() {
    let s = scratch("procaddress");
    let (out, _) = run(
        &s,
        &limit("1m"),
        &["procaddress", &(2u64 << 20).to_string()],
    );
    assert!(out.contains("lookup=0 status=0"), "{out}");
    assert!(
        out.contains("rc=2\n"),
        "cuGetProcAddress_v2 entry must be limited: {out}"
    );
    assert!(
        out.contains("dlsym_rc=2"),
        "dlsym(libcuda) entry must be limited: {out}"
    );
    // A too-old version is the driver's answer, not a wrapper of the wrong ABI.
    assert!(out.contains("old=500"), "{out}");
    assert!(out.contains("missing=(nil)"), "{out}");
}

#[test]
fn pitch_and_managed_are_counted() {
    let s = scratch("others");
    let (out, _) = run(&s, &limit("1m"), &["others", &(2u64 << 20).to_string()]);
    assert!(
        out.contains("pitch=2") && out.contains("managed=2"),
        "{out}"
    );
    let (out, _) = run(&s, &limit("8m"), &["others", "1000"]);
    assert!(
        out.contains("pitch=0") && out.contains("managed=0"),
        "{out}"
    );
}

#[test]
fn bad_limits_fail_closed_with_a_message() {
    let s = scratch("bad");
    let (out, err) = run(&s, &limit("4gb"), &["alloc", "1"]);
    assert!(out.contains("rc=2\n"), "{out}");
    assert!(err.contains("CUDA_DEVICE_MEMORY_LIMIT_0"), "{err}");
    let env = vec![
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g".to_owned()),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "/nonexistent-dir/x.cache".to_owned(),
        ),
    ];
    let (out, err) = run(&s, &env, &["alloc", "1"]);
    assert!(
        out.contains("rc=2\n"),
        "an unusable region fails closed: {out}"
    );
    assert!(err.contains("CUDA_DEVICE_MEMORY_SHARED_CACHE"), "{err}");
}

#[test]
fn concurrent_processes_never_exceed_the_limit() {
    let s = scratch("race");
    let env = limit("40m");
    let mut handles = Vec::new();
    for _ in 0..12 {
        handles.push(
            command(&s, &env, &["race", "1", &(7u64 << 20).to_string(), "60"])
                .spawn()
                .unwrap(),
        );
    }
    for mut h in handles {
        assert!(h.wait().unwrap().success());
    }
    assert!(
        device_peak(&s) <= 40 << 20,
        "peak {} over the limit",
        device_peak(&s)
    );
    assert_eq!(device_used(&s), 0);
    let region = std::fs::read(s.join("cudevshr.cache")).unwrap();
    let used = u64::from_le_bytes(
        region[offsets::PROCS + 8 + 32..offsets::PROCS + 48]
            .try_into()
            .unwrap(),
    );
    assert_eq!(used, 0, "every process returned its bytes");
}

#[test]
fn a_killed_process_leaks_nothing_and_blocks_nobody() {
    let s = scratch("sigkill");
    let env = limit("64m");
    let mut holder = command(&s, &env, &["hold", &(60u64 << 20).to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(holder.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "rc=0\n");
    let (out, _) = run(&s, &env, &["alloc", &(8u64 << 20).to_string()]);
    assert!(
        out.contains("rc=2\n"),
        "the holder's bytes count while it lives: {out}"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    let (out, _) = run(&s, &env, &["alloc", &(60u64 << 20).to_string()]);
    assert!(
        out.contains("rc=0\n"),
        "a dead process's bytes are reclaimed: {out}"
    );
    let bytes = std::fs::read(s.join("cudevshr.cache")).unwrap();
    let proc_num = i32::from_le_bytes(
        bytes[offsets::PROC_NUM..offsets::PROC_NUM + 4]
            .try_into()
            .unwrap(),
    );
    assert!(proc_num <= 2, "slots are reused, proc_num {proc_num}");
}
