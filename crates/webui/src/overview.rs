//! `/`, the overview: GPUs by type (the device plugins' GPUs and the DRA devices alike),
//! the last hour's trend, pending GPU pods and the nodes. Pure, like every page. Used
//! figures are per node and card ([`crate::usage`]), so nodes sharing card uuids (one
//! capture, two modes) are not counted twice.

use std::collections::{BTreeMap, BTreeSet};

use hami_protocol::names::Vendor;
use hami_report::report_from_state;

use crate::html::{Page, esc, frame, mib, table};
use crate::pages::{banners, cores_unit, node_link, pct, pod_link};
use crate::samples::Metrics;
use crate::svg::{PALETTE, line_chart};
use crate::usage::{Coverage, card_use, coverage, figure, figure_on};
use crate::world::World;

/// `/`: GPUs by type (the device plugins' and the DRA devices), the last hour's trend,
/// pending GPU pods and the nodes.
pub fn overview(world: &World, metrics: &Metrics, now: i64) -> Page {
    let report = report_from_state(&world.state, world.pods.values(), &world.scheduling_notes());
    let mut body = String::with_capacity(256 * report.nodes.len() + 8192);
    body.push_str("<h1>Overview</h1>");

    // GPUs by type: the device plugins' GPUs and the DRA devices, each a GPU or a hard
    // partition counted once (World::dra_devices says why both count alike).
    struct Counted<'a> {
        node: &'a str,
        device_type: &'a str,
        vendor: &'static str,
        id: &'a str,
        mem: f64,
        mem_granted: f64,
        cores: f64,
        cores_granted: f64,
        healthy: bool,
    }
    let plugin = report.nodes.iter().flat_map(|n| {
        n.gpus.iter().map(move |g| Counted {
            node: &n.name,
            device_type: &g.device_type,
            vendor: g.vendor,
            id: &g.id,
            mem: g.memory_mib as f64,
            mem_granted: g.memory_used_mib as f64,
            cores: f64::from(g.cores),
            cores_granted: g.cores_used as f64,
            healthy: g.healthy,
        })
    });
    // Granted on a DRA device: what the allocated claims consume; tainted = unhealthy.
    let dra = world.dra_devices().map(|(n, d)| Counted {
        node: &n.name,
        device_type: if d.product.is_empty() {
            "(no productName)"
        } else {
            &d.product
        },
        vendor: Vendor::Amd.word(),
        id: &d.uuid,
        mem: d.memory_bytes as f64 / 1048576.0,
        mem_granted: d.memory_used_bytes as f64 / 1048576.0,
        cores: d.compute_units as f64,
        cores_granted: d.compute_units_used as f64,
        healthy: !d.tainted,
    });
    #[derive(Default)]
    struct TypeRow<'a> {
        vendor: &'static str,
        gpus: usize,
        /// Nodes with GPUs of this type.
        nodes: BTreeSet<&'a str>,
        mem: f64,
        mem_granted: f64,
        mem_used: f64,
        cores: f64,
        cores_granted: f64,
        unhealthy: usize,
        /// GPUs with a memory sample from a monitor.
        sampled: usize,
        /// Busy percent of the cards that report one (host series or their pods').
        busy: Vec<f64>,
        /// The oldest sample counted.
        at: Option<i64>,
        /// The best monitor coverage among its nodes (what an empty figure says).
        coverage: Option<Coverage>,
    }
    let mut types: BTreeMap<&str, TypeRow> = BTreeMap::new();
    for g in plugin.chain(dra) {
        let row = types.entry(g.device_type).or_default();
        row.vendor = g.vendor;
        row.gpus += 1;
        row.nodes.insert(g.node);
        row.mem += g.mem;
        row.mem_granted += g.mem_granted;
        let sampled = card_use(metrics, g.node, g.id);
        if let Some(u) = sampled.memory_mib {
            row.mem_used += u;
            row.sampled += 1;
        }
        if let Some(at) = sampled.at {
            row.at = Some(row.at.map_or(at, |a: i64| a.min(at)));
        }
        let covered = coverage(metrics, g.node);
        row.coverage = Some(row.coverage.map_or(covered, |c| c.max(covered)));
        row.cores += g.cores;
        row.cores_granted += g.cores_granted;
        if let Some(b) = sampled.utilization {
            row.busy.push(b);
        }
        row.unhealthy += usize::from(!g.healthy);
    }
    let rows: Vec<Vec<String>> = types
        .iter()
        .map(|(t, r)| {
            let unit = cores_unit(r.vendor);
            vec![
                esc(t),
                r.vendor.to_owned(),
                r.gpus.to_string(),
                r.nodes.len().to_string(),
                format!(
                    "{} / {} ({})",
                    mib(r.mem_granted),
                    mib(r.mem),
                    pct(r.mem_granted, r.mem)
                ),
                figure_on(
                    (r.sampled > 0).then(|| {
                        (
                            format!("{} ({})", mib(r.mem_used), pct(r.mem_used, r.mem)),
                            r.at,
                        )
                    }),
                    now,
                    r.coverage.unwrap_or(Coverage::Unconfigured),
                    r.nodes.len(),
                ),
                format!(
                    "{:.0} / {:.0} {unit} ({})",
                    r.cores_granted,
                    r.cores,
                    pct(r.cores_granted, r.cores)
                ),
                figure_on(
                    (!r.busy.is_empty()).then(|| {
                        (
                            format!(
                                "{:.0}% busy (mean of {} cards)",
                                r.busy.iter().fold(0.0, |a, b| a + b) / r.busy.len() as f64,
                                r.busy.len()
                            ),
                            r.at,
                        )
                    }),
                    now,
                    r.coverage.unwrap_or(Coverage::Unconfigured),
                    r.nodes.len(),
                ),
                if r.unhealthy > 0 {
                    format!("<span class=\"bad\">{} unhealthy</span>", r.unhealthy)
                } else {
                    "ok".into()
                },
            ]
        })
        .collect();
    body.push_str("<h2>GPUs by type</h2>");
    if rows.is_empty() {
        body.push_str("<p class=\"muted\">No node registers GPUs (no hami.io/node-*-register annotation, no DRA device published).</p>");
    } else {
        body.push_str(&table(
            "Allocated (granted by the scheduler, or claimed through DRA) and used (reported by the monitors)",
            &[
                "TYPE",
                "VENDOR",
                "GPUS",
                "NODES",
                "MEMORY GRANTED",
                "MEMORY USED",
                "COMPUTE GRANTED",
                "COMPUTE USED",
                "HEALTH",
            ],
            &rows,
        ));
    }

    body.push_str("<h2>Last hour</h2><div class=\"cards\">");
    body.push_str(&line_chart(
        "GPU memory, whole cluster (MiB)",
        " MiB",
        &[
            ("granted", &metrics.trend_granted, PALETTE[0]),
            ("used", &metrics.trend_used, PALETTE[1]),
        ],
        now,
        0.0,
    ));
    body.push_str(&line_chart(
        "Mean utilization of GPU containers (%)",
        "%",
        &[("utilization", &metrics.trend_utilization, PALETTE[2])],
        now,
        100.0,
    ));
    body.push_str("</div>");

    body.push_str("<h2>Pending GPU pods</h2>");
    if report.pending.is_empty() {
        body.push_str("<p class=\"muted\">None: every GPU pod has a node.</p>");
    } else {
        let rows: Vec<Vec<String>> = report
            .pending
            .iter()
            .map(|p| vec![pod_link(&p.pod), esc(&p.reason)])
            .collect();
        body.push_str(&table(
            "Why they wait (the scheduler's latest event)",
            &["POD", "REASON"],
            &rows,
        ));
    }

    body.push_str("<h2>Nodes</h2>");
    // A DRA node registers no GPU by annotation (the DRA nodes table below lists its
    // devices), and there the scheduler's "serves AMD through DRA" note is the expected
    // state, not a problem.
    let dra_names = crate::dra::dra_node_names(world);
    let listed: Vec<_> = report
        .nodes
        .iter()
        .filter(|n| !(n.gpus.is_empty() && dra_names.contains(&n.name)))
        .collect();
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|n| {
            let dra = dra_names.contains(&n.name);
            let problems = world.state.node(&n.name).map_or(0, |s| {
                s.devices
                    .register_errors
                    .iter()
                    .filter(|(v, _)| !(dra && *v == Vendor::Amd))
                    .count()
            });
            // fold, not sum: an empty f64 sum is -0.0, shown as "-0 MiB".
            let mem = n.gpus.iter().fold(0.0, |a, g| a + g.memory_mib as f64);
            let granted = n.gpus.iter().fold(0.0, |a, g| a + g.memory_used_mib as f64);
            let node_used: Vec<_> = n
                .gpus
                .iter()
                .map(|g| card_use(metrics, &n.name, &g.id))
                .filter(|u| u.memory_mib.is_some())
                .collect();
            let busy = n.gpus.iter().filter(|g| g.shares_used > 0).count();
            let mut kinds: Vec<&str> = n.gpus.iter().map(|g| g.device_type.as_str()).collect();
            kinds.dedup();
            vec![
                node_link(&n.name),
                esc(&kinds.join(", ")),
                format!("{busy}/{}", n.gpus.len()),
                format!("{} / {}", mib(granted), mib(mem)),
                figure(
                    (!node_used.is_empty()).then(|| {
                        (
                            mib(node_used
                                .iter()
                                .fold(0.0, |a, u| a + u.memory_mib.unwrap_or(0.0))),
                            node_used.iter().filter_map(|u| u.at).min(),
                        )
                    }),
                    now,
                    coverage(metrics, &n.name),
                ),
                if problems == 0 && n.gpus.iter().all(|g| g.healthy) {
                    "ok".into()
                } else {
                    "<span class=\"bad\">problem</span>".into()
                },
            ]
        })
        .collect();
    body.push_str(&table(
        &format!("{} nodes with GPUs", listed.len()),
        &[
            "NODE",
            "TYPES",
            "GPUS IN USE",
            "MEMORY GRANTED",
            "USED",
            "HEALTH",
        ],
        &rows,
    ));
    body.push_str(&crate::dra::overview_section(world));
    Page {
        status: 200,
        html: frame("Overview", &banners(world, metrics), true, &body),
    }
}
