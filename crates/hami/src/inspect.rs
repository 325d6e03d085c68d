//! `hami inspect`: what a pod asked for and what the scheduler's annotations say it got;
//! what a node registered. The reports are built by `hami_report` (shared with the web
//! UI) and printed here as a table (or as JSON by the caller).

pub(crate) use hami_report::{Asked, NodeReport, PodReport, node_report, pod_report};

use crate::table::{Table, shown};

pub(crate) fn render_pod(report: &PodReport) -> String {
    let mut out = format!("Pod {}/{}", shown(&report.namespace), shown(&report.name));
    if let Some(node) = &report.node {
        out.push_str(&format!("   node: {}", shown(node)));
    }
    if let Some(phase) = &report.bind_phase {
        out.push_str(&format!("   bind-phase: {}", shown(phase)));
    }
    out.push('\n');
    let mut table = Table::new(&[
        "CONTAINER",
        "KIND",
        "ASKED",
        "DEVICE",
        "TYPE",
        "MEMORY",
        "CORES",
        "CU RANGES",
    ]);
    for c in &report.containers {
        let asked = if c.asked.is_empty() {
            "-".to_owned()
        } else {
            c.asked
                .iter()
                .map(Asked::describe)
                .collect::<Vec<_>>()
                .join("; ")
        };
        let head = vec![c.name.clone(), c.kind.as_str().to_owned(), asked];
        if c.got.is_empty() {
            let device = if c.asked.is_empty() {
                "-"
            } else {
                "(not scheduled)"
            };
            table.row([head, vec![device.to_owned()]].concat());
            continue;
        }
        for (i, g) in c.got.iter().enumerate() {
            let lead = if i == 0 {
                head.clone()
            } else {
                vec![String::new(); 3]
            };
            let ranges = match (&g.cu_ranges, g.cu_ranges_shared) {
                (Some(r), true) => format!("{r} (pod)"),
                (Some(r), false) => r.clone(),
                (None, _) if g.vendor == "AMD" && c.waiting_for_allocate => {
                    "(pending Allocate)".into()
                }
                (None, _) => "-".into(),
            };
            table.row(
                [
                    lead,
                    vec![
                        g.uuid.clone(),
                        g.device_type.clone(),
                        format!("{} MiB", g.memory_mib),
                        format!("{} {}", g.cores, g.cores_unit),
                        ranges,
                    ],
                ]
                .concat(),
            );
        }
    }
    out.push_str(&table.render());
    for held in &report.whole_cards {
        let cards: Vec<String> = held.cards.iter().map(|c| shown(c).into_owned()).collect();
        out.push_str(&format!(
            "whole cards: {} ({})\n",
            cards.join(", "),
            held.annotation
        ));
    }
    for note in &report.notes {
        out.push_str(&format!("note: {}\n", shown(note)));
    }
    out
}

pub(crate) fn render_node(report: &NodeReport) -> String {
    let mut out = format!("Node {}\n", shown(&report.name));
    if report.devices.is_empty() {
        out.push_str("no GPU registered (no hami.io/node-amd-register or hami.io/node-nvidia-register annotation)\n");
    } else {
        let mut table = Table::new(&[
            "VENDOR",
            "INDEX",
            "ID",
            "TYPE",
            "SHARES",
            "MEMORY",
            "CORES",
            "NUMA",
            "MODE",
            "HEALTH",
            "PCI",
            "XGMI PEERS",
        ]);
        for d in &report.devices {
            table.row(vec![
                d.vendor.to_owned(),
                d.index.to_string(),
                d.id.clone(),
                d.device_type.clone(),
                d.shares.to_string(),
                format!("{} MiB", d.memory_mib),
                if d.vendor == "AMD" {
                    format!("{} CUs", d.cores)
                } else {
                    format!("{}%", d.cores)
                },
                d.numa.to_string(),
                if d.mode.is_empty() {
                    "-".into()
                } else {
                    d.mode.clone()
                },
                if d.health {
                    "healthy".into()
                } else {
                    "UNHEALTHY".into()
                },
                d.pci_bdf.clone().unwrap_or_else(|| "-".into()),
                if d.xgmi_peers.is_empty() {
                    "-".into()
                } else {
                    d.xgmi_peers.join(",")
                },
            ]);
        }
        out.push_str(&table.render());
    }
    if let Some(lock) = &report.lock {
        match (&lock.owner, &lock.taken_at, &lock.problem) {
            (_, _, Some(problem)) => {
                out.push_str(&format!("node lock: unreadable ({})\n", shown(problem)))
            }
            (Some(owner), Some(at), _) => out.push_str(&format!(
                "node lock: held by {} since {}\n",
                shown(owner),
                shown(at)
            )),
            (None, Some(at), _) => out.push_str(&format!(
                "node lock: legacy lock without owner, since {}\n",
                shown(at)
            )),
            _ => {}
        }
    }
    if let Some(mode) = &report.amd_operating_mode {
        out.push_str(&format!(
            "AMD operating mode (node override): {}\n",
            shown(mode)
        ));
    }
    if let Some(partition) = &report.amd_compute_partition {
        out.push_str(&format!(
            "AMD compute partition (node override): {}\n",
            shown(partition)
        ));
    }
    out
}
