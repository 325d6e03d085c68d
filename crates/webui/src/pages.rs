//! The pages, as pure functions of what the watchers and scrapers gathered (no I/O): the
//! overview, a node (cards, slices, CU maps), a pod (asked vs got, live charts), and the
//! What-if planner (their DRA parts: [`crate::dra`]; the overview: [`crate::overview`]). Each returns a [`Page`]; unknown objects give a 404 page.

use std::collections::BTreeMap;
use std::fmt::Write;

use hami_protocol::cu_allocated::CuAllocation;
use hami_protocol::cu_list::CuSet;
use hami_protocol::names::{Vendor, pod as pod_keys};
use hami_protocol::node_register::DeviceInfo;
use hami_report::{WHOLE_CARD_MARK, node_report, pod_report};
use hami_scheduler_core::snapshot::{Gpu, GpuUsage};

use crate::html::{Page, clock, esc, frame, mib, not_found, table, url_segment};
use crate::physical::{Group, Physical, group};
use crate::samples::{Metrics, Series};
use crate::svg::{CuOwner, cu_map, meter};
use crate::usage::{Coverage, card_use, coverage, figure, not_sampled, sampled_note};
use crate::world::{EventRow, World};

pub use crate::overview::overview;

pub(crate) fn banners(world: &World, metrics: &Metrics) -> Vec<String> {
    let mut out = world.banners();
    out.extend(metrics.banners());
    if metrics.endpoints.is_empty() {
        out.push("No monitor is configured (--monitor URL or --prometheus URL): memory used and utilization are not shown.".into());
    }
    out
}

/// A link to a node's page.
pub(crate) fn node_link(name: &str) -> String {
    format!("<a href=\"/nodes/{}\">{}</a>", url_segment(name), esc(name))
}

/// A link to the page of the pod `namespace/name`.
pub(crate) fn pod_link(namespaced: &str) -> String {
    let (ns, name) = namespaced
        .split_once('/')
        .unwrap_or(("default", namespaced));
    format!(
        "<a href=\"/pods/{}/{}\">{}</a>",
        url_segment(ns),
        url_segment(name),
        esc(namespaced)
    )
}

/// `part` as a whole percent of `whole`; `-` when there is no whole.
pub(crate) fn pct(part: f64, whole: f64) -> String {
    if whole <= 0.0 {
        "-".into()
    } else {
        format!("{:.0}%", part * 100.0 / whole)
    }
}

pub(crate) fn cores_unit(vendor: &str) -> &'static str {
    if vendor == Vendor::Amd.word() {
        "CUs"
    } else {
        "%"
    }
}

fn events_table(events: &[&EventRow]) -> String {
    if events.is_empty() {
        return "<p class=\"muted\">No events.</p>".into();
    }
    let rows: Vec<Vec<String>> = events
        .iter()
        .rev()
        .take(50)
        .map(|e| {
            vec![
                clock(e.at),
                if e.warning {
                    "<span class=\"bad\">Warning</span>".into()
                } else {
                    "Normal".into()
                },
                esc(&e.reason),
                esc(&e.note),
            ]
        })
        .collect();
    table(
        "Events (newest first, UTC)",
        &["TIME", "TYPE", "REASON", "MESSAGE"],
        &rows,
    )
}

/// Pods on a node with what each holds per device, and their CU sets (AMD).
struct Slice<'a> {
    pod: String,
    uuid: &'a str,
    mem_mib: u64,
    cores: u64,
    cus: Option<CuSet>,
    /// Held whole by a pod HAMi did not place (`hami.io/<vendor>-whole-cards`).
    whole: bool,
}

fn node_pods<'a>(world: &'a World, node: &str) -> (Vec<Slice<'a>>, Vec<String>) {
    let mut slices = Vec::new();
    let mut problems = Vec::new();
    for (_, h) in world.state.holdings() {
        if h.node != node {
            continue;
        }
        let key = format!("{}/{}", h.namespace, h.name);
        let cus = world
            .pods
            .get(&key)
            .and_then(|p| p.metadata.annotations.as_ref())
            .and_then(|a| a.get(pod_keys::AMD_CU_ALLOCATED))
            .map(|text| CuAllocation::parse(text));
        let cus = match cus {
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => {
                problems.push(format!("{key}: {}: {e}", pod_keys::AMD_CU_ALLOCATED));
                None
            }
            None => None,
        };
        for c in &h.charges {
            slices.push(Slice {
                pod: key.clone(),
                uuid: c.uuid.as_str(),
                mem_mib: c.mem_mib,
                cores: c.cores,
                cus: cus.as_ref().and_then(|a| a.0.get(&c.uuid).cloned()),
                whole: false,
            });
        }
    }
    // Pods HAMi did not place that hold cards whole (issue 26 item 1): the whole card each.
    let gpus = world.state.node(node).map(|s| s.devices.gpus.as_slice());
    for (_, w) in world.state.whole_card_holdings() {
        if w.node != node {
            continue;
        }
        for card in &w.cards {
            let Some(gpu) = gpus.and_then(|g| g.iter().find(|g| g.info.id == *card)) else {
                continue;
            };
            slices.push(Slice {
                pod: format!("{}/{}", w.namespace, w.name),
                uuid: card.as_str(),
                mem_mib: gpu.info.devmem,
                cores: u64::from(gpu.info.devcore),
                cus: None,
                whole: true,
            });
        }
    }
    slices.sort_by(|a, b| a.pod.cmp(&b.pod));
    (slices, problems)
}

/// `/nodes/<name>`: the node's GPUs, CU maps and the pods on them.
pub fn node(world: &World, metrics: &Metrics, name: &str, now: i64) -> Page {
    let banners = banners(world, metrics);
    let Some(object) = world.nodes.get(name) else {
        return not_found(&format!("Node {name}"), &banners);
    };
    let mut body = format!("<h1>Node {}</h1>", esc(name));
    let report = match node_report(object) {
        Ok(r) => Some(r),
        Err(e) => {
            let _ = write!(
                body,
                "<p class=\"bad\">The node's GPU registration cannot be read: {}</p>",
                esc(&e.0)
            );
            None
        }
    };
    if let Some(r) = &report {
        if let Some(mode) = &r.amd_operating_mode {
            let _ = write!(
                body,
                "<p>AMD operating mode (node override): {}</p>",
                esc(mode)
            );
        }
        if let Some(p) = &r.amd_compute_partition {
            let _ = write!(
                body,
                "<p>AMD compute partition (node override): {}</p>",
                esc(p)
            );
        }
        if let Some(lock) = &r.lock {
            let _ = write!(
                body,
                "<p>Node lock: {}</p>",
                esc(&lock
                    .problem
                    .clone()
                    .map(|p| format!("unreadable ({p})"))
                    .unwrap_or_else(|| format!(
                        "held by {} since {}",
                        lock.owner
                            .clone()
                            .unwrap_or_else(|| "a legacy writer".into()),
                        lock.taken_at.clone().unwrap_or_default()
                    )))
            );
        }
    }
    let snapshot = world.state.node(name);
    let dra = crate::dra::node_section(world, metrics, name, now);
    let covered = coverage(metrics, name);
    // On a DRA node the scheduler's "serves AMD through DRA" is the expected state.
    let class = if dra.is_some() { "muted" } else { "bad" };
    for (vendor, e) in snapshot
        .map(|s| s.devices.register_errors.as_slice())
        .unwrap_or(&[])
    {
        let _ = write!(
            body,
            "<p class=\"{class}\">{} registration: {}</p>",
            vendor.word(),
            esc(e)
        );
    }
    let (slices, problems) = node_pods(world, name);
    for p in &problems {
        let _ = write!(body, "<p class=\"bad\">{}</p>", esc(p));
    }
    let cards = snapshot.map(|s| s.devices.gpus.len()).unwrap_or(0);
    // A DRA node registers nothing by annotation: its devices are the DRA section.
    if cards > 0 || dra.is_none() {
        let _ = write!(body, "<h2>Cards and partitions ({cards})</h2>");
    }
    if cards == 0 && dra.is_none() {
        body.push_str("<p class=\"muted\">This node registers no GPU.</p>");
    }
    if cards > 0 || dra.is_none() {
        body.push_str("<div class=\"cards\">");
    }
    if let Some(snapshot) = snapshot {
        let gpus: Vec<&DeviceInfo> = snapshot.devices.gpus.iter().map(|g| &g.info).collect();
        let card = |body: &mut String, i: usize| {
            if let (Some(gpu), Some(usage)) = (snapshot.devices.gpus.get(i), snapshot.usage.get(i))
            {
                card_section(body, gpu, usage, &slices, metrics, name, covered, now);
            }
        };
        for g in group(&gpus) {
            match g {
                Group::Whole(i) => card(&mut body, i),
                Group::Card(c) => {
                    body.push_str(&physical_open(&c));
                    for (_, i) in &c.partitions {
                        card(&mut body, *i);
                    }
                    body.push_str("</div></section>");
                }
            }
        }
    }
    if cards > 0 || dra.is_none() {
        body.push_str("</div>");
    }
    body.push_str(dra.as_deref().unwrap_or_default());
    body.push_str("<h2>Events</h2>");
    let events: Vec<&EventRow> = world.events_of("Node", "", name).collect();
    let events = if events.is_empty() {
        world
            .events
            .iter()
            .filter(|e| e.kind == "Node" && e.name == name)
            .collect()
    } else {
        events
    };
    body.push_str(&events_table(&events));
    Page {
        status: 200,
        html: frame(&format!("Node {name}"), &banners, true, &body),
    }
}

/// One registered GPU or partition of a node: health, shares, meters, its CU map (AMD) and
/// the slices on it.
#[allow(clippy::too_many_arguments)]
fn card_section(
    body: &mut String,
    gpu: &Gpu,
    usage: &GpuUsage,
    slices: &[Slice<'_>],
    metrics: &Metrics,
    name: &str,
    covered: Coverage,
    now: i64,
) {
    let info = &gpu.info;
    let amd = gpu.vendor == Vendor::Amd;
    let unit = cores_unit(gpu.vendor.word());
    let mine: Vec<&Slice> = slices.iter().filter(|s| s.uuid == info.id).collect();
    let sampled = card_use(metrics, name, &info.id);
    let _ = write!(
        body,
        "<section class=\"card\" data-card=\"{id}\" aria-labelledby=\"card-{idx}\"><h3 id=\"card-{idx}\">{vendor} #{index} {ty} <span class=\"muted\">{id}</span></h3><p>{health} · mode {mode} · {shares}/{count} shares · NUMA {numa}</p>",
        id = esc(&info.id),
        idx = url_segment(&info.id),
        vendor = gpu.vendor.word(),
        index = info.index,
        ty = esc(&info.device_type),
        health = if info.health {
            "healthy".to_owned()
        } else {
            "<span class=\"bad\">UNHEALTHY</span>".to_owned()
        },
        mode = esc(if info.mode.as_str().is_empty() {
            "-"
        } else {
            info.mode.as_str()
        }),
        shares = usage.used,
        count = info.count,
        numa = info.numa,
    );
    let _ = write!(
        body,
        "<p>{}<br>{}<br>{}</p>",
        meter(
            "Memory (MiB)",
            usage.mem_mib as f64,
            sampled.memory_mib,
            info.devmem as f64,
            "MiB"
        ),
        meter(
            &format!("Compute ({unit})"),
            usage.cores as f64,
            // AMD's utilization is time busy, not a share of the CUs.
            sampled.utilization.filter(|_| !amd),
            f64::from(info.devcore),
            unit
        ),
        sampled_note(sampled.at, now, covered),
    );
    if amd {
        let owners: Vec<CuOwner> = mine
            .iter()
            .filter_map(|s| s.cus.as_ref().map(|cus| CuOwner { pod: &s.pod, cus }))
            .collect();
        body.push_str(&cu_map(
            info.devcore,
            &owners,
            info.custom_info.cu_per_wgp,
            &format!("CU map of {}: {} CUs", info.id, info.devcore),
        ));
    }
    if mine.is_empty() {
        body.push_str("<p class=\"muted\">No slices.</p>");
    } else {
        let rows: Vec<Vec<String>> = mine
            .iter()
            .map(|s| {
                let (ns, p) = s.pod.split_once('/').unwrap_or(("", &s.pod));
                let u = metrics.pod_device(ns, p, &info.id);
                let at = u.at;
                vec![
                    if s.whole {
                        format!("{} {}", pod_link(&s.pod), esc(WHOLE_CARD_MARK))
                    } else {
                        pod_link(&s.pod)
                    },
                    format!("{} MiB", s.mem_mib),
                    figure(
                        u.memory_bytes.map(|b| (mib(b / 1048576.0), at)),
                        now,
                        covered,
                    ),
                    figure(
                        u.utilization.map(|v| (format!("{v:.0}%"), at)),
                        now,
                        covered,
                    ),
                    format!("{} {unit}", s.cores),
                    s.cus
                        .as_ref()
                        .map(|c| esc(&c.to_string()))
                        .unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        body.push_str(&table(
            "Slices",
            &[
                "POD",
                "MEMORY GRANTED",
                "USED",
                "UTILIZATION",
                "COMPUTE",
                "CUS",
            ],
            &rows,
        ));
    }
    body.push_str("</section>");
}

/// The opening of a physical card's group: its PCI address, mode, partitions present of
/// those the mode gives it, and a marker for each missing one (closed by the caller).
fn physical_open(c: &Physical) -> String {
    let missing = if c.missing.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = c.missing.iter().map(u8::to_string).collect();
        format!(
            " · <span class=\"bad\">missing: partition {}</span>",
            list.join(", ")
        )
    };
    let mut out = format!(
        "<section class=\"physical\" data-pci=\"{bdf}\" data-partitions=\"{n}\" data-expected=\"{e}\" data-missing=\"{m}\" aria-labelledby=\"pci-{id}\"><h3 id=\"pci-{id}\">Card {bdf}: {mode}, {n} of {e} partitions{missing}</h3><div class=\"cards\">",
        bdf = esc(&c.pci_bdf),
        id = url_segment(&c.pci_bdf),
        mode = esc(&c.mode),
        n = c.partitions.len(),
        e = c.expected,
        m = c.missing.len(),
    );
    for i in &c.missing {
        let _ = write!(
            out,
            "<div class=\"card missing\" data-missing-partition=\"{i}\"><p><strong>Partition {i}</strong>: not registered. The card's mode gives it {e} partitions; this one did not register (see the node's events and the device plugin's log).</p></div>",
            e = c.expected
        );
    }
    out
}

/// `/pods/<namespace>/<name>`: what the pod asked for, got and uses.
pub fn pod(world: &World, metrics: &Metrics, namespace: &str, name: &str, now: i64) -> Page {
    pod_in(world, metrics, namespace, name, "", now)
}

/// [`pod`] with its query (`?window=15m|1h`, the charts' window); a bad field is a 400
/// naming it (the page still renders, with the default window).
pub fn pod_in(
    world: &World,
    metrics: &Metrics,
    namespace: &str,
    name: &str,
    raw_query: &str,
    now: i64,
) -> Page {
    let banners = banners(world, metrics);
    let (window, problem) = match crate::pod_charts::parse_window(raw_query) {
        Ok(w) => (w, None),
        Err(e) => (None, Some(e)),
    };
    let key = format!("{namespace}/{name}");
    let Some(object) = world.pods.get(&key) else {
        return not_found(&format!("Pod {key}"), &banners);
    };
    let mut body = format!("<h1>Pod {}</h1>", esc(&key));
    if let Some(p) = &problem {
        let _ = write!(body, "<p class=\"bad\">{}</p>", esc(p));
    }
    let report = pod_report(object);
    match &report {
        Err(e) => {
            let _ = write!(
                body,
                "<p class=\"bad\">This pod's GPU request or annotations cannot be read: {}</p>",
                esc(&e.0)
            );
        }
        Ok(r) => {
            let _ = write!(
                body,
                "<p>Node: {} · bind phase: {} · phase: {}</p>",
                r.node
                    .as_deref()
                    .map(node_link)
                    .unwrap_or_else(|| "(not scheduled)".into()),
                esc(r.bind_phase.as_deref().unwrap_or("-")),
                esc(object
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .unwrap_or("-"))
            );
            let mut rows = Vec::new();
            for c in &r.containers {
                let asked = if c.asked.is_empty() {
                    "-".to_owned()
                } else {
                    c.asked
                        .iter()
                        .map(|a| esc(&a.describe()))
                        .collect::<Vec<_>>()
                        .join("<br>")
                };
                // A DRA container asks through the claims it names (shares below).
                let claims: Vec<String> = object
                    .spec
                    .iter()
                    .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
                    .filter(|k| k.name == c.name)
                    .flat_map(|k| k.resources.iter().flat_map(|r| r.claims.iter().flatten()))
                    .map(|claim| claim.name.clone())
                    .collect();
                let got = if c.got.is_empty() {
                    if c.asked.is_empty() && !claims.is_empty() {
                        esc(&format!("claims {} (DRA shares below)", claims.join(", ")))
                    } else if c.asked.is_empty() {
                        "-".to_owned()
                    } else {
                        "(not scheduled)".to_owned()
                    }
                } else {
                    c.got
                        .iter()
                        .map(|g| {
                            let ranges = match (&g.cu_ranges, g.cu_ranges_shared) {
                                (Some(r), true) => format!(", CUs {r} (pod-wide)"),
                                (Some(r), false) => format!(", CUs {r}"),
                                (None, _) if g.vendor == "AMD" && c.waiting_for_allocate => {
                                    ", CUs pending Allocate".into()
                                }
                                (None, _) => String::new(),
                            };
                            esc(&format!(
                                "{} {}: {} MiB, {} {}{ranges}",
                                g.uuid, g.device_type, g.memory_mib, g.cores, g.cores_unit
                            ))
                        })
                        .collect::<Vec<_>>()
                        .join("<br>")
                };
                rows.push(vec![esc(&c.name), c.kind.as_str().to_owned(), asked, got]);
            }
            body.push_str(&table(
                "Per container: asked and got",
                &["CONTAINER", "KIND", "ASKED", "GOT"],
                &rows,
            ));
            for n in &r.notes {
                let _ = write!(body, "<p class=\"muted\">Note: {}</p>", esc(n));
            }
        }
    }
    body.push_str(&crate::dra::pod_section(world, &key));
    body.push_str("<h2 id=\"live\">Live</h2>");
    // Where no monitor covers the pod's node, the empty charts say why.
    let node = object.spec.as_ref().and_then(|s| s.node_name.as_deref());
    let sampled = |m: &BTreeMap<(String, String, String, String), Series>| {
        m.keys().any(|(ns, p, _, _)| ns == namespace && p == name)
    };
    if let Some(node) = node.filter(|_| !sampled(&metrics.utilization) && !sampled(&metrics.memory))
    {
        let covered = coverage(metrics, node);
        if covered < Coverage::Waiting {
            let _ = write!(body, "<p class=\"muted\">{}.</p>", not_sampled(covered));
        }
    }
    body.push_str(&crate::pod_charts::section(
        metrics,
        report.as_ref().ok(),
        namespace,
        name,
        window,
        now,
    ));
    body.push_str("<h2>Events</h2>");
    let events: Vec<&EventRow> = world.events_of("Pod", namespace, name).collect();
    body.push_str(&events_table(&events));
    Page {
        status: if problem.is_some() { 400 } else { 200 },
        html: frame(&format!("Pod {key}"), &banners, true, &body),
    }
}
