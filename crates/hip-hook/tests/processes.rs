//! Real processes running a HIP program (C, linked dynamically against the stand-in runtime)
//! under `LD_AUDIT=libamvgpu.so`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::{Binding, Run, codes, lines, scratch, stand_in_counters, stderr};
use hami_region::{Limits, Session};

const MIB: u64 = 1 << 20;

fn hooked(binding: Binding, dir: &std::path::Path, limit: &str) -> Run {
    Run::new(binding, dir, true).env("HIP_DEVICE_MEMORY_LIMIT_0", limit)
}

#[test]
fn allocations_succeed_up_to_the_limit_and_one_byte_more_fails() {
    for binding in [Binding::Lazy, Binding::Now] {
        let dir = scratch("limit");
        let out = hooked(binding, &dir, "4m").run(&[
            "malloc", "4194304", "malloc", "1", "free", "malloc", "4194303", "malloc", "1",
            "malloc", "1",
        ]);
        assert_eq!(
            codes(&out),
            [0, 2, 0, 0, 0, 2],
            "{binding:?}: {}",
            stderr(&out)
        );
        assert!(out.status.success());
    }
}

#[test]
fn without_the_hook_only_the_device_size_limits() {
    let dir = scratch("unhooked");
    let out = Run::new(Binding::Lazy, &dir, false)
        .env("HIP_DEVICE_MEMORY_LIMIT_0", "1m")
        .env("FAKE_HIP_DEVICE_MEMORY", "8m")
        .run(&[
            "malloc", "4194304", "malloc", "4194304", "malloc", "1", "meminfo",
        ]);
    assert_eq!(codes(&out), [0, 0, 2, 0]);
    assert_eq!(lines(&out)[3].1, [0, 0, 8 * MIB as i64]);
}

#[test]
fn every_allocation_api_is_accounted_and_freed() {
    let dir = scratch("apis");
    let limit = 64 * 1024;
    let out = hooked(Binding::Now, &dir, &limit.to_string())
        .env("FAKE_HIP_DEVICE_COUNT", "2")
        .run(&[
            "ext",
            "1000",
            "meminfo",
            "free", //
            "managed",
            "1000",
            "meminfo",
            "free", //
            "async",
            "1000",
            "meminfo",
            "freeasync", //
            "pool",
            "0",
            "1000",
            "meminfo",
            "freeasync", //
            "pitch",
            "100",
            "10",
            "meminfo",
            "free", //
            "3d",
            "100",
            "2",
            "3",
            "meminfo",
            "free", //
            "array",
            "10",
            "10",
            "meminfo",
            "freearray", //
            "memcreate",
            "0",
            "1000",
            "meminfo",
            "release", //
            "procaddr",
            "1000",
            "meminfo",
            "free", //
            "dlsym",
            "1000",
            "meminfo",
            "free", //
            "meminfo",
        ]);
    let results = lines(&out);
    let free_after: Vec<i64> = results
        .iter()
        .filter(|(op, _)| op == "meminfo")
        .map(|(_, v)| v[1])
        .collect();
    let limit = limit as i64;
    assert_eq!(
        free_after,
        [
            limit - 1000,
            limit - 1000,
            limit - 1000,
            limit - 1000,
            limit - 512 * 10, // the stand-in's pitch is 512: counted once, not twice
            limit - 512 * 6,
            limit - 400, // 10 x 10 elements of 32 bits
            limit - 1000,
            limit - 1000,
            limit - 1000,
            limit,
        ],
        "{results:?}\n{}",
        stderr(&out)
    );
    assert!(
        results.iter().all(|(_, v)| v.first() == Some(&0)),
        "{results:?}"
    );
}

#[test]
fn the_runtime_calling_itself_is_not_counted_twice() {
    // hipMallocPitch, hipMalloc3D and hipExtMallocWithFlags of the stand-in allocate through
    // its own exported hipMalloc, as the real runtime's internals do. Counted twice, these
    // allocations of just over half the limit would fail.
    let dir = scratch("internal");
    let out = hooked(Binding::Lazy, &dir, "10240").run(&[
        "pitch", "512", "11", "free", "ext", "6000", "free", "3d", "512", "11", "1", "free",
        "meminfo",
    ]);
    assert_eq!(codes(&out), [0, 0, 0, 0, 0, 0, 0], "{}", stderr(&out));
    assert_eq!(lines(&out)[6].1, [0, 10240, 10240]);
}

#[test]
fn queries_report_the_limit_as_the_total() {
    let dir = scratch("queries");
    let out = hooked(Binding::Now, &dir, "3g").run(&[
        "malloc",
        "1073741824",
        "meminfo",
        "props",
        "0",
        "attr",
        "0",
        "totalmem",
        "0",
    ]);
    let results = lines(&out);
    assert_eq!(results[1].1, [0, 2 << 30, 3 << 30]);
    assert_eq!(results[2].1[..2], [0, 3 << 30]);
    assert_eq!(results[3].1[..2], [0, i32::MAX as i64]);
    assert_eq!(results[4].1, [0, 3 << 30]);
    // A limit above the device reports the device (HAMi-core PR #80).
    let dir = scratch("queries-big");
    let out = hooked(Binding::Now, &dir, "64g").run(&["meminfo", "totalmem", "0"]);
    assert_eq!(lines(&out)[0].1, [0, 16 << 30, 16 << 30]);
    assert_eq!(lines(&out)[1].1, [0, 16 << 30]);
}

#[test]
fn frees_return_bytes_to_the_device_they_came_from() {
    let dir = scratch("devices");
    let out = Run::new(Binding::Lazy, &dir, true)
        .env("FAKE_HIP_DEVICE_COUNT", "2")
        .env("HIP_DEVICE_MEMORY_LIMIT_0", "1000")
        .env("HIP_DEVICE_MEMORY_LIMIT_1", "2000")
        .run(&[
            "setdevice",
            "1",
            "malloc",
            "2000",
            "setdevice",
            "0",
            "malloc",
            "1000",
            "free",
            "free",
            "meminfo",
            "setdevice",
            "1",
            "meminfo",
            "malloc",
            "2000",
        ]);
    let results = lines(&out);
    assert_eq!(results[6].1, [0, 1000, 1000]);
    assert_eq!(results[8].1, [0, 2000, 2000]);
    assert_eq!(results[9].1, [0]);
}

#[test]
fn a_forked_child_accounts_in_its_own_slot() {
    let dir = scratch("fork");
    let out = hooked(Binding::Lazy, &dir, "1000").run(&[
        "malloc",
        "600",
        "fork_malloc",
        "600",
        "fork_malloc",
        "300",
        "free",
        "malloc",
        "1000",
    ]);
    // The child sees the parent's 600 bytes; its own 300 die with it and come back.
    assert_eq!(
        codes(&out),
        [0, 2, 0, 0, 0, 0, 0],
        "{:?}\n{}",
        lines(&out),
        stderr(&out)
    );
}

#[test]
fn a_bad_limit_fails_closed_and_says_why() {
    let dir = scratch("bad-limit");
    let out = hooked(Binding::Lazy, &dir, "4 GB").run(&["malloc", "1", "meminfo"]);
    assert_eq!(codes(&out), [2, 0]);
    assert_eq!(lines(&out)[1].1, [0, 0, 0]);
    let err = stderr(&out);
    assert!(
        err.contains("HIP_DEVICE_MEMORY_LIMIT_0") && err.contains("4096m"),
        "{err}"
    );
    assert!(out.status.success(), "the application must keep running");
}

#[test]
fn an_unusable_region_fails_closed_only_where_a_limit_applies() {
    let dir = scratch("no-region");
    let out = Run::new(Binding::Lazy, &dir, true)
        .env("FAKE_HIP_DEVICE_COUNT", "2")
        .env("HIP_DEVICE_MEMORY_LIMIT_0", "1m")
        .env(
            "HIP_DEVICE_MEMORY_SHARED_CACHE",
            dir.join("missing/dir/cache"),
        )
        .run(&["malloc", "1", "setdevice", "1", "malloc", "1"]);
    assert_eq!(codes(&out), [2, 0, 0]);
    let err = stderr(&out);
    assert!(err.contains("HIP_DEVICE_MEMORY_SHARED_CACHE"), "{err}");
    assert!(out.status.success());
}

#[test]
fn sixteen_processes_of_four_threads_never_exceed_the_limit() {
    let dir = scratch("contention");
    let state = dir.join("device-state");
    let limit = 8 * MIB;
    let children: Vec<_> = (0..16)
        .map(|_| {
            let mut run = hooked(Binding::Now, &dir, &limit.to_string())
                .env("FAKE_HIP_SHARED_STATE", &state)
                .env("LIBHIP_LOG_LEVEL", "1");
            run.command
                .args(["stress", "4", "1500", &MIB.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            run.command.spawn().unwrap()
        })
        .collect();
    let (mut ok, mut oom) = (0, 0);
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let result = &lines(&out)[0];
        assert_eq!(result.0, "stress");
        assert_eq!(result.1[2], 0, "unexpected errors: {}", stderr(&out));
        ok += result.1[0];
        oom += result.1[1];
    }
    let (used, peak) = stand_in_counters(&state, 0);
    assert_eq!(used, 0);
    assert!(
        peak <= limit,
        "the device saw {peak} bytes at once, limit {limit}"
    );
    assert!(
        ok > 0 && oom > 0,
        "no contention at the limit: ok {ok}, refused {oom}"
    );
    let observer = Session::attach(&dir.join("hipdevshr.cache"), &Limits::default()).unwrap();
    observer.reclaim_dead();
    assert_eq!(observer.device_usage(0).unwrap().used, 0);
}

fn start_holding(dir: &std::path::Path, limit: &str, bytes: &str) -> std::process::Child {
    let mut run = hooked(Binding::Lazy, dir, limit);
    run.command
        .args(["malloc", bytes, "hold"])
        .stdout(Stdio::piped());
    let mut child = run.command.spawn().unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "malloc 0");
    line.clear();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    child
}

#[test]
fn a_process_killed_with_sigkill_gives_its_bytes_back() {
    let dir = scratch("sigkill");
    let mut holder = start_holding(&dir, "1m", "1048576");
    let out = hooked(Binding::Lazy, &dir, "1m").run(&["malloc", "1"]);
    assert_eq!(codes(&out), [2], "a live holder's bytes must not be taken");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let out = hooked(Binding::Lazy, &dir, "1m").run(&["malloc", "1048576"]);
    assert_eq!(codes(&out), [0], "{}", stderr(&out));
}

#[test]
fn processes_killed_mid_allocation_neither_block_nor_leak() {
    let dir = scratch("sigkill-stress");
    let limit = 4 * MIB;
    for _ in 0..3 {
        let mut children: Vec<_> = (0..4)
            .map(|_| {
                let mut run =
                    hooked(Binding::Now, &dir, &limit.to_string()).env("LIBHIP_LOG_LEVEL", "1");
                run.command
                    .args(["stress", "4", "100000000", &MIB.to_string()])
                    .stdout(Stdio::null());
                run.command.spawn().unwrap()
            })
            .collect();
        std::thread::sleep(Duration::from_millis(150));
        for child in &mut children {
            child.kill().unwrap();
        }
        for mut child in children {
            child.wait().unwrap();
        }
        let out = hooked(Binding::Now, &dir, &limit.to_string()).run(&[
            "malloc",
            &limit.to_string(),
            "meminfo",
        ]);
        assert_eq!(codes(&out), [0, 0], "{}", stderr(&out));
        assert_eq!(lines(&out)[1].1, [0, 0, limit as i64]);
    }
}

#[test]
fn active_oom_killer_ends_a_process_left_above_a_lowered_limit() {
    use std::io::Write;
    use std::os::unix::process::ExitStatusExt;
    for (killer, expect_killed) in [("true", true), ("false", false)] {
        let dir = scratch("oom-killer");
        let mut run = hooked(Binding::Lazy, &dir, "1000").env("ACTIVE_OOM_KILLER", killer);
        run.command
            .args(["malloc", "600", "wait", "malloc", "1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = run.command.spawn().unwrap();
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap() > 0 && !line.contains("waiting") {}
        let operator = Session::attach(&dir.join("hipdevshr.cache"), &Limits::default()).unwrap();
        operator.set_limit(0, 500).unwrap();
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        if expect_killed {
            assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{err}");
            assert!(err.contains("ACTIVE_OOM_KILLER"), "{err}");
        } else {
            assert!(out.status.success(), "{err}");
        }
    }
}

#[test]
fn env_i_children_run_unhooked() {
    // SPEC §5 known limit: `env -i` drops LD_AUDIT, so the child is not limited (dmem still
    // applies on the node). This test pins the documented behaviour.
    let dir = scratch("env-i");
    let mut run = hooked(Binding::Lazy, &dir, "1m");
    run.command = {
        let mut command = std::process::Command::new("env");
        command
            .env_clear()
            .env("LD_AUDIT", common::hook_library())
            .env("HIP_DEVICE_MEMORY_LIMIT_0", "1m")
            .args(["-i"])
            .arg(common::probe(Binding::Lazy));
        command
    };
    let out = run.run(&["malloc", "2097152"]);
    assert_eq!(codes(&out), [0], "{}", stderr(&out));
}

#[test]
fn in_a_pod_setenv_cannot_widen_the_cu_mask_and_cleaned_children_keep_the_limit() {
    // The probe runs as pid 1 of a new PID namespace, like a container's entrypoint, so
    // /proc/1/environ is its pod-spec environment.
    let probe = common::probe(Binding::Lazy);
    let dir = scratch("pod");
    let cache = dir.join("hipdevshr.cache");
    let run = |hooked: bool| {
        let mut command = std::process::Command::new("unshare");
        command
            .env_clear()
            .args([
                "--user",
                "--map-root-user",
                "--pid",
                "--fork",
                "--mount-proc",
                "env",
            ])
            .arg(format!(
                "HIP_DEVICE_MEMORY_SHARED_CACHE={}",
                cache.display()
            ))
            .arg("HIP_DEVICE_MEMORY_LIMIT_0=1m")
            .arg("HSA_CU_MASK=0:0-3")
            .arg("FAKE_HIP_CU_COUNT=64");
        if hooked {
            command.arg(format!("LD_AUDIT={}", common::hook_library().display()));
        }
        command
            .arg(&probe)
            .args([
                "setenv",
                "HSA_CU_MASK",
                "0:0-63",
                "attr",
                "0",
                "spawn_clean",
                "2097152",
            ])
            .output()
            .expect("unshare (util-linux) is needed for this test")
    };
    let out = run(true);
    assert!(
        out.status.success(),
        "could not create a user+PID namespace with unshare (needs unprivileged user namespaces): {}",
        stderr(&out)
    );
    let results = lines(&out);
    assert_eq!(
        results[1],
        ("attr".to_owned(), vec![0, 1 << 20, 4]),
        "{results:?}\n{}",
        stderr(&out)
    );
    // The child started with only LD_AUDIT in its environment got the pod's 1m limit back.
    assert_eq!(results[2], ("malloc".to_owned(), vec![2]), "{results:?}");
    // Without the hook the same program does widen its mask.
    let out = run(false);
    let results = lines(&out);
    assert_eq!(results[1].1[2], 64, "{results:?}");
}
