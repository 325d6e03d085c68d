//! Least privilege, end to end: on the embedded API server with authentication and RBAC on,
//! the scheduler (extender + webhook + leader election), the AMD device plugin, the monitor
//! and the node labeller each run under their own service account with exactly the RBAC
//! objects of `hami_manifests::objects::rbac_objects`, while the simulated kube-scheduler
//! and the simulated kubelet (which in a cluster have their own built-in rights) run under
//! separate identities. A GPU pod goes webhook → filter → bind → Allocate → running, the
//! monitor finds its container's GPU process without the memory hook and posts
//! `SliceNotEnforced` on it (issue 29), and a GPU turns unhealthy.
//!
//! Checked both ways:
//! - nothing any component asked for was refused (no 401/403 in the request log);
//! - every verb of every shipped rule is needed: removing it from its rule denies at least
//!   one request the components actually made (replayed through the server's authorizer);
//! - and for real: with `create` removed from `pods/binding`, the pod is not bound and the
//!   scheduler's bind is answered 403.
//!
//! Not exercised here: the kube-webhook-certgen roles (a third-party image), the
//! sidecar's Lease name in the scheduler's Role (the simulated kube-scheduler does not
//! elect), and the grants listed in `RACE_ONLY` with the code path that needs them.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hami_apiserver::RequestRecord;
use hami_apiserver::rbac::{Policy, ResourceAttributes};
use hami_kube_scheduler_sim::front::SchedulerFront;
use hami_manifests::{Object, Settings, names, objects};
use hami_plugin_harness::start_kubelet;
use hami_protocol::names::{AMD, node as node_keys, pod as pod_keys};
use hami_protocol::node_lock::{NodeLock, PodRef};
use hami_scheduler::leader::{ElectionConfig, Leadership};
use hami_scheduler::runtime::Scheduler;
use hami_system_tests::grants::{self, RaceOnly, policy_of};
use hami_system_tests::{
    SIM_KUBELET, admin_client, client_for, cluster_admin_for, create_node, service_account_user,
    start_authed_server, to_values, wait_until,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NODE: &str = "gpu-node-1";
const SIM_SCHEDULER: &str = "sim-kube-scheduler";
/// The node a user's forged `vgpu-node` patch names (refused by the webhook, D-4).
const FORGED_NODE: &str = "forged-node";

fn settings() -> Settings {
    let mut s = Settings::default();
    // The conditional nodes/status grant is shipped, so it is exercised too.
    s.values.device_plugin.report_node_capacity = true;
    s
}

/// The shipped RBAC objects, plus the rights the stand-ins for kube-scheduler and kubelet
/// have in a real cluster (bootstrap roles and the Node authorizer), as test-only roles.
fn rbac(settings: &Settings) -> Vec<Object> {
    let mut out = objects::rbac_objects(settings);
    let mut extra: Vec<Value> = vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": SIM_SCHEDULER},
               "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list", "watch"]},
                         {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": SIM_SCHEDULER},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SIM_SCHEDULER},
               "subjects": [{"kind": "ServiceAccount", "name": SIM_SCHEDULER, "namespace": "kube-system"}]}),
    ];
    extra.extend(cluster_admin_for(SIM_KUBELET));
    for v in extra {
        out.push(match v["kind"].as_str().unwrap() {
            "ClusterRole" => Object::ClusterRole(serde_json::from_value(v).unwrap()),
            _ => Object::ClusterRoleBinding(serde_json::from_value(v).unwrap()),
        });
    }
    out
}

fn user(sa: &str) -> String {
    service_account_user(&settings().namespace, sa)
}

struct Outcome {
    log: Vec<RequestRecord>,
    bound: bool,
    running: bool,
    unhealthy_event: bool,
    labelled: bool,
    /// The monitor's SliceNotEnforced Event landed on the pod.
    slice_not_enforced: bool,
}

/// Runs the whole flow with the given RBAC objects; `expect_success` shortens the waits
/// of a run that is meant to fail. Before stopping, waits (bounded) until the request log
/// holds what the test's checks need (`settled`): periodic calls (register, renew) come in
/// their own time.
async fn run_flow(
    rbac_objects: Vec<Object>,
    expect_success: bool,
    settled: impl Fn(&[RequestRecord]) -> bool,
) -> Outcome {
    let s = settings();
    let ns = s.namespace.clone();
    let server = start_authed_server(&[&ns], &to_values(&rbac_objects)).await;
    create_node(&server, NODE);
    let admin = admin_client(&server).await;
    let sched = client_for(&server, &ns, names::SCHEDULER).await;
    let plugin = client_for(&server, &ns, names::DEVICE_PLUGIN).await;
    let monitor = client_for(&server, &ns, names::MONITOR).await;
    let labeller = client_for(&server, &ns, names::NODE_LABELLER).await;
    let sim_sched = client_for(&server, "kube-system", SIM_SCHEDULER).await;
    let kubelet = client_for(&server, "kube-system", SIM_KUBELET).await;

    // Node: sysfs with one RDNA3 card, the kubelet stand-in, the device plugin.
    let tree = hami_sysfs_fixtures::rdna_node(&[hami_sysfs_fixtures::Rdna::Gfx11]).unwrap();
    let sockets = tree.sysfs_root().parent().unwrap().join("device-plugins");
    let sim = start_kubelet(sockets.clone(), NODE, kubelet.clone()).await;
    let dp = objects::device_plugin_args(&s);
    let mut args = hami_amd_plugin::cli::Args::parse_from(
        std::iter::once("k8s-device-plugin".to_string()).chain(dp),
    );
    args.sysfs_root = tree.sysfs_root();
    args.dev_root = tree.dev_root();
    args.device_plugin_dir = sockets.clone();
    args.node_name = Some(NODE.into());
    args.register_interval = 1;
    args.pulse = 1;
    args.cgroup_root = tree.sysfs_root().join("fs/cgroup");
    args.host_hook_path = tree.sysfs_root().parent().unwrap().join("hook");
    hami_plugin_harness::install_stub_hook(&args.host_hook_path, "libamvgpu.so");
    let reg = args.registration_settings().unwrap();
    let (stop_plugin, stop_rx) = tokio::sync::watch::channel(false);
    let plugin_task = tokio::spawn(hami_amd_plugin::plugin::serve(args, reg, plugin, stop_rx));

    // Monitor: its node-scoped pod informer.
    let informer = hami_monitor::pods::PodInformer::start(
        monitor.clone(),
        NODE,
        &settings().values.scheduler.scheduler_name,
    );

    // Node labeller: what k8s-node-labeller's refresh does (get the Node, patch labels).
    let discovery = hami_amd_discovery::discovery::discover(&tree.sysfs_root()).unwrap();
    let nodes: Api<Node> = Api::all(labeller);
    let current = nodes
        .get(NODE)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    let patch = hami_node_labeller::label_patch(&current, &hami_node_labeller::labels(&discovery));
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": patch}})),
        )
        .await
        .unwrap();

    // Scheduler: leader election on the shipped Lease, extender + webhook over HTTPS.
    let leadership = Arc::new(Leadership::elected());
    tokio::spawn(hami_scheduler::leader::run(
        sched.clone(),
        ElectionConfig {
            namespace: ns.clone(),
            name: names::SCHEDULER_LEASE.into(),
            identity: "hami-scheduler-0".into(),
            lease_duration: Duration::from_secs(3),
            renew_interval: Duration::from_millis(300),
        },
        leadership.clone(),
    ));
    let sched_settings = hami_scheduler::config::Settings::default();
    let scheduler = Scheduler::start(sched.clone(), sched_settings.clone(), leadership);
    // Over HTTPS, the shipped webhook configuration pointed at this process (created as
    // the installer would, not under a component's account), kube-scheduler's account
    // calling the extender.
    let front = SchedulerFront::start(
        &scheduler,
        &tree.sysfs_root().parent().unwrap().join("tls"),
        &s,
        &admin_client(&server).await,
    )
    .await
    .unwrap();
    tokio::spawn(
        front
            .kube_scheduler(sim_sched, sched_settings.scheduler_name.clone())
            .unwrap()
            .run(),
    );

    let registered = wait_until(Duration::from_secs(20), async || {
        server
            .get_object("v1", "nodes", "", NODE)
            .is_some_and(|n| n["metadata"]["annotations"][AMD.node_register].is_string())
    })
    .await;
    assert!(registered, "the plugin never registered the node");
    assert!(
        wait_until(Duration::from_secs(10), async || scheduler.ready()).await,
        "scheduler never ready"
    );
    informer.wait_ready().await.unwrap();

    // A stale node lock left by a pod that no longer exists: the scheduler must check the
    // owner with the API server before taking the lock over.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let ghost = NodeLock::new(now, PodRef::new("default", "ghost"))
        .encode()
        .unwrap();
    Api::<Node>::all(admin.clone())
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {node_keys::MUTEX_LOCK: ghost}}})),
        )
        .await
        .unwrap();
    // A pod that cannot fit (two GPUs on a one-GPU node): kube-scheduler retries it, and the
    // repeated FilteringFailed event is patched (an event series), not created again.
    let too_big: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "too-big", "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "rocm/pytorch",
                 "resources": {"limits": {"amd.com/gpu": "2"}}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &too_big)
        .await
        .unwrap();
    // A GPU pod, created by a user (admin).
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "slice", "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "rocm/pytorch",
                 "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "1024"}}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let wait = if expect_success {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(4)
    };
    let bound = wait_until(wait, async || {
        server
            .get_object("v1", "pods", "default", "slice")
            .is_some_and(|p| p["spec"]["nodeName"] == NODE)
    })
    .await;
    let running = bound
        && wait_until(wait, async || {
            server
                .get_object("v1", "pods", "default", "slice")
                .is_some_and(|p| {
                    p["status"]["phase"] == "Running"
                        && p["metadata"]["annotations"][pod_keys::BIND_PHASE] == "success"
                })
        })
        .await;
    // The monitor sees the pod on its node.
    if running {
        let uid = server.get_object("v1", "pods", "default", "slice").unwrap()["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            wait_until(Duration::from_secs(10), async || informer
                .index()
                .get(&uid)
                .is_some())
            .await,
            "the monitor never saw the pod"
        );
    }
    // The monitor's hook check (issue 29) finds the pod's process on the GPU without its
    // memory hook and posts SliceNotEnforced under its account.
    let slice_not_enforced = running
        && hook_check_posts_its_event(
            &server,
            &admin,
            &kubelet,
            &monitor,
            &informer,
            &tree.sysfs_root().parent().unwrap().join("monitor"),
        )
        .await;
    // D-4 on UPDATE through the API server's admission: a user (the admin) changing a
    // scheduler-owned annotation of the running pod is refused with the webhook's message;
    // the scheduler's and the plugin's own annotation patches above went through.
    if running {
        let forge = json!({"metadata": {"annotations": {pod_keys::VGPU_NODE: FORGED_NODE}}});
        match Api::<Pod>::namespaced(admin.clone(), "default")
            .patch("slice", &PatchParams::default(), &Patch::Merge(&forge))
            .await
        {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 403, "{}", s.message);
                assert!(
                    s.message.contains(pod_keys::VGPU_NODE)
                        && s.message.contains("may not set, change or remove it"),
                    "{}",
                    s.message
                );
            }
            other => panic!("a forged vgpu-node patch was not refused: {other:?}"),
        }
        let pod = server.get_object("v1", "pods", "default", "slice").unwrap();
        assert_eq!(pod["metadata"]["annotations"][pod_keys::VGPU_NODE], NODE);
    }
    // The GPU's render node disappears: the plugin records AMDGPUUnhealthy.
    tree.remove_dev("dri/renderD128").unwrap();
    let unhealthy_event = wait_until(wait, async || {
        server.request_log().iter().any(|r| {
            r.resource == "events"
                && r.api_group.is_empty()
                && r.verb == "create"
                && r.user.as_deref() == Some(&user(names::DEVICE_PLUGIN))
                && r.status == 201
        })
    })
    .await;
    if expect_success {
        let series = wait_until(Duration::from_secs(15), async || {
            server.request_log().iter().any(|r| {
                r.resource == "events"
                    && r.api_group == "events.k8s.io"
                    && r.verb == "patch"
                    && r.user.as_deref() == Some(&user(names::SCHEDULER))
            })
        })
        .await;
        assert!(series, "the scheduler never patched a repeated event");
    }
    let labelled = server.get_object("v1", "nodes", "", NODE).is_some_and(|n| {
        n["metadata"]["labels"]
            .as_object()
            .is_some_and(|l| l.keys().any(|k| k.starts_with("amd.com/gpu.")))
    });
    // On a timeout the test's checks name what is missing.
    wait_until(Duration::from_secs(10), async || {
        settled(&server.request_log())
    })
    .await;
    stop_plugin.send(true).unwrap();
    let _ = plugin_task.await;
    drop(sim);
    Outcome {
        log: server.request_log(),
        bound,
        running,
        unhealthy_event,
        labelled,
        slice_not_enforced,
    }
}

/// The running pod's container (status written as a kubelet would: this kubelet-sim runs
/// no container) holds a real process whose `LD_AUDIT` names a hook that is not there (ld.so
/// warns and runs it, with no memory limit); a `NodeMonitor` over a proc-shaped tree that
/// places it in that container with `/dev/kfd` open refreshes once, and the server's
/// `post_hook_events` posts with the monitor's client. Whether exactly one SliceNotEnforced
/// Event landed on the pod.
async fn hook_check_posts_its_event(
    server: &hami_apiserver::RunningApiServer,
    admin: &kube::Client,
    kubelet: &kube::Client,
    monitor_client: &kube::Client,
    informer: &hami_monitor::pods::PodInformer,
    dir: &std::path::Path,
) -> bool {
    use hami_monitor::hook_presence::REASON_SLICE_NOT_ENFORCED;
    use hami_monitor::node_monitor::{MonitorConfig, NodeMonitor};
    use k8s_openapi::api::core::v1::Event;

    let uid = server.get_object("v1", "pods", "default", "slice").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let cid = "5a".repeat(32);
    Api::<Pod>::namespaced(kubelet.clone(), "default")
        .patch_status(
            "slice",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"containerStatuses": [{"name": "main",
                "containerID": format!("containerd://{cid}"), "image": "rocm/pytorch",
                "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {}}}]}})),
        )
        .await
        .unwrap();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("600")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env(
            hami_protocol::names::env::hip_device_memory_limit(0),
            "1024m",
        )
        .env("LD_AUDIT", "/nonexistent/vgpu/libamvgpu.so")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = sleeper.id();
    // Started once ld.so has mapped the program's libraries (audit libraries come first).
    let started = wait_until(Duration::from_secs(30), async || {
        std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains("libc"))
    })
    .await;
    assert!(started, "sleep never started");
    let proc_dir = dir.join("proc").join(pid.to_string());
    std::fs::create_dir_all(proc_dir.join("fd")).unwrap();
    std::fs::create_dir_all(dir.join("hook/containers")).unwrap();
    std::fs::create_dir_all(dir.join("sys")).unwrap();
    std::fs::write(
        proc_dir.join("cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{cid}.scope\n",
            uid.replace('-', "_")
        ),
    )
    .unwrap();
    std::os::unix::fs::symlink("/dev/kfd", proc_dir.join("fd/3")).unwrap();
    for entry in ["maps", "environ", "comm"] {
        std::os::unix::fs::symlink(format!("/proc/{pid}/{entry}"), proc_dir.join(entry)).unwrap();
    }
    let seen = wait_until(Duration::from_secs(10), async || {
        informer.index().by_container_id.contains_key(&cid)
    })
    .await;
    assert!(seen, "the monitor never saw the container's status");
    let node_monitor = Arc::new(NodeMonitor::new(MonitorConfig {
        hook_path: dir.join("hook"),
        proc_root: dir.join("proc"),
        sys_root: dir.join("sys"),
        node_name: NODE.into(),
        gc_grace: Duration::from_secs(3600),
        nvml_library: None,
    }));
    let (refreshing, index) = (node_monitor.clone(), informer.index());
    tokio::task::spawn_blocking(move || refreshing.refresh(index))
        .await
        .unwrap();
    hami_monitor::server::post_hook_events(&node_monitor, monitor_client).await;
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let events = Api::<Event>::namespaced(admin.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap();
    events
        .items
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some(REASON_SLICE_NOT_ENFORCED)
                && e.involved_object.name.as_deref() == Some("slice")
        })
        .count()
        == 1
}

/// Grants that only a race exercises, each with the code path that needs it: a run may or
/// may not use them. The test fails if any other grant is unused.
const RACE_ONLY: &[RaceOnly] = &[(
    // plugin-core node_pods.rs: the pod named by the node lock is read directly when the
    // node's pod watch has not shown it within 500 ms.
    names::DEVICE_PLUGIN,
    "",
    "pods",
    "get",
)];

/// The components' service accounts whose shipped rules must all be used.
fn checked_accounts() -> [&'static str; 4] {
    [
        names::SCHEDULER,
        names::DEVICE_PLUGIN,
        names::MONITOR,
        names::NODE_LABELLER,
    ]
}

/// The service account `sa`'s requests (those naming a resource), as the authorizer sees
/// them.
fn made_by(log: &[RequestRecord], sa: &str) -> Vec<ResourceAttributes> {
    grants::made_by(log, &settings().namespace, sa).1
}

/// [`grants::unused_grants`] of the checked accounts: empty when the shipped grants are
/// exactly what the components use.
fn unused_grants(policy: &Policy, log: &[RequestRecord]) -> Vec<String> {
    grants::unused_grants(
        policy,
        log,
        &settings().namespace,
        &checked_accounts(),
        RACE_ONLY,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shipped_rbac_is_enough_and_every_verb_is_used() {
    let _machine = crate::MACHINE.read().await;
    let shipped = rbac(&settings());
    let policy = policy_of(&shipped);
    let out = run_flow(shipped.clone(), true, |log| {
        unused_grants(&policy, log).is_empty()
    })
    .await;
    assert!(
        out.bound && out.running,
        "the GPU pod did not run under the shipped RBAC"
    );
    assert!(
        out.unhealthy_event,
        "the plugin recorded no AMDGPUUnhealthy event"
    );
    assert!(out.labelled, "the node labeller labelled nothing");
    assert!(
        out.slice_not_enforced,
        "the monitor posted no SliceNotEnforced Event on the unhooked pod"
    );

    // 1. Nothing a component asked for was refused (the admin's forgery is, on purpose).
    let refused: Vec<_> = out
        .log
        .iter()
        .filter(|r| (r.status == 401 || r.status == 403) && !r.body.contains(FORGED_NODE))
        .collect();
    assert!(refused.is_empty(), "refused requests: {refused:#?}");

    // 2. Every verb of every rule bound to a component is needed by some request it made.
    for sa in checked_accounts() {
        assert!(!made_by(&out.log, sa).is_empty(), "{sa} made no requests");
    }
    let unused = unused_grants(&policy, &out.log);
    assert!(
        unused.is_empty(),
        "granted but never used, or race-only but used: {unused:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_verb_fails_with_403() {
    let _machine = crate::MACHINE.read().await;
    let mut rbac_objects = rbac(&settings());
    for o in &mut rbac_objects {
        if let Object::ClusterRole(r) = o
            && r.metadata.name.as_deref() == Some(names::SCHEDULER)
        {
            for rule in r.rules.iter_mut().flatten() {
                if rule.resources.as_deref() == Some(&["pods/binding".to_string()][..]) {
                    rule.verbs.retain(|v| v != "create");
                }
            }
        }
    }
    let out = run_flow(rbac_objects, false, |log| {
        log.iter()
            .any(|r| r.resource == "pods/binding" && r.status == 403)
    })
    .await;
    assert!(!out.bound, "the pod was bound without pods/binding create");
    let denied = out
        .log
        .iter()
        .find(|r| r.resource == "pods/binding" && r.status == 403)
        .expect("the scheduler's bind was not refused");
    assert_eq!(
        denied.user.as_deref(),
        Some(user(names::SCHEDULER).as_str())
    );
}
