//! `/pods`: every GPU pod (device-plugin slices, whole cards held by pods HAMi did not
//! place, DRA shares) with what it asked (as the pod wrote it), what it was granted (the
//! allocation annotations, the whole-card record, the DRA claims), the memory it uses
//! against that and its utilization against its compute grant; pods near (>= 90 %) or over
//! their share are marked in words. Sorted on the server (`?sort=`), filtered by namespace,
//! node and state (`?ns=&node=&state=`); pending pods grouped by the scheduler's reason.
//! Pure. Asked and granted come from `hami_report::pod_report` and the DRA view, as on the
//! pod page; used from the same per-pod series as the node page's slice rows; the pending
//! reasons from `hami_report`'s pending list, as on the overview and in `hami status`.

use std::collections::BTreeMap;
use std::fmt::Write;

use hami_protocol::names::Vendor;
use hami_report::{WHOLE_CARD_MARK, pod_report, report_from_state};
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::Pod;

use crate::html::{Page, esc, frame, mib, table};
use crate::pages::{banners, cores_unit, node_link, pod_link};
use crate::query::{Paging, choose, fields, href, pager, sort_links};
use crate::samples::Metrics;
use crate::usage::{coverage, figure};
use crate::world::World;

/// At or above this percent of its grant a pod is "near" its share; above 100 "over".
pub const NEAR_PERCENT: f64 = 90.0;

/// How the table is sorted (`?sort=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sort {
    /// By namespace/name (the default).
    #[default]
    Pod,
    /// By node, then pod.
    Node,
    /// By state, then pod.
    State,
    /// Most memory granted first.
    Granted,
    /// Most memory used first.
    Used,
    /// Highest used/limit percent first.
    UsedPercent,
    /// Highest utilization against the compute grant first.
    Utilization,
}

impl Sort {
    const ALL: [(Sort, &'static str); 7] = [
        (Sort::Pod, "pod"),
        (Sort::Node, "node"),
        (Sort::State, "state"),
        (Sort::Granted, "granted"),
        (Sort::Used, "used"),
        (Sort::UsedPercent, "used-percent"),
        (Sort::Utilization, "utilization"),
    ];

    fn word(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(s, _)| *s == self)
            .map_or("pod", |(_, w)| w)
    }
}

/// Pods named per reason in the pending groups (the rest: a count and a link).
pub const PENDING_SHOWN: usize = 20;

/// The states a pod is filtered by (`?state=`): its phase, or `pending` while unbound.
pub const STATES: [&str; 5] = ["running", "pending", "succeeded", "failed", "unknown"];

/// Rows per page unless `?per=` says otherwise (4,000 pods on one page weigh 1.7 MB).
pub const PER_PAGE: usize = 100;

/// The page's query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// The order.
    pub sort: Sort,
    /// Only this namespace; empty: all.
    pub namespace: String,
    /// Only this node; empty: all.
    pub node: String,
    /// Only this state (one of [`STATES`]); empty: all.
    pub state: String,
    /// Which rows.
    pub paging: Paging,
}

impl Default for Query {
    fn default() -> Self {
        Query {
            sort: Sort::default(),
            namespace: String::new(),
            node: String::new(),
            state: String::new(),
            paging: Paging::new(PER_PAGE),
        }
    }
}

impl Query {
    /// The filter fields, as links keep them (sort and page apart).
    fn filters(&self) -> Vec<(&'static str, String)> {
        vec![
            ("ns", self.namespace.clone()),
            ("node", self.node.clone()),
            ("state", self.state.clone()),
        ]
    }
}

/// Reads `sort`, `ns`, `node`, `state`, `page` and `per`; an unknown or malformed value is
/// an error naming the field.
pub fn parse_query(raw: &str) -> Result<Query, String> {
    let mut q = Query::default();
    let words: Vec<&str> = Sort::ALL.iter().map(|(_, w)| *w).collect();
    for (key, value) in fields(raw)? {
        if q.paging.read(&key, &value)? {
            continue;
        }
        match key.as_str() {
            "sort" => q.sort = Sort::ALL[choose("sort", &value, &words)?].0,
            "ns" => q.namespace = value,
            "node" => q.node = value,
            "state" if !value.is_empty() => {
                choose("state", &value, &STATES)?;
                q.state = value;
            }
            _ => {}
        }
    }
    Ok(q)
}

/// One device a pod was granted, with what the monitors say it uses of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// The card's registered id (or the DRA device's uuid).
    pub uuid: String,
    /// As the pod page writes it (`<uuid> <type>: 4096 MiB, 26 CUs`), unescaped.
    pub text: String,
    /// MiB granted.
    pub memory_mib: f64,
    /// CUs (AMD) or percent of the SMs (NVIDIA) granted.
    pub cores: f64,
    /// AMD's utilization is time busy, not a share of the CUs: no ratio to the grant.
    pub amd: bool,
    /// Memory used, MiB (the pod's containers on this device).
    pub used_mib: Option<f64>,
    /// Percent busy.
    pub utilization: Option<f64>,
    /// When sampled (the oldest).
    pub at: Option<i64>,
}

/// One GPU pod as the page lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodRow {
    /// `namespace/name`.
    pub key: String,
    /// Its namespace.
    pub namespace: String,
    /// The node it is bound to.
    pub node: Option<String>,
    /// One of [`STATES`].
    pub state: &'static str,
    /// Its GPU asks, one line each, as the pod page describes them (unescaped).
    pub asked: Vec<String>,
    /// What it was granted, per device.
    pub grants: Vec<Grant>,
    /// Why its GPU request or annotations cannot be read.
    pub problem: Option<String>,
}

impl PodRow {
    /// MiB granted over all its devices.
    pub fn granted_mib(&self) -> f64 {
        self.grants.iter().fold(0.0, |a, g| a + g.memory_mib)
    }

    /// MiB used over the devices with a sample; `None` when none has one.
    pub fn used_mib(&self) -> Option<f64> {
        let sampled: Vec<f64> = self.grants.iter().filter_map(|g| g.used_mib).collect();
        (!sampled.is_empty()).then(|| sampled.iter().fold(0.0, |a, b| a + b))
    }

    /// Used memory as a percent of what was granted on the devices with a sample.
    pub fn used_percent(&self) -> Option<f64> {
        let (used, limit) = self.grants.iter().fold((0.0, 0.0), |(u, l), g| {
            g.used_mib.map_or((u, l), |m| (u + m, l + g.memory_mib))
        });
        (limit > 0.0 && self.used_mib().is_some()).then(|| used * 100.0 / limit)
    }

    /// The highest utilization against the compute grant over its NVIDIA devices (percent
    /// of the card over percent granted); AMD's busy time is no share of CUs.
    pub fn utilization_percent(&self) -> Option<f64> {
        self.grants
            .iter()
            .filter(|g| !g.amd && g.cores > 0.0)
            .filter_map(|g| g.utilization.map(|u| u * 100.0 / g.cores))
            .reduce(f64::max)
    }

    /// "over" (> 100 %), "near" (>= [`NEAR_PERCENT`]) or neither, with what says so.
    pub fn share(&self) -> Option<(&'static str, String)> {
        let mut said = Vec::new();
        let mut worst: f64 = 0.0;
        if let Some(p) = self.used_percent().filter(|p| *p >= NEAR_PERCENT) {
            said.push(format!("memory {p:.0}% of its limit"));
            worst = worst.max(p);
        }
        if let Some(p) = self.utilization_percent().filter(|p| *p >= NEAR_PERCENT) {
            said.push(format!("compute {p:.0}% of its grant"));
            worst = worst.max(p);
        }
        if said.is_empty() {
            return None;
        }
        let word = if worst > 100.0 { "over" } else { "near" };
        Some((word, said.join(", ")))
    }
}

fn state_of(pod: &Pod) -> &'static str {
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Succeeded") => "succeeded",
        Some("Failed") => "failed",
        Some("Running") if bound => "running",
        Some("Unknown") => "unknown",
        _ => "pending",
    }
}

/// Every GPU pod of `world`, in namespace/name order.
pub fn pod_rows(world: &World, metrics: &Metrics) -> Vec<PodRow> {
    let mut out = Vec::new();
    let usage = metrics.pod_devices();
    for (key, pod) in &world.pods {
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        let mut row = PodRow {
            key: key.clone(),
            namespace: namespace.to_owned(),
            node: node.clone(),
            state: state_of(pod),
            asked: Vec::new(),
            grants: Vec::new(),
            problem: None,
        };
        let used = |uuid: &str| {
            let u = usage
                .get(&(namespace, name, uuid))
                .copied()
                .unwrap_or_default();
            (u.memory_bytes.map(|b| b / 1048576.0), u.utilization, u.at)
        };
        match pod_report(pod) {
            Err(e) => row.problem = Some(e.0),
            Ok(r) => {
                for c in &r.containers {
                    row.asked.extend(c.asked.iter().map(|a| a.describe()));
                    for g in &c.got {
                        // Two containers on one card: one grant, as the monitors' sum is.
                        if let Some(same) = row.grants.iter_mut().find(|x| x.uuid == g.uuid) {
                            same.memory_mib += g.memory_mib as f64;
                            same.cores += f64::from(g.cores);
                            let _ = write!(
                                same.text,
                                " + {} MiB, {} {}",
                                g.memory_mib, g.cores, g.cores_unit
                            );
                            continue;
                        }
                        let (used_mib, utilization, at) = used(&g.uuid);
                        row.grants.push(Grant {
                            uuid: g.uuid.clone(),
                            text: format!(
                                "{} {}: {} MiB, {} {}",
                                g.uuid, g.device_type, g.memory_mib, g.cores, g.cores_unit
                            ),
                            memory_mib: g.memory_mib as f64,
                            cores: f64::from(g.cores),
                            amd: g.vendor == Vendor::Amd.word(),
                            used_mib,
                            utilization,
                            at,
                        });
                    }
                }
                // Whole cards a pod HAMi did not place holds: the whole card, as the
                // scheduler's state counts it.
                let gpus = node
                    .as_deref()
                    .and_then(|n| world.state.node(n))
                    .map(|s| s.devices.gpus.as_slice())
                    .unwrap_or_default();
                for held in &r.whole_cards {
                    for card in &held.cards {
                        let Some(gpu) = gpus.iter().find(|g| g.info.id == *card) else {
                            continue;
                        };
                        let (used_mib, utilization, at) = used(card);
                        let unit = cores_unit(gpu.vendor.word());
                        row.grants.push(Grant {
                            uuid: card.clone(),
                            text: format!(
                                "{card} {} {WHOLE_CARD_MARK}: {} MiB, {} {unit}",
                                gpu.info.device_type, gpu.info.devmem, gpu.info.devcore
                            ),
                            memory_mib: gpu.info.devmem as f64,
                            cores: f64::from(gpu.info.devcore),
                            amd: gpu.vendor == Vendor::Amd,
                            used_mib,
                            utilization,
                            at,
                        });
                    }
                }
            }
        }
        // DRA: what the claims reserved for it consume.
        for s in world.dra_shares_of(key) {
            let (used_mib, utilization, at) = used(&s.device.uuid);
            row.grants.push(Grant {
                uuid: s.device.uuid.clone(),
                text: format!(
                    "{} (DRA {}, claim {}): {}, {} CUs",
                    s.device.uuid,
                    s.device.name,
                    s.holder.claim,
                    mib(s.holder.memory_bytes as f64 / 1048576.0),
                    s.holder.compute_units
                ),
                memory_mib: s.holder.memory_bytes as f64 / 1048576.0,
                cores: s.holder.compute_units as f64,
                amd: true,
                used_mib,
                utilization,
                at,
            });
        }
        let claims: Vec<&str> = pod
            .spec
            .iter()
            .flat_map(|s| s.resource_claims.iter().flatten())
            .map(|c| c.name.as_str())
            .collect();
        if row.asked.is_empty() && !claims.is_empty() {
            row.asked
                .push(format!("claims {} (DRA)", claims.join(", ")));
        }
        if !row.asked.is_empty() || !row.grants.is_empty() || row.problem.is_some() {
            out.push(row);
        }
    }
    out
}

fn sort(rows: &mut [PodRow], by: Sort) {
    let desc = |a: Option<f64>, b: Option<f64>| b.unwrap_or(-1.0).total_cmp(&a.unwrap_or(-1.0));
    match by {
        Sort::Pod => rows.sort_by(|a, b| a.key.cmp(&b.key)),
        Sort::Node => rows.sort_by(|a, b| (&a.node, &a.key).cmp(&(&b.node, &b.key))),
        Sort::State => rows.sort_by(|a, b| (a.state, &a.key).cmp(&(b.state, &b.key))),
        Sort::Granted => rows.sort_by(|a, b| {
            desc(Some(a.granted_mib()), Some(b.granted_mib())).then(a.key.cmp(&b.key))
        }),
        Sort::Used => rows.sort_by(|a, b| desc(a.used_mib(), b.used_mib()).then(a.key.cmp(&b.key))),
        Sort::UsedPercent => {
            rows.sort_by(|a, b| desc(a.used_percent(), b.used_percent()).then(a.key.cmp(&b.key)))
        }
        Sort::Utilization => rows.sort_by(|a, b| {
            desc(a.utilization_percent(), b.utilization_percent()).then(a.key.cmp(&b.key))
        }),
    }
}

/// `/pods?sort=&ns=&node=&state=`: the GPU pods; a bad field is a 400 naming it.
pub fn pods(world: &World, metrics: &Metrics, raw_query: &str, now: i64) -> Page {
    let banners = banners(world, metrics);
    let (query, problem) = match parse_query(raw_query) {
        Ok(q) => (q, None),
        Err(e) => (Query::default(), Some(e)),
    };
    let mut body = String::from("<h1>Pods</h1>");
    body.push_str(&form(&query));
    if let Some(p) = &problem {
        let _ = write!(body, "<p class=\"bad\">{}</p>", esc(p));
    }
    let mut all = pod_rows(world, metrics);
    let total = all.len();
    all.retain(|r| {
        (query.namespace.is_empty() || r.namespace == query.namespace)
            && (query.node.is_empty() || r.node.as_deref() == Some(query.node.as_str()))
            && (query.state.is_empty() || r.state == query.state)
    });
    sort(&mut all, query.sort);
    let (window, _) = query.paging.window(all.len());
    let rows: Vec<Vec<String>> = all[window].iter().map(|r| cells(r, metrics, now)).collect();
    let mut kept = query.filters();
    kept.insert(0, ("sort", query.sort.word().to_owned()));
    let pages = pager("pods", "/pods", &kept, &query.paging, all.len());
    body.push_str(&pages);
    body.push_str(&table(
        &format!(
            "{} of {total} GPU pods (asked: as the pod wrote it; granted: the allocation annotations or DRA claims; used: the monitors)",
            all.len()
        ),
        &[
            "POD", "NODE", "STATE", "ASKED", "GRANTED", "MEMORY USED", "USED / LIMIT",
            "UTILIZATION", "SHARE",
        ],
        &rows,
    ));
    body.push_str(&pages);

    // Pending pods by the scheduler's reason: the overview's and `hami status`'s list (its
    // nodes are not needed here, so the state it measures is empty).
    let notes = world.scheduling_notes();
    let pending = report_from_state(&ClusterState::new(), world.pods.values(), &notes).pending;
    let mut by_reason: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for p in &pending {
        let ns = p.pod.split_once('/').map_or("", |(ns, _)| ns);
        if query.namespace.is_empty() || ns == query.namespace {
            by_reason.entry(&p.reason).or_default().push(&p.pod);
        }
    }
    body.push_str("<h2>Pending, by the scheduler's reason</h2>");
    if by_reason.is_empty() {
        body.push_str("<p class=\"muted\">None: every GPU pod has a node.</p>");
    } else {
        let rows: Vec<Vec<String>> = by_reason
            .iter()
            .map(|(reason, pods)| {
                let mut which: Vec<String> = pods
                    .iter()
                    .take(PENDING_SHOWN)
                    .map(|p| pod_link(p))
                    .collect();
                if pods.len() > PENDING_SHOWN {
                    which.push(format!(
                        "and {} more (<a href=\"{}\">every pending pod</a>)",
                        pods.len() - PENDING_SHOWN,
                        href(
                            "/pods",
                            &[("state", "pending".into()), ("ns", query.namespace.clone())]
                        )
                    ));
                }
                vec![esc(reason), pods.len().to_string(), which.join(", ")]
            })
            .collect();
        body.push_str(&table(
            "The scheduler's latest event per pod",
            &["REASON", "PODS", "WHICH"],
            &rows,
        ));
    }
    Page {
        status: if problem.is_some() { 400 } else { 200 },
        // Not live, as /cards: a refresh of <main> would wipe the form being filled in.
        html: frame("Pods", &banners, false, &body),
    }
}

fn cells(r: &PodRow, metrics: &Metrics, now: i64) -> Vec<String> {
    let covered = r
        .node
        .as_deref()
        .map_or(crate::usage::Coverage::Unconfigured, |n| {
            coverage(metrics, n)
        });
    let at = r.grants.iter().filter_map(|g| g.at).min();
    let lines = |v: Vec<String>| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.join("<br>")
        }
    };
    let util: Vec<String> = r
        .grants
        .iter()
        .filter_map(|g| {
            g.utilization.map(|u| {
                if g.amd {
                    format!("{u:.0}% busy (time busy, not a share of CUs)")
                } else if g.cores > 0.0 {
                    format!(
                        "{u:.0}% of the card, {:.0}% of its {:.0}% grant",
                        u * 100.0 / g.cores,
                        g.cores
                    )
                } else {
                    format!("{u:.0}% of the card (no compute grant)")
                }
            })
        })
        .collect();
    vec![
        pod_link(&r.key),
        r.node.as_deref().map_or_else(|| "-".into(), node_link),
        r.state.to_owned(),
        match &r.problem {
            Some(p) => format!("<span class=\"bad\">cannot be read: {}</span>", esc(p)),
            None => lines(r.asked.iter().map(|a| esc(a)).collect()),
        },
        // The figures exact in `<data value>` (MiB, percent), for scripts and tests.
        if r.grants.is_empty() {
            "-".into()
        } else {
            format!(
                "<data class=\"granted-mib\" value=\"{}\">{}</data>",
                r.granted_mib(),
                lines(r.grants.iter().map(|g| esc(&g.text)).collect())
            )
        },
        match r.used_mib() {
            Some(m) => format!(
                "<data class=\"used-mib\" value=\"{m}\">{}</data>",
                figure(Some((mib(m), at)), now, covered)
            ),
            None if r.grants.is_empty() => "-".into(),
            None => figure(None, now, covered),
        },
        r.used_percent().map_or_else(
            || "-".into(),
            |p| format!("<data class=\"used-pct\" value=\"{p}\">{p:.0}%</data>"),
        ),
        if util.is_empty() {
            "-".into()
        } else {
            util.join("<br>")
        },
        match r.share() {
            Some(("over", why)) => {
                format!("<span class=\"bad\">over its share: {}</span>", esc(&why))
            }
            Some((_, why)) => format!("<strong>near its share: {}</strong>", esc(&why)),
            None => "within".into(),
        },
    ]
}

/// The filter form and the sort links (each keeping the other fields).
fn form(q: &Query) -> String {
    let per = q.paging.per;
    let mut out = format!(
        "<form method=\"get\" action=\"/pods\" class=\"filters\"><input type=\"hidden\" name=\"sort\" value=\"{sort}\">{per}<label>Namespace <input name=\"ns\" value=\"{ns}\"></label> <label>Node <input name=\"node\" value=\"{node}\"></label> <label>State <select name=\"state\"><option value=\"\">any</option>",
        sort = q.sort.word(),
        per = if per == q.paging.default_per {
            String::new()
        } else {
            format!("<input type=\"hidden\" name=\"per\" value=\"{per}\">")
        },
        ns = esc(&q.namespace),
        node = esc(&q.node),
    );
    for s in STATES {
        let _ = write!(
            out,
            "<option{}>{s}</option>",
            if q.state == s { " selected" } else { "" }
        );
    }
    out.push_str("</select></label> <button type=\"submit\">Show</button></form>");
    let mut kept = q.filters();
    if per != q.paging.default_per {
        kept.push(("per", per.to_string()));
    }
    let words: Vec<(&str, &str)> = Sort::ALL.iter().map(|(_, w)| (*w, *w)).collect();
    out.push_str(&sort_links("/pods", &kept, &words, q.sort.word()));
    out
}
