//! Issue 31 items 6 and 7 on the demo's shapes: charts with units, a window offered only as
//! far back as the history reaches, allocation vs usage in percent, a pod's ask and limit
//! drawn, Grafana linked only when its address is known; CU maps whose owners differ by
//! pattern as well as colour and keep both on every card and every refresh; an MI300X's
//! partitions grouped under their card with the missing one shown.

use std::collections::BTreeMap;

use hami_protocol::cu_allocated::CuAllocation;
use hami_protocol::cu_list::CuSet;
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::names::{Vendor, pod as pod_keys};
use hami_protocol::scrape::parse_samples;
use k8s_openapi::api::core::v1::Pod;

use crate::fixtures::*;
use crate::pages;
use crate::samples::Metrics;
use crate::world::World;

/// The demo's MI210 node with two pods on card 0 (CUs 0-25 and 26-51) and one of them also
/// on card 1, the NVIDIA stand-in card with a pod asking 90 % of it.
fn cluster() -> (World, Vec<String>, String) {
    let (mut node, _) = captures();
    node.metadata.name = Some("mi210-node".into());
    let cards = amd_entries(&node);
    let ids: Vec<String> = cards.iter().map(|c| c.id.clone()).collect();
    let ty = cards[0].device_type.clone();
    let nvidia = nvidia_card();
    let mut w = World::default();
    w.upsert_node(node);
    w.upsert_node(plugin_node(
        "nvidia-node",
        Vendor::Nvidia,
        std::slice::from_ref(&nvidia),
    ));
    for (name, card, cus) in [
        ("train", 0, "0-25"),
        ("infer", 0, "26-51"),
        ("eval", 1, "0-25"),
    ] {
        let mut pod = plugin_pod(
            "ml",
            name,
            "mi210-node",
            Vendor::Amd,
            (&ids[card], &ty),
            (16384, 26),
        );
        let mut cu = CuAllocation(BTreeMap::new());
        cu.0.insert(ids[card].clone(), CuSet::parse(cus, 104).unwrap());
        annotate(&mut pod, pod_keys::AMD_CU_ALLOCATED, &cu.encode());
        w.upsert_pod(pod);
    }
    w.upsert_pod(plugin_pod(
        "team",
        "cuda",
        "nvidia-node",
        Vendor::Nvidia,
        (&nvidia.id, &nvidia.device_type),
        (4096, 90),
    ));
    (w, ids, nvidia.id)
}

fn annotate(pod: &mut Pod, key: &str, value: &str) {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.into(), value.into());
}

/// The monitor's body: memory, utilization and the enforced limit of each pod.
fn samples(ids: &[String], nvidia: &str) -> String {
    let mut body = String::new();
    for (pod, uuid, mib, util) in [
        ("train", &ids[0], 6144, 40.0),
        ("infer", &ids[0], 2048, 10.0),
        ("eval", &ids[1], 1024, 5.0),
    ] {
        body.push_str(&container_samples("ml", pod, uuid, mib, util));
        body.push_str(&limit_sample("ml", pod, uuid, 20480));
    }
    body.push_str(&container_samples("team", "cuda", nvidia, 3072, 85.0));
    body
}

fn limit_sample(ns: &str, pod: &str, uuid: &str, mib: u64) -> String {
    format!(
        "hami_vgpu_memory_limit_bytes{{namespace=\"{ns}\",pod=\"{pod}\",container=\"main\",vdevice_index=\"0\",device_uuid=\"{uuid}\"}} {}\n",
        mib << 20
    )
}

/// Monitor rounds every `step` seconds from `from` to `to` (inclusive).
fn rounds(w: &World, m: &mut Metrics, body: &str, from: i64, to: i64, step: i64) {
    let mut t = from;
    while t <= to {
        m.ingest(t, vec![Ok(parse_samples(body))], w);
        t += step;
    }
}

fn attr<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    html.split(&format!("{name}=\""))
        .skip(1)
        .map(|r| &r[..r.find('"').unwrap()])
        .collect()
}

#[test]
fn the_overview_offers_windows_as_far_as_the_trend_reaches() {
    let (w, ids, nvidia) = cluster();
    let body = samples(&ids, &nvidia);
    let mut m = Metrics::with_endpoints(&["http://monitor/metrics".into()]);
    let start = 100_000;
    // Ten minutes of history: one window, no choice, and the page says why.
    rounds(&w, &mut m, &body, start, start + 600, 30);
    let now = start + 600;
    let html = pages::overview(&w, &m, "", now).html;
    assert_eq!(attr(&html, "data-windows"), vec!["15m"], "{html}");
    assert!(html.contains("a longer window is offered once"), "{html}");
    assert!(attr(&html, "data-window").iter().all(|w| *w == "15m"));
    // Asking for 6 h before there is that much falls back to what there is.
    let html = pages::overview(&w, &m, "window=6h", now).html;
    assert!(attr(&html, "data-window").iter().all(|w| *w == "15m"));
    // Half an hour: 15 min and 1 h, 1 h shown; 15 min on request.
    rounds(&w, &mut m, &body, start + 630, start + 1800, 30);
    let now = start + 1800;
    let html = pages::overview(&w, &m, "", now).html;
    assert_eq!(attr(&html, "data-windows"), vec!["15m 1h"]);
    assert_eq!(attr(&html, "data-window"), vec!["1h"; 3]);
    assert!(
        html.contains("<a href=\"/?window=15m#trend\">15 min</a>"),
        "{html}"
    );
    let html = pages::overview(&w, &m, "window=15m&sort=granted", now).html;
    assert_eq!(attr(&html, "data-window"), vec!["15m"; 3]);
    assert!(html.contains(">−15 min</text>"));
    // The node table's links keep the window; the window's links keep the sort.
    assert!(html.contains("window=15m"), "{html}");
    assert!(
        html.contains("<a href=\"/?window=1h&amp;sort=granted#trend\">1 h</a>"),
        "{html}"
    );
    // Two hours: 6 h too, drawn with hours on its time axis; past the hour the trend is
    // thinned to a point a minute (and drawn without gaps).
    rounds(&w, &mut m, &body, start + 1830, start + 7200, 30);
    let now = start + 7200;
    let html = pages::overview(&w, &m, "window=6h", now).html;
    assert_eq!(attr(&html, "data-windows"), vec!["15m 1h 6h"]);
    assert_eq!(attr(&html, "data-window"), vec!["6h"; 3]);
    assert!(html.contains(">−6 h</text>") && html.contains(">−2 h</text>"));
    let kept = m.trend_granted.0.len();
    assert!(
        (120 + 59..=120 + 62).contains(&kept),
        "the last hour at 30 s (120 points) and the hour before at one a minute (60): {kept}"
    );
    let granted_lines = html.matches("data-series=\"granted\"").count();
    assert_eq!(granted_lines, 1, "one line, no gap at the thinning: {html}");
    assert!(pages::overview(&w, &m, "window=2d", now).status == 400);
}

#[test]
fn overview_charts_have_units_and_allocation_vs_usage_in_percent() {
    let (w, ids, nvidia) = cluster();
    let mut m = Metrics::with_endpoints(&["http://monitor/metrics".into()]);
    m.ingest(1000, vec![Ok(parse_samples(&samples(&ids, &nvidia)))], &w);
    let html = pages::overview(&w, &m, "", 1010).html;
    // Granted 3 × 16 GiB + 4 GiB = 52 GiB; used 6 + 2 + 1 + 3 = 12 GiB.
    assert!(
        html.contains("granted: 52 GiB") && html.contains("used: 12 GiB"),
        "{html}"
    );
    let units = attr(&html, "data-unit");
    assert_eq!(units, vec!["GiB", "%", "%"], "{html}");
    // Of the MI210 node's eight cards and the 16 GiB NVIDIA card.
    let capacity: f64 = amd_entries(&captures().0)
        .iter()
        .map(|c| c.devmem as f64)
        .sum::<f64>()
        + 16384.0;
    let allocated = 53248.0 * 100.0 / capacity;
    let used = 12288.0 * 100.0 / capacity;
    assert!(
        html.contains(&format!("allocated: {}%", crate::charts::number(allocated))),
        "{allocated}: {html}"
    );
    assert!(html.contains(&format!("used: {}%", crate::charts::number(used))));
}

#[test]
fn a_pods_charts_draw_its_ask_and_limit_and_offer_at_most_an_hour() {
    let (w, ids, nvidia) = cluster();
    let body = samples(&ids, &nvidia);
    let mut m = Metrics::with_endpoints(&["http://monitor/metrics".into()]);
    rounds(&w, &mut m, &body, 10_000, 10_000 + 3 * 3600, 60);
    let now = 10_000 + 3 * 3600;
    let html = pages::pod(&w, &m, "ml", "train", now).html;
    // Memory: used 6 GiB against the 16 GiB grant and the 20 GiB limit, in GiB.
    assert!(
        html.contains("data-level=\"asked\" data-value=\"16384\""),
        "{html}"
    );
    assert!(
        html.contains("data-level=\"limit\" data-value=\"20480\""),
        "{html}"
    );
    assert!(html.contains("main on ") && html.contains(": asked: 16 GiB"));
    assert!(html.contains(": limit: 20 GiB"));
    assert!(html.contains("data-unit=\"GiB\""));
    // AMD utilization is busy time: no CU level, and the page says why.
    assert_eq!(html.matches("data-level=").count(), 2, "{html}");
    assert!(html.contains("not a share of its CUs"));
    // Per container an hour is kept: 15 min and 1 h, never 6 h.
    assert_eq!(attr(&html, "data-windows"), vec!["15m 1h"]);
    let short = pages::pod_in(&w, &m, "ml", "train", "window=15m", now).html;
    assert_eq!(attr(&short, "data-window"), vec!["15m"; 2]);
    assert!(short.contains("<a href=\"/pods/ml/train?window=1h#live\">1 h</a>"));
    let bad = pages::pod_in(&w, &m, "ml", "train", "window=6x", now);
    assert_eq!(bad.status, 400);
    assert!(
        bad.html
            .contains("window=&quot;6x&quot; is not one of 15m, 1h, 6h")
    );
    // NVIDIA: the compute ask is a percent, drawn on the utilization chart.
    let cuda = pages::pod(&w, &m, "team", "cuda", now).html;
    assert!(
        cuda.contains("data-level=\"asked\" data-value=\"90\""),
        "{cuda}"
    );
    assert!(cuda.contains("data-level=\"asked\" data-value=\"4096\""));
}

#[test]
fn grafana_is_linked_only_when_its_address_is_known() {
    let (w, ids, nvidia) = cluster();
    let mut m = Metrics::with_endpoints(&["http://monitor/metrics".into()]);
    m.ingest(1000, vec![Ok(parse_samples(&samples(&ids, &nvidia)))], &w);
    for html in [
        pages::overview(&w, &m, "", 1010).html,
        pages::pod(&w, &m, "ml", "train", 1010).html,
    ] {
        assert!(!html.contains("class=\"grafana\""), "{html}");
        assert!(html.contains("not given Grafana's address"), "{html}");
    }
    m.grafana = Some("https://grafana.example.com/g".into());
    let overview = pages::overview(&w, &m, "", 1010).html;
    assert!(
        overview.contains(
            "href=\"https://grafana.example.com/g/d/hami-rs-scheduler?from=now-24h&amp;to=now\""
        ),
        "{overview}"
    );
    assert!(
        overview.contains(
            "href=\"https://grafana.example.com/g/d/hami-rs-vgpu?from=now-24h&amp;to=now\""
        )
    );
    let pod = pages::pod(&w, &m, "ml", "train", 1010).html;
    assert!(
        pod.contains(
            "/d/hami-rs-vgpu?from=now-24h&amp;to=now&amp;var-namespace=ml&amp;var-pod=train\""
        ),
        "{pod}"
    );
    assert!(!pod.contains("not given Grafana's address"));
}

/// The legend entries of the CU map in the card section `card`: (owner, colour, pattern).
fn legend(page: &str, card: &str) -> Vec<(String, String, String)> {
    let start = page.find(&format!("data-card=\"{card}\"")).unwrap();
    let section = &page[start..start + page[start..].find("</section>").unwrap()];
    section
        .split("<li data-pod=\"")
        .skip(1)
        .map(|li| {
            let field = |name: &str| {
                let at = li
                    .find(&format!("{name}=\""))
                    .map_or(0, |i| i + name.len() + 2);
                li[at..at + li[at..].find('"').unwrap()].to_owned()
            };
            (
                li[..li.find('"').unwrap()].to_owned(),
                field("data-colour"),
                field("data-pattern"),
            )
        })
        .collect()
}

#[test]
fn cu_owners_differ_by_pattern_and_keep_their_style_across_cards_and_refreshes() {
    let (mut w, ids, nvidia) = cluster();
    let m = Metrics::with_endpoints(&["http://monitor/metrics".into()]);
    let page = pages::node(&w, &m, "mi210-node", 1000).html;
    let card0 = legend(&page, &ids[0]);
    assert_eq!(card0.len(), 2, "{card0:?}");
    assert_ne!(
        card0[0].2, card0[1].2,
        "two owners of a card differ in pattern"
    );
    assert_ne!(card0[0].1, card0[1].1, "and in colour");
    for (owner, _, pattern) in &card0 {
        assert!(page.contains(&format!("{owner} (26 CUs: ")), "{page}");
        assert!(page.contains(&format!("; {pattern})</li>")));
    }
    // ml/train also on card 1, beside ml/eval (a second device in its device list): the
    // same colour and pattern there.
    let ty = amd_entries(&captures().0)[0].device_type.clone();
    let mut both = plugin_pod(
        "ml",
        "train",
        "mi210-node",
        Vendor::Amd,
        (&ids[0], &ty),
        (16384, 26),
    );
    let runs = vec![vec![
        ContainerDevice {
            uuid: ids[0].clone(),
            device_type: ty.clone(),
            mem_mib: 16384,
            cores: 26,
        },
        ContainerDevice {
            uuid: ids[1].clone(),
            device_type: ty.clone(),
            mem_mib: 16384,
            cores: 26,
        },
    ]];
    annotate(
        &mut both,
        Vendor::Amd.names().devices_allocated,
        &encode_pod_devices(&runs).unwrap(),
    );
    let mut cu = CuAllocation(BTreeMap::new());
    cu.0.insert(ids[0].clone(), CuSet::parse("0-25", 104).unwrap());
    cu.0.insert(ids[1].clone(), CuSet::parse("52-77", 104).unwrap());
    annotate(&mut both, pod_keys::AMD_CU_ALLOCATED, &cu.encode());
    w.upsert_pod(both);
    let _ = nvidia;
    let again = pages::node(&w, &m, "mi210-node", 2000).html;
    let card1 = legend(&again, &ids[1]);
    let on0 = legend(&again, &ids[0]);
    let style = |l: &[(String, String, String)], who: &str| {
        l.iter().find(|(o, _, _)| o == who).cloned().unwrap()
    };
    assert_eq!(
        style(&card1, "ml/train"),
        style(&on0, "ml/train"),
        "{card1:?} {on0:?}"
    );
    // A refresh draws the same map.
    assert_eq!(legend(&page, &ids[0]), on0);
    let cells = |p: &str| -> usize { p.matches("class=\"cu\"").count() };
    assert_eq!(cells(&again), 8 * 104);
}

#[test]
fn an_mi300x_in_cpx_shows_its_partitions_under_their_card_and_the_missing_one() {
    let (_, cpx) = captures();
    let mut w = World::default();
    w.upsert_node(plugin_node("cpx-node", Vendor::Amd, &cpx));
    let m = Metrics::with_endpoints(&[]);
    let page = pages::node(&w, &m, "cpx-node", 1000).html;
    let groups = page.matches("<section class=\"physical\"").count();
    assert_eq!(groups, 8, "eight MI300X cards");
    assert_eq!(
        page.matches("<section class=\"card\"").count(),
        cpx.len(),
        "every partition once"
    );
    let missing: usize = attr(&page, "data-missing")
        .iter()
        .map(|n| n.parse::<usize>().unwrap())
        .sum();
    assert_eq!(missing, 8 * 8 - cpx.len(), "{page}");
    assert_eq!(page.matches("data-missing-partition=").count(), missing);
    assert!(
        page.contains(", 7 of 8 partitions · <span class=\"bad\">missing: partition"),
        "{page}"
    );
    // Each partition sits inside its card's group: every card section between a group's
    // opening and the next one carries that group's PCI address.
    for part in page.split("<section class=\"physical\"").skip(1) {
        let bdf = attr(part, "data-pci")[0];
        for id in attr(part, "data-card") {
            let entry = cpx.iter().find(|d| d.id == id).unwrap();
            assert_eq!(entry.custom_info.pci_bdf.as_deref(), Some(bdf), "{id}");
        }
    }
}
