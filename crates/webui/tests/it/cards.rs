//! `/cards` over real HTTP against the embedded API server: two nodes registering GPUs, one
//! of them with a slice taken; the route lists every card with what is free, filters by the
//! scheduler's fit (`?mem=`), sorts (`?sort=`), answers 400 naming a bad field, and carries
//! the security headers like every page.

use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use serde_json::json;

use crate::support::{get, register};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cards_route_lists_filters_and_sorts() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = ApiServer::start(Config::default()).await.unwrap();
    for (name, ids) in [("n1", ["CARD-A", "CARD-B"]), ("n2", ["CARD-C", "CARD-D"])] {
        server
            .create_object(
                "v1",
                "nodes",
                None,
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                    "annotations": {"hami.io/node-amd-register": register(&ids)}}}),
            )
            .unwrap();
    }
    // 40 GiB of CARD-A taken by a pod the scheduler placed.
    server
        .create_object(
            "v1",
            "pods",
            Some("default"),
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "train", "namespace": "default", "annotations": {
                    "hami.io/vgpu-node": "n1",
                    "hami.io/amd-devices-allocated": "CARD-A,AMD Instinct MI210,40960,26:;",
                    "hami.io/bind-phase": "success"}},
                "spec": {"nodeName": "n1", "schedulerName": "hami-scheduler",
                    "containers": [{"name": "main", "image": "rocm",
                        "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "40960"}}}]}}),
        )
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ui = hami_webui::start(client, listener, vec![], Duration::from_secs(5)).unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = get(ui.addr, "/cards".into()).await;
        if page.contains("4 of 4 cards") && page.contains("24576 of 65536 MiB") {
            break page;
        }
        assert!(Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        page.to_ascii_lowercase()
            .contains("content-security-policy:")
    );

    // 32 GiB fits everywhere but CARD-A (24 GiB free), by the scheduler's fit.
    let page = get(ui.addr, "/cards?mem=32768".into()).await;
    assert!(
        page.contains("3 of 4 cards and partitions take the slice"),
        "{page}"
    );
    assert!(!page.contains("<td>CARD-A</td>"), "{page}");
    // Least free memory last.
    let page = get(ui.addr, "/cards?sort=free-memory".into()).await;
    let last = page.rfind("<td>CARD-").unwrap();
    assert!(page[last..].starts_with("<td>CARD-A</td>"), "{page}");
    let page = get(ui.addr, "/cards?mem=plenty".into()).await;
    assert!(page.starts_with("HTTP/1.1 400"), "{page}");
    assert!(
        page.contains("mem=&quot;plenty&quot; is not a whole number of MiB"),
        "{page}"
    );
    ui.shutdown();
}
