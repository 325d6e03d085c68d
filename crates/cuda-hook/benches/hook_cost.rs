//! Benchmarks of libvgpu.so on the stand-in driver (figures go to BENCHMARKS.md; not a timed
//! test), the figures of issue 14's table:
//! 1. added cost of a cuMemAlloc_v2+cuMemFree_v2 pair (1 MiB), single thread, hooked vs not;
//! 2. the same with 1,000 other allocations alive;
//! 3. start-up: exec → cuInit → context → one allocation → exit;
//! 4. 16 processes × 4 threads racing at a 1 GiB limit: runs whose device peak ends over it;
//! 5. SIGKILL within the first milliseconds of a process: is the next process blocked?
//!
//! Run: `cargo bench -p hami-cuda-hook --bench hook_cost`; `VGPU_HOOK_LIBRARY=<libvgpu.so>`
//! measures another build of the hook against the same stand-in driver (before/after).
//! The stand-in's free does not yield here (`FAKE_CUDA_FREE_YIELD=0`): a quieter baseline.

#[path = "../tests/it/common.rs"]
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{command, device_peak, plain_command, scratch};

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn probe(dir: &std::path::Path, hooked: bool, args: &[&str]) -> Command {
    let mut cmd = if hooked {
        command(dir, &[], args)
    } else {
        plain_command(dir, args)
    };
    cmd.env("FAKE_CUDA_DEVICE_MEMORY", "16g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "8g")
        .env("FAKE_CUDA_FREE_YIELD", "0")
        .env("LIBCUDA_LOG_LEVEL", "1");
    cmd
}

/// ns per pair reported by one probe.
fn pair_ns(dir: &std::path::Path, hooked: bool, pairs: u64, alive: u64) -> f64 {
    let out = probe(
        dir,
        hooked,
        &["bench", &pairs.to_string(), "1048576", &alive.to_string()],
    )
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    text.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no pair_ns in {text}"))
}

fn start_up_us(dir: &std::path::Path, hooked: bool, runs: usize) -> f64 {
    median(
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                let out = probe(dir, hooked, &["alloc", "4096"]).output().unwrap();
                assert!(out.status.success());
                start.elapsed().as_nanos() as f64 / 1000.0
            })
            .collect(),
    )
}

/// 16 processes × 4 threads of 256 MiB-class allocations at a 1 GiB limit; true when the
/// device's peak went over the limit.
fn contended_run_over_limit() -> bool {
    let dir = scratch("bench-contended");
    let children: Vec<Child> = (0..16)
        .map(|_| {
            let mut cmd = command(
                &dir,
                &[("CUDA_DEVICE_MEMORY_LIMIT_0", "1g".into())],
                &["threads", "4", &(256u64 << 20).to_string(), "300"],
            );
            cmd.env("FAKE_CUDA_DEVICE_MEMORY", "16g")
                .env("LIBCUDA_LOG_LEVEL", "1")
                .stdout(Stdio::null());
            cmd.spawn().unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let over = device_peak(&dir) > 1 << 30;
    let _ = std::fs::remove_dir_all(&dir);
    over
}

/// Kills a hooked process `delay` after its start, then times the next process's
/// allocation; true when it took longer than 2 s (blocked).
fn next_blocked_after_kill(dir: &std::path::Path, delay: Duration) -> bool {
    let mut victim = probe(dir, true, &["threads", "4", "1048576", "100000"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(delay);
    let _ = victim.kill();
    let _ = victim.wait();
    let start = Instant::now();
    let mut next = probe(dir, true, &["alloc", "1048576"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    loop {
        if next.try_wait().unwrap().is_some() {
            return start.elapsed() > Duration::from_secs(2);
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = next.kill();
            let _ = next.wait();
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn main() {
    let dir = scratch("bench");
    let pairs = 100_000;
    pair_ns(&dir, true, 1000, 0);

    for alive in [0, 1000] {
        // Alternating runs, so drifting machine load hits both sides alike.
        let (mut plain, mut hooked) = (Vec::new(), Vec::new());
        for _ in 0..7 {
            plain.push(pair_ns(&dir, false, pairs, alive));
            hooked.push(pair_ns(&dir, true, pairs, alive));
        }
        let least = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
        let (plain_min, hooked_min) = (least(&plain), least(&hooked));
        let (plain, hooked) = (median(plain), median(hooked));
        println!(
            "pair (1 MiB, {pairs} pairs, {alive} others alive): median of 7 {plain:.0} ns without hook, {hooked:.0} ns with hook: +{:.0} ns; fastest {plain_min:.0} vs {hooked_min:.0} ns: +{:.0} ns",
            hooked - plain,
            hooked_min - plain_min
        );
    }

    let plain_start = start_up_us(&dir, false, 101);
    let hooked_start = start_up_us(&dir, true, 101);
    println!(
        "start-up (exec, cuInit, context, one allocation, exit): {plain_start:.0} us without hook, {hooked_start:.0} us with hook: +{:.0} us",
        hooked_start - plain_start
    );

    let runs = 10;
    let over = (0..runs).filter(|_| contended_run_over_limit()).count();
    println!("16 processes x 4 threads at a 1 GiB limit: {over}/{runs} runs ended over the limit");

    let kills = 40;
    let blocked = (0..kills)
        .filter(|i| next_blocked_after_kill(&dir, Duration::from_micros(250 * (*i as u64 % 8))))
        .count();
    println!(
        "SIGKILL 0-1.75 ms after start, then the next process: blocked {blocked}/{kills} times"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
