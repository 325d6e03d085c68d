//! `/pods` over real HTTP against the embedded API server: a pod the scheduler placed and
//! one waiting; the route lists both with what was granted, groups the waiting one by
//! reason, filters (`?state=&node=`), pages (`?per=&page=`), answers 400 naming a bad field, and carries the security
//! headers like every page.

use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use serde_json::json;

use crate::support::{get, register};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pods_route_lists_filters_and_names_a_bad_field() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = ApiServer::start(Config::default()).await.unwrap();
    server
        .create_object(
            "v1",
            "nodes",
            None,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1",
                "annotations": {"hami.io/node-amd-register": register(&["CARD-A"])}}}),
        )
        .unwrap();
    // 40 GiB of CARD-A granted to a pod the scheduler placed; one more waiting.
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
    server
        .create_object(
            "v1",
            "pods",
            Some("default"),
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "wait-1", "namespace": "default"},
                "spec": {"schedulerName": "hami-scheduler",
                    "containers": [{"name": "main", "image": "rocm",
                        "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "99999"}}}]}}),
        )
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ui = hami_webui::start(client, listener, vec![], Duration::from_secs(5)).unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = get(ui.addr, "/pods".into()).await;
        if page.contains("2 of 2 GPU pods") {
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
    assert!(
        page.contains("CARD-A AMD Instinct MI210: 40960 MiB, 26 CUs"),
        "{page}"
    );
    // Waiting, and in the pending group under the overview's words.
    assert!(
        page.contains("<a href=\"/pods/default/wait-1\">default/wait-1</a>"),
        "{page}"
    );
    assert!(
        page.contains("<td>waiting for the scheduler (no scheduling event yet)</td><td>1</td>"),
        "{page}"
    );

    // The API server keeps no status on create: bound, no phase yet, so pending too.
    let page = get(ui.addr, "/pods?state=pending&node=n1".into()).await;
    assert!(page.contains("1 of 2 GPU pods"), "{page}");
    assert!(
        page.contains("<tr><td><a href=\"/pods/default/train\">"),
        "{page}"
    );
    let page = get(ui.addr, "/pods?state=running".into()).await;
    assert!(page.contains("0 of 2 GPU pods"), "{page}");
    // One pod a page: the second page, its links keeping the filter and the page size.
    let page = get(ui.addr, "/pods?ns=default&per=1&page=2".into()).await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("pods 2–2 of 2"), "{page}");
    assert!(
        page.contains(
            "<a href=\"/pods?sort=pod&amp;ns=default&amp;per=1\" rel=\"prev\">Previous</a>"
        ),
        "{page}"
    );
    assert!(page.contains("/pods/default/wait-1\">"), "{page}");
    let page = get(ui.addr, "/pods?page=0".into()).await;
    assert!(page.starts_with("HTTP/1.1 400"), "{page}");
    let page = get(ui.addr, "/pods?state=asleep".into()).await;
    assert!(page.starts_with("HTTP/1.1 400"), "{page}");
    assert!(
        page.contains("state=&quot;asleep&quot; is not one of running"),
        "{page}"
    );
    ui.shutdown();
}
