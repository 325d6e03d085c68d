//! The stand-in driver and NVML behave like the real ones where hooks depend on it: memory
//! of a process that dies or exits without freeing goes back to the device, and NVML lists
//! the compute processes of a device (HAMi-core calls it unchecked).

use std::io::BufRead;

use crate::common::*;

fn spawn_holder(s: &std::path::Path, bytes: u64) -> std::process::Child {
    let mut holder = plain_command(s, &["hold", &bytes.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "rc=0\n");
    holder
}

fn free_bytes(s: &std::path::Path) -> u64 {
    let (out, _) = run_plain(s, &["devinfo"]);
    out.split_whitespace()
        .find_map(|w| w.strip_prefix("free="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no free= in {out}"))
}

#[test]
fn a_killed_process_gives_its_device_memory_back() {
    let s = scratch("standin-kill");
    let mut holder = spawn_holder(&s, 600 << 20);
    assert_eq!(device_used(&s), 600 << 20);
    assert_eq!(
        free_bytes(&s),
        (1 << 30) - (600 << 20),
        "held while it lives"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(
        free_bytes(&s),
        1 << 30,
        "a dead process's memory is the device's again"
    );
    assert_eq!(device_used(&s), 0);
    // And an allocation that needs it gets it without anyone asking first.
    let mut again = spawn_holder(&s, 900 << 20);
    again.kill().unwrap();
    again.wait().unwrap();
    let (out, _) = run_plain(&s, &["alloc", &(900u64 << 20).to_string()]);
    assert!(out.contains("rc=0\n"), "{out}");
}

#[test]
fn an_exited_process_gives_its_device_memory_back() {
    let s = scratch("standin-exit");
    let (out, _) = run_plain(&s, &["leak", &(300u64 << 20).to_string()]);
    assert!(out.contains("rc=0\n"), "{out}");
    assert_eq!(free_bytes(&s), 1 << 30);
}

#[test]
fn nvml_lists_compute_processes_with_their_memory() {
    let s = scratch("standin-procs");
    let mut holder = spawn_holder(&s, 100 << 20);
    let (out, _) = run_plain(&s, &["nvmlprocs", &(20u64 << 20).to_string()]);
    // Room 0 first: the count needed, INSUFFICIENT_SIZE (7); then both processes.
    assert!(out.contains("first=7 count=2 second=0 n=2"), "{out}");
    assert!(
        out.contains(&format!("proc pid={} used={}", holder.id(), 100u64 << 20)),
        "{out}"
    );
    assert!(out.contains(&format!("used={}", 20u64 << 20)), "{out}");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let (out, _) = run_plain(&s, &["nvmlprocs"]);
    assert!(
        out.contains("first=7 count=1 second=0 n=1"),
        "only the asking process (it has a context) is left: {out}"
    );
}
