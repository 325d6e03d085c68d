//! The overview page at fleet scale: the planner's 1,000-node fleet
//! (examples/scenarios/fleet-1000.yaml: 600 MI210 nodes from the real capture + 400 nodes
//! of 8 MI300X = 8,000 GPUs), its 10,000 pods placed by the scheduler's engine
//! (binpack/binpack) and written to the embedded API server as the scheduler annotates
//! them (unplaceable ones pending, with a FailedScheduling event each), watched by the UI.
//! Measures, over real HTTP: the overview's server time per request (p50/p99/max) and its
//! page weight; and the pure render alone.
//!
//! `cargo bench -p hami-webui --bench overview`

use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use hami_planner::engine::expand_workloads;
use hami_planner::scenario::parse_scenario;
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::names::{Vendor, pod as pod_keys};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("examples/scenarios/fleet-1000.yaml")).unwrap();
    let mut scenario = parse_scenario(&text, "fleet-1000.yaml").unwrap();
    scenario.gpu_policies.truncate(1);
    scenario.node_policies.truncate(1);
    let specs = hami_planner::fleet::resolve_groups(&scenario.fleet).unwrap();
    let nodes = hami_planner::fleet::build_nodes(&scenario.fleet, &specs).unwrap();
    let report = hami_planner::plan(&scenario).unwrap();
    let policy = &report.policies[0];
    let planned = expand_workloads(&scenario.workloads);
    let gpus: usize = report.gpus;
    println!(
        "fleet: {} nodes, {gpus} GPUs, {} pods ({} placed under {}/{})",
        nodes.len(),
        planned.len(),
        policy.placed,
        policy.gpu_policy,
        policy.node_policy
    );
    let types: std::collections::HashMap<String, String> = nodes
        .iter()
        .flat_map(|n| {
            let a = n.metadata.annotations.clone().unwrap_or_default();
            let list = a
                .get(Vendor::Amd.names().node_register)
                .cloned()
                .unwrap_or_default();
            hami_protocol::node_register::decode_node_devices(&list)
                .unwrap_or_default()
                .into_iter()
                .map(|d| (d.id, d.device_type))
        })
        .collect();
    let placements: std::collections::HashMap<&str, &hami_planner::report::PodPlacement> = policy
        .placements
        .iter()
        .map(|p| (p.pod.as_str(), p))
        .collect();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let api = ApiServer::start(Config::default()).await.unwrap();
        let started = Instant::now();
        for n in &nodes {
            api.create_object("v1", "nodes", None, serde_json::to_value(n).unwrap()).unwrap();
        }
        for (i, p) in planned.iter().enumerate() {
            let mut pod = serde_json::to_value(&p.pod).unwrap();
            let name = p.pod.metadata.name.clone().unwrap();
            let ns = p.pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
            pod["metadata"]["namespace"] = json!(ns);
            pod["spec"]["schedulerName"] = json!("hami-scheduler");
            for list in ["initContainers", "containers"] {
                if let Some(cs) = pod["spec"][list].as_array_mut() {
                    for c in cs {
                        c["image"] = json!("workload:latest");
                    }
                }
            }
            match placements.get(format!("{ns}/{name}").as_str()) {
                Some(pl) => {
                    // Every container's run (D-1 padding): the devices on the last one.
                    let spec = p.pod.spec.clone().unwrap_or_default();
                    let count = spec.init_containers.as_ref().map_or(0, |c| c.len()) + spec.containers.len();
                    let mut runs = vec![Vec::new(); count];
                    runs[count - 1] = pl
                        .devices
                        .iter()
                        .map(|d| ContainerDevice {
                            uuid: d.id.clone(),
                            device_type: types.get(&d.id).cloned().unwrap_or_default(),
                            mem_mib: d.mem_mib,
                            cores: d.cores as u32,
                        })
                        .collect();
                    let list = encode_pod_devices(&runs).unwrap();
                    pod["metadata"]["annotations"] = json!({
                        pod_keys::VGPU_NODE: pl.node,
                        Vendor::Amd.names().devices_allocated: list,
                        pod_keys::BIND_PHASE: "success",
                    });
                    pod["spec"]["nodeName"] = json!(pl.node);
                    pod["status"] = json!({"phase": "Running"});
                }
                None => {
                    api.create_object("v1", "events", Some(&ns), json!({
                        "apiVersion": "v1", "kind": "Event",
                        "metadata": {"name": format!("{name}.{i}"), "namespace": ns},
                        "involvedObject": {"kind": "Pod", "namespace": ns, "name": name},
                        "reason": "FailedScheduling", "type": "Warning",
                        "message": "no available node, 1000 nodes do not meet: CardInsufficientMemory",
                    })).unwrap();
                }
            }
            api.create_object("v1", "pods", Some(&ns), pod).unwrap();
        }
        println!("seeded the embedded API server in {:.1}s", started.elapsed().as_secs_f64());

        let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ui = hami_webui::start(client, listener, vec![], Duration::from_secs(5)).unwrap();
        let synced = Instant::now();
        loop {
            let ready = ui.shared.world.read().map(|w| w.pods.len() == planned.len() && w.nodes.len() == nodes.len() && w.synced.values().all(|s| *s)).unwrap_or(false);
            if ready {
                break;
            }
            assert!(synced.elapsed() < Duration::from_secs(300), "the UI never synced");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!("UI synced by watch in {:.1}s", synced.elapsed().as_secs_f64());

        let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let url = ui.url();
        let mut times = Vec::new();
        let mut weight = 0;
        for i in 0..220 {
            let t = Instant::now();
            let response = http.request(hyper::Request::get(url.as_str()).body(Empty::new()).unwrap()).await.unwrap();
            assert_eq!(response.status(), 200);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let took = t.elapsed();
            if i >= 20 {
                times.push(took);
            }
            weight = body.len();
        }
        times.sort();
        let css = hami_webui::html::CSS.len() + hami_webui::html::LIVE_JS.len();
        println!(
            "overview over HTTP ({} requests): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            times.len(),
            percentile(&times, 0.5).as_secs_f64() * 1e3,
            percentile(&times, 0.99).as_secs_f64() * 1e3,
            times.last().unwrap().as_secs_f64() * 1e3
        );
        println!("page weight: {weight} bytes HTML + {css} bytes CSS/JS = {} bytes", weight + css);

        // The pure render alone, under the same read locks the handler takes.
        let mut pure = Vec::new();
        for _ in 0..100 {
            let (w, m) = (ui.shared.world.read().unwrap(), ui.shared.metrics.read().unwrap());
            let t = Instant::now();
            let page = hami_webui::pages::overview(&w, &m, "", 0);
            pure.push(t.elapsed());
            assert_eq!(page.status, 200);
        }
        pure.sort();
        println!(
            "overview render alone (100 runs): p50 {:.1} ms, p99 {:.1} ms",
            percentile(&pure, 0.5).as_secs_f64() * 1e3,
            percentile(&pure, 0.99).as_secs_f64() * 1e3
        );
        ui.shutdown();
        drop(api);
    });
}
