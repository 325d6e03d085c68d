//! Benchmarks of the hook (figures go to BENCHMARKS.md; not a timed test):
//! 1. added cost of a hipMalloc+hipFree pair, single-threaded, hooked vs not;
//! 2. the same with 16 processes contending for one device's accounting;
//! 3. process start-up cost of the hook (first HIP call included), alone and with 200 other
//!    live processes attached to the region.
//!
//! Run: `cargo bench -p hami-hip-hook --bench hook_cost`

#[path = "../tests/it/common.rs"]
mod common;

use std::process::{Child, Stdio};
use std::time::Instant;

use common::{Binding, Run, lines, scratch};

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn run(dir: &std::path::Path, hooked: bool) -> Run {
    Run::new(Binding::Lazy, dir, hooked)
        .env("HIP_DEVICE_MEMORY_LIMIT_0", "8g")
        .env("LIBHIP_LOG_LEVEL", "1")
}

/// ns per pair reported by one probe.
fn pair_ns(dir: &std::path::Path, hooked: bool, pairs: u64) -> f64 {
    let out = run(dir, hooked).run(&["bench", &pairs.to_string()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("bench line")
}

/// 16 processes each doing `pairs` pairs at once: (wall ns per pair over all processes,
/// median ns per pair inside one process).
fn contended(dir: &std::path::Path, hooked: bool, pairs: u64) -> (f64, f64) {
    let start = Instant::now();
    let children: Vec<Child> = (0..16)
        .map(|_| {
            let mut run = run(dir, hooked);
            run.command
                .args(["bench", &pairs.to_string()])
                .stdout(Stdio::piped());
            run.command.spawn().unwrap()
        })
        .collect();
    let per_process: Vec<f64> = children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().unwrap();
            lines(&out)[0].1.first().copied().unwrap_or(0) as f64
        })
        .collect();
    let wall = start.elapsed().as_nanos() as f64 / (16 * pairs) as f64;
    (wall, median(per_process))
}

/// Wall time of starting a process that makes one allocation and exits.
fn start_up_us(dir: &std::path::Path, hooked: bool, runs: usize) -> f64 {
    let samples = (0..runs)
        .map(|_| {
            let start = Instant::now();
            let out = run(dir, hooked).run(&["malloc", "4096"]);
            assert!(out.status.success());
            start.elapsed().as_nanos() as f64 / 1000.0
        })
        .collect();
    median(samples)
}

fn main() {
    let dir = scratch("bench");
    let pairs = 200_000;
    // Warm up the page cache and the compiled probe.
    pair_ns(&dir, true, 1000);

    let plain = median((0..5).map(|_| pair_ns(&dir, false, pairs)).collect());
    let hooked = median((0..5).map(|_| pair_ns(&dir, true, pairs)).collect());
    println!(
        "single thread: hipMalloc+hipFree pair {plain:.0} ns without hook, {hooked:.0} ns with hook: +{:.0} ns",
        hooked - plain
    );

    let (plain_wall, plain_in) = contended(&dir, false, pairs / 4);
    let (hooked_wall, hooked_in) = contended(&dir, true, pairs / 4);
    println!(
        "16 processes: wall per pair {plain_wall:.0} ns without hook, {hooked_wall:.0} ns with hook: +{:.0} ns; median in-process per pair {plain_in:.0} ns vs {hooked_in:.0} ns: +{:.0} ns",
        hooked_wall - plain_wall,
        hooked_in - plain_in
    );

    let plain_start = start_up_us(&dir, false, 101);
    let hooked_start = start_up_us(&dir, true, 101);
    println!(
        "start-up (exec to exit, one hipMalloc): {plain_start:.0} us without hook, {hooked_start:.0} us with hook: +{:.0} us",
        hooked_start - plain_start
    );

    let holders: Vec<Child> = (0..200)
        .map(|_| {
            let mut run = run(&dir, true);
            run.command
                .args(["malloc", "4096", "hold"])
                .stdout(Stdio::piped());
            run.command.spawn().unwrap()
        })
        .collect();
    let mut holders: Vec<Child> = holders
        .into_iter()
        .map(|mut child| {
            use std::io::BufRead;
            let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 0 && !line.contains("ready") {}
            child
        })
        .collect();
    let crowded_start = start_up_us(&dir, true, 101);
    println!(
        "start-up with 200 live processes in the region: {crowded_start:.0} us with hook: +{:.0} us over no hook",
        crowded_start - plain_start
    );
    for child in &mut holders {
        let _ = child.kill();
    }
    for mut child in holders {
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
