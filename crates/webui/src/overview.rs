//! `/`, the overview: headline tiles (GPUs, allocation, usage, pending pods), GPUs by type
//! and their distribution, the last hour's trend, the Top-5 tables ([`crate::tops`]),
//! pending GPU pods and the nodes (sorted and paged on the server: `?sort=&page=&per=`).
//! Pure, like every page. Used figures are per node and card ([`crate::usage`]), so nodes
//! sharing card uuids (one capture, two modes) are not counted twice.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use hami_protocol::names::Vendor;
use hami_report::report_from_state;

use crate::charts::{Line, Quantity, Window, line_chart, offered, shown, window_nav};
use crate::grafana::{Dashboard, SCHEDULER_DASHBOARD, VGPU_DASHBOARD, longer_ranges};
use crate::html::{Page, age, esc, frame, mib, table};
use crate::pages::{banners, cores_unit, node_link, pct, pod_link};
use crate::query::{Paging, choose, fields, href, pager, sort_links};
use crate::samples::{Metrics, Series, TREND_SECONDS};
use crate::svg::{PALETTE, swatch};
use crate::usage::{CardUse, Coverage, card_use, coverage, figure, figure_on, not_sampled_on};
use crate::world::World;

/// Nodes per page unless `?per=` says otherwise.
pub const PER_PAGE: usize = 50;
/// Pending pods named on the overview (the rest: a count and a link to `/pods`).
pub const PENDING_SHOWN: usize = 10;

/// How the node table is sorted (`?sort=`): its word and its link's label.
const SORTS: [(&str, &str); 5] = [
    ("node", "node"),
    ("in-use", "GPUs in use"),
    ("granted", "memory granted"),
    ("used", "memory used"),
    ("health", "problems first"),
];

/// The overview's query: the node table's order (an index in [`SORTS`]) and page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Index in the sort words.
    pub sort: usize,
    /// Which nodes.
    pub paging: Paging,
    /// The trend charts' window (`?window=`), where asked.
    pub window: Option<Window>,
}

/// Reads `sort`, `page` and `per`; a malformed value is an error naming the field.
pub fn parse_query(raw: &str) -> Result<Query, String> {
    let mut q = Query {
        sort: 0,
        paging: Paging::new(PER_PAGE),
        window: None,
    };
    let words: Vec<&str> = SORTS.iter().map(|(w, _)| *w).collect();
    for (key, value) in fields(raw)? {
        if q.paging.read(&key, &value)? {
            continue;
        }
        if key == "sort" {
            q.sort = choose("sort", &value, &words)?;
        } else if key == "window" {
            q.window = Some(Window::parse(&value)?);
        }
    }
    Ok(q)
}

/// One GPU or hard partition, the device plugins' and the DRA devices alike, with what the
/// monitors say it uses and (for the cards the scheduler places on) how fragmented its
/// free memory is. The Top-5 tables read these.
pub(crate) struct Card<'a> {
    pub node: &'a str,
    pub device_type: &'a str,
    pub vendor: &'static str,
    pub id: &'a str,
    pub mem: f64,
    pub mem_granted: f64,
    pub cores: f64,
    pub cores_granted: f64,
    pub healthy: bool,
    pub used: CardUse,
    /// `hami_defrag_core`'s largest reference slice that fits (through `hami status`'s
    /// report); `None` for a DRA device (not measured) or where nothing fits.
    pub largest: Option<&'static str>,
    /// `1 − placeable / free` memory; `None` for a DRA device.
    pub fragmentation: Option<f64>,
}

/// One node of the node table.
struct NodeRow<'a> {
    name: &'a str,
    types: String,
    in_use: usize,
    gpus: usize,
    granted: f64,
    mem: f64,
    /// Memory used over its sampled cards, and the oldest sample.
    used: Option<(f64, Option<i64>)>,
    problem: bool,
}

/// `/?sort=&page=&per=`: the overview; a bad field is a 400 naming it (the page still
/// renders, with the node table's defaults).
pub fn overview(world: &World, metrics: &Metrics, raw_query: &str, now: i64) -> Page {
    let (query, problem) = match parse_query(raw_query) {
        Ok(q) => (q, None),
        Err(e) => (parse_query("").unwrap_or_else(|_| unreachable!()), Some(e)),
    };
    let report = report_from_state(&world.state, world.pods.values(), &world.scheduling_notes());
    let mut body = String::with_capacity(64 * 1024);
    body.push_str("<h1>Overview</h1>");
    if let Some(p) = &problem {
        let _ = write!(body, "<p class=\"bad\">{}</p>", esc(p));
    }

    // Every card once: the device plugins' GPUs, then the DRA devices (World::dra_devices
    // says why both count alike); per node, the range of its plugin cards.
    let mut cards: Vec<Card> = Vec::with_capacity(8 * report.nodes.len());
    let mut node_cards = Vec::with_capacity(report.nodes.len());
    for n in &report.nodes {
        let start = cards.len();
        for g in &n.gpus {
            cards.push(Card {
                node: &n.name,
                device_type: &g.device_type,
                vendor: g.vendor,
                id: &g.id,
                mem: g.memory_mib as f64,
                mem_granted: g.memory_used_mib as f64,
                cores: f64::from(g.cores),
                cores_granted: g.cores_used as f64,
                healthy: g.healthy,
                used: card_use(metrics, &n.name, &g.id),
                largest: g.largest_slice,
                fragmentation: Some(g.fragmentation),
            });
        }
        node_cards.push(start..cards.len());
    }
    for (n, d) in world.dra_devices() {
        // Granted on a DRA device: what the allocated claims consume; tainted = unhealthy.
        cards.push(Card {
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
            used: card_use(metrics, &n.name, &d.uuid),
            largest: None,
            fragmentation: None,
        });
    }

    body.push_str(&tiles(&cards, report.pending.len(), metrics, now));
    body.push_str(&types_section(&cards, metrics, now));

    body.push_str(&trend_section(metrics, &query, now));

    body.push_str(&crate::tops::section(world, metrics, &cards, now));

    body.push_str("<h2>Pending GPU pods</h2>");
    if report.pending.is_empty() {
        body.push_str("<p class=\"muted\">None: every GPU pod has a node.</p>");
    } else {
        let rows: Vec<Vec<String>> = report
            .pending
            .iter()
            .take(PENDING_SHOWN)
            .map(|p| vec![pod_link(&p.pod), esc(&p.reason)])
            .collect();
        body.push_str(&table(
            &format!(
                "Why they wait (the scheduler's latest event): {} of {}",
                rows.len(),
                report.pending.len()
            ),
            &["POD", "REASON"],
            &rows,
        ));
        if report.pending.len() > PENDING_SHOWN {
            let _ = write!(
                body,
                "<p><a href=\"{}\">Every pending pod, grouped by reason</a></p>",
                href("/pods", &[("state", "pending".into())])
            );
        }
    }

    body.push_str("<h2 id=\"nodes\">Nodes</h2>");
    // A DRA node registers no GPU by annotation (the DRA nodes table below lists its
    // devices), and there the scheduler's "serves AMD through DRA" note is the expected
    // state, not a problem.
    let dra_names = crate::dra::dra_node_names(world);
    let mut nodes: Vec<NodeRow> = report
        .nodes
        .iter()
        .zip(&node_cards)
        .filter(|(n, _)| !(n.gpus.is_empty() && dra_names.contains(&n.name)))
        .map(|(n, range)| {
            let dra = dra_names.contains(&n.name);
            let problems = world.state.node(&n.name).map_or(0, |s| {
                s.devices
                    .register_errors
                    .iter()
                    .filter(|(v, _)| !(dra && *v == Vendor::Amd))
                    .count()
            });
            let mine = &cards[range.clone()];
            let sampled: Vec<&CardUse> = mine
                .iter()
                .map(|c| &c.used)
                .filter(|u| u.memory_mib.is_some())
                .collect();
            let mut kinds: Vec<&str> = mine.iter().map(|c| c.device_type).collect();
            kinds.dedup();
            NodeRow {
                name: &n.name,
                types: kinds.join(", "),
                in_use: n.gpus.iter().filter(|g| g.shares_used > 0).count(),
                gpus: n.gpus.len(),
                // fold, not sum: an empty f64 sum is -0.0, shown as "-0 MiB".
                granted: mine.iter().fold(0.0, |a, c| a + c.mem_granted),
                mem: mine.iter().fold(0.0, |a, c| a + c.mem),
                used: (!sampled.is_empty()).then(|| {
                    (
                        sampled
                            .iter()
                            .fold(0.0, |a, u| a + u.memory_mib.unwrap_or(0.0)),
                        sampled.iter().filter_map(|u| u.at).min(),
                    )
                }),
                problem: problems > 0 || n.gpus.iter().any(|g| !g.healthy),
            }
        })
        .collect();
    let desc = |a: f64, b: f64| b.total_cmp(&a);
    match SORTS[query.sort].0 {
        "in-use" => nodes.sort_by(|a, b| b.in_use.cmp(&a.in_use).then(a.name.cmp(b.name))),
        "granted" => nodes.sort_by(|a, b| desc(a.granted, b.granted).then(a.name.cmp(b.name))),
        "used" => nodes.sort_by(|a, b| {
            desc(a.used.map_or(-1.0, |u| u.0), b.used.map_or(-1.0, |u| u.0))
                .then(a.name.cmp(b.name))
        }),
        "health" => nodes.sort_by(|a, b| b.problem.cmp(&a.problem).then(a.name.cmp(b.name))),
        _ => {} // by name: the report's order
    }
    let mut kept = vec![("sort", SORTS[query.sort].0.to_owned())];
    if query.paging.per != query.paging.default_per {
        kept.push(("per", query.paging.per.to_string()));
    }
    if let Some(w) = query.window {
        kept.push(("window", w.word().to_owned()));
    }
    body.push_str(&sort_links("/", &kept[1..], &SORTS, SORTS[query.sort].0));
    let pages = pager("nodes", "/", &kept, &query.paging, nodes.len());
    body.push_str(&pages);
    let (window, _) = query.paging.window(nodes.len());
    let rows: Vec<Vec<String>> = nodes[window]
        .iter()
        .map(|n| {
            vec![
                node_link(n.name),
                esc(&n.types),
                format!("{}/{}", n.in_use, n.gpus),
                format!("{} / {}", mib(n.granted), mib(n.mem)),
                figure(
                    n.used.map(|(m, at)| (mib(m), at)),
                    now,
                    coverage(metrics, n.name),
                ),
                if n.problem {
                    "<span class=\"bad\">problem</span>".into()
                } else {
                    "ok".into()
                },
            ]
        })
        .collect();
    body.push_str(&table(
        &format!("{} nodes with GPUs", nodes.len()),
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
    body.push_str(&pages);
    body.push_str(&crate::dra::overview_section(world));
    Page {
        status: if problem.is_some() { 400 } else { 200 },
        html: frame("Overview", &banners(world, metrics), true, &body),
    }
}

/// The cluster trend: memory granted and used (MiB to TiB), allocation and usage as a
/// percent of the GPU memory there was at each moment, mean utilization; the window choice
/// (as far back as the trend reaches, up to [`TREND_SECONDS`]); Grafana for longer.
fn trend_section(metrics: &Metrics, query: &Query, now: i64) -> String {
    let reach = metrics.trend_granted.reach(now);
    let windows = offered(reach, TREND_SECONDS);
    let window = shown(query.window, &windows);
    let mut out = format!("<h2 id=\"trend\">Trend: last {}</h2>", window.label());
    out.push_str(&window_nav("the trend charts", &windows, window, |w| {
        let mut fields = vec![("window", w.word().to_owned())];
        if query.sort != 0 {
            fields.push(("sort", SORTS[query.sort].0.to_owned()));
        }
        if query.paging.per != query.paging.default_per {
            fields.push(("per", query.paging.per.to_string()));
        }
        format!("{}#trend", href("/", &fields))
    }));
    out.push_str("<div class=\"cards\">");
    out.push_str(&line_chart(
        "GPU memory, whole cluster",
        Quantity::Mib,
        &[
            Line {
                label: "granted",
                series: &metrics.trend_granted,
                colour: PALETTE[0],
            },
            Line {
                label: "used",
                series: &metrics.trend_used,
                colour: PALETTE[1],
            },
        ],
        &[],
        window,
        now,
        0.0,
    ));
    let allocated = percent_of(&metrics.trend_granted, &metrics.trend_capacity);
    let used = percent_of(&metrics.trend_used, &metrics.trend_capacity);
    out.push_str(&line_chart(
        "Allocation vs usage, % of GPU memory",
        Quantity::Percent,
        &[
            Line {
                label: "allocated",
                series: &allocated,
                colour: PALETTE[0],
            },
            Line {
                label: "used",
                series: &used,
                colour: PALETTE[1],
            },
        ],
        &[],
        window,
        now,
        100.0,
    ));
    out.push_str(&line_chart(
        "Mean utilization of GPU containers",
        Quantity::Percent,
        &[Line {
            label: "utilization",
            series: &metrics.trend_utilization,
            colour: PALETTE[2],
        }],
        &[],
        window,
        now,
        100.0,
    ));
    out.push_str("</div>");
    out.push_str(&longer_ranges(
        metrics.grafana.as_deref(),
        &[
            Dashboard {
                label: "allocation and scheduling (hami-rs scheduler)",
                uid: SCHEDULER_DASHBOARD,
                vars: Vec::new(),
            },
            Dashboard {
                label: "GPU use per pod (hami-rs vGPU)",
                uid: VGPU_DASHBOARD,
                vars: Vec::new(),
            },
        ],
    ));
    out
}

/// `part` as a percent of `whole` at the same moments (a moment `whole` lacks or where it
/// is 0 has no point).
fn percent_of(part: &Series, whole: &Series) -> Series {
    let mut out = Series::default();
    let mut w = whole.0.iter().peekable();
    for (t, v) in &part.0 {
        while w.next_if(|(tw, _)| tw < t).is_some() {}
        if let Some((tw, total)) = w.peek()
            && tw == t
            && *total > 0.0
        {
            out.0.push_back((*t, v * 100.0 / total));
        }
    }
    out
}

/// The headline tiles: GPUs, allocation, usage and pending pods.
fn tiles(cards: &[Card], pending: usize, metrics: &Metrics, now: i64) -> String {
    let sum = |f: fn(&Card) -> f64| cards.iter().fold(0.0, |a, c| a + f(c));
    let nodes: BTreeSet<&str> = cards.iter().map(|c| c.node).collect();
    let unhealthy = cards.iter().filter(|c| !c.healthy).count();
    // Compute is in CUs on AMD and percent on NVIDIA: the mean of each card's share.
    let compute_share = |f: fn(&Card) -> Option<f64>| {
        let shares: Vec<f64> = cards.iter().filter_map(f).collect();
        (!shares.is_empty()).then(|| shares.iter().fold(0.0, |a, b| a + b) / shares.len() as f64)
    };
    let compute_granted =
        compute_share(|c| (c.cores > 0.0).then(|| c.cores_granted * 100.0 / c.cores));
    let sampled: Vec<&Card> = cards
        .iter()
        .filter(|c| c.used.memory_mib.is_some())
        .collect();
    let busy = compute_share(|c| c.used.utilization);
    let oldest = cards.iter().filter_map(|c| c.used.at).min();
    let best = nodes
        .iter()
        .map(|n| coverage(metrics, n))
        .max()
        .unwrap_or(Coverage::Unconfigured);
    let used = if sampled.is_empty() {
        format!(
            "<p class=\"big\">-</p><p class=\"muted\">{}</p>",
            not_sampled_on(best, nodes.len())
        )
    } else {
        let used = sampled
            .iter()
            .fold(0.0, |a, c| a + c.used.memory_mib.unwrap_or(0.0));
        let of = sampled.iter().fold(0.0, |a, c| a + c.mem);
        format!(
            "<p class=\"big\" data-used-mib=\"{used}\" data-of-mib=\"{of}\">{}</p><p>of the memory of the {} cards reporting; {}</p><p>{}</p>",
            pct(used, of),
            sampled.len(),
            busy.map_or_else(
                || "busy: not reported".into(),
                |b| format!("{b:.0}% busy (mean)")
            ),
            oldest.map(|at| age(at, now)).unwrap_or_default()
        )
    };
    let mut out = String::from("<div class=\"tiles\">");
    let _ = write!(
        out,
        "<section class=\"tile\" aria-labelledby=\"tile-gpus\"><h2 id=\"tile-gpus\">GPUs</h2><p class=\"big\" data-gpus=\"{gpus}\">{gpus}</p><p>on {} nodes{}</p></section>",
        nodes.len(),
        if unhealthy > 0 {
            format!(", <span class=\"bad\">{unhealthy} unhealthy</span>")
        } else {
            ", all healthy".into()
        },
        gpus = cards.len(),
    );
    let _ = write!(
        out,
        "<section class=\"tile\" aria-labelledby=\"tile-alloc\"><h2 id=\"tile-alloc\">Allocated</h2><p class=\"big\" data-granted-mib=\"{}\" data-of-mib=\"{}\">{}</p><p>of the memory ({} of {}); compute {}</p></section>",
        sum(|c| c.mem_granted),
        sum(|c| c.mem),
        pct(sum(|c| c.mem_granted), sum(|c| c.mem)),
        mib(sum(|c| c.mem_granted)),
        mib(sum(|c| c.mem)),
        compute_granted.map_or_else(|| "-".into(), |c| format!("{c:.0}% (mean of the cards)")),
    );
    let _ = write!(
        out,
        "<section class=\"tile\" aria-labelledby=\"tile-used\"><h2 id=\"tile-used\">Used</h2>{used}</section>"
    );
    let _ = write!(
        out,
        "<section class=\"tile\" aria-labelledby=\"tile-pending\"><h2 id=\"tile-pending\">Pending GPU pods</h2><p class=\"big\" data-pending=\"{pending}\">{pending}</p><p>{}</p></section>",
        if pending == 0 {
            "every GPU pod has a node".to_owned()
        } else {
            format!(
                "<a href=\"{}\">why they wait</a>",
                href("/pods", &[("state", "pending".into())])
            )
        }
    );
    out.push_str("</div>");
    out
}

/// GPUs by type: the distribution (a bar and its legend) and a row per type with what is
/// granted and used.
fn types_section(cards: &[Card], metrics: &Metrics, now: i64) -> String {
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
    for g in cards {
        let row = types.entry(g.device_type).or_default();
        row.vendor = g.vendor;
        row.gpus += 1;
        if row.nodes.insert(g.node) {
            let covered = coverage(metrics, g.node);
            row.coverage = Some(row.coverage.map_or(covered, |c| c.max(covered)));
        }
        row.mem += g.mem;
        row.mem_granted += g.mem_granted;
        if let Some(u) = g.used.memory_mib {
            row.mem_used += u;
            row.sampled += 1;
        }
        if let Some(at) = g.used.at {
            row.at = Some(row.at.map_or(at, |a: i64| a.min(at)));
        }
        row.cores += g.cores;
        row.cores_granted += g.cores_granted;
        if let Some(b) = g.used.utilization {
            row.busy.push(b);
        }
        row.unhealthy += usize::from(!g.healthy);
    }
    let mut out = String::from("<h2>GPUs by type</h2>");
    if types.is_empty() {
        out.push_str("<p class=\"muted\">No node registers GPUs (no hami.io/node-*-register annotation, no DRA device published).</p>");
        return out;
    }
    // The distribution: one bar, a segment per type, and a legend that says it in words.
    let total = cards.len() as f64;
    let words: Vec<String> = types
        .iter()
        .map(|(t, r)| format!("{t}: {} ({})", r.gpus, pct(r.gpus as f64, total)))
        .collect();
    let _ = write!(
        out,
        "<figure class=\"distribution\"><figcaption>Type distribution</figcaption><svg viewBox=\"0 0 1000 20\" preserveAspectRatio=\"none\" width=\"100%\" height=\"20\" role=\"img\" aria-label=\"{t}\"><title>{t}</title>",
        t = esc(&words.join("; "))
    );
    let mut x = 0.0;
    for (i, r) in types.values().enumerate() {
        let w = r.gpus as f64 * 1000.0 / total;
        let _ = write!(
            out,
            "<rect x=\"{x:.1}\" width=\"{w:.1}\" height=\"20\" fill=\"{}\"/>",
            PALETTE[i % PALETTE.len()]
        );
        x += w;
    }
    out.push_str("</svg><ul class=\"legend\">");
    for (i, w) in words.iter().enumerate() {
        let _ = write!(
            out,
            "<li>{}{}</li>",
            swatch(PALETTE[i % PALETTE.len()]),
            esc(w)
        );
    }
    out.push_str("</ul></figure>");
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
    out.push_str(&table(
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
    out
}
