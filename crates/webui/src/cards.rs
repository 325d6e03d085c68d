//! `/cards`: every GPU and hard partition, the device plugins' and the DRA devices, with
//! what is free on it (MiB, CUs or SM percent), its shares, health and node; sorted on the
//! server (`?sort=`), searched by uuid (`?q=`), and filtered to the cards a slice would fit
//! on (`?mem=MiB&pct=PERCENT&type=WORD`) by the scheduler's own fit
//! (`hami_scheduler_core::fit::fit_node`, on a snapshot of that one card). Each card the
//! scheduler places on shows how fragmented its free memory is (`hami_defrag_core`'s
//! measure, as `hami status` and the overview's Top-5: `1 − placeable / free` and the
//! largest reference slice that still fits). Pure.

use std::fmt::Write;
use std::sync::Arc;

use hami_protocol::names::Vendor;
use hami_protocol::node_register::DeviceInfo;
use hami_protocol::requests::{ContainerRequest, RequestDefaults, pod_requests};
use hami_protocol::selection::{DeviceSelector, GpuPolicy, NodePolicy};
use hami_scheduler_core::fit::{FitRequest, Selectors, fit_node};
use hami_scheduler_core::snapshot::{Gpu, GpuUsage, NodeDevices, NodeSnapshot};

use crate::html::{Page, esc, frame, table};
use crate::pages::{banners, node_link};
use crate::query::{Paging, choose, fields, pager, sort_links};
use crate::samples::Metrics;
use crate::world::World;

/// How the table is sorted (`?sort=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sort {
    /// By node, then card index (the default).
    #[default]
    Node,
    /// By type.
    Type,
    /// Most free memory first.
    FreeMemory,
    /// Most free compute (share of the card) first.
    FreeCompute,
    /// Fewest shares taken first.
    Shares,
    /// By uuid.
    Uuid,
    /// Most fragmented first.
    Fragmentation,
}

impl Sort {
    const ALL: [(Sort, &'static str, &'static str); 7] = [
        (Sort::Node, "node", "node"),
        (Sort::Type, "type", "type"),
        (Sort::FreeMemory, "free-memory", "free memory"),
        (Sort::FreeCompute, "free-compute", "free compute"),
        (Sort::Shares, "shares", "shares"),
        (Sort::Uuid, "uuid", "uuid"),
        (Sort::Fragmentation, "fragmentation", "fragmentation"),
    ];

    fn word(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(s, _, _)| *s == self)
            .map_or("node", |(_, w, _)| w)
    }
}

/// What a slice asks, for the "fits" filter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fit {
    /// MiB (`gpumem`); 0: not given (the scheduler's default applies).
    pub mem_mib: u64,
    /// Percent of the card's compute (`gpucores`); 0: not given.
    pub percent: u32,
    /// Only types containing this word (`use-gputype`); empty: any.
    pub device_type: String,
}

/// Rows per page unless `?per=` says otherwise.
pub const PER_PAGE: usize = 100;

/// The page's query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// The order.
    pub sort: Sort,
    /// Part of a uuid (case-insensitive); empty: every card.
    pub search: String,
    /// Only the cards this slice fits on.
    pub fit: Option<Fit>,
    /// Which rows.
    pub paging: Paging,
}

impl Default for Query {
    fn default() -> Self {
        Query {
            sort: Sort::default(),
            search: String::new(),
            fit: None,
            paging: Paging::new(PER_PAGE),
        }
    }
}

impl Query {
    /// The search and fit fields, as links keep them (sort and page apart).
    fn filters(&self) -> Vec<(&'static str, String)> {
        let fit = self.fit.clone().unwrap_or_default();
        let number = |n: u64| if n == 0 { String::new() } else { n.to_string() };
        let mut out = vec![
            ("q", self.search.clone()),
            ("mem", number(fit.mem_mib)),
            ("pct", number(u64::from(fit.percent))),
            ("type", fit.device_type),
        ];
        if self.paging.per != self.paging.default_per {
            out.push(("per", self.paging.per.to_string()));
        }
        out
    }
}

/// Reads `sort`, `q`, `mem`, `pct`, `type`, `page` and `per` from a query string; an
/// unknown or malformed value is an error naming it.
pub fn parse_query(raw: &str) -> Result<Query, String> {
    let mut q = Query::default();
    let mut fit = Fit::default();
    let words: Vec<&str> = Sort::ALL.iter().map(|(_, w, _)| *w).collect();
    for (key, value) in fields(raw)? {
        if q.paging.read(&key, &value)? {
            continue;
        }
        match key.as_str() {
            "sort" => q.sort = Sort::ALL[choose("sort", &value, &words)?].0,
            "q" => q.search = value,
            "mem" if !value.is_empty() => {
                fit.mem_mib = value
                    .parse()
                    .map_err(|_| format!("mem={value:?} is not a whole number of MiB"))?;
            }
            "pct" if !value.is_empty() => {
                fit.percent = value
                    .parse()
                    .ok()
                    .filter(|p| *p <= 100)
                    .ok_or_else(|| format!("pct={value:?} is not a percent from 0 to 100"))?;
            }
            "type" => fit.device_type = value,
            _ => {}
        }
    }
    if fit != Fit::default() {
        q.fit = Some(fit);
    }
    Ok(q)
}

/// One card or partition as the page lists it.
#[derive(Debug, Clone)]
struct Row<'a> {
    node: &'a str,
    /// Through the DRA driver rather than a device plugin.
    dra: bool,
    vendor: Vendor,
    info: DeviceInfo,
    usage: GpuUsage,
    held_whole: bool,
    /// Fragmentation (`1 − placeable / free`) and the largest reference slice that fits;
    /// `None` for a DRA device (the scheduler does not place on it: not measured).
    measured: Option<(f64, Option<&'static str>)>,
}

impl Row<'_> {
    fn free_mem(&self) -> u64 {
        self.info.devmem.saturating_sub(self.usage.mem_mib)
    }

    fn free_cores(&self) -> u64 {
        u64::from(self.info.devcore).saturating_sub(self.usage.cores)
    }

    fn free_compute_share(&self) -> f64 {
        if self.info.devcore == 0 {
            0.0
        } else {
            self.free_cores() as f64 / f64::from(self.info.devcore)
        }
    }

    /// Whether the scheduler's fit takes `request` on this card alone.
    fn fits(&self, request: &[ContainerRequest], selectors: &Selectors) -> bool {
        let snapshot = NodeSnapshot {
            devices: Arc::new(NodeDevices {
                name: self.node.to_owned(),
                gpus: vec![Gpu {
                    vendor: self.vendor,
                    info: self.info.clone(),
                }],
                register_errors: vec![],
                register_labels: vec![],
            }),
            usage: vec![self.usage],
            held_whole: vec![self.held_whole],
        };
        let req = FitRequest {
            containers: request,
            selectors,
            gpu_policy: GpuPolicy::default(),
            node_policy: NodePolicy::default(),
        };
        fit_node(&snapshot, &req).is_ok()
    }
}

fn rows(world: &World) -> Vec<Row<'_>> {
    let mut out = Vec::new();
    for node in world.state.nodes() {
        let measured = hami_defrag_core::measure_node(node);
        for (i, gpu) in node.devices.gpus.iter().enumerate() {
            out.push(Row {
                node: &node.devices.name,
                dra: false,
                vendor: gpu.vendor,
                info: gpu.info.clone(),
                usage: node.usage.get(i).copied().unwrap_or_default(),
                held_whole: node.held_whole.get(i).copied().unwrap_or(false),
                measured: measured
                    .cards
                    .get(i)
                    .map(|c| (c.fragmentation, c.largest.map(|s| s.as_str()))),
            });
        }
    }
    // A DRA device as the register entry the driver published it from (shares = count).
    for (node, d) in world.dra_devices() {
        out.push(Row {
            node: &node.name,
            dra: true,
            vendor: Vendor::Amd,
            info: DeviceInfo {
                id: d.uuid.clone(),
                count: u32::try_from(d.shares).unwrap_or(u32::MAX),
                devmem: d.memory_bytes >> 20,
                devcore: u32::try_from(d.compute_units).unwrap_or(u32::MAX),
                device_type: d.product.clone(),
                health: !d.tainted,
                device_vendor: Vendor::Amd.word().into(),
                ..Default::default()
            },
            usage: GpuUsage {
                used: u32::try_from(d.shares_used).unwrap_or(u32::MAX),
                mem_mib: d.memory_used_bytes >> 20,
                cores: d.compute_units_used,
            },
            held_whole: false,
            measured: None,
        });
    }
    out
}

/// The request a pod asking for one GPU of `vendor` with `fit` would make.
fn request(vendor: Vendor, fit: &Fit) -> Vec<ContainerRequest> {
    let names = vendor.names();
    let mut limits = serde_json::Map::new();
    limits.insert(names.resource_count.into(), "1".into());
    if fit.mem_mib > 0 {
        limits.insert(names.resource_memory.into(), fit.mem_mib.to_string().into());
    }
    if fit.percent > 0 {
        limits.insert(names.resource_cores.into(), fit.percent.to_string().into());
    }
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "fits"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}));
    pod.ok()
        .and_then(|p| pod_requests(&p, &RequestDefaults::default()).ok())
        .unwrap_or_default()
}

/// `/cards?…`: the query string as given (without `?`).
pub fn cards(world: &World, metrics: &Metrics, raw_query: &str) -> Page {
    let banners = banners(world, metrics);
    let (query, problem) = match parse_query(raw_query) {
        Ok(q) => (q, None),
        Err(e) => (Query::default(), Some(e)),
    };
    let mut body = String::from("<h1>Cards</h1>");
    body.push_str(&form(&query));
    if let Some(p) = &problem {
        let _ = write!(body, "<p class=\"bad\">{}</p>", esc(p));
    }
    let mut all = rows(world);
    let total = all.len();
    let needle = query.search.to_ascii_lowercase();
    all.retain(|r| needle.is_empty() || r.info.id.to_ascii_lowercase().contains(&needle));
    if let Some(fit) = &query.fit {
        let selector = DeviceSelector {
            use_types: if fit.device_type.is_empty() {
                vec![]
            } else {
                vec![fit.device_type.clone()]
            },
            ..Default::default()
        };
        let selectors = Selectors {
            amd: selector.clone(),
            nvidia: selector,
        };
        let requests = [
            (Vendor::Amd, request(Vendor::Amd, fit)),
            (Vendor::Nvidia, request(Vendor::Nvidia, fit)),
        ];
        all.retain(|r| {
            requests
                .iter()
                .find(|(v, _)| *v == r.vendor)
                .is_some_and(|(_, req)| !req.is_empty() && r.fits(req, &selectors))
        });
    }
    match query.sort {
        Sort::Node => all.sort_by(|a, b| (a.node, a.info.index).cmp(&(b.node, b.info.index))),
        Sort::Type => {
            all.sort_by(|a, b| (&a.info.device_type, a.node).cmp(&(&b.info.device_type, b.node)))
        }
        Sort::FreeMemory => {
            all.sort_by(|a, b| b.free_mem().cmp(&a.free_mem()).then(a.node.cmp(b.node)))
        }
        Sort::FreeCompute => all.sort_by(|a, b| {
            b.free_compute_share()
                .total_cmp(&a.free_compute_share())
                .then(a.node.cmp(b.node))
        }),
        Sort::Shares => all.sort_by_key(|r| (r.usage.used, r.node, r.info.index)),
        Sort::Uuid => all.sort_by(|a, b| a.info.id.cmp(&b.info.id)),
        Sort::Fragmentation => all.sort_by(|a, b| {
            let f = |r: &Row| r.measured.map_or(-1.0, |(f, _)| f);
            f(b).total_cmp(&f(a)).then(a.node.cmp(b.node))
        }),
    }
    let (window, _) = query.paging.window(all.len());
    let table_rows: Vec<Vec<String>> = all[window]
        .iter()
        .map(|r| {
            let unit = if r.vendor == Vendor::Amd {
                " CUs"
            } else {
                " %"
            };
            vec![
                node_link(r.node),
                esc(&r.info.id),
                esc(&r.info.device_type),
                if r.dra { "DRA" } else { "device plugin" }.to_owned(),
                format!("{} of {} MiB", r.free_mem(), r.info.devmem),
                format!("{} of {}{unit}", r.free_cores(), r.info.devcore),
                format!("{}/{}", r.usage.used, r.info.count),
                match r.measured {
                    None => "not measured (DRA)".to_owned(),
                    Some((f, largest)) => format!(
                        "{:.0}%, largest slice {}",
                        f * 100.0,
                        largest.unwrap_or("none")
                    ),
                },
                if !r.info.health {
                    "<span class=\"bad\">unhealthy</span>".into()
                } else if r.held_whole {
                    "held whole by a pod HAMi did not place".into()
                } else {
                    "ok".into()
                },
            ]
        })
        .collect();
    let caption = match &query.fit {
        Some(_) => format!(
            "{} of {total} cards and partitions take the slice (the scheduler's fit)",
            all.len()
        ),
        None => format!("{} of {total} cards and partitions", all.len()),
    };
    let mut kept = query.filters();
    kept.insert(0, ("sort", query.sort.word().to_owned()));
    let pages = pager("cards", "/cards", &kept, &query.paging, all.len());
    body.push_str(&pages);
    body.push_str(&table(
        &caption,
        &[
            "NODE",
            "UUID",
            "TYPE",
            "THROUGH",
            "FREE MEMORY",
            "FREE COMPUTE",
            "SHARES",
            "FRAGMENTATION",
            "HEALTH",
        ],
        &table_rows,
    ));
    body.push_str(&pages);
    Page {
        status: if problem.is_some() { 400 } else { 200 },
        // Not live: a refresh of <main> would wipe the form while it is being filled in.
        html: frame("Cards", &banners, false, &body),
    }
}

/// The search and fit form, and the sort links (each keeping the other fields).
fn form(q: &Query) -> String {
    let fit = q.fit.clone().unwrap_or_default();
    let number = |n: u64| if n == 0 { String::new() } else { n.to_string() };
    let mut out = format!(
        "<form method=\"get\" action=\"/cards\" class=\"filters\"><input type=\"hidden\" name=\"sort\" value=\"{sort}\">{per}<label>UUID contains <input name=\"q\" value=\"{q}\"></label> <label>Fits MiB <input name=\"mem\" inputmode=\"numeric\" value=\"{mem}\"></label> <label>and compute % <input name=\"pct\" inputmode=\"numeric\" value=\"{pct}\"></label> <label>of type <input name=\"type\" value=\"{ty}\"></label> <button type=\"submit\">Show</button></form>",
        sort = q.sort.word(),
        per = if q.paging.per == q.paging.default_per {
            String::new()
        } else {
            format!(
                "<input type=\"hidden\" name=\"per\" value=\"{}\">",
                q.paging.per
            )
        },
        q = esc(&q.search),
        mem = number(fit.mem_mib),
        pct = number(u64::from(fit.percent)),
        ty = esc(&fit.device_type),
    );
    let words: Vec<(&str, &str)> = Sort::ALL.iter().map(|(_, w, l)| (*w, *l)).collect();
    out.push_str(&sort_links("/cards", &q.filters(), &words, q.sort.word()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;

    /// The demo with `--dra`: the MI210 pair (same uuids, a pod on card 0 of each) and the
    /// NVIDIA node's one 16 GiB card.
    fn demo() -> (World, String) {
        let (mut node, _) = captures();
        node.metadata.name = Some("mi210-node".into());
        let cards = amd_entries(&node);
        let mut w = World::default();
        w.upsert_node(node);
        w.upsert_node(dra_node("mi210-dra-node"));
        w.upsert_slice(dra_slice("mi210-dra-node", &cards));
        let u0 = cards[0].id.clone();
        w.upsert_pod(plugin_pod(
            "default",
            "infer",
            "mi210-node",
            Vendor::Amd,
            (&u0, &cards[0].device_type),
            (16384, 26),
        ));
        let (pod, claim) = dra_pod("ml", "train", "mi210-dra-node", "gpu-0", (8, 26));
        w.upsert_claim(claim);
        w.upsert_pod(pod);
        let mut nvidia = cards[1].clone();
        nvidia.id = "GPU-00000000-0000-4000-8000-000000000001".into();
        nvidia.device_type = "NVIDIA-Stand-in GPU".into();
        nvidia.device_vendor = Vendor::Nvidia.word().into();
        nvidia.devmem = 16384;
        nvidia.devcore = 100;
        w.upsert_node(plugin_node("nvidia-node", Vendor::Nvidia, &[nvidia]));
        (w, u0)
    }

    fn body_rows(html: &str) -> Vec<&str> {
        let tbody = &html[html.find("<tbody>").unwrap()..];
        tbody.split("<tr>").skip(1).collect()
    }

    #[test]
    fn every_card_with_what_is_free_searched_sorted_and_fitted() {
        let (w, u0) = demo();
        let m = Metrics::default();
        let page = cards(&w, &m, "");
        assert_eq!(page.status, 200);
        assert!(
            page.html.contains("17 of 17 cards and partitions"),
            "{}",
            page.html
        );
        assert!(
            page.html.contains("<a href=\"/cards\">Cards</a>"),
            "linked from the nav"
        );
        assert!(
            !page.html.contains("data-live"),
            "the form is not refreshed away"
        );
        let rows = body_rows(&page.html);
        assert_eq!(rows.len(), 17);
        let plugin0 = rows
            .iter()
            .find(|r| r.contains("mi210-node\">mi210-node") && r.contains(&u0))
            .unwrap();
        assert!(
            plugin0.contains("<td>49152 of 65536 MiB</td><td>78 of 104 CUs</td><td>1/")
                && plugin0.contains("<td>device plugin</td>"),
            "{plugin0}"
        );
        let dra0 = rows
            .iter()
            .find(|r| r.contains("mi210-dra-node\">") && r.contains(&u0))
            .unwrap();
        assert!(
            dra0.contains("<td>DRA</td><td>57344 of 65536 MiB</td><td>78 of 104 CUs</td><td>1/"),
            "{dra0}"
        );

        // Search by part of a uuid: card 0 of both nodes.
        let page = cards(&w, &m, &format!("q={}", &u0[..u0.len() - 1].to_lowercase()));
        assert!(body_rows(&page.html).len() >= 2, "{}", page.html);
        assert!(
            body_rows(&page.html)
                .iter()
                .all(|r| r.contains(&u0[..u0.len() - 1]))
        );

        // Fits 60000 MiB: every MI210 but the two card 0s; not the 16 GiB NVIDIA card.
        let page = cards(&w, &m, "mem=60000");
        let rows = body_rows(&page.html);
        assert_eq!(rows.len(), 14, "{}", page.html);
        assert!(rows.iter().all(|r| !r.contains(&format!("<td>{u0}</td>"))));
        assert!(
            page.html
                .contains("14 of 17 cards and partitions take the slice")
        );
        // 1 GiB and 50 % of an NVIDIA card: only the NVIDIA one (type filter).
        let page = cards(&w, &m, "mem=1024&pct=50&type=NVIDIA");
        let rows = body_rows(&page.html);
        assert_eq!(rows.len(), 1, "{}", page.html);
        assert!(rows[0].contains("nvidia-node"));
        // More compute than card 0 has free (78 of 104 CUs): the others only.
        let page = cards(&w, &m, "pct=80&type=MI210");
        assert_eq!(body_rows(&page.html).len(), 14, "{}", page.html);

        // Most free memory first: the NVIDIA card last.
        let page = cards(&w, &m, "sort=free-memory");
        let rows = body_rows(&page.html);
        assert!(
            rows[0].contains("<td>65536 of 65536 MiB</td>"),
            "{}",
            rows[0]
        );
        assert!(rows[16].contains("nvidia-node"), "{}", rows[16]);
        assert!(
            page.html
                .contains("<strong aria-current=\"true\">free memory</strong>")
        );
        assert!(page.html.contains("<a href=\"/cards?sort=node\">node</a>"));
        // The links keep the search and the fit; a page of 5 keeps its size.
        let page = cards(&w, &m, "sort=uuid&mem=1024&type=MI210&per=5&page=2");
        assert_eq!(body_rows(&page.html).len(), 5, "{}", page.html);
        assert!(
            page.html.contains(
                "<a href=\"/cards?sort=node&amp;mem=1024&amp;type=MI210&amp;per=5\">node</a>"
            ),
            "{}",
            page.html
        );
        assert!(
            page.html.contains(
                "<a href=\"/cards?sort=uuid&amp;mem=1024&amp;type=MI210&amp;per=5&amp;page=3\" rel=\"next\">Next</a>"
            ),
            "{}",
            page.html
        );
        assert!(page.html.contains("cards 6–10 of 14"), "{}", page.html);
    }

    /// Issue 32 item 1: each card the scheduler places on shows its fragmentation and the
    /// largest reference slice that still fits (defrag-core's measure); a card whose CUs
    /// are all taken strands its free memory (100 %, no slice) and sorts first.
    #[test]
    fn fragmentation_per_card_is_shown_and_sorted() {
        let (mut w, _) = demo();
        let cards1 = amd_entries(w.nodes.get("mi210-node").unwrap());
        w.upsert_pod(plugin_pod(
            "default",
            "all-cus",
            "mi210-node",
            Vendor::Amd,
            (&cards1[1].id, &cards1[1].device_type),
            (8192, 104),
        ));
        let m = Metrics::default();
        let page = cards(&w, &m, "sort=fragmentation");
        assert_eq!(page.status, 200, "{}", page.html);
        assert!(
            page.html.contains("<th scope=\"col\">FRAGMENTATION</th>"),
            "{}",
            page.html
        );
        let rows = body_rows(&page.html);
        assert!(
            rows[0].contains(&cards1[1].id)
                && rows[0].contains("<td>100%, largest slice none</td>"),
            "{}",
            rows[0]
        );
        let idle = rows
            .iter()
            .find(|r| r.contains("mi210-node\">") && r.contains(&cards1[7].id))
            .unwrap();
        assert!(idle.contains("<td>0%, largest slice 1/1</td>"), "{idle}");
        let dra = rows.iter().find(|r| r.contains("<td>DRA</td>")).unwrap();
        assert!(dra.contains("<td>not measured (DRA)</td>"), "{dra}");
        assert!(
            page.html
                .contains("<strong aria-current=\"true\">fragmentation</strong>")
        );
    }

    #[test]
    fn bad_queries_say_which_field_and_text_is_escaped() {
        let (w, _) = demo();
        let m = Metrics::default();
        let page = cards(&w, &m, "mem=lots");
        assert_eq!(page.status, 400);
        assert!(
            page.html
                .contains("mem=&quot;lots&quot; is not a whole number of MiB")
        );
        assert_eq!(cards(&w, &m, "sort=price").status, 400);
        assert_eq!(cards(&w, &m, "pct=101").status, 400);
        let page = cards(&w, &m, "q=%3Cscript%3E");
        assert_eq!(page.status, 200);
        assert!(
            page.html.contains("value=\"&lt;script&gt;\""),
            "{}",
            page.html
        );
        assert!(!page.html.contains("<script>"));
    }
}
