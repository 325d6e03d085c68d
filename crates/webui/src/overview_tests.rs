//! The overview at issue 31 item 3 on the demo's shapes: headline tiles, the type
//! distribution, the Top-5 tables (busiest cards, most fragmented cards as `hami status`
//! measures them, allocated but idle pods) and the node table sorted and paged.

use hami_protocol::names::Vendor;
use hami_protocol::scrape::parse_samples;
use hami_report::report_from_state;
use serde_json::json;

use crate::fixtures::*;
use crate::pages;
use crate::samples::Metrics;
use crate::world::World;

/// An MI210 node (pods busy, idle, dozing, unsampled, and one taking nearly every CU of a
/// card), the NVIDIA stand-in card taken to 90 % of its compute, an idle MI210 node and a
/// pending pod; one monitor round at 1000.
fn fleet() -> (World, Metrics, Vec<String>) {
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
    let mut spare = cards[0].clone();
    spare.id = "SPARE-0".into();
    w.upsert_node(plugin_node("a-spare", Vendor::Amd, &[spare]));
    let mut body = String::new();
    for (i, (name, mem, cus, sample)) in [
        ("busy", 16384, 26, Some((8192, 90.0))),
        ("idle", 32768, 26, Some((1024, 0.0))),
        ("dozing", 4096, 13, Some((512, 0.5))),
        ("unsampled", 4096, 13, None),
        ("packed", 1024, 100, Some((1024, 50.0))),
    ]
    .into_iter()
    .enumerate()
    {
        w.upsert_pod(plugin_pod(
            "ml",
            name,
            "mi210-node",
            Vendor::Amd,
            (&ids[i], &ty),
            (mem, cus),
        ));
        if let Some((used, util)) = sample {
            body.push_str(&container_samples("ml", name, &ids[i], used, util));
        }
    }
    w.upsert_pod(plugin_pod(
        "team",
        "cuda",
        "nvidia-node",
        Vendor::Nvidia,
        (&nvidia.id, &nvidia.device_type),
        (4096, 90),
    ));
    body.push_str(&container_samples("team", "cuda", &nvidia.id, 2048, 95.0));
    w.upsert_pod(
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "wait", "namespace": "team", "uid": "uid-wait"},
            "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "main",
                "image": "app", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}))
        .unwrap(),
    );
    let mut m = Metrics::with_endpoints(&["http://monitor/metrics".into()]);
    m.ingest(1000, vec![Ok(parse_samples(&body))], &w);
    (w, m, ids)
}

/// The rows of the table under the heading whose id is `id`, up to the next heading.
fn rows_under<'a>(page: &'a str, id: &str) -> Vec<&'a str> {
    let start = page
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no {id} in {page}"));
    let rest = &page[start..];
    let end = rest[4..].find("<h").map_or(rest.len(), |e| e + 4);
    let part = &rest[..end];
    match part.find("<tbody>") {
        Some(b) => part[b..].split("<tr>").skip(1).collect(),
        None => Vec::new(),
    }
}

#[test]
fn tiles_distribution_and_top_fives() {
    let (w, m, ids) = fleet();
    let page = pages::overview(&w, &m, "", 1010);
    assert_eq!(page.status, 200, "{}", page.html);
    let html = page.html;
    // Tiles: 10 GPUs on 3 nodes; 62,464 of 606,208 MiB granted (10 %); used: the five
    // sampled cards' 12,800 MiB of their 4 × 64 + 16 GiB (5 %), busy (90 + 0 + 0.5 + 50 +
    // 95) / 5; one pending pod.
    assert!(
        html.contains(
            "<h2 id=\"tile-gpus\">GPUs</h2><p class=\"big\" data-gpus=\"10\">10</p><p>on 3 nodes, all healthy</p>"
        ),
        "{html}"
    );
    assert!(html.contains("<h2 id=\"tile-alloc\">Allocated</h2><p class=\"big\" data-granted-mib=\"62464\" data-of-mib=\"606208\">10%</p><p>of the memory (61.0 GiB of 592.0 GiB)"), "{html}");
    assert!(
        html.contains(
            "<p class=\"big\" data-used-mib=\"12800\" data-of-mib=\"278528\">5%</p><p>of the memory of the 5 cards reporting; 47% busy (mean)</p>"
        ),
        "{html}"
    );
    assert!(
        html.contains(
            "<h2 id=\"tile-pending\">Pending GPU pods</h2><p class=\"big\" data-pending=\"1\">1</p>"
        ),
        "{html}"
    );
    // The distribution says it in words too.
    assert!(html.contains("AMD Instinct MI210: 9 (90%)"), "{html}");
    assert!(html.contains("NVIDIA-Stand-in GPU: 1 (10%)"), "{html}");

    // Busiest: the NVIDIA card at 95 %, then card 0 (90 %), card 4 (50 %)...
    let busy = rows_under(&html, "top-busy");
    assert_eq!(busy.len(), 5, "{html}");
    assert!(
        busy[0].contains("nvidia-node") && busy[0].contains("<td>95% "),
        "{}",
        busy[0]
    );
    assert!(
        busy[1].contains(&ids[0]) && busy[1].contains("<td>90% "),
        "{}",
        busy[1]
    );
    assert!(busy[2].contains(&ids[4]), "{}", busy[2]);
    assert!(
        html.contains("By busy percent, of 5 cards reporting"),
        "{html}"
    );

    // Most fragmented, as `hami status` measures them: card 4 (4 CUs left: not even an
    // eighth fits its 64,512 free MiB) and the NVIDIA card (10 % left) first.
    let report = report_from_state(&w.state, w.pods.values(), &[]);
    let frag = rows_under(&html, "top-fragmented");
    assert!(frag.len() >= 2, "{html}");
    assert!(
        frag[0].contains(&ids[4])
            && frag[0].contains(
                "<td>63.0 GiB</td><td>none (not even 1/8)</td><td>100% of the free memory</td>"
            ),
        "{}",
        frag[0]
    );
    assert!(
        frag[1].contains("nvidia-node")
            && frag[1].contains("<td>12.0 GiB</td><td>none (not even 1/8)</td>"),
        "{}",
        frag[1]
    );
    for row in &frag {
        let g = report
            .nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .find(|g| row.contains(&format!(">{} <span", g.id)))
            .unwrap_or_else(|| panic!("{row}"));
        assert!(g.fragmentation > 0.0);
        assert!(
            row.contains(&format!(
                "{:.0}% of the free memory",
                g.fragmentation * 100.0
            )),
            "{row}"
        );
        let largest = g
            .largest_slice
            .map_or("none (not even 1/8)".to_owned(), |s| {
                format!("{s} of the card")
            });
        assert!(row.contains(&largest), "{row}");
    }

    // Idle: busy at most 1 % on everything held, most memory first; not the unsampled one.
    let idle = rows_under(&html, "top-idle");
    assert_eq!(idle.len(), 2, "{html}");
    assert!(
        idle[0].contains("/pods/ml/idle") && idle[0].contains("<td>32.0 GiB</td><td>0% "),
        "{}",
        idle[0]
    );
    assert!(idle[1].contains("/pods/ml/dozing"), "{}", idle[1]);
    assert!(!html.contains("/pods/ml/unsampled\">ml/unsampled</a></td><td><a href=\"/nodes/mi210-node\">mi210-node</a></td><td>4.0 GiB"));
}

#[test]
fn the_node_table_sorts_and_pages_and_names_a_bad_field() {
    let (w, m, _) = fleet();
    let nodes = |query: &str| -> Vec<String> {
        let page = pages::overview(&w, &m, query, 1010);
        assert_eq!(page.status, 200, "{query}");
        rows_under(&page.html, "nodes")
            .iter()
            .map(|r| {
                let r = &r[r.find("/nodes/").unwrap() + 7..];
                r[..r.find('"').unwrap()].to_owned()
            })
            .collect()
    };
    assert_eq!(nodes(""), ["a-spare", "mi210-node", "nvidia-node"]);
    assert_eq!(
        nodes("sort=granted"),
        ["mi210-node", "nvidia-node", "a-spare"]
    );
    assert_eq!(
        nodes("sort=in-use"),
        ["mi210-node", "nvidia-node", "a-spare"]
    );
    assert_eq!(nodes("sort=used"), ["mi210-node", "nvidia-node", "a-spare"]);
    assert_eq!(nodes("sort=granted&per=1&page=3"), ["a-spare"]);
    assert_eq!(nodes("sort=granted&per=2&page=2"), ["a-spare"]);
    let page = pages::overview(&w, &m, "sort=granted&per=1&page=2", 1010).html;
    assert!(page.contains("nodes 2–2 of 3"), "{page}");
    assert!(
        page.contains("<a href=\"/?sort=granted&amp;per=1&amp;page=3\" rel=\"next\">Next</a>"),
        "{page}"
    );
    assert!(
        page.contains("<a href=\"/?sort=used&amp;per=1\">memory used</a>"),
        "{page}"
    );
    for (query, said) in [
        (
            "sort=%3Cscript%3E",
            "sort=&quot;&lt;script&gt;&quot; is not one of node",
        ),
        ("page=-1", "page=&quot;-1&quot; is not a page number"),
        ("per=1001", "per=&quot;1001&quot; is not a number of rows"),
    ] {
        let page = pages::overview(&w, &m, query, 1010);
        assert_eq!(page.status, 400, "{query}");
        assert!(page.html.contains(said), "{query}: {}", page.html);
        assert!(!page.html.contains("<script>"));
    }
}
