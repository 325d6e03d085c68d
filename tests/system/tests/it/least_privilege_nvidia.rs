//! Least privilege for the NVIDIA device plugin, end to end: on the embedded API server
//! with authentication and RBAC on, the real plugin (NVML from the stand-in
//! `libnvidia-ml.so.1`, flags from its rendered DaemonSet) runs under its own
//! service-account token with exactly the shipped RBAC objects, beside a simulated kubelet.
//! It publishes the node (annotation + capacity), and a pod placed the way the scheduler
//! places it (annotations, node lock) is allocated and committed. Then: no request of the
//! plugin was refused, and every verb the plugin's rules grant was used (the one grant only
//! a race exercises, the lock owner's `get`, is named with its code path and may go unused). An XID injected
//! through the stand-in NVML makes the plugin record its Node Event under the events Role.

use std::collections::BTreeSet;
use std::time::Duration;

use clap::Parser;
use hami_manifests::{Object, Settings, names, objects};
use hami_plugin_harness::{nvml_driver_dir, start_kubelet, take_node_lock};
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::names::{NVIDIA, pod as pod_keys};
use hami_protocol::node_register::decode_node_devices;
use hami_system_tests::{
    SIM_KUBELET, admin_client, client_for, cluster_admin_for, create_node, in_child_with_env,
    refused, requests_of, service_account_user, start_authed_server, to_values, wait_until,
};
use serde_json::json;

const NODE: &str = "nv-node-1";

/// plugin-core node_pods.rs: the pod named by the node lock is read directly only when the
/// node's pod watch has not shown it within 500 ms (a run may or may not do so).
const RACE_ONLY: &[(&str, &str)] = &[("pods", "get")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidia_plugin_under_its_shipped_rbac_needs_every_grant_and_no_more() {
    let _machine = crate::MACHINE.read().await;
    // XIDs for the stand-in NVML, which the plugin loads into this process, come from the
    // file this variable names: the body runs in a child process started with it.
    let parent_scratch = std::env::temp_dir().join(format!("hami-lp-nv-{}", std::process::id()));
    let xid_file = parent_scratch.join("xids");
    if !in_child_with_env(
        "least_privilege_nvidia::nvidia_plugin_under_its_shipped_rbac_needs_every_grant_and_no_more",
        &[("FAKE_NVML_XID_FILE", xid_file.as_os_str())],
    ) {
        let _ = std::fs::remove_dir_all(&parent_scratch);
        return;
    }
    let xid_file = std::path::PathBuf::from(std::env::var_os("FAKE_NVML_XID_FILE").unwrap());
    let scratch = xid_file.parent().unwrap().to_path_buf();
    let mut s = Settings::default();
    s.values.nvidia_device_plugin.enabled = true;
    // The conditional nodes/status grant is shipped, so it is exercised too.
    s.values.nvidia_device_plugin.report_node_capacity = true;
    let ns = s.namespace.clone();
    let mut rbac = to_values(&objects::rbac_objects(&s));
    // The kubelet stand-in has the Node authorizer's rights in a cluster; here an admin role.
    rbac.extend(cluster_admin_for(SIM_KUBELET));
    let server = start_authed_server(&[&ns], &rbac).await;
    create_node(&server, NODE);
    let plugin_client = client_for(&server, &ns, names::NVIDIA_DEVICE_PLUGIN).await;
    let kubelet = client_for(&server, "kube-system", SIM_KUBELET).await;

    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    // The XIDs are written after the pod is committed (a critical XID on its GPU before
    // would refuse the pod).
    std::fs::write(&xid_file, "").unwrap();
    let sockets = scratch.join("device-plugins");
    std::fs::create_dir_all(&sockets).unwrap();
    let sim = start_kubelet(sockets.clone(), NODE, kubelet).await;
    // The plugin's flags as its DaemonSet passes them; paths pointed at the scratch node.
    let Object::DaemonSet(ds) = objects::nvidia_device_plugin_daemon_set(&s) else {
        panic!()
    };
    let container = &ds.spec.unwrap().template.spec.unwrap().containers[0];
    let mut args = hami_nvidia_plugin::cli::Args::parse_from(
        std::iter::once("nvidia-device-plugin".to_string()).chain(container.args.clone().unwrap()),
    );
    // The stand-in NVML, built as this test's dependency, under the driver's file name.
    args.nvml_library = nvml_driver_dir(&scratch)
        .join("libnvidia-ml.so.1")
        .display()
        .to_string();
    args.device_plugin_dir = sockets.clone();
    args.node_name = Some(NODE.into());
    args.hook_path = scratch.join("hook");
    hami_plugin_harness::install_stub_hook(&args.hook_path, "libvgpu.so");
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
    take_node_lock(&admin_client(&server).await, NODE, "cuda-slice").await;
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
    // A critical XID (79: fallen off the bus) on its GPU, now that the pod has it: the
    // plugin marks the GPU unhealthy and records NVIDIAGPUUnhealthy in `default`.
    std::fs::write(&xid_file, format!("{} 79\n", gpu.index)).unwrap();
    let me = service_account_user(&ns, names::NVIDIA_DEVICE_PLUGIN);
    let granted: BTreeSet<(String, String)> =
        hami_manifests::rbac::nvidia_device_plugin_cluster_rules(&s)
            .iter()
            .chain(&hami_manifests::rbac::nvidia_device_plugin_event_rules())
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
    let mine = requests_of(&log, &me);
    assert!(!mine.is_empty());
    let refused = refused(&mine);
    assert!(refused.is_empty(), "refused: {refused:?}");
    let used: BTreeSet<(String, String)> = mine
        .iter()
        .map(|r| (r.resource.clone(), r.verb.clone()))
        .collect();
    for g in &granted {
        // A race-only grant may or may not be used in a run; every other one must be.
        let race = RACE_ONLY.contains(&(g.0.as_str(), g.1.as_str()));
        assert!(
            race || used.contains(g),
            "{g:?}: granted but never used: drop it or say which code needs it (used: {used:?})"
        );
    }
    // Nothing used outside the grants (the server would have refused, but say so plainly).
    for u in &used {
        assert!(granted.contains(u), "{u:?} used without a grant");
    }
}
