//! Least privilege for the web UI, end to end: on the embedded API server with
//! authentication and RBAC on, the real UI (`hami_webui::start_with`, flags from its
//! rendered Deployment) runs under its own service-account token with exactly the shipped
//! RBAC objects, while a node, a GPU pod, its PodDisruptionBudget and Events of both APIs
//! exist. Its pages show them (the defrag preview the budget it listed); no request was
//! refused; every granted verb was used; and nothing it did writes. In both install modes:
//! - DRA (`hami manifests --dra` / `draPlugin.enabled`): also a DRA node with the driver's
//!   ResourceSlice and a pod's allocated ResourceClaim, which its pages show;
//! - not DRA: its role has no resource.k8s.io rule and it asks for no such resource (no
//!   `--dra=off`); and a UI started with `--dra` under that role anyway gets its refusals only
//!   there, shows no banner for them (no node is in DRA mode) and keeps its pages.

use std::collections::BTreeSet;
use std::time::Duration;

use clap::Parser;
use hami_apiserver::{RequestRecord, RunningApiServer};
use hami_manifests::{Object, Settings, names, objects};
use hami_system_tests::{
    admin_client, client_for, refused, requests_of, service_account_user, start_authed_server,
    to_values,
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    ui: hami_webui::UiArgs,
}

/// The settings `hami manifests --webui [--dra]` renders with.
fn settings(dra: bool) -> Settings {
    let mut argv = vec!["hami-manifests", "--webui"];
    if dra {
        argv.extend(["--dra", "--kube-version", "v1.36.0"]);
    }
    ManifestsCli::parse_from(argv).args.settings().unwrap()
}

/// `hami manifests`' flags.
#[derive(Parser)]
struct ManifestsCli {
    #[command(flatten)]
    args: hami_manifests::ManifestsArgs,
}

/// The shipped RBAC objects and an authenticating server holding them.
async fn server_for(s: &Settings) -> (Vec<Value>, RunningApiServer) {
    let ns = s.namespace.clone();
    let rbac = to_values(&objects::rbac_objects(s));
    assert!(
        rbac.iter().any(|v| v["metadata"]["name"] == names::WEBUI),
        "webui RBAC shipped when enabled"
    );
    let server = start_authed_server(&[&ns, "ml"], &rbac).await;
    (rbac, server)
}

/// A device-plugin GPU node, a pod on it (the only replica of its ReplicaSet) under a
/// PodDisruptionBudget allowing no disruption, and an Event of each API about the pod.
fn create_plugin_objects(server: &RunningApiServer) {
    let register = r#"[{"id":"G1","index":1,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#;
    server
        .create_object("v1", "nodes", None, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1", "annotations": {"hami.io/node-amd-register": register}}}))
        .unwrap();
    server
        .create_object("v1", "pods", Some("ml"), json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "train", "namespace": "ml", "labels": {"app": "train"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train",
                    "uid": "uid-train-rs", "controller": true}],
                "annotations": {
                "hami.io/vgpu-node": "gpu-node-1", "hami.io/amd-devices-allocated": "G1,AMD Instinct MI210,8192,26:;",
                "hami.io/amd-cu-allocated": "{\"G1\":\"0-25\"}", "hami.io/bind-phase": "success"}},
            "spec": {"nodeName": "gpu-node-1", "schedulerName": "hami-scheduler", "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}))
        .unwrap();
    server
        .create_object(
            "policy/v1",
            "poddisruptionbudgets",
            Some("ml"),
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "train-pdb", "namespace": "ml"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}},
                "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1,
                    "expectedPods": 1}}),
        )
        .unwrap();
    server
        .create_object(
            "v1",
            "events",
            Some("ml"),
            json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "train.1", "namespace": "ml"},
            "involvedObject": {"kind": "Pod", "namespace": "ml", "name": "train"},
            "reason": "Started", "type": "Normal", "message": "core event seen"}),
        )
        .unwrap();
    server
        .create_object("events.k8s.io/v1", "events", Some("ml"), json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "train.2", "namespace": "ml"}, "eventTime": "2026-12-01T10:00:00.000000Z",
            "reportingController": "hami-scheduler", "reportingInstance": "hami-scheduler-0", "action": "Binding",
            "regarding": {"kind": "Pod", "namespace": "ml", "name": "train"},
            "reason": "BindingSucceed", "type": "Normal", "note": "new event seen"}))
        .unwrap();
}

/// A DRA node: its devices in the driver's slice, a pod's share in an allocated claim
/// (the status through the status subresource, as the scheduler and driver write it).
async fn create_dra_objects(server: &RunningApiServer) {
    let driver = hami_protocol::dra::DRIVER;
    server
        .create_object(
            "v1",
            "nodes",
            None,
            json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "dra-node-1", "labels": {"hami.io/amd-mode": "dra"}}}),
        )
        .unwrap();
    server
        .create_object("resource.k8s.io/v1", "resourceslices", None, json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "dra-node-1-amdgpu-hami-rs-io-0"},
            "spec": {"driver": driver, "nodeName": "dra-node-1",
                "pool": {"name": "dra-node-1", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "allowMultipleAllocations": true,
                    "attributes": {"uuid": {"string": "0xd1a"}, "productName": {"string": "AMD Instinct MI210"}},
                    "capacity": {"memory": {"value": "64Gi"}, "computeUnits": {"value": "104"},
                        "shares": {"value": "10"}}}]}}))
        .unwrap();
    server
        .create_object("v1", "pods", Some("ml"), json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "dra-train", "namespace": "ml"},
            "spec": {"nodeName": "dra-node-1",
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "dra-train-gpu"}],
                "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]},
            "status": {"phase": "Running"}}))
        .unwrap();
    server
        .create_object("resource.k8s.io/v1", "resourceclaims", Some("ml"), json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "dra-train-gpu", "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": driver}}]}}}))
        .unwrap();
    Api::<ResourceClaim>::namespaced(admin_client(server).await, "ml")
        .patch_status(
            "dra-train-gpu",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": driver,
                "pool": "dra-node-1", "device": "gpu-0", "shareID": "s1",
                "consumedCapacity": {"memory": "16Gi", "computeUnits": "52", "shares": "1"}}]}},
            "reservedFor": [{"resource": "pods", "name": "dra-train", "uid": "u-dra-train"}],
            "devices": [{"driver": driver, "pool": "dra-node-1", "device": "gpu-0", "shareID": "s1",
                "data": {"cuRanges": "0-51", "memoryBytes": 17179869184u64}}]}})),
        )
        .await
        .unwrap();
}

/// The UI's flags from its rendered Deployment, parsed by the binary's own parser.
fn deployment_flags(s: &Settings) -> Cli {
    // The flags as the Deployment passes them are the binary's flags.
    let Object::Deployment(d) = objects::webui_deployment(s) else {
        panic!()
    };
    let container = &d.spec.unwrap().template.spec.unwrap().containers[0];
    assert_eq!(
        container.command.as_deref(),
        Some(&["/hami-webui".to_string()][..])
    );
    let cli = Cli::parse_from(
        std::iter::once("hami-webui".to_string()).chain(container.args.clone().unwrap()),
    );
    assert_eq!(cli.ui.listen.port(), names::WEBUI_PORT as u16);
    assert_eq!(
        cli.ui.dra,
        if s.values.dra_plugin.enabled {
            hami_webui::DraWatch::On
        } else {
            hami_webui::DraWatch::Off
        },
        "--dra exactly in the DRA mode (with its rules), else --dra=off"
    );
    cli
}

/// Starts the UI under the web UI's service account, DRA watches as `dra`.
async fn start_ui(
    server: &RunningApiServer,
    s: &Settings,
    cli: &Cli,
    dra: hami_webui::DraWatch,
) -> hami_webui::RunningUi {
    let client = client_for(server, &s.namespace, names::WEBUI).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    hami_webui::start_with(
        client,
        listener,
        cli.ui.monitors.clone(),
        Duration::from_secs(5),
        dra,
    )
    .unwrap()
}

/// Sends `request` (a whole HTTP/1.1 request) to the UI: the raw HTTP answer.
async fn http(addr: std::net::SocketAddr, request: String) -> String {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap()
}

/// `GET path` from the UI: the raw HTTP answer.
async fn get(addr: std::net::SocketAddr, path: &'static str) -> String {
    http(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: ui\r\nConnection: close\r\n\r\n"),
    )
    .await
}

/// `POST path` of the form `body` to the UI: the raw HTTP answer.
async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> String {
    http(
        addr,
        format!(
            "POST {path} HTTP/1.1\r\nHost: ui\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await
}

/// Waits for the pod page to show both Events, then checks the plugin node's CU map.
async fn check_plugin_pages(ui: &hami_webui::RunningUi) {
    let get = |path: &'static str| get(ui.addr, path);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let page = get("/pods/ml/train").await;
        if page.contains("core event seen") && page.contains("new event seen") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each watcher syncs on its own: the node page can still be a 404 when the pod's is
    // complete (seen in CI); wait for it, bounded, then check it whole.
    let node = loop {
        let page = get("/nodes/gpu-node-1").await;
        if page.contains("data-owner=\"ml/train\"") {
            break page;
        }
        assert!(std::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        node.matches("data-owner=\"ml/train\"").count(),
        26,
        "{node}"
    );
}

/// The defrag preview (`/whatif/defrag`) lists the PodDisruptionBudgets under the UI's
/// role: freeing the card `ml/train` holds, that pod stays because its budget allows no
/// disruption. Had the list been refused, the page would say the budgets were not read
/// and its preview would ignore them (the pod then is not kept in place).
async fn check_defrag_reads_budgets(ui: &hami_webui::RunningUi) {
    let page = post(
        ui.addr,
        "/whatif/defrag",
        "target=cards&type=MI210&count=1&single=on&min_age=0",
    )
    .await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        !page.contains("PodDisruptionBudgets were not read"),
        "{page}"
    );
    assert!(
        page.contains(
            "<li>ml/train: PodDisruptionBudget ml/train-pdb allows no disruption now</li>"
        ),
        "{page}"
    );
}

/// The (group, resource, verb) triples the shipped hami-webui ClusterRole grants.
fn granted(rbac: &[Value]) -> BTreeSet<(String, String, String)> {
    let role = rbac
        .iter()
        .find(|v| v["kind"] == "ClusterRole" && v["metadata"]["name"] == names::WEBUI)
        .expect("the web UI's ClusterRole");
    let rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule> =
        serde_json::from_value(role["rules"].clone()).unwrap();
    rules
        .iter()
        .flat_map(|rule| {
            let group = rule.api_groups.clone().unwrap_or_default()[0].clone();
            let verbs = rule.verbs.clone();
            rule.resources
                .clone()
                .unwrap_or_default()
                .into_iter()
                .flat_map(move |res| {
                    let group = group.clone();
                    verbs
                        .clone()
                        .into_iter()
                        .map(move |v| (group.clone(), res.clone(), v))
                })
        })
        .collect()
}

/// The pages can be served from a watcher's first list before its watch request is made
/// (a CI run stopped the UI in between): waits, bounded, for `me` to use every granted
/// verb before the UI is stopped; [`check_least_privilege`] still names any never used.
async fn wait_for_every_grant_used(
    server: &RunningApiServer,
    me: &str,
    granted: &BTreeSet<(String, String, String)>,
) {
    hami_system_tests::wait_until(Duration::from_secs(15), async || {
        let log = server.request_log();
        let used: BTreeSet<(String, String, String)> = requests_of(&log, me)
            .iter()
            .map(|r| (r.api_group.clone(), r.resource.clone(), r.verb.clone()))
            .collect();
        granted.is_subset(&used)
    })
    .await;
}

/// Both directions of least privilege over `mine` (the UI's requests): nothing refused,
/// every granted verb used, nothing used without a grant, no write.
fn check_least_privilege(mine: &[&RequestRecord], granted: &BTreeSet<(String, String, String)>) {
    assert!(!mine.is_empty());
    let refused = refused(mine);
    assert!(refused.is_empty(), "refused: {refused:?}");
    let used: BTreeSet<(String, String, String)> = mine
        .iter()
        .filter(|r| !r.resource.is_empty())
        .map(|r| (r.api_group.clone(), r.resource.clone(), r.verb.clone()))
        .collect();
    for g in granted {
        assert!(
            used.contains(g),
            "{g:?} granted but never used (used: {used:?})"
        );
    }
    for u in &used {
        assert!(granted.contains(u), "{u:?} used without a grant");
        assert!(
            matches!(u.2.as_str(), "get" | "list" | "watch"),
            "{u:?}: the UI must not write"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webui_under_its_shipped_rbac_reads_everything_it_shows_and_writes_nothing() {
    let _machine = crate::MACHINE.read().await;
    let s = settings(true);
    let ns = s.namespace.clone();
    let (rbac, server) = server_for(&s).await;
    create_plugin_objects(&server);
    create_dra_objects(&server).await;
    let cli = deployment_flags(&s);
    let ui = start_ui(&server, &s, &cli, cli.ui.dra).await;
    check_plugin_pages(&ui).await;
    check_defrag_reads_budgets(&ui).await;
    let get = |path: &'static str| get(ui.addr, path);
    // The DRA node's device with the pod's 52 CUs, and the pod's share on its page.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let dra_node = loop {
        let page = get("/nodes/dra-node-1").await;
        if page.matches("data-owner=\"ml/dra-train\"").count() == 52 {
            break page;
        }
        assert!(std::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        dra_node.contains("Memory (MiB): 16384 of 65536 MiB granted"),
        "{dra_node}"
    );
    let dra_pod = loop {
        let page = get("/pods/ml/dra-train").await;
        if page.contains("ml/dra-train-gpu:gpu") {
            break page;
        }
        assert!(std::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        dra_pod.contains("<td>ml/dra-train-gpu:gpu</td><td>16.0 GiB</td><td>16.0 GiB</td><td>52 CUs</td><td>0-51</td>"),
        "{dra_pod}"
    );
    let overview = get("/").await;
    assert!(
        overview.contains("href=\"/nodes/dra-node-1\""),
        "{overview}"
    );
    assert!(!overview.contains("cannot be read"), "{overview}");
    let me = service_account_user(&ns, names::WEBUI);
    let granted = granted(&rbac);
    wait_for_every_grant_used(&server, &me, &granted).await;
    ui.shutdown();

    let log = server.request_log();
    let mine = requests_of(&log, &me);
    assert!(
        granted.iter().any(|g| g.0 == "resource.k8s.io"),
        "the DRA mode grants the DRA reads: {granted:?}"
    );
    check_least_privilege(&mine, &granted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webui_without_dra_holds_and_asks_for_no_dra_resource() {
    let _machine = crate::MACHINE.read().await;
    let s = settings(false);
    let ns = s.namespace.clone();
    let (rbac, server) = server_for(&s).await;
    let granted = granted(&rbac);
    assert!(
        granted.iter().all(|g| g.0 != "resource.k8s.io"),
        "no resource.k8s.io rule without the DRA mode: {granted:?}"
    );
    create_plugin_objects(&server);
    let cli = deployment_flags(&s);
    let ui = start_ui(&server, &s, &cli, cli.ui.dra).await;
    check_plugin_pages(&ui).await;
    check_defrag_reads_budgets(&ui).await;
    let overview = get(ui.addr, "/").await;
    assert!(
        overview.contains("href=\"/nodes/gpu-node-1\""),
        "{overview}"
    );
    assert!(!overview.contains("cannot be read"), "{overview}");
    assert!(!overview.contains("Still listing"), "{overview}");
    assert!(!overview.contains("DRA mode"), "{overview}");
    let me = service_account_user(&ns, names::WEBUI);
    wait_for_every_grant_used(&server, &me, &granted).await;
    ui.shutdown();
    let log = server.request_log();
    let mine = requests_of(&log, &me);
    assert!(
        mine.iter().all(|r| r.api_group != "resource.k8s.io"),
        "a DRA request without the DRA mode: {:?}",
        mine.iter()
            .filter(|r| r.api_group == "resource.k8s.io")
            .map(|r| &r.path)
            .collect::<Vec<_>>()
    );
    check_least_privilege(&mine, &granted);
    let seen = log.len();

    // Misconfigured: --dra under the role without DRA rules. The refusals are of the DRA
    // reads only; no node is in DRA mode, so no banner, and the pages work.
    let ui = start_ui(&server, &s, &cli, hami_webui::DraWatch::On).await;
    check_plugin_pages(&ui).await;
    let me_refused =
        |log: &[RequestRecord]| -> Vec<String> { refused(&requests_of(&log[seen..], &me)) };
    assert!(
        hami_system_tests::wait_until(Duration::from_secs(20), async || {
            let r = me_refused(&server.request_log());
            r.iter().any(|r| r.contains("resourceslices"))
                && r.iter().any(|r| r.contains("resourceclaims"))
        })
        .await,
        "both DRA lists refused: {:?}",
        me_refused(&server.request_log())
    );
    let overview = get(ui.addr, "/").await;
    assert!(!overview.contains("cannot be read"), "{overview}");
    assert!(!overview.contains("Still listing"), "{overview}");
    assert!(
        overview.contains("href=\"/nodes/gpu-node-1\""),
        "{overview}"
    );
    ui.shutdown();
    for r in me_refused(&server.request_log()) {
        assert!(
            r.contains("resourceslices") || r.contains("resourceclaims"),
            "only the DRA reads are refused: {r}"
        );
    }
}
