//! Least privilege for the NVIDIA device plugin, end to end: on the embedded API server
//! with authentication and RBAC on, the real plugin (NVML from the stand-in
//! `libnvidia-ml.so.1`, flags from its rendered DaemonSet) runs under its own
//! service-account token with exactly the shipped RBAC objects, beside a simulated kubelet.
//! It publishes the node (annotation + capacity), and a pod placed the way the scheduler
//! places it (annotations, node lock) is allocated and committed. Then: no request of the
//! plugin was refused, and every verb the plugin's rules grant was used (the one grant only
//! a race exercises, the lock owner's `get`, is named with its code path).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use hami_apiserver::authn::AuthConfig;
use hami_apiserver::{ApiServer, Config};
use hami_kubelet_sim::KubeletSim;
use hami_manifests::{Object, Settings, names, objects};
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::names::{NVIDIA, node as node_keys, pod as pod_keys};
use hami_protocol::node_lock::{NodeLock, PodRef};
use hami_protocol::node_register::decode_node_devices;
use serde_json::{Value, json};

const NODE: &str = "nv-node-1";
const SIM_KUBELET: &str = "sim-kubelet";

/// kube_shell.rs: the pod named by the node lock is read directly only when it is not (yet)
/// among the pods listed for the node.
const RACE_ONLY: &[(&str, &str)] = &[("pods", "get")];

fn plural(kind: &str) -> &'static str {
    match kind {
        "ServiceAccount" => "serviceaccounts",
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        other => panic!("unexpected RBAC kind {other}"),
    }
}

/// The stand-in NVML, built as this test's dependency, under the driver's file name.
fn driver_lib(scratch: &std::path::Path) -> PathBuf {
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let built = deps.join("libnvidia_ml.so");
    assert!(built.exists(), "{} was not built", built.display());
    let link = scratch.join("libnvidia-ml.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&built, &link).unwrap();
    link
}

async fn wait_until(limit: Duration, mut f: impl AsyncFnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidia_plugin_under_its_shipped_rbac_needs_every_grant_and_no_more() {
    let mut s = Settings::default();
    s.values.nvidia_device_plugin.enabled = true;
    // The conditional nodes/status grant is shipped, so it is exercised too.
    s.values.nvidia_device_plugin.report_node_capacity = true;
    let ns = s.namespace.clone();
    let server = ApiServer::start(Config {
        auth: Some(AuthConfig::default()),
        ..Config::default()
    })
    .await
    .unwrap();
    server
        .create_object(
            "v1",
            "namespaces",
            None,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .unwrap();
    let mut rbac: Vec<Value> = objects::rbac_objects(&s)
        .iter()
        .map(|o| o.to_value().unwrap())
        .collect();
    // The kubelet stand-in has the Node authorizer's rights in a cluster; here an admin role.
    rbac.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "cluster-admin"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}));
    rbac.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": SIM_KUBELET},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": SIM_KUBELET, "namespace": "kube-system"}]}));
    for v in &rbac {
        server
            .create_object(
                v["apiVersion"].as_str().unwrap(),
                plural(v["kind"].as_str().unwrap()),
                v["metadata"]["namespace"].as_str(),
                v.clone(),
            )
            .unwrap();
    }
    server
        .create_object(
            "v1",
            "nodes",
            None,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
        )
        .unwrap();
    let client_for = async |ns: &str, sa: &str| {
        let token = server.service_account_token(ns, sa).unwrap();
        let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml_with_token(&token))
            .unwrap();
        kube::Client::try_from(
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap(),
        )
        .unwrap()
    };
    let plugin_client = client_for(&ns, names::NVIDIA_DEVICE_PLUGIN).await;
    let kubelet = client_for("kube-system", SIM_KUBELET).await;

    let scratch = std::env::temp_dir().join(format!("hami-lp-nv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let sockets = scratch.join("device-plugins");
    std::fs::create_dir_all(&sockets).unwrap();
    let sim = KubeletSim::start(
        hami_kubelet_sim::Args {
            socket_dir: sockets.clone(),
            node_name: NODE.into(),
            record_dir: None,
            run_containers: false,
            runtime: Default::default(),
            sync_interval_ms: 50,
        },
        kubelet,
    )
    .await
    .unwrap();
    // The plugin's flags as its DaemonSet passes them; paths pointed at the scratch node.
    let Object::DaemonSet(ds) = objects::nvidia_device_plugin_daemon_set(&s) else {
        panic!()
    };
    let container = &ds.spec.unwrap().template.spec.unwrap().containers[0];
    let mut args = hami_nvidia_plugin::cli::Args::parse_from(
        std::iter::once("nvidia-device-plugin".to_string()).chain(container.args.clone().unwrap()),
    );
    args.nvml_library = driver_lib(&scratch).display().to_string();
    args.device_plugin_dir = sockets.clone();
    args.node_name = Some(NODE.into());
    args.hook_path = scratch.join("hook");
    args.register_interval = 1;
    args.pulse = 1;
    let settings = args.settings().unwrap();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(hami_nvidia_plugin::plugin::serve(
        args,
        settings,
        plugin_client,
        stop_rx,
    ));
    let node_annotation = || {
        server.get_object("v1", "nodes", "", NODE).unwrap()["metadata"]["annotations"]
            [NVIDIA.node_register]
            .as_str()
            .map(str::to_owned)
    };
    assert!(
        wait_until(Duration::from_secs(20), async || node_annotation()
            .is_some())
        .await,
        "the NVIDIA plugin never registered the node"
    );
    // And with kubelet: a pod that reaches a node before its plugin registered there fails
    // admission (UnexpectedAdmissionError), as with a real kubelet; the scheduler offers
    // only nodes whose kubelet reports the resource.
    let kubelet_reports = || {
        server.get_object("v1", "nodes", "", NODE).unwrap()["status"]["allocatable"]
            ["nvidia.com/gpu"]
            .as_str()
            .is_some_and(|n| n != "0")
    };
    assert!(
        wait_until(Duration::from_secs(20), async || kubelet_reports()).await,
        "the NVIDIA plugin never registered with kubelet"
    );
    let gpu = decode_node_devices(&node_annotation().unwrap()).unwrap()[0].clone();
    // What the scheduler writes at filter + bind, as an admin would see it written.
    let list = encode_pod_devices(&[vec![ContainerDevice {
        uuid: gpu.id.clone(),
        device_type: "NVIDIA".into(),
        mem_mib: 1024,
        cores: 30,
    }]])
    .unwrap();
    // The scheduler's order: the node lock first, then the binding that shows kubelet the
    // pod (kubelet-sim allocates a pod once, as soon as it sees it on its node).
    let lock = NodeLock::new(1_700_000_000, PodRef::new("default", "cuda-slice"))
        .encode()
        .unwrap();
    let patch = json!({"metadata": {"annotations": {node_keys::MUTEX_LOCK: lock}}});
    let admin = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml()).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    kube::Api::<k8s_openapi::api::core::v1::Node>::all(admin)
        .patch(NODE, &Default::default(), &kube::api::Patch::Merge(patch))
        .await
        .unwrap();
    server
        .create_object(
            "v1",
            "pods",
            Some("default"),
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "cuda-slice", "annotations": {
                    NVIDIA.devices_to_allocate: list, NVIDIA.devices_allocated: list,
                    pod_keys::VGPU_NODE: NODE, pod_keys::BIND_PHASE: "allocating",
                    pod_keys::BIND_TIME: "1700000000"}},
                "spec": {"nodeName": NODE, "schedulerName": "hami-scheduler", "containers": [
                    {"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
        )
        .unwrap();
    let committed = wait_until(Duration::from_secs(20), async || {
        server
            .get_object("v1", "pods", "default", "cuda-slice")
            .is_some_and(|p| p["metadata"]["annotations"][pod_keys::BIND_PHASE] == "success")
    })
    .await;
    assert!(committed, "the plugin never committed the pod");
    let me = format!("system:serviceaccount:{ns}:{}", names::NVIDIA_DEVICE_PLUGIN);
    let granted: BTreeSet<(String, String)> =
        hami_manifests::rbac::nvidia_device_plugin_cluster_rules(&s)
            .iter()
            .flat_map(|rule| {
                let verbs = rule.verbs.clone();
                rule.resources
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .flat_map(move |res| verbs.clone().into_iter().map(move |v| (res.clone(), v)))
            })
            .collect();
    // Periodic calls (publication, renewals) are in the log: every grant but the race-only
    // ones has been used (what the fixed 1.2 s wait used to hope for). On a timeout the
    // checks below name what is missing.
    let used_now = || -> BTreeSet<(String, String)> {
        server
            .request_log()
            .iter()
            .filter(|r| r.user.as_deref() == Some(me.as_str()))
            .map(|r| (r.resource.clone(), r.verb.clone()))
            .collect()
    };
    wait_until(Duration::from_secs(10), async || {
        let used = used_now();
        granted
            .iter()
            .all(|g| RACE_ONLY.contains(&(g.0.as_str(), g.1.as_str())) || used.contains(g))
    })
    .await;
    stop.send(true).unwrap();
    let _ = task.await;
    drop(sim);
    let _ = std::fs::remove_dir_all(&scratch);

    let log = server.request_log();
    let mine: Vec<_> = log
        .iter()
        .filter(|r| r.user.as_deref() == Some(me.as_str()))
        .collect();
    assert!(!mine.is_empty());
    let refused: Vec<_> = mine
        .iter()
        .filter(|r| r.status == 401 || r.status == 403)
        .map(|r| format!("{} {} {}", r.verb, r.resource, r.path))
        .collect();
    assert!(refused.is_empty(), "refused: {refused:?}");
    let used: BTreeSet<(String, String)> = mine
        .iter()
        .map(|r| (r.resource.clone(), r.verb.clone()))
        .collect();
    for g in &granted {
        let race = RACE_ONLY.contains(&(g.0.as_str(), g.1.as_str()));
        assert!(
            used.contains(g) != race,
            "{g:?}: {} (used: {used:?})",
            if race {
                "listed as race-only but used: check it with the rest"
            } else {
                "granted but never used: drop it or say which code needs it"
            }
        );
    }
    // Nothing used outside the grants (the server would have refused, but say so plainly).
    for u in &used {
        assert!(granted.contains(u), "{u:?} used without a grant");
    }
}
