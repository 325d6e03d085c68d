//! libvgpu.so in real processes against the stand-in driver: limits to the byte, entry
//! points through cuGetProcAddress and dlsym, virtualized queries, concurrency without
//! overshoot, SIGKILL without leak or stuck lock, fail-closed settings.

use crate::common::*;
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

/// The stand-in reuses a freed address at once (LIFO, like a caching allocator), so a hook
/// that frees before it forgets the address loses the next allocation's record to the
/// racing thread and stops counting it.
#[test]
fn threads_racing_alloc_and_free_never_exceed_the_limit() {
    let s = scratch("threads");
    let env = limit("64m");
    for _ in 0..3 {
        let (out, _) = run(
            &s,
            &env,
            &["threads", "8", &(16u64 << 20).to_string(), "4000"],
        );
        assert!(out.contains("bad=0"), "{out}");
        assert!(
            out.contains(&format!("free={0} total={0}", 64u64 << 20)),
            "every freed byte must come back to the container (a lost record leaks or overshoots): {out}"
        );
        assert!(
            device_peak(&s) <= 64 << 20,
            "the device held {} bytes at its peak, over the 64 MiB limit",
            device_peak(&s)
        );
    }
    assert_eq!(device_used(&s), 0);
}

/// The allocation, free and launch paths make no system call of their own: counted with
/// seccomp (each call traps instead of running), the hooked probe makes exactly as many as
/// the stand-in driver alone (whose free yields, as a real free's ioctl does).
#[test]
fn alloc_free_and_launch_make_no_system_call() {
    let s = scratch("syscalls");
    let count = |out: &str| -> i64 {
        assert!(out.contains("failed=0"), "{out}");
        out.split_whitespace()
            .find_map(|w| w.strip_prefix("syscalls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{out}"))
    };
    let block = [("FAKE_CUDA_BLOCK_NS", "0".to_owned())];
    let mut plain = plain_command(&s, &["syscalls", "1000"]);
    plain.env("FAKE_CUDA_BLOCK_NS", "0");
    let plain = String::from_utf8_lossy(&plain.output().unwrap().stdout).into_owned();
    let mut env = limit("1g");
    env.extend(block);
    let (hooked, _) = run(&s, &env, &["syscalls", "1000"]);
    assert_eq!(
        count(&hooked),
        count(&plain),
        "1,000 hooked pairs + launches: {hooked} vs the driver alone: {plain}"
    );
}

/// Processes killed at arbitrary instants of an allocation storm (some while they hold the
/// region's lock word) never block the next process, and their bytes come back.
#[test]
fn killing_racing_processes_at_any_instant_blocks_nobody() {
    let s = scratch("kill-storm");
    let env = limit("64m");
    for round in 0..8u64 {
        let mut victims: Vec<_> = (0..2)
            .map(|_| {
                command(
                    &s,
                    &env,
                    &["threads", "4", &(8u64 << 20).to_string(), "1000000"],
                )
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
            })
            .collect();
        // Each victim says "racing" once all its threads are allocating; the kill then lands
        // at a different instant of the storm each round (the delay is the instant, not a wait).
        for victim in &mut victims {
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(victim.stdout.take().unwrap()),
                &mut line,
            )
            .unwrap();
            assert_eq!(line, "racing\n");
        }
        std::thread::sleep(std::time::Duration::from_millis(1 + 7 * round));
        for victim in &mut victims {
            victim.kill().unwrap();
            victim.wait().unwrap();
        }
        let started = std::time::Instant::now();
        let mut next = command(&s, &env, &["alloc", &(60u64 << 20).to_string()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status = loop {
            if let Some(status) = next.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > std::time::Duration::from_secs(10) {
                let _ = next.kill();
                panic!("round {round}: the next process is blocked");
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        let mut out = String::new();
        std::io::Read::read_to_string(next.stdout.as_mut().unwrap(), &mut out).unwrap();
        assert!(
            status.success() && out.contains("rc=0\n"),
            "round {round}: {out}"
        );
    }
}

/// An empty limit variable is malformed (SPEC §2.7): the device refuses every allocation and
/// its memory info shows nothing free while it does (the reference runs it unlimited).
#[test]
fn an_empty_limit_fails_closed_and_shows_no_free_memory() {
    let s = scratch("empty-limit");
    let (out, err) = run(&s, &limit(""), &["meminfo", "4096"]);
    assert!(out.contains("rc=2\n"), "{out}");
    assert!(out.contains("info=0 free=0 total="), "{out}");
    assert!(err.contains("CUDA_DEVICE_MEMORY_LIMIT_0"), "{err}");
    // An unusable region with a limit: refused, and no free memory shown either.
    let env = vec![
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g".to_owned()),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "/nonexistent-dir/x.cache".to_owned(),
        ),
    ];
    let (out, _) = run(&s, &env, &["meminfo", "4096"]);
    assert!(
        out.contains("rc=2\n") && out.contains("free=0 total=1073741824"),
        "{out}"
    );
}

/// A tenant who owns the cache directory plants a link (to a file like /etc/ld.so.preload,
/// or dangling) or a FIFO at the cache path: the hook follows nothing, creates nothing,
/// changes nothing, and fails closed with a message naming the path.
#[test]
fn a_planted_cache_path_fails_closed_and_is_left_alone() {
    use std::os::unix::fs::PermissionsExt;
    let s = scratch("planted");
    let cache = s.join("cudevshr.cache");
    let target = s.join("ld.so.preload");
    std::fs::write(&target, b"").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&target, &cache).unwrap();
    let (out, err) = run(&s, &limit("1g"), &["alloc", "4096"]);
    assert!(out.contains("rc=2\n"), "{out}");
    assert!(
        err.contains("is a symbolic link") && err.contains("cudevshr.cache"),
        "{err}"
    );
    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!((meta.len(), meta.permissions().mode() & 0o777), (0, 0o644));

    std::fs::remove_file(&cache).unwrap();
    let nowhere = s.join("created-through-the-link");
    std::os::unix::fs::symlink(&nowhere, &cache).unwrap();
    let (out, _) = run(&s, &limit("1g"), &["alloc", "4096"]);
    assert!(out.contains("rc=2\n"), "{out}");
    assert!(
        !nowhere.exists(),
        "a dangling link's target is never created"
    );

    std::fs::remove_file(&cache).unwrap();
    let c_path = std::ffi::CString::new(cache.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let (out, err) = run(&s, &limit("1g"), &["alloc", "4096"]);
    assert!(
        out.contains("rc=2\n") && err.contains("is a FIFO"),
        "{out}{err}"
    );
    assert_eq!(
        std::fs::symlink_metadata(&cache)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
}

/// A forked child is noticed without a `getpid` per call (its fork-mark page is wiped) and
/// accounts into a slot of its own, never into its parent's.
#[test]
fn a_forked_child_accounts_in_its_own_slot() {
    let s = scratch("fork");
    let (out, _) = run(&s, &limit("64m"), &["fork", &(1u64 << 20).to_string()]);
    assert!(
        out.contains("parent rc=0") && out.contains("child rc=0"),
        "{out}"
    );
    let pid_of = |key: &str| -> i32 {
        out.lines()
            .filter(|l| l.starts_with(key))
            .flat_map(str::split_whitespace)
            .find_map(|w| w.strip_prefix("pid="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{out}"))
    };
    let (parent, child) = (pid_of("parent"), pid_of("child"));
    let region = std::fs::read(s.join("cudevshr.cache")).unwrap();
    let held = |pid: i32| -> u64 {
        (0..4)
            .map(|i| offsets::PROCS + i * offsets::SLOT_SIZE)
            .find(|at| i32::from_le_bytes(region[*at..*at + 4].try_into().unwrap()) == pid)
            .map(|at| {
                let total = at + offsets::SLOT_USED + 32;
                u64::from_le_bytes(region[total..total + 8].try_into().unwrap())
            })
            .unwrap_or_else(|| panic!("no slot of pid {pid}"))
    };
    assert_eq!(held(parent), 1 << 20);
    assert_eq!(held(child), 2 << 20);
}

/// Memory freed by a call the hook does not wrap (here `cuCtxDestroy_v2`, which frees the
/// context's allocations in the driver) is noticed when the driver hands the address out
/// again: the stale record's bytes are returned with a warning instead of being silently
/// overwritten and leaked.
#[test]
fn a_reused_address_replaces_its_stale_record() {
    let s = scratch("stale");
    let (out, err) = run(&s, &limit("64m"), &["unseen", &(1u64 << 20).to_string()]);
    assert!(out.contains("again rc=0 same=1"), "LIFO reuse: {out}");
    assert!(
        out.contains(&format!("free={} total={}", 63u64 << 20, 64u64 << 20)),
        "only the live allocation counts: {out}"
    );
    assert!(err.contains("does not wrap"), "{err}");
}

/// Reads the region's lock word (`owner_pid`) and slot 0's claim generation from the file.
fn lock_word_and_slot0_generation(region: &std::path::Path) -> (u64, u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(region).unwrap();
    let mut word = [0u8; 8];
    file.read_exact_at(&mut word, offsets::OWNER_PID as u64)
        .unwrap();
    let mut generation = [0u8; 8];
    file.read_exact_at(
        &mut generation,
        (offsets::PROCS + offsets::SLOT_GENERATION) as u64,
    )
    .unwrap();
    (u64::from_le_bytes(word), u64::from_le_bytes(generation))
}

/// Runs `alloc <bytes>` and fails the test if it takes more than 10 s (a process waiting
/// on a lock word nobody will release waits forever).
fn alloc_unblocked(s: &std::path::Path, env: &[(&str, String)], bytes: u64, what: &str) {
    let started = std::time::Instant::now();
    let mut next = command(s, env, &["alloc", &bytes.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = next.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(10) {
            let _ = next.kill();
            let _ = next.wait();
            panic!("{what}: the next process is blocked on the region's lock word");
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(next.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert!(status.success() && out.contains("rc=0\n"), "{what}: {out}");
}

/// Issue 26 item 12: a process killed holding the region's lock word leaves it naming its
/// slot; the next process is given that slot (reclaimed, a new generation) and must take
/// the word over at once instead of waiting on what looks like itself. The word is set
/// exactly so: slot 0's previous generation, and also the generation the next claim gets.
#[test]
fn a_lock_word_naming_our_own_slot_blocks_nobody() {
    use std::os::unix::fs::FileExt;
    let s = scratch("own-slot-word");
    let env = limit("64m");
    let region = s.join("cudevshr.cache");
    let (out, _) = run(&s, &env, &["alloc", "4096"]);
    assert!(out.contains("rc=0\n"), "{out}");
    for ahead in [0u64, 1] {
        // The last process ran in slot 0 (it exited without freeing it, like a killed one).
        let (_, generation) = lock_word_and_slot0_generation(&region);
        assert!(generation >= 1);
        let word = hami_cuda_region::layout::lock_word(0, generation + ahead);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&region)
            .unwrap();
        file.write_all_at(&word.to_le_bytes(), offsets::OWNER_PID as u64)
            .unwrap();
        drop(file);
        alloc_unblocked(
            &s,
            &env,
            60 << 20,
            &format!("word of slot 0, generation {}", generation + ahead),
        );
        let (_, after) = lock_word_and_slot0_generation(&region);
        assert_eq!(after, generation + 1, "the next process reused slot 0");
    }
}

/// Kills a process inside its alloc/free loop exactly while it holds the region's lock word
/// (stopped, checked, killed; resumed and tried again when it did not hold it), round after
/// round: the next process, which reuses the killed one's slot, never blocks and gets the
/// whole limit. Random kills reached that instant 2 times in 300 (issue 26 item 12).
#[test]
fn a_process_killed_holding_the_lock_word_blocks_nobody_who_reuses_its_slot() {
    let s = scratch("kill-in-lock");
    let env = limit("64m");
    let region = s.join("cudevshr.cache");
    let mut hits = 0;
    for round in 0..6u32 {
        let mut victim = command(
            &s,
            &env,
            &["threads", "4", &(8u64 << 20).to_string(), "100000000"],
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(victim.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "racing\n");
        let pid = victim.id() as libc::pid_t;
        let started = std::time::Instant::now();
        let mut tries = 0u64;
        let held = loop {
            tries += 1;
            // SAFETY: signals to our own child; waitpid on it with WUNTRACED.
            let stopped = unsafe {
                libc::kill(pid, libc::SIGSTOP);
                let mut status = 0;
                libc::waitpid(pid, &mut status, libc::WUNTRACED) == pid && libc::WIFSTOPPED(status)
            };
            assert!(stopped, "round {round}: the victim did not stop");
            let (word, generation) = lock_word_and_slot0_generation(&region);
            if word == hami_cuda_region::layout::lock_word(0, generation) {
                break true;
            }
            if started.elapsed() > std::time::Duration::from_secs(30) {
                break false;
            }
            // SAFETY: resumes our own stopped child.
            unsafe { libc::kill(pid, libc::SIGCONT) };
            // A different instant of the loop each try (the delay is the instant, not a wait).
            std::thread::sleep(std::time::Duration::from_micros(50 + (tries * 37) % 400));
        };
        victim.kill().unwrap();
        victim.wait().unwrap();
        if held {
            hits += 1;
        }
        alloc_unblocked(&s, &env, 60 << 20, &format!("round {round}"));
    }
    assert!(
        hits >= 3,
        "only {hits} of 6 kills landed while the victim held the lock word"
    );
}
