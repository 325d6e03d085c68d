//! Scrape latency and memory with 1,000 containers × 2 devices (issue 7 target: < 50 ms).
//!
//! `CARGO_TARGET_DIR=target-monitor cargo bench -p hami-monitor --bench scrape`
//!
//! Builds 1,000 pods and 1,000 HAMi-core v1.2 region files (sparse, 2 devices, 4 live
//! process slots each, whose host pids are checked) under a temp hook path, runs one refresh (directory scan + opening the files),
//! then times `snapshot()` + `render()` (what a `/metrics` request does, minus HTTP).

use std::io::{Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

use hami_monitor::metrics::{LegacyMetrics, render, render_as};
use hami_monitor::node_monitor::{MonitorConfig, NodeMonitor};
use hami_monitor::pods::PodIndex;
use hami_protocol::exposition::Format;
use k8s_openapi::api::core::v1::Pod;

const CONTAINERS: usize = 1000;

fn put(file: &mut std::fs::File, at: u64, bytes: &[u8]) {
    file.seek(SeekFrom::Start(at)).unwrap();
    file.write_all(bytes).unwrap();
}

fn region(path: &std::path::Path, n: usize) {
    let mut f = std::fs::File::create(path).unwrap();
    f.set_len(2_008_953).unwrap();
    put(&mut f, 0, &19_920_718i32.to_le_bytes());
    put(&mut f, 4, &1u32.to_le_bytes());
    put(&mut f, 8, &2u32.to_le_bytes());
    put(&mut f, 56, &2u64.to_le_bytes());
    for d in 0..2u64 {
        put(
            &mut f,
            64 + 96 * d,
            format!("GPU-{n:08x}-0000-0000-0000-00000000000{d}").as_bytes(),
        );
        put(&mut f, 1600 + 8 * d, &(8u64 << 30).to_le_bytes());
    }
    for s in 0..4u64 {
        let base = 1856 + 1960 * s;
        put(&mut f, base + 4, &(100 + s as i32).to_le_bytes());
        for d in 0..2u64 {
            put(&mut f, base + 8 + 64 * d + 32, &(1u64 << 28).to_le_bytes());
            put(&mut f, base + 1160 + 48 * d + 16, &(10 + s).to_le_bytes());
        }
        put(&mut f, base + 1928, &1i32.to_le_bytes());
    }
    put(&mut f, 2_008_896, &4i32.to_le_bytes());
    put(&mut f, 2_008_912, &1_700_000_000u64.to_le_bytes());
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")
                .map(|v| v.trim().trim_end_matches(" kB").parse().unwrap())
        })
        .unwrap()
}

fn main() {
    let base = std::env::temp_dir().join(format!("hami-monitor-bench-{}", std::process::id()));
    let containers = base.join("hook/containers");
    std::fs::create_dir_all(&containers).unwrap();
    let mut pods = Vec::new();
    for n in 0..CONTAINERS {
        let uid = format!("{n:08x}-1111-2222-3333-444444444444");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("pod-{n}"), "namespace": "bench", "uid": uid,
                "annotations": {"hami.io/vgpu-devices-allocated": format!("GPU-{n:08x}-0000-0000-0000-000000000000,NVIDIA,8192,50:GPU-{n:08x}-0000-0000-0000-000000000001,NVIDIA,8192,50:;")}},
            "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
        }))
        .unwrap();
        pods.push(pod);
        let dir = containers.join(format!("{uid}_main"));
        std::fs::create_dir_all(&dir).unwrap();
        region(&dir.join("r.cache"), n);
    }
    let monitor = NodeMonitor::new(MonitorConfig {
        hook_path: base.join("hook"),
        proc_root: base.join("proc"),
        sys_root: base.join("sys"),
        node_name: "bench".into(),
        gc_grace: Duration::from_secs(300),
        nvml_library: None,
    });
    // Live host pids of the slots: every slot's liveness is checked on each scrape.
    for pid in 100..104 {
        std::fs::create_dir_all(base.join("proc").join(pid.to_string())).unwrap();
    }
    let rss_before = rss_kib();
    let t = Instant::now();
    monitor.refresh(PodIndex::from_pods(pods.iter(), "hami-scheduler"));
    let refresh = t.elapsed();
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..60 {
        let t = Instant::now();
        let body = render(&monitor.snapshot(), LegacyMetrics::default());
        times.push(t.elapsed());
        bytes = body.len();
        assert!(body.contains("hami_container_device_utilization_ratio"));
    }
    times.sort();
    // The same scrape as Prometheus text 0.0.4 (what a text/plain Accept gets).
    let mut text_times = Vec::new();
    for _ in 0..60 {
        let t = Instant::now();
        let body = render_as(
            &monitor.snapshot(),
            LegacyMetrics::default(),
            Format::PrometheusText,
        );
        text_times.push(t.elapsed());
        assert!(!body.contains("# EOF"));
    }
    text_times.sort();
    let series = render(&monitor.snapshot(), LegacyMetrics::default())
        .lines()
        .filter(|l| !l.starts_with('#'))
        .count();
    println!(
        "0.0.4 text scrape (snapshot+render+conversion): p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        text_times[text_times.len() / 2].as_secs_f64() * 1e3,
        text_times[text_times.len() * 9 / 10].as_secs_f64() * 1e3,
        text_times[text_times.len() - 1].as_secs_f64() * 1e3,
    );
    println!(
        "monitor scrape, {CONTAINERS} containers x 2 devices: refresh {:.1} ms; scrape (snapshot+render) p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms; body {} KiB, {series} series; RSS {} MiB (+{} MiB for the monitor's state)",
        refresh.as_secs_f64() * 1e3,
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[times.len() * 9 / 10].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3,
        bytes / 1024,
        rss_kib() / 1024,
        rss_kib().saturating_sub(rss_before) / 1024,
    );
    std::fs::remove_dir_all(&base).unwrap();
}
