//! Issue 31 item 3's budget: the overview of 500 nodes × 8 GPUs and 4,000 pods renders
//! server-side in < 50 ms p99, and the page is < 300 KB. The world is built in memory (no
//! API server: the render is what the budget is about): 500 nodes of the real MI210
//! capture (8 cards each), 3,800 pods the scheduler placed (one slice per card, 16 GiB and
//! 26 CUs, as the scheduler annotates them) and 200 pending with a FailedScheduling event
//! each, and one monitor round reporting every pod's container and every card. Measures
//! the pure render (under no lock) of the overview, and of `/pods` at the same scale.
//!
//! `cargo bench -p hami-webui --bench overview_500`

use std::time::{Duration, Instant};

use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::names::{Vendor, pod as pod_keys};
use hami_protocol::node_register::decode_node_devices;
use hami_webui::samples::Metrics;
use hami_webui::world::{EventRow, World};
use serde_json::json;

const NODES: usize = 500;
const PODS: usize = 4000;
const PENDING: usize = 200;
const RUNS: usize = 200;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// `render` returns the page's bytes (0: not a page, nothing to weigh).
fn measure(what: &str, runs: usize, mut render: impl FnMut() -> usize) {
    for _ in 0..10 {
        render();
    }
    let mut times = Vec::with_capacity(runs);
    let mut bytes = 0;
    for _ in 0..runs {
        let t = Instant::now();
        bytes = render();
        times.push(t.elapsed());
    }
    times.sort();
    let weight = if bytes > 0 {
        format!("; page {bytes} bytes HTML")
    } else {
        String::new()
    };
    println!(
        "{what} ({runs} renders): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms{weight}",
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
        times.last().unwrap().as_secs_f64() * 1e3
    );
}

fn main() {
    let scenario = hami_planner::scenario::parse_scenario(
        &format!("fleet:\n- {{name: mi210, count: {NODES}, capture: mi210-xgmi}}\nworkloads: []\n"),
        "bench.yaml",
    )
    .unwrap();
    let specs = hami_planner::fleet::resolve_groups(&scenario.fleet).unwrap();
    let nodes = hami_planner::fleet::build_nodes(&scenario.fleet, &specs).unwrap();
    let mut world = World::default();
    let mut cards = Vec::new();
    for n in nodes {
        let name = n.metadata.name.clone().unwrap();
        let register = &n.metadata.annotations.as_ref().unwrap()[Vendor::Amd.names().node_register];
        for d in decode_node_devices(register).unwrap() {
            cards.push((name.clone(), d.id, d.device_type));
        }
        world.upsert_node(n);
    }
    assert_eq!(cards.len(), NODES * 8);
    let names = Vendor::Amd.names();
    let mut monitor = String::new();
    for (i, (node, uuid, ty)) in cards.iter().enumerate() {
        let labels = format!(
            "node=\"{node}\",device_index=\"{}\",device_uuid=\"{uuid}\",device_type=\"{ty}\"",
            i % 8
        );
        monitor.push_str(&format!(
            "hami_host_gpu_memory_used_bytes{{{labels}}} {}\nhami_host_gpu_utilization_ratio{{{labels}}} {}\n",
            (4096 + i % 8 * 1024) << 20,
            i % 100
        ));
    }
    for i in 0..PODS {
        let (ns, name) = (format!("team-{}", i % 20), format!("job-{i}"));
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{i}")},
            "spec": {"schedulerName": "hami-scheduler",
                "containers": [{"name": "main", "image": "rocm",
                    "resources": {"limits": {names.resource_count: "1",
                        names.resource_memory: "16384", names.resource_cores: "25"}}}]},
            "status": {"phase": "Pending"}});
        // The first PODS - PENDING pods take card i each; the rest wait.
        if let Some((node, uuid, ty)) = cards.get(i).filter(|_| i < PODS - PENDING) {
            let runs = vec![vec![ContainerDevice {
                uuid: uuid.clone(),
                device_type: ty.clone(),
                mem_mib: 16384,
                cores: 26,
            }]];
            pod["metadata"]["annotations"] = json!({pod_keys::VGPU_NODE: node,
                names.devices_allocated: encode_pod_devices(&runs).unwrap(),
                pod_keys::BIND_PHASE: "success"});
            pod["spec"]["nodeName"] = json!(node);
            pod["status"]["phase"] = json!("Running");
            let labels = format!(
                "namespace=\"{ns}\",pod=\"{name}\",container=\"main\",vdevice_index=\"0\",device_uuid=\"{uuid}\""
            );
            monitor.push_str(&format!(
                "hami_container_device_memory_bytes{{{labels}}} {}\nhami_container_device_utilization_ratio{{{labels}}} {}\n",
                (2048 + i % 16 * 1024) << 20,
                i % 100
            ));
        } else {
            world.upsert_event(EventRow {
                uid: format!("ev-{i}"),
                source: "core",
                at: i as i64,
                kind: "Pod".into(),
                namespace: ns.clone(),
                name: name.clone(),
                reason: "FailedScheduling".into(),
                note: format!(
                    "no available node, {NODES} nodes do not meet: CardInsufficientMemory"
                ),
                warning: true,
            });
        }
        world.upsert_pod(serde_json::from_value(pod).unwrap());
    }
    let mut metrics = Metrics::with_endpoints(&["http://monitor:9394/metrics".into()]);
    let now = 1_000_000;
    metrics.ingest(
        now,
        vec![Ok(hami_protocol::scrape::parse_samples(&monitor))],
        &world,
    );
    println!(
        "world: {} nodes, {} GPUs, {} pods ({} placed, {PENDING} pending), {} series from one monitor",
        world.nodes.len(),
        cards.len(),
        world.pods.len(),
        PODS - PENDING,
        metrics.latest.len() + metrics.cards.len()
    );
    // The report the overview starts from (`hami status`'s, defrag-core's measure per
    // node included): what the page itself adds is the rest.
    measure("hami status report alone", RUNS, || {
        std::hint::black_box(hami_report::report_from_state(
            &world.state,
            world.pods.values(),
            &world.scheduling_notes(),
        ));
        0
    });
    measure("overview", RUNS, || {
        let page = hami_webui::pages::overview(&world, &metrics, "", now);
        assert_eq!(page.status, 200);
        page.html.len()
    });
    // /pods reads each pod's series: the same scale, fewer runs.
    measure("pods page", 50, || {
        let page = hami_webui::pods::pods(&world, &metrics, "", now);
        assert_eq!(page.status, 200);
        page.html.len()
    });
}
