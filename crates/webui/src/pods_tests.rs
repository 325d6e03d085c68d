//! The Pods page (issue 31 item 2) on the demo's shapes (`hami demo --dra`): the MI210
//! pair (a device-plugin slice and a DRA share of the same capture's card 0), the NVIDIA
//! stand-in card with a pod near its memory limit and one over its compute grant, and
//! pending pods with the scheduler's reasons.

use hami_protocol::names::Vendor;
use hami_protocol::scrape::parse_samples;
use serde_json::json;

use crate::fixtures::*;
use crate::pages;
use crate::pods::{self, parse_query};
use crate::samples::Metrics;
use crate::world::{EventRow, World};

/// The `<tr>` whose first cell links to the pod `ns/name`.
fn row<'a>(page: &'a str, pod: &str) -> &'a str {
    let (ns, name) = pod.split_once('/').unwrap();
    let first = format!("<tr><td><a href=\"/pods/{ns}/{name}\">");
    let start = page
        .find(&first)
        .unwrap_or_else(|| panic!("no row {pod} in {page}"));
    let rest = &page[start..];
    &rest[..rest.find("</tr>").unwrap()]
}

/// The `n`th `<td>` of a row, inside the `<data value>` that carries a figure exactly.
fn cell(row: &str, n: usize) -> &str {
    let rest = row.split("<td>").nth(n + 1).unwrap();
    let cell = &rest[..rest.find("</td>").unwrap()];
    match cell.strip_prefix("<data ") {
        Some(tagged) => tagged[tagged.find('>').unwrap() + 1..]
            .strip_suffix("</data>")
            .unwrap(),
        None => cell,
    }
}

/// The exact figure the `n`th `<td>` of a row carries (`<data value>`).
fn value(row: &str, n: usize) -> f64 {
    let rest = row.split("<td>").nth(n + 1).unwrap();
    let v = &rest[rest.find("value=\"").unwrap() + 7..];
    v[..v.find('"').unwrap()].parse().unwrap()
}

/// A GPU pod the scheduler has not placed: `mem` MiB of one `vendor` GPU.
fn pending_pod(ns: &str, name: &str, vendor: Vendor, mem: u64) -> k8s_openapi::api::core::v1::Pod {
    let names = vendor.names();
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}")},
        "spec": {"schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "app",
                "resources": {"limits": {names.resource_count: "1",
                    names.resource_memory: mem.to_string()}}}]},
        "status": {"phase": "Pending"}}))
    .unwrap()
}

fn failed_scheduling(uid: usize, ns: &str, pod: &str, note: &str) -> EventRow {
    EventRow {
        uid: format!("e{uid}"),
        source: "core",
        at: 900 + uid as i64,
        kind: "Pod".into(),
        namespace: ns.into(),
        name: pod.into(),
        reason: "FailedScheduling".into(),
        note: note.into(),
        warning: true,
    }
}

/// The demo's shapes with one monitor per node having answered at `1000`.
fn demo() -> (World, Metrics, String) {
    let (mut node, _) = captures();
    node.metadata.name = Some("mi210-node".into());
    let cards = amd_entries(&node);
    let (u0, ty) = (cards[0].id.clone(), cards[0].device_type.clone());
    let card = nvidia_card();
    let mut w = World::default();
    w.upsert_node(node);
    w.upsert_node(dra_node("mi210-dra-node"));
    w.upsert_slice(dra_slice("mi210-dra-node", &cards));
    w.upsert_node(plugin_node(
        "nvidia-node",
        Vendor::Nvidia,
        std::slice::from_ref(&card),
    ));
    w.upsert_pod(plugin_pod(
        "default",
        "infer",
        "mi210-node",
        Vendor::Amd,
        (&u0, &ty),
        (16384, 26),
    ));
    let (pod, claim) = dra_pod("ml", "train", "mi210-dra-node", "gpu-0", (8, 26));
    w.upsert_claim(claim);
    w.upsert_pod(pod);
    let nv = (card.id.as_str(), card.device_type.as_str());
    w.upsert_pod(plugin_pod(
        "default",
        "cuda",
        "nvidia-node",
        Vendor::Nvidia,
        nv,
        (4096, 25),
    ));
    w.upsert_pod(plugin_pod(
        "team",
        "near",
        "nvidia-node",
        Vendor::Nvidia,
        nv,
        (2048, 10),
    ));
    w.upsert_pod(pending_pod("team", "big-1", Vendor::Nvidia, 20000));
    w.upsert_pod(pending_pod("team", "big-2", Vendor::Nvidia, 20000));
    w.upsert_pod(pending_pod("default", "odd", Vendor::Amd, 1024));
    let full = "0/3 nodes are available: 3 Insufficient <gpu> memory";
    w.upsert_event(failed_scheduling(1, "team", "big-1", full));
    w.upsert_event(failed_scheduling(2, "team", "big-2", full));
    // One monitor per node, as the demo runs them.
    let bodies = [
        container_samples("default", "infer", &u0, 4096, 30.0),
        container_samples("ml", "train", &u0, 2048, 20.0),
        // cuda: 1 GiB of 4 and 30 % of the card against 25 % granted (over);
        // near: 1900 of 2048 MiB (93 %, near) at 5 % of 10 %.
        container_samples("default", "cuda", &card.id, 1024, 30.0)
            + &container_samples("team", "near", &card.id, 1900, 5.0),
    ];
    let mut m = Metrics::with_endpoints(
        &bodies
            .iter()
            .enumerate()
            .map(|(i, _)| format!("http://m{i}/metrics"))
            .collect::<Vec<_>>(),
    );
    m.ingest(
        1000,
        bodies.iter().map(|b| Ok(parse_samples(b))).collect(),
        &w,
    );
    (w, m, u0)
}

#[test]
fn the_pods_page_shows_what_the_pod_and_node_pages_show() {
    let (w, m, u0) = demo();
    let page = pods::pods(&w, &m, "", 1000);
    assert_eq!(page.status, 200);
    let page = page.html;
    assert!(
        page.contains("<a href=\"/pods\">Pods</a>"),
        "linked from the nav"
    );
    assert!(page.contains("7 of 7 GPU pods"), "{page}");

    // The plugin slice: granted as the pod page's GOT, used as the node page's slice row.
    let infer = row(&page, "default/infer");
    let pod_page = pages::pod(&w, &m, "default", "infer", 1000).html;
    let got = cell(&pod_page[pod_page.find("<tr><td>main</td>").unwrap()..], 3);
    assert!(got.starts_with(&crate::html::esc(&u0)), "{got}");
    assert!(cell(infer, 4).starts_with(got), "{infer} vs {got}");
    let asked = cell(&pod_page[pod_page.find("<tr><td>main</td>").unwrap()..], 2);
    assert_eq!(cell(infer, 3), asked);
    let node_page = pages::node(&w, &m, "mi210-node", 1000).html;
    let slice = &node_page[node_page
        .find("<tr><td><a href=\"/pods/default/infer\">")
        .unwrap()..];
    assert_eq!(cell(infer, 5), cell(slice, 2), "used: {infer}");
    assert!(cell(infer, 5).starts_with("4.0 GiB"), "{infer}");
    assert_eq!(cell(infer, 6), "25%", "4 of 16 GiB: {infer}");
    assert_eq!(
        (value(infer, 4), value(infer, 5), value(infer, 6)),
        (16384.0, 4096.0, 25.0),
        "{infer}"
    );

    // The DRA share: the claim's memory as the pod page's DRA section says it.
    let train = row(&page, "ml/train");
    let dra_page = pages::pod(&w, &m, "ml", "train", 1000).html;
    let share = &dra_page[dra_page.find("<h2>DRA shares</h2>").unwrap()..];
    let share = &share[share.find("<tbody><tr>").unwrap() + 7..];
    let claimed = cell(share, 4);
    assert!(
        cell(train, 4).contains(&format!(": {claimed}, 26 CUs")),
        "{train} vs {claimed}"
    );
    assert!(cell(train, 3).contains("claims gpu (DRA)"), "{train}");
    assert!(cell(train, 5).starts_with("2.0 GiB"), "{train}");
    assert!(cell(train, 2) == "running", "{train}");

    // Pending pods grouped by the scheduler's reason, escaped; a pod with no event has the
    // overview's words.
    let overview = pages::overview(&w, &m, "", 1000).html;
    let grouped = &page[page.find("Pending, by the scheduler").unwrap()..];
    let reason = "0/3 nodes are available: 3 Insufficient &lt;gpu&gt; memory";
    assert!(overview.contains(reason), "{overview}");
    assert!(
        grouped.contains(&format!("<tr><td>{reason}</td><td>2</td><td><a href=\"/pods/team/big-1\">team/big-1</a>, <a href=\"/pods/team/big-2\">team/big-2</a></td></tr>")),
        "{grouped}"
    );
    assert!(
        grouped.contains("<td>waiting for the scheduler (no scheduling event yet)</td><td>1</td>"),
        "{grouped}"
    );
    assert_eq!(cell(row(&page, "team/big-1"), 2), "pending");
    // The page's one-pass index is the pod and node pages' per-pod sum, key by key.
    let index = m.pod_devices();
    assert_eq!(index.len(), 4);
    for (ns, p, _, d) in m.latest.keys() {
        assert_eq!(
            index[&(ns.as_str(), p.as_str(), d.as_str())],
            m.pod_device(ns, p, d)
        );
    }
}

#[test]
fn pods_near_or_over_their_share_are_marked_in_words() {
    let (w, m, _) = demo();
    let page = pods::pods(&w, &m, "", 1000).html;
    let cuda = row(&page, "default/cuda");
    assert_eq!(cell(cuda, 6), "25%", "{cuda}");
    assert!(
        cell(cuda, 7).contains("30% of the card, 120% of its 25% grant"),
        "{cuda}"
    );
    assert_eq!(
        cell(cuda, 8),
        "<span class=\"bad\">over its share: compute 120% of its grant</span>"
    );
    let near = row(&page, "team/near");
    assert_eq!(cell(near, 6), "93%", "{near}");
    assert_eq!(
        cell(near, 8),
        "<strong>near its share: memory 93% of its limit</strong>"
    );
    // AMD's busy time is not set against CUs; 25 % of its memory is within.
    let infer = row(&page, "default/infer");
    assert!(
        cell(infer, 7).contains("30% busy (time busy, not a share of CUs)"),
        "{infer}"
    );
    assert_eq!(cell(infer, 8), "within");
    // A pod at 89 % is within (the threshold is 90).
    let rows = pods::pod_rows(&w, &m);
    let mut r = rows.iter().find(|r| r.key == "team/near").unwrap().clone();
    r.grants[0].used_mib = Some(2048.0 * 0.89);
    assert_eq!(r.share(), None);
    r.grants[0].used_mib = Some(2048.0 * 1.01);
    assert_eq!(r.share().map(|s| s.0), Some("over"));
}

#[test]
fn pods_filter_sort_and_name_a_bad_field() {
    let (w, m, _) = demo();
    let keys = |query: &str| -> Vec<String> {
        let page = pods::pods(&w, &m, query, 1000);
        assert_eq!(page.status, 200, "{query}: {}", page.html);
        let body = &page.html[page.html.find("<tbody>").unwrap()..];
        body.split("<tr><td><a href=\"/pods/")
            .skip(1)
            .map(|r| r[..r.find('"').unwrap()].to_owned())
            .collect()
    };
    assert_eq!(keys("ns=team&state=pending"), ["team/big-1", "team/big-2"]);
    assert_eq!(keys("node=nvidia-node"), ["default/cuda", "team/near"]);
    assert_eq!(keys("state=running&ns=ml"), ["ml/train"]);
    // Most memory used first; highest used/limit first; highest compute against grant first.
    let used = keys("sort=used&state=running");
    assert_eq!(used[..2], ["default/infer", "ml/train"]);
    assert_eq!(
        keys("sort=used-percent&node=nvidia-node"),
        ["team/near", "default/cuda"]
    );
    assert_eq!(
        keys("sort=utilization&node=nvidia-node"),
        ["default/cuda", "team/near"]
    );
    assert_eq!(keys("sort=granted&state=running")[0], "default/infer");

    for (query, field) in [
        ("sort=size", "sort=\"size\" is not one of pod, node"),
        (
            "state=sleeping",
            "state=\"sleeping\" is not one of running, pending",
        ),
        ("ns=%zz", "the query's \"ns\" is not valid form encoding"),
    ] {
        assert!(
            parse_query(query).unwrap_err().starts_with(field),
            "{query}"
        );
        let page = pods::pods(&w, &m, query, 1000);
        assert_eq!(page.status, 400, "{query}");
        assert!(
            page.html.contains(&crate::html::esc(field)),
            "{}",
            page.html
        );
    }
}

/// 250 more pending pods: pages of `per` rows that together are every row once, in the
/// sort's order, with links keeping the filters and the sort; the pending groups name 20
/// pods each and link the rest.
#[test]
fn pods_come_in_pages_whose_links_keep_filters_and_sort() {
    let (mut w, m, _) = demo();
    for i in 0..250 {
        w.upsert_pod(pending_pod("bulk", &format!("p-{i:03}"), Vendor::Amd, 1024));
    }
    let keys = |page: &str| -> Vec<String> {
        let body = &page[page.find("<tbody>").unwrap()..];
        body.split("<tr><td><a href=\"/pods/")
            .skip(1)
            .map(|r| r[..r.find('"').unwrap()].to_owned())
            .collect()
    };
    let all = keys(&pods::pods(&w, &m, "per=1000", 1000).html);
    assert_eq!(all.len(), 257);
    let first = pods::pods(&w, &m, "", 1000).html;
    assert_eq!(keys(&first).len(), pods::PER_PAGE, "the default page size");
    assert!(first.contains("pods 1–100 of 257"), "{first}");
    assert!(
        first.contains("<a href=\"/pods?sort=pod&amp;page=2\" rel=\"next\">Next</a>"),
        "{first}"
    );
    assert!(first.contains("page 1 of 3"));
    // Filtered and sorted by state, 40 a page: every bulk pod once, in order.
    let mut seen = Vec::new();
    for page in 1..=7 {
        let html = pods::pods(
            &w,
            &m,
            &format!("ns=bulk&sort=state&per=40&page={page}"),
            1000,
        )
        .html;
        if page < 7 {
            assert!(
                html.contains(&format!(
                    "<a href=\"/pods?sort=state&amp;ns=bulk&amp;per=40&amp;page={}\" rel=\"next\">Next</a>",
                    page + 1
                )),
                "{html}"
            );
        } else {
            assert!(!html.contains("rel=\"next\""), "the last page: {html}");
            assert!(html.contains("pods 241–250 of 250"), "{html}");
        }
        // The sort links keep the filter and the page size, and start at page 1.
        assert!(
            html.contains("<a href=\"/pods?sort=used&amp;ns=bulk&amp;per=40\">used</a>"),
            "{html}"
        );
        assert!(html.contains("<input type=\"hidden\" name=\"per\" value=\"40\">"));
        seen.extend(keys(&html));
    }
    let mut expected: Vec<String> = all
        .iter()
        .filter(|k| k.starts_with("bulk/"))
        .cloned()
        .collect();
    expected.sort();
    assert_eq!(seen, expected);
    // Past the last page: the last page; a bad page or size is a 400 naming it.
    let past = pods::pods(&w, &m, "ns=bulk&per=40&page=99", 1000).html;
    assert_eq!(keys(&past), expected[240..]);
    for (query, field) in [
        ("page=0", "page=&quot;0&quot; is not a page number"),
        (
            "per=100000",
            "per=&quot;100000&quot; is not a number of rows",
        ),
        ("page=18446744073709551616", "is not a page number"),
    ] {
        let page = pods::pods(&w, &m, query, 1000);
        assert_eq!(page.status, 400, "{query}");
        assert!(page.html.contains(field), "{query}: {}", page.html);
    }
    // 251 pending for one reason (with default/odd): 20 named, the rest counted and linked.
    assert!(
        first.contains("and 231 more (<a href=\"/pods?state=pending\">every pending pod</a>)"),
        "{first}"
    );
    assert!(
        first.len() < 120_000,
        "a page of 100 pods: {} bytes",
        first.len()
    );
}
