//! The defragmentation gauges (issue 32, D-30) as a scrape of `/metrics` reads them, on a
//! fragmented node, against `hami_defrag_core::measure` of the scheduler's own state.

use std::collections::BTreeMap;

use hami_defrag_core::{Shape, measure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::common::{api, create_node, start_scheduler, wait};
use crate::http_api::request;

/// Two MI210s split 10 ways (1000 MiB, 100 CUs each) and an A100 (40000 MiB, 100 %).
const REGISTER_AMD: &str = r#"[{"id":"A0","index":0,"count":10,"devmem":1000,"devcore":100,"type":"AMD Instinct MI210","health":true},{"id":"A1","index":1,"count":10,"devmem":1000,"devcore":100,"type":"AMD Instinct MI210","health":true}]"#;
const REGISTER_NVIDIA: &str = r#"[{"id":"N0","index":0,"count":10,"devmem":40000,"devcore":100,"type":"NVIDIA A100-SXM4-40GB","health":true}]"#;

/// A pod hami-scheduler placed on node `n`, holding `allocated` (`<vendor>-devices-allocated`).
async fn placed(client: &kube::Client, name: &str, key: &str, allocated: &str, limit: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": {
            "hami.io/vgpu-node": "n", key: allocated}},
        "spec": {"schedulerName": "hami-scheduler", "nodeName": "n", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {limit: "1"}}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// `name{labels} value` lines of the scrape whose labels contain every `want`, by name.
fn series(text: &str, name: &str, want: &[(&str, &str)]) -> Vec<(String, f64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.rsplit_once("} ")?;
            want.iter()
                .all(|(k, v)| labels.contains(&format!(r#"{k}="{v}""#)))
                .then(|| (labels.to_owned(), value.parse().unwrap()))
        })
        .collect()
}

fn one(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    let found = series(text, name, want);
    assert_eq!(found.len(), 1, "{name} {want:?}: {found:?} in\n{text}");
    found[0].1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_defrag_gauges_match_the_measure_of_a_fragmented_node() {
    let (_api, client) = api().await;
    create_node(
        &client,
        json!({"annotations": {"hami.io/node-amd-register": REGISTER_AMD,
            "hami.io/node-nvidia-register": REGISTER_NVIDIA}}),
        json!({"capacity": {"amd.com/gpu": "20", "nvidia.com/gpu": "10"},
            "allocatable": {"amd.com/gpu": "20", "nvidia.com/gpu": "10"}}),
    )
    .await;
    // A0: 600 MiB and 20 CUs taken (a 1/4 still fits, a 1/2 does not); A1: every CU taken,
    // 700 MiB stranded; N0: 30 % of compute and 1000 MiB taken.
    let amd = "hami.io/amd-devices-allocated";
    placed(
        &client,
        "a",
        amd,
        "A0,AMD Instinct MI210,600,20:;",
        "amd.com/gpu",
    )
    .await;
    placed(
        &client,
        "b",
        amd,
        "A1,AMD Instinct MI210,300,100:;",
        "amd.com/gpu",
    )
    .await;
    let nvidia = "hami.io/vgpu-devices-allocated";
    placed(
        &client,
        "c",
        nvidia,
        "N0,NVIDIA,1000,30:;",
        "nvidia.com/gpu",
    )
    .await;

    let scheduler = start_scheduler(&client);
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = metrics.local_addr().unwrap().port();
    tokio::spawn(hami_scheduler::http::serve_on(
        hami_scheduler::http::metrics_router(scheduler.clone()),
        metrics,
        None,
    ));
    let s = scheduler.clone();
    wait("the scheduler holds the three pods", move || {
        let n = s.state().holdings().count();
        async move { n == 3 }
    })
    .await;
    let nodes: Vec<_> = scheduler.state().nodes().cloned().collect();
    let want = measure(&nodes);
    let text = tokio::task::spawn_blocking(move || request(port, "GET", "/metrics", b""))
        .await
        .unwrap();
    assert_eq!(text.0, 200, "{}", text.1);
    let text = text.1;

    let mib = 1_048_576.0;
    let node = &want.nodes[0];
    // The fixture is fragmented: memory is free and stranded, and a 1/2 slice fits no
    // MI210 although their free memory adds up to more than one.
    let a0 = &node.cards[0];
    let a1 = &node.cards[1];
    assert!(
        a1.stranded_mib > 0 && a0.largest < Some(Shape::Half),
        "{node:?}"
    );
    assert!(a0.free_mib + a1.free_mib > 500, "{node:?}");
    assert!(
        node.cards[2].free_mib < node.cards[2].total_mib,
        "N0 counts its pod: {node:?}"
    );
    for card in &node.cards {
        let at = [("node", "n"), ("device_uuid", card.card.as_str())];
        assert_eq!(
            one(&text, "hami_gpu_memory_free_bytes", &at),
            card.free_mib as f64 * mib
        );
        assert_eq!(
            one(&text, "hami_gpu_memory_stranded_bytes", &at),
            card.stranded_mib as f64 * mib
        );
        // Both types have 100 cores (CUs, percent): percent equals cores here.
        assert_eq!(
            one(&text, "hami_gpu_core_free_ratio", &at),
            card.free_cores as f64
        );
        assert_eq!(
            one(&text, "hami_gpu_core_stranded_ratio", &at),
            card.stranded_cores as f64
        );
        assert_eq!(
            one(&text, "hami_gpu_fragmentation_ratio", &at),
            card.fragmentation
        );
        let shapes: BTreeMap<String, f64> = series(&text, "hami_gpu_largest_slice", &at)
            .into_iter()
            .collect();
        assert_eq!(
            shapes.len(),
            Shape::ALL.len(),
            "one series per shape: {shapes:?}"
        );
        for shape in Shape::ALL {
            let mut at = at.to_vec();
            at.push(("shape", shape.as_str()));
            let value = one(&text, "hami_gpu_largest_slice", &at);
            assert_eq!(
                value == 1.0,
                card.largest == Some(shape),
                "{} {shape:?}: {value}",
                card.card
            );
        }
    }
    let at = [("node", "n")];
    assert_eq!(
        one(&text, "hami_node_gpu_memory_free_bytes", &at),
        node.totals.free_mib as f64 * mib
    );
    assert_eq!(
        one(&text, "hami_node_gpu_memory_stranded_bytes", &at),
        node.totals.stranded_mib as f64 * mib
    );
    assert_eq!(
        one(&text, "hami_node_gpu_fragmentation_ratio", &at),
        node.totals.fragmentation
    );
    let largest = node.largest.expect("the A100 takes a 1/2").as_str();
    assert_eq!(
        one(
            &text,
            "hami_node_gpu_largest_slice",
            &[("node", "n"), ("shape", largest)]
        ),
        1.0
    );
    for (vendor, t) in [("amd", &want.amd), ("nvidia", &want.nvidia)] {
        let at = [("vendor", vendor)];
        assert_eq!(
            one(&text, "hami_cluster_gpu_memory_free_bytes", &at),
            t.free_mib as f64 * mib
        );
        assert_eq!(
            one(&text, "hami_cluster_gpu_memory_stranded_bytes", &at),
            t.stranded_mib as f64 * mib
        );
        assert_eq!(
            one(&text, "hami_cluster_gpu_core_free_ratio", &at),
            t.free_cores as f64
        );
        assert_eq!(
            one(&text, "hami_cluster_gpu_fragmentation_ratio", &at),
            t.fragmentation
        );
        assert_eq!(
            one(&text, "hami_cluster_gpu_idle_cards", &at),
            t.idle_cards as f64
        );
    }
    // Every new family has help and a type, as promtool wants.
    for family in [
        "hami_gpu_memory_free_bytes",
        "hami_gpu_largest_slice",
        "hami_node_gpu_fragmentation_ratio",
        "hami_cluster_gpu_idle_cards",
    ] {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "{family}:\n{text}"
        );
        assert!(
            text.contains(&format!("# TYPE {family} gauge")),
            "{family}:\n{text}"
        );
    }
}
