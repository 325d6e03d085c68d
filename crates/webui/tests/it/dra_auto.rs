//! `--dra=auto` (`hami ui`'s default): on a cluster with no node in DRA mode the UI makes
//! no resource.k8s.io request at all (a cluster without the API, or a role without the
//! rights, sees nothing refused); once a node is labelled `hami.io/amd-mode=dra` it watches
//! the driver's ResourceSlices and the ResourceClaims, and the node's page shows its DRA
//! devices, with no restart and no banner. `--dra=off` on the same cluster shows the banner
//! naming the flag instead. Real embedded API server, its request log as the witness.

use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config, RunningApiServer};
use hami_webui::DraWatch;
use serde_json::json;

async fn get(addr: std::net::SocketAddr, path: &'static str) -> String {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: ui\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap()
}

/// Waits (bounded) until the UI's `path` contains `needle`; the page on failure.
async fn page_with(ui: &hami_webui::RunningUi, path: &'static str, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let page = get(ui.addr, path).await;
        if page.contains(needle) {
            return page;
        }
        assert!(
            Instant::now() < deadline,
            "{path} never showed {needle:?}:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn start_ui(server: &RunningApiServer, dra: DraWatch) -> hami_webui::RunningUi {
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    hami_webui::start_with(client, listener, vec![], Duration::from_secs(5), dra).unwrap()
}

fn dra_requests(server: &RunningApiServer) -> Vec<String> {
    server
        .request_log()
        .iter()
        .filter(|r| r.api_group == "resource.k8s.io")
        .map(|r| format!("{} {}", r.verb, r.path))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_watches_dra_once_a_node_is_in_dra_mode_and_off_names_the_flag() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = ApiServer::start(Config::default()).await.unwrap();
    let node = |name: &str, labels: serde_json::Value| {
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels}})
    };
    server
        .create_object("v1", "nodes", None, node("plain", json!({})))
        .unwrap();
    let ui = start_ui(&server, DraWatch::Auto).await;
    page_with(&ui, "/nodes/plain", "HTTP/1.1 200").await;
    // A non-event: several of auto's looks at the nodes pass without a DRA request.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        dra_requests(&server),
        Vec::<String>::new(),
        "no node in DRA mode, yet a resource.k8s.io request"
    );

    server
        .create_object("resource.k8s.io/v1", "resourceslices", None, json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "dra-1-amdgpu-hami-rs-io-0"},
            "spec": {"driver": hami_protocol::dra::DRIVER, "nodeName": "dra-1",
                "pool": {"name": "dra-1", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "allowMultipleAllocations": true,
                    "attributes": {"uuid": {"string": "0xd1a"}, "productName": {"string": "AMD Instinct MI210"}},
                    "capacity": {"memory": {"value": "64Gi"}, "computeUnits": {"value": "104"},
                        "shares": {"value": "10"}}}]}}))
        .unwrap();
    server
        .create_object(
            "v1",
            "nodes",
            None,
            node("dra-1", json!({"hami.io/amd-mode": "dra"})),
        )
        .unwrap();
    let page = page_with(&ui, "/nodes/dra-1", "<h2>DRA devices (1)</h2>").await;
    assert!(page.contains("data-dra-device=\"dra-1/gpu-0\""), "{page}");
    assert!(!page.contains("--dra"), "no banner once watched: {page}");
    let seen = dra_requests(&server);
    for resource in ["resourceslices", "resourceclaims"] {
        assert!(
            seen.iter()
                .any(|r| r.starts_with("list ") && r.ends_with(resource)),
            "{resource} listed: {seen:?}"
        );
    }
    ui.shutdown();

    // Off: the same cluster, never a DRA request, and the banner says how to see them.
    server.clear_request_log();
    let ui = start_ui(&server, DraWatch::Off).await;
    let page = page_with(&ui, "/", "Node dra-1 is in DRA mode").await;
    assert!(page.contains("without --dra=off"), "{page}");
    ui.shutdown();
    assert_eq!(dra_requests(&server), Vec::<String>::new());
}
