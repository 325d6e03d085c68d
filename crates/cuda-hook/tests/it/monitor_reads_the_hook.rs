//! What libvgpu.so writes, our monitor reads (SPEC Appendix A): a process under the hook
//! holds memory and runs kernels in two "containers" (two region files); hami-monitor's
//! HAMi-core reader reports each container's bytes and its own utilization separately.

use std::io::BufRead;
use std::time::{Duration, Instant};

use crate::common::*;
use hami_monitor::hami_core_region::read_region;

fn reading(path: &std::path::Path) -> hami_monitor::hami_core_region::CoreReading {
    let bytes = std::fs::read(path).unwrap();
    read_region(&bytes, &|pid| {
        std::path::Path::new(&format!("/proc/{pid}")).exists()
    })
    .unwrap()
}

#[test]
fn the_monitor_reads_memory_and_utilization_of_two_containers() {
    let devices = scratch("monitor");
    let a = scratch("container-a");
    let b = scratch("container-b");
    let env = |c: &std::path::Path, lim: &str| {
        vec![
            ("CUDA_DEVICE_MEMORY_LIMIT_0", lim.to_owned()),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                c.join("cudevshr.cache").display().to_string(),
            ),
        ]
    };
    let spawn = |c: &std::path::Path, args: &[&str]| {
        let mut cmd = command(&devices, &env(c, "256m"), args);
        cmd.stdout(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        (child, line)
    };
    let (mut hold_a, line) = spawn(&a, &["hold", &(48u64 << 20).to_string()]);
    assert_eq!(line, "rc=0\n");
    // Container A busy all the time (kernels of 5000 blocks × 1 µs), container B idle-ish.
    let (mut busy_a, _) = spawn(&a, &["busy", "6", "5000"]);
    let (mut busy_b, _) = spawn(&b, &["busy", "6", "5000", "graph"]);

    let deadline = Instant::now() + Duration::from_secs(5);
    let (mut util_a, mut util_b) = (0, 0);
    while Instant::now() < deadline && (util_a < 50 || util_b < 50) {
        std::thread::sleep(Duration::from_millis(200));
        util_a = reading(&a.join("cudevshr.cache"))
            .devices
            .first()
            .map_or(0, |d| d.sm_util_sum);
        util_b = reading(&b.join("cudevshr.cache"))
            .devices
            .first()
            .map_or(0, |d| d.sm_util_sum);
    }
    let ra = reading(&a.join("cudevshr.cache"));
    assert_eq!((ra.major, ra.minor), (1, 2));
    let device = &ra.devices[0];
    assert!(device.uuid.starts_with("GPU-fa4e0000"), "{device:?}");
    assert_eq!(device.limit, 256 << 20);
    assert_eq!(device.memory.data, 48 << 20, "A holds 48 MiB");
    assert!(util_a >= 50, "container A busy, util {util_a}");
    assert!(
        util_b >= 50,
        "container B (graph launches) busy, util {util_b}"
    );
    assert!(util_a <= 100 && util_b <= 100);
    let rb = reading(&b.join("cudevshr.cache"));
    assert_eq!(rb.devices[0].memory.data, 0, "B holds nothing");
    for c in [&mut hold_a, &mut busy_a, &mut busy_b] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[test]
fn the_sm_limit_throttles_kernels_and_graphs() {
    let devices = scratch("limited-devices");
    let c = scratch("limited");
    let mut results = Vec::new();
    for graph in [false, true] {
        let mut args = vec!["busy", "4", "5000"];
        if graph {
            args.push("graph");
        }
        let env = vec![
            ("CUDA_DEVICE_SM_LIMIT", "30".to_owned()),
            ("GPU_CORE_UTILIZATION_POLICY", "force".to_owned()),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                c.join(format!("r{graph}.cache")).display().to_string(),
            ),
        ];
        let limited = run(&devices, &env, &args).0;
        let free = run(&devices, &[], &args).0;
        let count = |out: &str| -> f64 {
            out.lines()
                .find_map(|l| l.strip_prefix("launches="))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        results.push((graph, count(&limited) / count(&free)));
    }
    for (graph, ratio) in results {
        // 30 % of the device: well under the unlimited run (ramp-up and 100 ms lag included).
        assert!(
            ratio < 0.6,
            "graph={graph}: limited/unlimited launches {ratio:.2}"
        );
        assert!(ratio > 0.1, "graph={graph}: throttled too hard {ratio:.2}");
    }
}
