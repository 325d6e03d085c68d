//! `hami status` against an API server: slices per GPU, free capacity, pending pods and
//! the scheduler's reason.

use std::process::Command;

use hami_apiserver::{ApiServer, Config};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_holders_free_capacity_and_why_pods_wait() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let register = r#"[{"id":"G1","index":1,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true},{"id":"G2","index":2,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":false}]"#;
    let n1 = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "annotations": {"hami.io/node-amd-register": register}}});
    api.create_object("v1", "nodes", None, n1.clone()).unwrap();
    api.create_object("v1", "nodes", None, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "broken", "annotations": {"hami.io/node-amd-register": "[{\"id\":1}]"}}}))
        .unwrap();
    let placed = |name: &str, list: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml", "annotations": {
            "hami.io/vgpu-node": "n1", "hami.io/amd-devices-allocated": list}},
            "spec": {"nodeName": "n1", "schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}})
    };
    api.create_object(
        "v1",
        "namespaces",
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}),
    )
    .unwrap();
    api.create_object(
        "v1",
        "pods",
        Some("ml"),
        placed("a", "G1,AMD Instinct MI210,8192,26:;"),
    )
    .unwrap();
    api.create_object(
        "v1",
        "pods",
        Some("ml"),
        placed("b", "G1,AMD Instinct MI210,4096,52:;"),
    )
    .unwrap();
    api.create_object("v1", "pods", Some("ml"), json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waiting", "namespace": "ml"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": "4"}}}]}}))
        .unwrap();
    api.create_object("events.k8s.io/v1", "events", Some("ml"), json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "waiting.1", "namespace": "ml"}, "eventTime": "2026-11-29T10:00:00.000000Z", "reason": "FilteringFailed",
        "action": "Filtering", "reportingController": "hami-scheduler", "reportingInstance": "x", "type": "Warning",
        "regarding": {"kind": "Pod", "namespace": "ml", "name": "waiting"}, "note": "no available node, 1 nodes do not meet: NodeInsufficientDevice"}))
        .unwrap();
    let kubeconfig =
        std::env::temp_dir().join(format!("hami-status-{}.kubeconfig", std::process::id()));
    api.write_kubeconfig(&kubeconfig).unwrap();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_hami"))
            .args(["status", "--kubeconfig"])
            .arg(&kubeconfig)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("Node n1 (2 GPUs, 1 idle)"), "{text}");
    let g1 = text
        .lines()
        .find(|l| l.trim_start().starts_with("G1 "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        g1.contains("2/10") && g1.contains("12288/65536 MiB") && g1.contains("53248 MiB"),
        "{g1}"
    );
    assert!(
        g1.contains("78/104 CUs") && g1.contains("26 CUs") && g1.contains("ml/a, ml/b"),
        "{g1}"
    );
    // LARGEST and FRAG are defrag-core's measure of the same card (26 CUs left: a 1/2
    // slice does not fit, a smaller one does).
    let mut state = hami_scheduler_core::state::ClusterState::new();
    state.upsert_node(&serde_json::from_value(n1).unwrap());
    for (name, list) in [
        ("a", "G1,AMD Instinct MI210,8192,26:;"),
        ("b", "G1,AMD Instinct MI210,4096,52:;"),
    ] {
        let mut pod = placed(name, list);
        pod["metadata"]["uid"] = json!(name);
        state.upsert_pod(&serde_json::from_value(pod).unwrap());
    }
    let card = &hami_defrag_core::measure_node(state.node("n1").unwrap()).cards[0];
    let largest = card.largest.expect("a 1/4 slice fits").as_str();
    assert!(largest != "1/2" && largest != "1/1", "{card:?}");
    let cells: Vec<&str> = g1.split_whitespace().collect();
    let frag = format!("{:.0}%", card.fragmentation * 100.0);
    assert!(
        cells.windows(2).any(|w| w == [largest, frag.as_str()]),
        "LARGEST {largest} FRAG {frag}: {g1}"
    );
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("G2 ") && l.contains("UNHEALTHY")),
        "an unhealthy GPU is listed: {text}"
    );
    assert!(
        text.contains("Node broken")
            && text.contains("problem: annotation hami.io/node-amd-register does not decode"),
        "{text}"
    );
    assert!(
        text.contains("ml/waiting: no available node, 1 nodes do not meet: NodeInsufficientDevice"),
        "{text}"
    );
}

/// A monitor's `/metrics`, served once per connection by a thread.
fn serve_metrics(body: &'static str) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            // The whole request, so closing does not reset the connection under it.
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_live_memory_and_utilization_from_monitors() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let kubeconfig = std::env::temp_dir().join(format!(
        "hami-status-live-{}.kubeconfig",
        std::process::id()
    ));
    api.write_kubeconfig(&kubeconfig).unwrap();
    let url = serve_metrics(concat!(
        "# TYPE hami_container_device_memory_bytes gauge\n",
        "hami_container_device_memory_bytes{namespace=\"ml\",pod=\"a\",container=\"c\",vdevice_index=\"0\",device_uuid=\"G1\",zone=\"vGPU\"} 4294967296\n",
        "hami_vgpu_memory_limit_bytes{namespace=\"ml\",pod=\"a\",container=\"c\",vdevice_index=\"0\",device_uuid=\"G1\",zone=\"vGPU\"} 8589934592\n",
        "hami_container_device_utilization_ratio{namespace=\"ml\",pod=\"a\",container=\"c\",vdevice_index=\"0\",device_uuid=\"G1\",zone=\"vGPU\"} 37\n",
    ));
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_hami"))
            .args(["status", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["--monitor", &url, "--monitor", "http://127.0.0.1:1/metrics"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("ml/a "))
        .unwrap_or_else(|| panic!("{text}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        ["ml/a", "c", "0", "G1", "4096/8192", "MiB", "37%"],
        "{text}"
    );
    assert!(
        text.contains("monitor unreadable: cannot connect to 127.0.0.1:1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_dra_devices_their_claims_pods_and_cu_ranges() {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    use kube::api::{Api, Patch, PatchParams};
    let api = ApiServer::start(Config::default()).await.unwrap();
    api.create_object(
        "v1",
        "namespaces",
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}),
    )
    .unwrap();
    // What the driver publishes for an MI210 node (dra-core's slice builder: one device per
    // GPU with memory, computeUnits and shares), one GPU tainted unhealthy.
    let gpu = |name: &str, uuid: &str, taints: serde_json::Value| {
        json!({"name": name, "allowMultipleAllocations": true,
            "attributes": {"uuid": {"string": uuid}, "productName": {"string": "AMD Instinct MI210"}},
            "capacity": {"memory": {"value": "64Gi"}, "computeUnits": {"value": "104"}, "shares": {"value": "10"}},
            "taints": taints})
    };
    api.create_object("resource.k8s.io/v1", "resourceslices", None, json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "dra-1-amdgpu"},
        "spec": {"driver": "amdgpu.hami-rs.io", "nodeName": "dra-1",
            "pool": {"name": "dra-1", "generation": 2, "resourceSliceCount": 1},
            "devices": [gpu("gpu-0", "GPU-a1", json!([])),
                        gpu("gpu-1", "GPU-a2", json!([{"key": "amdgpu.hami-rs.io/unhealthy", "effect": "NoSchedule", "timeAdded": "2026-12-01T10:00:00Z"}]))]}}))
        .unwrap();
    let kubeconfig =
        std::env::temp_dir().join(format!("hami-status-dra-{}.kubeconfig", std::process::id()));
    api.write_kubeconfig(&kubeconfig).unwrap();
    let client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client, "ml");
    for (name, share, mem, cus, pod, ranges) in [
        ("train-gpu", "s1", "16Gi", "26", Some("train"), Some("0-25")),
        ("infer-gpu", "s2", "8Gi", "52", None, None),
    ] {
        api.create_object("resource.k8s.io/v1", "resourceclaims", Some("ml"), json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "amdgpu.hami-rs.io"}}]}}}))
            .unwrap();
        let mut status = json!({"allocation": {"devices": {"results": [{"request": "gpu", "driver": "amdgpu.hami-rs.io",
            "pool": "dra-1", "device": "gpu-0", "shareID": share,
            "consumedCapacity": {"memory": mem, "computeUnits": cus, "shares": "1"}}]}}});
        if let (Some(pod), Some(ranges)) = (pod, ranges) {
            status["reservedFor"] = json!([{"resource": "pods", "name": pod, "uid": "u-1"}]);
            status["devices"] = json!([{"driver": "amdgpu.hami-rs.io", "pool": "dra-1", "device": "gpu-0",
                "shareID": share, "data": {"cuRanges": ranges, "memoryBytes": 17179869184u64}}]);
        }
        claims
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .unwrap();
    }
    let run = |args: &'static [&'static str]| {
        let kubeconfig = kubeconfig.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_hami"))
                .arg("status")
                .args(args)
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .output()
                .unwrap()
        })
    };
    let out = run(&[]).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // A DRA-only cluster is not "a cluster with no GPUs".
    assert!(!text.contains("No node registers GPUs"), "{text}");
    assert!(
        text.contains("DRA node dra-1 (2 devices, 1 idle)"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("dra-1/gpu-0 "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains("2/10")
            && row.contains("24576/65536 MiB")
            && row.contains("40960 MiB")
            && row.contains("78/104 CUs")
            && row.contains("26 CUs"),
        "{row}"
    );
    assert!(
        row.contains("ml/train (ml/train-gpu:gpu) CUs 0-25")
            && row.contains("ml/infer-gpu:gpu (no pod yet)"),
        "{row}"
    );
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("dra-1/gpu-1 ") && l.contains("TAINTED")),
        "a tainted device is listed: {text}"
    );
    let out = run(&["-o", "json"]).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["dra"][0]["devices"][0]["compute_units_used"], 78, "{v}");
    let holders = v["dra"][0]["devices"][0]["holders"].as_array().unwrap();
    let train = holders
        .iter()
        .find(|h| h["claim"] == "ml/train-gpu:gpu")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(train["pods"], json!(["ml/train"]));
    assert_eq!(train["cu_ranges"], "0-25");
}

/// A user who may read nodes, pods and events but not resource.k8s.io still gets the
/// device-plugin tables, and a warning on stderr says which rights the DRA section needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_without_dra_rights_shows_the_rest_and_says_what_dra_needs() {
    let api = ApiServer::start(Config {
        auth: Some(hami_apiserver::authn::AuthConfig::default()),
        ..Config::default()
    })
    .await
    .unwrap();
    let register = r#"[{"id":"G1","index":1,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#;
    api.create_object("v1", "nodes", None, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "annotations": {"hami.io/node-amd-register": register}}}))
        .unwrap();
    api.create_object(
        "v1",
        "namespaces",
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops"}}),
    )
    .unwrap();
    let rbac = "rbac.authorization.k8s.io/v1";
    api.create_object(
        rbac,
        "clusterroles",
        None,
        json!({"apiVersion": rbac, "kind": "ClusterRole",
        "metadata": {"name": "gpu-viewer"},
        "rules": [{"apiGroups": [""], "resources": ["nodes", "pods", "events"], "verbs": ["list"]},
                  {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["list"]}]}),
    )
    .unwrap();
    api.create_object(rbac, "clusterrolebindings", None, json!({"apiVersion": rbac, "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpu-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpu-viewer"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": "ops"}]}))
        .unwrap();
    let token = api.service_account_token("ops", "viewer").unwrap();
    let kubeconfig = std::env::temp_dir().join(format!(
        "hami-status-no-dra-{}.kubeconfig",
        std::process::id()
    ));
    std::fs::write(&kubeconfig, api.kubeconfig_yaml_with_token(&token)).unwrap();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_hami"))
            .args(["status", "--kubeconfig"])
            .arg(&kubeconfig)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{text}\n{err}");
    assert!(text.contains("n1"), "{text}");
    assert!(
        err.contains("warning: the DRA section is not shown: listing ResourceSlices was refused")
            && err.contains(
                "it needs list on resourceslices and resourceclaims (API group resource.k8s.io)"
            ),
        "{err}"
    );
}

mod hostile_text;
