//! The overview's Top-5 tables (issue 31 item 3): the busiest cards (the monitors' busy
//! percent), the most fragmented cards (free memory that reference slices can no longer
//! take, with the largest slice that still fits: `hami_defrag_core`'s measure, as `hami
//! status` prints it) and the pods holding GPUs that sit idle. Pure.

use std::collections::BTreeMap;

use crate::html::{esc, mib, table};
use crate::overview::Card;
use crate::pages::{node_link, pod_link};
use crate::samples::Metrics;
use crate::usage::{coverage, figure};
use crate::world::World;

/// Rows per table.
pub const TOP: usize = 5;
/// A pod busy at most this percent on every device it holds is idle.
pub const IDLE_PERCENT: f64 = 1.0;

/// One pod holding GPUs, with what the monitors say it uses of each.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// `namespace/name`.
    pub pod: String,
    /// Its node.
    pub node: String,
    /// MiB granted over its devices.
    pub granted_mib: f64,
    /// The highest busy percent over its devices; `None` unless every device reports one.
    pub busiest: Option<f64>,
    /// Memory used over its devices that report it.
    pub used_mib: Option<f64>,
    /// The oldest sample.
    pub at: Option<i64>,
}

/// The pods holding GPUs (device-plugin slices and DRA shares) that are idle: every device
/// they hold reports a busy percent, none above [`IDLE_PERCENT`]; most memory granted
/// first.
pub fn idle_pods(world: &World, metrics: &Metrics) -> Vec<Held> {
    // (pod, node) -> [(uuid, MiB granted)]
    let mut grants: BTreeMap<(String, &str), Vec<(&str, f64)>> = BTreeMap::new();
    for (_, h) in world.state.holdings() {
        let e = grants
            .entry((format!("{}/{}", h.namespace, h.name), h.node.as_str()))
            .or_default();
        e.extend(
            h.charges
                .iter()
                .map(|c| (c.uuid.as_str(), c.mem_mib as f64)),
        );
    }
    for n in world.dra_nodes() {
        for d in &n.devices {
            for holder in &d.holders {
                for pod in &holder.pods {
                    grants
                        .entry((pod.clone(), n.name.as_str()))
                        .or_default()
                        .push((&d.uuid, holder.memory_bytes as f64 / 1048576.0));
                }
            }
        }
    }
    let usage = metrics.pod_devices();
    let mut out = Vec::new();
    for ((pod, node), devices) in grants {
        if devices.is_empty() {
            continue;
        }
        let (ns, name) = pod.split_once('/').unwrap_or(("", &pod));
        let mut busiest: Option<f64> = Some(0.0);
        let mut used: Option<f64> = None;
        let mut at: Option<i64> = None;
        for (uuid, _) in &devices {
            let u = usage.get(&(ns, name, *uuid)).copied().unwrap_or_default();
            busiest = busiest.zip(u.utilization).map(|(a, b)| a.max(b));
            if let Some(m) = u.memory_bytes {
                used = Some(used.unwrap_or(0.0) + m / 1048576.0);
            }
            at = match (at, u.at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        if busiest.is_some_and(|b| b <= IDLE_PERCENT) {
            out.push(Held {
                node: node.to_owned(),
                granted_mib: devices.iter().fold(0.0, |a, (_, m)| a + m),
                busiest,
                used_mib: used,
                at,
                pod,
            });
        }
    }
    out.sort_by(|a, b| {
        b.granted_mib
            .total_cmp(&a.granted_mib)
            .then(a.pod.cmp(&b.pod))
    });
    out
}

fn card_cell(c: &Card) -> String {
    format!(
        "{} <span class=\"muted\">{}</span>",
        esc(c.id),
        esc(c.device_type)
    )
}

/// The three tables, under one heading.
pub(crate) fn section(world: &World, metrics: &Metrics, cards: &[Card], now: i64) -> String {
    let mut out = String::from("<h2>Top 5</h2><div class=\"tops\">");

    let mut busy: Vec<&Card> = cards
        .iter()
        .filter(|c| c.used.utilization.is_some())
        .collect();
    busy.sort_by(|a, b| {
        b.used
            .utilization
            .unwrap_or(0.0)
            .total_cmp(&a.used.utilization.unwrap_or(0.0))
            .then(
                b.used
                    .memory_mib
                    .unwrap_or(0.0)
                    .total_cmp(&a.used.memory_mib.unwrap_or(0.0)),
            )
            .then((a.node, a.id).cmp(&(b.node, b.id)))
    });
    out.push_str("<section aria-labelledby=\"top-busy\"><h3 id=\"top-busy\">Busiest cards</h3>");
    if busy.is_empty() {
        out.push_str("<p class=\"muted\">No card reports a busy percent (no monitor sample yet, or none configured).</p>");
    } else {
        let rows: Vec<Vec<String>> = busy
            .iter()
            .take(TOP)
            .map(|c| {
                let covered = coverage(metrics, c.node);
                vec![
                    card_cell(c),
                    node_link(c.node),
                    figure(
                        c.used.utilization.map(|u| (format!("{u:.0}%"), c.used.at)),
                        now,
                        covered,
                    ),
                    figure(c.used.memory_mib.map(|m| (mib(m), c.used.at)), now, covered),
                ]
            })
            .collect();
        out.push_str(&table(
            &format!("By busy percent, of {} cards reporting", busy.len()),
            &["CARD", "NODE", "BUSY", "MEMORY USED"],
            &rows,
        ));
    }
    out.push_str("</section>");

    let mut fragmented: Vec<&Card> = cards
        .iter()
        .filter(|c| c.fragmentation.is_some_and(|f| f > 0.0) && c.mem > c.mem_granted)
        .collect();
    fragmented.sort_by(|a, b| {
        b.fragmentation
            .unwrap_or(0.0)
            .total_cmp(&a.fragmentation.unwrap_or(0.0))
            .then((b.mem - b.mem_granted).total_cmp(&(a.mem - a.mem_granted)))
            .then((a.node, a.id).cmp(&(b.node, b.id)))
    });
    out.push_str(
        "<section aria-labelledby=\"top-fragmented\"><h3 id=\"top-fragmented\">Most fragmented cards</h3>",
    );
    if fragmented.is_empty() {
        out.push_str("<p class=\"muted\">None: on every card the scheduler places on, reference slices (1/8 to a whole card) can still take all the free memory.</p>");
    } else {
        let rows: Vec<Vec<String>> = fragmented
            .iter()
            .take(TOP)
            .map(|c| {
                vec![
                    card_cell(c),
                    node_link(c.node),
                    mib(c.mem - c.mem_granted),
                    c.largest.map_or_else(
                        || "none (not even 1/8)".to_owned(),
                        |s| format!("{s} of the card"),
                    ),
                    format!(
                        "{:.0}% of the free memory",
                        c.fragmentation.unwrap_or(0.0) * 100.0
                    ),
                ]
            })
            .collect();
        out.push_str(&table(
            &format!(
                "Free memory no reference slice can take, of {} fragmented cards (as hami status measures it)",
                fragmented.len()
            ),
            &["CARD", "NODE", "FREE MEMORY", "LARGEST SLICE THAT FITS", "STRANDED"],
            &rows,
        ));
    }
    out.push_str("</section>");

    let idle = idle_pods(world, metrics);
    out.push_str(
        "<section aria-labelledby=\"top-idle\"><h3 id=\"top-idle\">Allocated but idle pods</h3>",
    );
    if idle.is_empty() {
        out.push_str("<p class=\"muted\">None: every pod holding GPUs that the monitors report on is busier than 1%.</p>");
    } else {
        let rows: Vec<Vec<String>> = idle
            .iter()
            .take(TOP)
            .map(|p| {
                let covered = coverage(metrics, &p.node);
                vec![
                    pod_link(&p.pod),
                    node_link(&p.node),
                    mib(p.granted_mib),
                    figure(p.busiest.map(|b| (format!("{b:.0}%"), p.at)), now, covered),
                    figure(p.used_mib.map(|m| (mib(m), p.at)), now, covered),
                ]
            })
            .collect();
        out.push_str(&table(
            &format!(
                "Busy at most {IDLE_PERCENT:.0}% on every device held, most memory granted first: {} pods",
                idle.len()
            ),
            &["POD", "NODE", "MEMORY GRANTED", "BUSY", "MEMORY USED"],
            &rows,
        ));
    }
    out.push_str("</section></div>");
    out
}
