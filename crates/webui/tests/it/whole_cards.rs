//! The node page lists whole cards held by pods HAMi did not place (issue 26 item 1): the
//! device plugin's `hami.io/<vendor>-whole-cards` record, as the scheduler's state counts
//! it (`ClusterState::whole_card_holdings`), is a row on the card naming the holder, with
//! the card's memory and compute.

use hami_webui::pages;
use hami_webui::samples::Metrics;
use hami_webui::world::World;
use serde_json::json;

fn world() -> World {
    let mut w = World::default();
    w.upsert_node(
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "annotations": {
                "hami.io/node-amd-register": r#"[{"id":"CARD-A","count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true},{"id":"CARD-B","count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#}}}))
        .unwrap(),
    );
    // A plain pod (webhook opt-out) the AMD plugin handed CARD-B whole.
    w.upsert_pod(
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "plain", "namespace": "ml", "uid": "u1",
                "labels": {"hami.io/webhook": "ignore"},
                "annotations": {"hami.io/amd-whole-cards": "CARD-B"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "rocm",
                "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}))
        .unwrap(),
    );
    w
}

/// The HTML of the card section `id`.
fn card<'a>(page: &'a str, id: &str) -> &'a str {
    let start = page
        .find(&format!("data-card=\"{id}\""))
        .unwrap_or_else(|| panic!("no card {id} in {page}"));
    let rest = &page[start..];
    &rest[..rest.find("</section>").unwrap()]
}

#[test]
fn a_card_held_whole_lists_its_holder_with_the_whole_card() {
    let w = world();
    let page = pages::node(&w, &Metrics::default(), "n1", 1000).html;
    let held = card(&page, "CARD-B");
    assert!(!held.contains("No slices."), "{held}");
    assert!(
        held.contains("<a href=\"/pods/ml/plain\">ml/plain</a> (whole card)"),
        "{held}"
    );
    assert!(held.contains("<td>65536 MiB</td>"), "{held}");
    assert!(held.contains("<td>104 CUs</td>"), "{held}");
    // The other card is free; no holder is listed there.
    let free = card(&page, "CARD-A");
    assert!(
        free.contains("No slices.") && !free.contains("ml/plain"),
        "{free}"
    );
}
