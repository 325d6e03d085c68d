//! Plan time at 1,000 nodes x 8 GPUs with 20,000 slices (issue 32: target < 2 s), and
//! the measurement of the same fleet. Run in release:
//!
//! ```text
//! cargo bench -p hami-defrag-core --bench plan_bench
//! ```
//!
//! The fleet: 1,000 nodes of 8 MI300X, every card holding 2 or 3 slices of 1/8 or 1/4
//! (20,000 slices, deterministic), every pod movable. Each target is planned `RUNS` times;
//! the median and the slowest are printed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_defrag_core::table::constraint_text;
use hami_defrag_core::{
    Cluster, Owner, Pdb, PodFacts, PodRequest, Policy, Safety, Target, measure, plan,
};
use hami_protocol::names::Vendor;
use hami_protocol::node_register::{DeviceInfo, DeviceMode};
use hami_protocol::requests::{ContainerKind, ContainerRequest, DeviceRequest, MemoryRequest};
use hami_protocol::selection::GpuPolicy;
use hami_scheduler_core::fit::{Selectors, demand};
use hami_scheduler_core::snapshot::{Gpu, NodeDevices, NodeSnapshot};
use hami_scheduler_core::usage::DeviceCharge;

const NODES: usize = 1_000;
const GPUS: usize = 8;
const SLICES: usize = 20_000;
const RUNS: usize = 5;

fn slice_request(devmem: u64, eighths: u64) -> PodRequest {
    PodRequest {
        containers: vec![ContainerRequest {
            name: "c".into(),
            kind: ContainerKind::App,
            amd: Some(DeviceRequest {
                count: 1,
                memory: MemoryRequest::Mib(devmem * eighths / 8),
                cores_percent: u32::try_from(eighths * 100 / 8).unwrap_or(100),
                priority: None,
                added_limits: Vec::new(),
            }),
            nvidia: None,
        }],
        selectors: Selectors::default(),
        gpu_policy: GpuPolicy::default(),
    }
}

fn fleet() -> Cluster {
    let devmem = 196_288;
    let safety = Safety {
        pdb: Some(Pdb {
            name: "ns/pdb".into(),
            disruptions_allowed: 5,
        }),
        owner: Some(Owner {
            kind: "ReplicaSet".into(),
            name: "web".into(),
            replicas: 10,
        }),
        age_seconds: 86_400,
        ..Safety::default()
    };
    // A fixed LCG: the same fleet on every run and machine.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        seed >> 33
    };
    let mut nodes = Vec::with_capacity(NODES);
    let mut pods = Vec::with_capacity(SLICES);
    for n in 0..NODES {
        let name = format!("node-{n:04}");
        let gpus: Vec<Gpu> = (0..GPUS)
            .map(|g| Gpu {
                vendor: Vendor::Amd,
                info: DeviceInfo {
                    id: format!("{name}-gpu{g}"),
                    index: u32::try_from(g).unwrap_or(0),
                    count: 10,
                    devmem,
                    devcore: 304,
                    device_type: "AMD Instinct MI300X".into(),
                    numa: i32::from(g >= GPUS / 2),
                    mode: DeviceMode::HamiCore,
                    health: true,
                    device_vendor: "AMD".into(),
                    custom_info: Default::default(),
                },
            })
            .collect();
        let mut node = NodeSnapshot::idle(Arc::new(NodeDevices {
            name: name.clone(),
            gpus,
            ..NodeDevices::default()
        }));
        for g in 0..GPUS {
            // 2 or 3 slices per card, 2.5 on average: 20,000 over 8,000 cards.
            let count = if (n * GPUS + g).is_multiple_of(2) {
                2
            } else {
                3
            };
            for s in 0..count {
                let eighths = 1 + next() % 2;
                let request = slice_request(devmem, eighths);
                let gpu = &node.devices.gpus[g];
                let wanted = request.containers[0].amd.as_ref().map(|r| demand(gpu, r));
                let (mem, cores) = wanted.unwrap_or_default();
                let charges = vec![DeviceCharge {
                    uuid: gpu.info.id.clone(),
                    slots: 1,
                    mem_mib: mem,
                    cores,
                }];
                node.charge(&charges);
                pods.push(PodFacts {
                    uid: format!("uid-{n}-{g}-{s}"),
                    namespace: "ns".into(),
                    name: format!("p-{n}-{g}-{s}"),
                    node: name.clone(),
                    charges,
                    request,
                    safety: safety.clone(),
                });
            }
        }
        nodes.push(node);
    }
    Cluster { nodes, pods }
}

fn time<T>(what: &str, mut f: impl FnMut() -> T, show: impl Fn(&T) -> String) {
    let mut times: Vec<Duration> = Vec::with_capacity(RUNS);
    let mut last = None;
    for _ in 0..RUNS {
        let start = Instant::now();
        let out = f();
        times.push(start.elapsed());
        last = Some(out);
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{what:<44} p50 {:>8.1} ms  max {:>8.1} ms  {}",
        ms(times[RUNS / 2]),
        ms(times[RUNS - 1]),
        last.as_ref().map(&show).unwrap_or_default()
    );
}

fn main() {
    let start = Instant::now();
    let cluster = fleet();
    println!(
        "fleet: {} nodes x {GPUS} MI300X, {} slices (built in {:.0} ms)",
        cluster.nodes.len(),
        cluster.pods.len(),
        start.elapsed().as_secs_f64() * 1000.0
    );
    time(
        "measure (every card, node, fleet)",
        || measure(&cluster.nodes),
        |m| format!("fragmentation {:.1} %", m.amd.fragmentation * 100.0),
    );
    let targets = [
        (
            "fit pending 7/8-card pod",
            Target::FitPod {
                pod: "ns/big".into(),
                request: Box::new(slice_request(196_288, 7)),
            },
            Policy::default(),
        ),
        (
            "fit pending whole-card pod (no card idle)",
            Target::FitPod {
                pod: "ns/whole".into(),
                request: Box::new(slice_request(196_288, 8)),
            },
            Policy::default(),
        ),
        (
            "free 8 whole MI300X",
            Target::FreeWholeCards {
                device_type: "MI300X".into(),
                count: 8,
            },
            Policy::default(),
        ),
        (
            "free 100 whole MI300X (max_moves 1000)",
            Target::FreeWholeCards {
                device_type: "MI300X".into(),
                count: 100,
            },
            Policy {
                max_moves: 1_000,
                ..Policy::default()
            },
        ),
        (
            "every card >= 50 % free or full",
            Target::MinFreeOrFull { percent: 50 },
            Policy::default(),
        ),
    ];
    for (what, target, policy) in &targets {
        time(
            what,
            || plan(&cluster, target, policy).unwrap(),
            |p| {
                let first = p.blocked.first().map_or(String::new(), |b| {
                    format!("; blocked first by: {}", constraint_text(&b.constraint))
                });
                format!(
                    "{} moves, shortfall {} -> {}{first}",
                    p.moves.len(),
                    p.shortfall_before,
                    p.shortfall_after
                )
            },
        );
    }
}
