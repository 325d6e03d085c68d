//! Issue 31 item 4, "numbers to trust", on the demo's shapes (`hami demo --dra`): a
//! device-plugin node and a DRA node built from the same MI210 capture (so the same card
//! uuids), an NVIDIA card whose host series reads lower than its pods, the API server and
//! the monitors going away, and a node no monitor covers.

use hami_protocol::names::Vendor;
use hami_protocol::node_register::DeviceInfo;
use hami_protocol::scrape::parse_samples;

use crate::fixtures::*;
use crate::pages;
use crate::samples::Metrics;
use crate::world::World;

/// One scrape round as the scraper runs it: `bodies[i]` from endpoint `i` (`Err`: it
/// cannot be read).
fn round(w: &World, m: &mut Metrics, now: i64, bodies: &[Result<String, &str>]) {
    let results = bodies
        .iter()
        .map(|b| match b {
            Ok(text) => Ok(parse_samples(text)),
            Err(e) => Err((*e).to_owned()),
        })
        .collect();
    m.ingest(now, results, w);
}

/// The `<tr>` of a table whose first cell starts with `first`.
fn row<'a>(page: &'a str, first: &str) -> &'a str {
    let start = page
        .find(&format!("<tr><td>{first}"))
        .unwrap_or_else(|| panic!("no row {first} in {page}"));
    let rest = &page[start..];
    &rest[..rest.find("</tr>").unwrap()]
}

/// The card section whose opening tag carries `attr`.
fn section<'a>(page: &'a str, attr: &str) -> &'a str {
    let start = page
        .find(attr)
        .unwrap_or_else(|| panic!("no {attr} in {page}"));
    let rest = &page[start..];
    &rest[..rest.find("</section>").unwrap()]
}

/// `hami demo --dra`'s MI210 pair: `mi210-node` (device plugin) and `mi210-dra-node` (the
/// DRA driver) from the same capture, with a pod on card 0 of each.
fn demo_mi210_pair() -> (World, Vec<DeviceInfo>) {
    let (mut node, _) = captures();
    node.metadata.name = Some("mi210-node".into());
    let cards = amd_entries(&node);
    let mut w = World::default();
    w.upsert_node(node);
    w.upsert_node(dra_node("mi210-dra-node"));
    w.upsert_slice(dra_slice("mi210-dra-node", &cards));
    w.upsert_pod(plugin_pod(
        "default",
        "infer",
        "mi210-node",
        Vendor::Amd,
        (&cards[0].id, &cards[0].device_type),
        (16384, 26),
    ));
    let (pod, claim) = dra_pod("ml", "train", "mi210-dra-node", "gpu-0", (8, 26));
    w.upsert_claim(claim);
    w.upsert_pod(pod);
    (w, cards)
}

#[test]
fn usage_is_counted_per_node_and_card_when_two_nodes_share_uuids() {
    let (w, cards) = demo_mi210_pair();
    let (u0, ty) = (cards[0].id.as_str(), cards[0].device_type.as_str());
    assert_eq!(
        w.dra_nodes()[0].devices[0].uuid,
        u0,
        "the DRA node publishes the same uuids"
    );
    // One monitor per node, as the demo runs them: 4 GiB / 30 % on the plugin node's card
    // 0, 2 GiB / 20 % on the DRA node's.
    let mut m = Metrics::with_endpoints(&["http://a/metrics".into(), "http://b/metrics".into()]);
    round(
        &w,
        &mut m,
        1000,
        &[
            Ok(container_samples("default", "infer", u0, 4096, 30.0)
                + &host_samples("mi210-node", u0, ty, 4096, 30.0)),
            Ok(container_samples("ml", "train", u0, 2048, 20.0)
                + &host_samples("mi210-dra-node", u0, ty, 2048, 20.0)),
        ],
    );
    let overview = pages::overview(&w, &m, "", 1000).html;
    let mi210 = row(&overview, "AMD Instinct MI210");
    assert!(mi210.contains("<td>16</td><td>2</td>"), "{mi210}");
    assert!(
        mi210.contains("<td>6.0 GiB (1%)"),
        "6 GiB used, not 12: {mi210}"
    );
    assert!(mi210.contains("25% busy (mean of 2 cards)"), "{mi210}");
    let plugin_row = row(&overview, "<a href=\"/nodes/mi210-node\">");
    assert!(plugin_row.contains("<td>4.0 GiB"), "{plugin_row}");

    let node = pages::node(&w, &m, "mi210-node", 1000).html;
    let card = section(&node, &format!("data-card=\"{u0}\""));
    assert!(
        card.contains("Memory (MiB): 16384 of 65536 MiB granted, 4096 used"),
        "{card}"
    );
    let dra = pages::node(&w, &m, "mi210-dra-node", 1000).html;
    let device = section(&dra, "data-dra-device=\"mi210-dra-node/gpu-0\"");
    assert!(
        device.contains("Memory (MiB): 8192 of 65536 MiB granted, 2048 used"),
        "{device}"
    );
}

#[test]
fn a_card_meter_is_at_least_the_sum_of_its_pods() {
    let card = nvidia_card();
    let mut w = World::default();
    w.upsert_node(plugin_node(
        "nvidia-node",
        Vendor::Nvidia,
        std::slice::from_ref(&card),
    ));
    w.upsert_pod(plugin_pod(
        "default",
        "cuda",
        "nvidia-node",
        Vendor::Nvidia,
        (&card.id, &card.device_type),
        (4096, 25),
    ));
    let pods = container_samples("default", "cuda", &card.id, 2048, 25.0);
    // The card-level series lower than its pods (the stand-in NVML says 0), then missing.
    for host in [
        host_samples("nvidia-node", &card.id, &card.device_type, 0, 0.0),
        String::new(),
    ] {
        let mut m = Metrics::with_endpoints(&["http://nvidia-node:9394/metrics".into()]);
        round(&w, &mut m, 1000, &[Ok(pods.clone() + &host)]);
        let page = pages::node(&w, &m, "nvidia-node", 1000).html;
        let section = section(&page, &format!("data-card=\"{}\"", card.id));
        assert!(section.contains("<td>2.0 GiB"), "the slice row: {section}");
        assert!(
            section.contains("Memory (MiB): 4096 of 16384 MiB granted, 2048 used"),
            "{section}"
        );
        assert!(
            section.contains("Compute (%): 25 of 100 % granted, 25 used"),
            "{section}"
        );
    }
}

#[test]
fn while_the_api_server_is_down_the_trend_stops_with_one_banner_since() {
    let (mut w, cards) = demo_mi210_pair();
    let body = container_samples("default", "infer", &cards[0].id, 4096, 30.0);
    let mut m = Metrics::with_endpoints(&["http://a/metrics".into()]);
    round(&w, &mut m, 1000, &[Ok(body.clone())]);
    assert_eq!(m.trend_granted.0.len(), 1);
    assert_eq!(m.trend_used.0.len(), 1);
    // Every watch fails from 00:16:45 UTC (1005 s): one banner, no point.
    for (what, at) in [
        ("nodes", 1005),
        ("pods", 1006),
        ("events", 1007),
        ("resourceslices", 1008),
        ("resourceclaims", 1009),
    ] {
        w.watch_failed(
            what,
            "error trying to connect: connection refused".into(),
            at,
        );
    }
    round(&w, &mut m, 1010, &[Ok(body.clone())]);
    assert_eq!(
        m.trend_granted.0.len(),
        1,
        "no point while the API server is down"
    );
    assert_eq!(
        m.trend_used.0.len(),
        1,
        "no point while the API server is down"
    );
    let page = pages::overview(&w, &m, "", 1010).html;
    assert_eq!(page.matches("Kubernetes API server").count(), 1, "{page}");
    assert!(page.contains("since 00:16 UTC"), "{page}");
    // Back: points again.
    w.api_errors.clear();
    round(&w, &mut m, 1020, &[Ok(body.clone())]);
    assert_eq!(m.trend_granted.0.len(), 2);
    // Every monitor unreachable from 1030: no point, one banner with its start.
    round(&w, &mut m, 1030, &[Err("connection refused")]);
    round(&w, &mut m, 1040, &[Err("connection refused")]);
    assert_eq!(
        m.trend_granted.0.len(),
        2,
        "no point while no monitor answers"
    );
    assert_eq!(m.trend_used.0.len(), 2);
    let page = pages::overview(&w, &m, "", 1040).html;
    assert_eq!(page.matches("cannot be read").count(), 1, "{page}");
    assert!(page.contains("since 00:17 UTC"), "{page}");
}

#[test]
fn a_node_no_monitor_covers_says_not_reported_and_figures_show_their_age() {
    let (mut w, cards) = demo_mi210_pair();
    let (u0, ty) = (cards[0].id.as_str(), cards[0].device_type.as_str());
    let (mut other, _) = captures();
    other.metadata.name = Some("mi210-other".into());
    w.upsert_node(other);
    w.upsert_pod(plugin_pod(
        "default",
        "lonely",
        "mi210-other",
        Vendor::Amd,
        (u0, ty),
        (8192, 26),
    ));
    // One monitor, on mi210-node only; it has not answered yet.
    let mut m = Metrics::with_endpoints(&["http://a/metrics".into()]);
    let page = pages::node(&w, &m, "mi210-other", 1000).html;
    assert!(page.contains("no samples yet"), "{page}");
    assert!(!page.contains("not reported"), "{page}");
    round(
        &w,
        &mut m,
        1000,
        &[Ok(container_samples("default", "infer", u0, 4096, 30.0)
            + &host_samples("mi210-node", u0, ty, 4096, 30.0))],
    );
    let page = pages::node(&w, &m, "mi210-other", 1012).html;
    let lonely = row(&page, "<a href=\"/pods/default/lonely\">");
    assert!(
        lonely.contains("not reported: no monitor configured for this node"),
        "{lonely}"
    );
    assert!(!page.contains("no samples yet"), "{page}");
    let pod = pages::pod(&w, &m, "default", "lonely", 1012).html;
    assert!(
        pod.contains("not reported: no monitor configured for this node."),
        "{pod}"
    );
    let overview = pages::overview(&w, &m, "", 1012).html;
    let other_row = row(&overview, "<a href=\"/nodes/mi210-other\">");
    assert!(
        other_row.contains("not reported: no monitor configured for this node"),
        "{other_row}"
    );
    // The covered node's figures carry their age.
    let page = pages::node(&w, &m, "mi210-node", 1012).html;
    let infer = row(&page, "<a href=\"/pods/default/infer\">");
    assert!(infer.contains("4.0 GiB"), "{infer}");
    assert!(infer.contains("as of 12 s ago"), "{infer}");
    let card = section(&page, &format!("data-card=\"{u0}\""));
    assert!(card.contains("as of 12 s ago"), "{card}");
}

#[test]
fn a_type_row_over_several_unmonitored_nodes_says_so_not_this_node() {
    let (w, _) = demo_mi210_pair();
    let m = Metrics::with_endpoints(&[]);
    let overview = pages::overview(&w, &m, "", 1000).html;
    let mi210 = row(&overview, "AMD Instinct MI210");
    assert!(mi210.contains("<td>16</td><td>2</td>"), "{mi210}");
    assert!(
        mi210.contains("not reported: no monitor configured for any of its 2 nodes"),
        "{mi210}"
    );
    assert!(!mi210.contains("this node"), "{mi210}");
    // A node's own row keeps "this node".
    let plugin_row = row(&overview, "<a href=\"/nodes/mi210-node\">");
    assert!(
        plugin_row.contains("not reported: no monitor configured for this node"),
        "{plugin_row}"
    );
}
