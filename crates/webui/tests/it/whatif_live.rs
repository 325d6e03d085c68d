//! `/whatif/live` and `/whatif/defrag` over real HTTP against the embedded API server (issue
//! 31 item 8, issue 32 item 2): two MI210 nodes each half taken by a replica of one
//! ReplicaSet (just started: the form's minimum age is set to 0) under a budget allowing one
//! disruption, and a 48 GiB pod that waits. "+1 node like n1" places it; the defrag form
//! plans the one move that makes room with its budget (listed for the plan) and shows the
//! commands; a node that is not one, a pending pod deleted since the page was shown, a post
//! from another site and an oversized form are each refused with what to change.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::json;

use crate::support::{get, register};

/// `POST path` with a form `body` (and `extra` header lines): the status and the answer.
async fn post(addr: SocketAddr, path: &str, body: &str, extra: &str) -> (u16, String) {
    let (path, body, extra) = (path.to_owned(), body.to_owned(), extra.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: ui\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\n{extra}Content-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        // A form past the UI's size is refused on its declared length: its body is not
        // sent (the UI closes the connection without reading it, and unread bytes would
        // reset the answer away).
        if body.len() <= 16 * 1024 {
            s.write_all(body.as_bytes()).unwrap();
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let status = out
            .get(9..12)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (status, out)
    })
    .await
    .unwrap()
}

fn pod(name: &str, node: Option<&str>, mib: u64) -> serde_json::Value {
    let mut limits = json!({"amd.com/gpu": "1", "amd.com/gpumem": mib.to_string()});
    let mut meta = json!({"name": name, "namespace": "default"});
    let mut spec = json!({"schedulerName": "hami-scheduler",
        "containers": [{"name": "main", "image": "rocm"}]});
    if let Some(node) = node {
        limits["amd.com/gpucores"] = json!("25");
        let card = if node == "n1" { "CARD-A" } else { "CARD-B" };
        meta["annotations"] = json!({"hami.io/vgpu-node": node,
            "hami.io/amd-devices-allocated": format!("{card},AMD Instinct MI210,{mib},26:;"),
            "hami.io/bind-phase": "success"});
        meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "name": "web", "uid": "uid-web", "controller": true}]);
        meta["labels"] = json!({"app": "web"});
        spec["nodeName"] = json!(node);
    }
    spec["containers"][0]["resources"] = json!({"limits": limits});
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
        "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_what_if_and_defrag_routes_plan_and_refuse_bad_input() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = ApiServer::start(Config::default()).await.unwrap();
    for (name, id) in [("n1", "CARD-A"), ("n2", "CARD-B")] {
        server
            .create_object(
                "v1",
                "nodes",
                None,
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                    "annotations": {"hami.io/node-amd-register": register(&[id])}}}),
            )
            .unwrap();
    }
    for (name, node, mib) in [
        ("web-a", Some("n1"), 32768),
        ("web-b", Some("n2"), 32768),
        ("wait", None, 49152),
    ] {
        server
            .create_object("v1", "pods", Some("default"), pod(name, node, mib))
            .unwrap();
    }
    // The replicas' budget allows one disruption: the plan may move one, and says so.
    server
        .create_object(
            "policy/v1",
            "poddisruptionbudgets",
            Some("default"),
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "web-pdb", "namespace": "default"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
                "status": {"disruptionsAllowed": 1, "currentHealthy": 2, "desiredHealthy": 1,
                    "expectedPods": 2}}),
        )
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ui = hami_webui::start(client.clone(), listener, vec![], Duration::from_secs(5)).unwrap();

    // The form lists the waiting pod and the nodes once the watches have them.
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = get(ui.addr, "/whatif/live".into()).await;
        if page.contains("<option value=\"default/wait\">")
            && page.contains("<option value=\"n2\">")
        {
            break page;
        }
        assert!(Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let whatif = get(ui.addr, "/whatif".into()).await;
    assert!(whatif.contains("<a href=\"/whatif/live\">"), "{whatif}");

    // +1 node like n1: the waiting pod is placed there.
    let (status, page) = post(ui.addr, "/whatif/live", "add=1&like=n1", "").await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("2 → 3 nodes, 2 → 3 GPUs. Of 1 waiting pod(s), 0 would be placed now and 1 after the edits"),
        "{page}"
    );
    assert!(page.contains("/nodes/n1-whatif-1"), "{page}");
    // Removing n2: web-b is planned again (onto n1's free half).
    let (status, page) = post(ui.addr, "/whatif/live", "remove=n2", "").await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("1 of the 1 GPU pod(s) of the removed node(s) find room again"),
        "{page}"
    );
    // Bad edits: 400 with what to change, the fields echoed escaped.
    let (status, page) = post(ui.addr, "/whatif/live", "add=1&like=n%3Cb%3E9", "").await;
    assert_eq!(status, 400, "{page}");
    assert!(
        page.contains("the cluster has no node of that name") && page.contains("n&lt;b&gt;9"),
        "{page}"
    );
    assert!(!page.contains("n<b>9"), "{page}");
    let (status, page) = post(ui.addr, "/whatif/live", "add=1000&like=n1", "").await;
    assert_eq!(status, 413, "{page}");
    assert!(page.contains("at most 100 nodes"), "{page}");

    // The defrag plan: one move makes room; the UI shows the commands, runs none.
    let (status, page) = post(
        ui.addr,
        "/whatif/defrag",
        "target=pod&pod=default%2Fwait&min_age=0",
        "",
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("<strong>reached</strong> (1 move(s), shortfall 1 → 0)"),
        "{page}"
    );
    assert!(
        page.contains("hami defrag plan --pending-pod default/wait --min-age-seconds 0 -o yaml &gt; defrag-plan.yaml"),
        "{page}"
    );
    assert!(page.contains("<td>default/web-pdb allows 1</td>"), "{page}");
    // The UI may not list the budgets (a role without list on them): the plan
    // is still made, says why the budgets were not read, and shows none.
    server
        .faults()
        .fail_next(Some("list"), Some("poddisruptionbudgets"), 1, 403);
    let (status, page) = post(
        ui.addr,
        "/whatif/defrag",
        "target=pod&pod=default%2Fwait&min_age=0",
        "",
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("the UI may not list poddisruptionbudgets")
            && page.contains("<td>not read (the commands below check it)</td>")
            && page.contains("<strong>reached</strong>"),
        "{page}"
    );
    let pods: Api<Pod> = Api::namespaced(client, "default");
    assert!(
        pods.get("web-a").await.is_ok() && pods.get("web-b").await.is_ok(),
        "the UI evicted a pod"
    );
    // The pending pod is deleted after the page was shown: the plan says so.
    pods.delete("wait", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let (status, page) = post(
            ui.addr,
            "/whatif/defrag",
            "target=pod&pod=default%2Fwait&min_age=0",
            "",
        )
        .await;
        if status == 400 {
            break page;
        }
        assert!(Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        page.contains("pod default/wait is no longer in the cluster"),
        "{page}"
    );

    // Posted from another site: 403, nothing planned.
    let (status, page) = post(
        ui.addr,
        "/whatif/defrag",
        "target=percent&percent=50",
        "Sec-Fetch-Site: cross-site\r\n",
    )
    .await;
    assert_eq!(status, 403, "{page}");
    assert!(!page.contains("Defrag plan</h2>"), "{page}");
    // A form past the UI's size: 413 before it is read.
    let huge = format!("add=1&like={}", "n".repeat(20_000));
    let (status, page) = post(ui.addr, "/whatif/live", &huge, "").await;
    assert_eq!(status, 413, "{page}");
    assert!(page.contains("larger than the UI accepts"), "{page}");
    ui.shutdown();
}
