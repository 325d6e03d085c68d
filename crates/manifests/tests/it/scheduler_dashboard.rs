//! Both Grafana dashboards define every `$variable` their queries use (an undefined one is
//! matched literally and the panel is empty). The scheduler's Grafana dashboard (deploy/grafana/hami-rs-scheduler.json) plots only
//! metrics the scheduler emits (every `hami_*` name in its queries appears in a scrape of
//! a state with a GPU, a pod on it and one filter and bind observed; the refusal counter's
//! fixed reason set is emitted from the start), and each panel's
//! unit matches the family it plots.

use std::time::Duration;

use hami_scheduler::metrics::Metrics;
use hami_scheduler::state::ClusterState;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

fn scrape() -> String {
    let mut state = ClusterState::new();
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": {
        "hami.io/node-amd-register": r#"[{"id":"G","index":0,"count":10,"devmem":1024,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#}}})).unwrap();
    state.upsert_node(&node);
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {
        "hami.io/vgpu-node": "n1", "hami.io/amd-devices-allocated": "G,AMD Instinct MI210,512,26:;"}},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]}})).unwrap();
    state.upsert_pod(&pod);
    let m = Metrics::new();
    m.observe_filter(Duration::from_millis(2), true);
    m.observe_bind(Duration::from_millis(3), false);
    m.render(&state)
}

#[test]
fn every_scheduler_panel_plots_an_emitted_metric() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana/hami-rs-scheduler.json"
    );
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let body = scrape();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 7);
    // Issue 13 item 12: refusals by reason, from the counter with the fixed reason set.
    let refusals = panels
        .iter()
        .find(|p| {
            p["title"]
                .as_str()
                .is_some_and(|t| t.starts_with("Filter refusals by reason"))
        })
        .expect("a \"Filter refusals by reason\" panel");
    let expr = refusals["targets"][0]["expr"].as_str().unwrap();
    assert!(
        expr.contains("hami_scheduler_filter_refusals_total") && expr.contains("by (reason)"),
        "{expr}"
    );
    for p in panels {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let mut rest = expr;
            let mut names = Vec::new();
            while let Some(at) = rest.find("hami_") {
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                names.push(&tail[..end]);
                rest = &tail[end..];
            }
            assert!(!names.is_empty(), "{}: no hami metric", p["title"]);
            for name in names {
                assert!(
                    body.lines().any(|l| l.starts_with(&format!("{name}{{"))),
                    "{}: {name} is plotted but not emitted:\n{body}",
                    p["title"]
                );
                assert!(expr.contains("zone=\"vGPU\""), "{expr}");
            }
            let unit = p["fieldConfig"]["defaults"]["unit"].as_str().unwrap();
            let want = if expr.contains("_bytes") {
                "bytes"
            } else if expr.contains("histogram_quantile") {
                "s"
            } else if expr.contains("_seconds_count{") {
                "reqps"
            } else if expr.contains("_ratio") {
                "percent"
            } else {
                "short"
            };
            assert_eq!(unit, want, "{}: {expr}", p["title"]);
        }
    }
}

#[test]
fn every_query_variable_is_defined() {
    for file in ["hami-rs-scheduler.json", "hami-rs-vgpu.json"] {
        let path = format!("{}/../../deploy/grafana/{file}", env!("CARGO_MANIFEST_DIR"));
        let d: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let defined: Vec<&str> = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        let mut texts: Vec<String> = d["panels"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| p["targets"].as_array().unwrap().clone())
            .map(|t| t["expr"].as_str().unwrap().to_string())
            .collect();
        texts.extend(
            d["templating"]["list"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|v| v["definition"].as_str().map(str::to_string)),
        );
        for text in texts {
            let mut rest = text.as_str();
            while let Some(at) = rest.find('$') {
                let tail = &rest[at + 1..];
                let tail = tail.strip_prefix('{').unwrap_or(tail);
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                let name = &tail[..end];
                assert!(
                    defined.contains(&name),
                    "{file}: ${name} is used but not defined (defined: {defined:?})"
                );
                rest = &tail[end..];
            }
        }
    }
}
