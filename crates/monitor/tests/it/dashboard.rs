//! The Grafana dashboard (deploy/grafana/hami-rs-vgpu.json) only plots metrics the monitor
//! emits: every `hami_*` name in its queries appears in a rendered scrape.

use std::sync::Arc;

use hami_monitor::fdinfo::DeviceUtilization;
use hami_monitor::hami_core_region::MemoryBreakdown;
use hami_monitor::host_gpus::HostGpu;
use hami_monitor::metrics::{LegacyMetrics, render};
use hami_monitor::node_monitor::{Allocation, ContainerMetrics, DeviceMetrics, Snapshot};
use hami_monitor::pods::WholeCard;

fn full_snapshot() -> Snapshot {
    Snapshot {
        node: "n".into(),
        containers: vec![ContainerMetrics {
            namespace: "ns".into(),
            pod: "p".into(),
            container: "c".into(),
            devices: vec![DeviceMetrics {
                vdevice_index: Some(0),
                device_uuid: "GPU-1".into(),
                memory_used: Some(1),
                memory_limit: Some(2),
                breakdown: Some(MemoryBreakdown {
                    context: 1,
                    module: 0,
                    data: 0,
                    total: 1,
                }),
                utilization: Some(DeviceUtilization {
                    percent: 5.0,
                    clamped: false,
                }),
            }],
            last_kernel_elapsed: Some(3),
        }],
        allocations: vec![Allocation {
            namespace: "ns".into(),
            pod: "p".into(),
            container: "c".into(),
            vendor: "AMD",
            vdevice_index: 0,
            device_uuid: "u".into(),
            memory_bytes: 1,
            cores: 2,
            cu_mask: Some("0-3,8-11".into()),
        }],
        host: Arc::new(vec![HostGpu {
            index: 1,
            uuid: "u".into(),
            device_type: "AMD-MI210".into(),
            pci_bdf: "0000:01:00.0".into(),
            memory_used: Some(1),
            busy_percent: Some(2.0),
        }]),
        whole_cards: vec![WholeCard {
            namespace: "ns".into(),
            pod: "plain".into(),
            device_uuid: "u2".into(),
        }],
        errors: [("cache_truncated", 1u64)].into(),
        hooks: Default::default(),
    }
}

#[test]
fn every_dashboard_metric_is_emitted() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana/hami-rs-vgpu.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let text = dashboard.to_string();
    let body = render(&full_snapshot(), LegacyMetrics::All);
    let mut names = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("hami_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names.retain(|n| n != "hami_rs");
    assert!(names.len() >= 8, "{names:?}");
    for name in names {
        assert!(
            body.contains(&format!("\n{name}{{")),
            "{name} is plotted but not emitted:\n{body}"
        );
    }
}

/// Seed 004's metric is what its users query: emitted by default, with the reference's
/// labels and the same value as the hami_ name; `--legacy-metrics=none` turns it off.
#[test]
fn the_seed_utilization_metric_is_emitted_by_default() {
    let body = render(&full_snapshot(), LegacyMetrics::default());
    let seed: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("Device_utilization_desc_of_container{"))
        .collect();
    let modern: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("hami_container_device_utilization_ratio{"))
        .collect();
    assert!(!seed.is_empty(), "{body}");
    assert_eq!(seed.len(), modern.len());
    for line in &seed {
        for label in [
            "podnamespace=",
            "podname=",
            "ctrname=",
            "vdeviceid=",
            "deviceuuid=",
        ] {
            assert!(line.contains(label), "{line}");
        }
    }
    let value = |l: &str| l.rsplit(' ').next().unwrap().to_owned();
    assert_eq!(
        seed.iter().map(|l| value(l)).collect::<Vec<_>>(),
        modern.iter().map(|l| value(l)).collect::<Vec<_>>()
    );
    for other in ["vGPU_device_memory_usage_in_bytes", "HostGPUMemoryUsage"] {
        assert!(
            !body.contains(other),
            "{other} only with --legacy-metrics=all"
        );
    }
}

#[test]
fn legacy_names_only_with_the_flag_and_zone_everywhere() {
    let modern = render(&full_snapshot(), LegacyMetrics::None);
    let legacy = render(&full_snapshot(), LegacyMetrics::All);
    for name in [
        "vGPU_device_memory_usage_in_bytes",
        "Device_utilization_desc_of_container",
        "HostGPUMemoryUsage",
        "Device_memory_desc_of_container",
    ] {
        assert!(!modern.contains(name));
        assert!(legacy.contains(&format!("\n{name}{{")), "{name}");
    }
    assert!(legacy.contains("context=\"1\",module=\"0\",data=\"0\",offset=\"0\""));
    assert!(modern.contains("cu_mask=\"0-3,8-11\""));
    assert!(
        modern.contains("# HELP hami_container_device_utilization_ratio")
            && modern.contains("clamped to 100")
    );
    for line in legacy
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("hami_build_info"))
    {
        assert!(line.contains("zone=\"vGPU\""), "{line}");
    }
    assert!(legacy.ends_with("# EOF\n"));
}

#[test]
fn prometheus_text_when_asked_with_zone_and_help_on_every_series() {
    use hami_monitor::metrics::render_as;
    use hami_protocol::exposition::Format;
    let accept = "text/plain;version=0.0.4;q=1,*/*;q=0.1";
    let text = render_as(
        &full_snapshot(),
        LegacyMetrics::All,
        Format::negotiate(Some(accept)),
    );
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
    let mut helped = std::collections::BTreeSet::new();
    let mut typed = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped.insert(rest.split(' ').next().unwrap().to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let name = parts.next().unwrap().to_owned();
            if parts.next() == Some("counter") {
                assert!(name.ends_with("_total"), "0.0.4 counter name: {line}");
            }
            typed.insert(name);
        } else {
            // The build info too: zone="vGPU" on every series.
            assert!(line.contains("zone=\"vGPU\""), "{line}");
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(
                typed.iter().any(|t| name == t
                    || ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| name.strip_suffix(s) == Some(t.as_str()))),
                "sample {name} outside its family: {text}"
            );
        }
    }
    assert_eq!(helped, typed, "{text}");
    assert!(typed.contains("hami_monitor_errors_total"), "{typed:?}");
    let cores = text
        .lines()
        .find(|l| l.starts_with("# HELP hami_container_device_allocated_cores "))
        .unwrap();
    assert!(
        cores.contains("compute units (CUs, not percent)") && cores.contains("percent of the SMs")
    );
}
