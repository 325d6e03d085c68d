//! Least privilege in the DRA mode, end to end: the manifests rendered as `hami manifests
//! --dra` renders them; on the embedded API server with authentication and RBAC on, the
//! real AMD DRA driver (flags from its rendered DaemonSet through its own parser; its
//! ResourceSlice publisher and its kubelet plugin: claim GET, claim status write) and the
//! monitor's DRA reads (the node's pods, their claims, the
//! driver's slices) each run under their own shipped service account with exactly the
//! shipped RBAC objects; so does the scheduler in the webhook's DRA mode (`--amd-mode=dra`
//! from its Deployment's flags, the shipped webhook configuration), whose DRA-mode rules
//! are checked here (its others in `least_privilege.rs`). The simulated kube-scheduler
//! (allocation, reservation, binding)
//! and the simulated kubelet (registration, NodePrepareResources/NodeUnprepareResources)
//! stand in for built-in components and run with admin rights.
//!
//! The driver's slice publisher creates the node's slice, deletes a stale one of its own,
//! and replaces the slice when a GPU turns unhealthy (its device tainted); a DRA pod is
//! allocated, prepared (CUs chosen, `status.devices` written) and runs; the monitor reports
//! its CUs; deleting the pod unprepares the claim (no API call). A pod written with HAMi's
//! AMD API is converted by the webhook (the driver's slices read for the shape, the claim
//! template created), an identical one reuses the template (409, read, stamped), and once
//! both are gone the sweeper lists and deletes it.
//!
//! Checked both ways:
//! - nothing the driver or the monitor asked for was refused, and no shipped rule of theirs
//!   is a wildcard;
//! - every verb of every rule bound to them is needed (removing it denies at least one
//!   request they made, replayed through the server's authorizer);
//! - and for real: without `patch` on `resourceclaims/status` the driver's prepare fails
//!   naming the status write and the refusal, without `get` on `resourceclaims` the
//!   monitor reports the claim as unreadable, and without `patch` on
//!   `resourceclaimtemplates` the webhook denies the pod that reuses a template, naming
//!   the stamp and the refusal.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hami_amd_discovery::discovery::discover;
use hami_amd_discovery::registration::{RegisteredDevice, register};
use hami_amdgpu_dra_plugin::args::Args;
use hami_amdgpu_dra_plugin::claims::KubeClaims;
use hami_amdgpu_dra_plugin::driver::{Driver, DriverConfig};
use hami_amdgpu_dra_plugin::registration::{Sockets, serve};
use hami_amdgpu_dra_plugin::slice_publisher::{Published, SlicePublisher};
use hami_apiserver::{RequestRecord, RunningApiServer};
use hami_deviceplugin_api::dra_v1::dra_plugin_client::DraPluginClient;
use hami_deviceplugin_api::dra_v1::{Claim, NodePrepareResourcesRequest};
use hami_dra_core::prepare::PrepareSettings;
use hami_kube_scheduler_sim::SimKubeScheduler;
use hami_kube_scheduler_sim::dra::DraOptions;
use hami_kube_scheduler_sim::front::SchedulerFront;
use hami_kubelet_sim::KubeletSim;
use hami_kubelet_sim::dra_manager::DraConfig;
use hami_manifests::{ManifestsArgs, Object, Settings, names, objects, rbac};
use hami_scheduler::config::{FileConfig, SchedulerArgs};
use hami_scheduler::dra_claims::AmdMode;
use hami_scheduler::dra_sweep::SweepTuning;
use hami_scheduler::leader::Leadership;
use hami_scheduler::runtime::Scheduler;
use hami_system_tests::grants::{made_by, policy_of, unused_grants_among};
use hami_system_tests::{
    SIM_KUBELET, admin_client, client_for, cluster_admin_for, start_authed_server, to_values,
    wait_until,
};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const NODE: &str = "dra-node-1";
const DRIVER: &str = names::DRA_DRIVER;
const WAIT: Duration = Duration::from_secs(20);

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    manifests: ManifestsArgs,
}

/// `hami-scheduler`'s command line.
#[derive(Parser)]
struct SchedulerCli {
    #[command(flatten)]
    args: SchedulerArgs,
}

/// The settings `hami manifests --dra` renders with (on a cluster that serves
/// resource.k8s.io/v1), with the chart value `scheduler.amdMode=dra` (the webhook converts
/// every AMD pod; it changes no RBAC).
fn settings() -> Settings {
    let mut s = Cli::parse_from(["hami-manifests", "--dra", "--kube-version", "v1.36.0"])
        .manifests
        .settings()
        .unwrap();
    s.values.scheduler.amd_mode = "dra".into();
    s
}

/// The RBAC objects among the rendered manifests.
fn shipped_rbac() -> Vec<Object> {
    let s = settings();
    let rendered = objects::all(&s, false).unwrap();
    let rbac: Vec<Object> = rendered
        .into_iter()
        .filter(|o| {
            matches!(
                o,
                Object::ServiceAccount(_)
                    | Object::ClusterRole(_)
                    | Object::ClusterRoleBinding(_)
                    | Object::Role(_)
                    | Object::RoleBinding(_)
            )
        })
        .collect();
    // The same objects the tests of the other modes install.
    assert_eq!(to_values(&rbac), to_values(&objects::rbac_objects(&s)));
    rbac
}

/// The shipped ClusterRole `name` in `objs`, to take a verb away from.
fn cluster_role<'a>(
    objs: &'a mut [Object],
    name: &str,
) -> &'a mut k8s_openapi::api::rbac::v1::ClusterRole {
    objs.iter_mut()
        .find_map(|o| match o {
            Object::ClusterRole(r) if r.metadata.name.as_deref() == Some(name) => Some(r),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no ClusterRole {name} shipped"))
}

/// `objs` with `verb` removed from the rule of `role` on `group`/`resource`.
fn without(
    mut objs: Vec<Object>,
    role: &str,
    group: &str,
    resource: &str,
    verb: &str,
) -> Vec<Object> {
    let mut found = false;
    for rule in cluster_role(&mut objs, role).rules.iter_mut().flatten() {
        if rule.api_groups.as_deref() == Some(&[group.to_string()][..])
            && rule.resources.as_deref() == Some(&[resource.to_string()][..])
            && rule.verbs.iter().any(|v| v == verb)
        {
            rule.verbs.retain(|v| v != verb);
            found = true;
        }
    }
    assert!(
        found,
        "{role} has no {verb} on {group}/{resource} to remove"
    );
    objs
}

fn accounts() -> [&'static str; 2] {
    [names::DRA_PLUGIN, names::MONITOR]
}

fn user(sa: &str) -> String {
    hami_system_tests::service_account_user(&settings().namespace, sa)
}

/// What one run saw.
struct Outcome {
    log: Vec<RequestRecord>,
    /// The publisher's first reconcile (create + stale delete) and the one after the GPU
    /// turned unhealthy.
    first: Published,
    unhealthy: Option<Published>,
    /// The pod ran (prepared by the driver under its account).
    running: bool,
    /// The driver's answer to a NodePrepareResources of the pod's claim sent directly
    /// (as kubelet sends it), when the run was meant to fail: the claim's error text.
    prepare_error: Option<String>,
    /// The monitor's view of the pod: its CU ranges, and the DRA problems it reported.
    monitor_cus: Vec<(String, String)>,
    monitor_problems: Vec<String>,
    /// The claim was unprepared after the pod went (gone from the driver's checkpoint).
    unprepared: bool,
    /// The webhook's template for the first HAMi-API pod.
    template: String,
    /// The identical second pod's creation error (the webhook's denial), if any.
    reuse_error: Option<String>,
    /// The sweeper deleted the template once both pods were gone.
    swept: bool,
}

/// A pod written with HAMi's AMD API: a quarter of the CUs (a percentage: the webhook needs
/// the device's shape from the driver's slices) and 1 GiB.
fn hami_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "rocm/pytorch", "resources": {"limits":
            {"amd.com/gpu": "1", "amd.com/gpucores": "25", "amd.com/gpumem": "1024"}}}]}
    }))
    .unwrap()
}

/// The node's GPUs as the driver's Prepare sees them (its `main.rs` does the same).
fn registered(args: &Args) -> BTreeMap<String, RegisteredDevice> {
    let d = discover(&args.sysfs_root).unwrap();
    let reg = register(&d, &args.registration_settings(), |_| true);
    hami_dra_core::slice::registered_by_name(&d, &reg)
        .into_iter()
        .map(|(k, v)| (k, v.clone()))
        .collect()
}

fn claim_name(server: &RunningApiServer, pod: &str) -> Option<String> {
    let p = server.get_object("v1", "pods", "default", pod)?;
    p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .map(str::to_owned)
}

/// The UID of the object `default/name`.
fn uid_of(server: &RunningApiServer, api_version: &str, plural: &str, name: &str) -> String {
    server
        .get_object(api_version, plural, "default", name)
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Runs the DRA flow with the given RBAC objects; `expect_success` says whether the pod is
/// meant to be prepared (otherwise the prepare is sent directly, to read its error).
async fn run_flow(rbac_objects: Vec<Object>, expect_success: bool) -> Outcome {
    let s = settings();
    let ns = s.namespace.clone();
    let mut rbac = to_values(&rbac_objects);
    // kubelet has the Node authorizer's rights in a cluster; here an admin role.
    rbac.extend(cluster_admin_for(SIM_KUBELET));
    let server = start_authed_server(&[&ns], &rbac).await;
    let admin = admin_client(&server).await;
    let dra = client_for(&server, &ns, names::DRA_PLUGIN).await;
    let monitor = client_for(&server, &ns, names::MONITOR).await;
    let kubelet = client_for(&server, "kube-system", SIM_KUBELET).await;

    // The node: one RDNA3 card; kubelet-sim (it creates the Node) with its DRA side.
    let tree = hami_sysfs_fixtures::rdna_node(&[hami_sysfs_fixtures::Rdna::Gfx11]).unwrap();
    let dir = tree.sysfs_root().parent().unwrap().join("node");
    let kubelet_sim = KubeletSim::start_with_dra(
        hami_kubelet_sim::Args {
            socket_dir: dir.join("device-plugins"),
            node_name: NODE.into(),
            record_dir: None,
            run_containers: false,
            runtime: Default::default(),
            sync_interval_ms: 20,
        },
        kubelet,
        DraConfig {
            registry_dir: dir.join("plugins_registry"),
            state_file: dir.join("dra_manager_state"),
            cdi_dirs: vec![dir.join("cdi")],
        },
    )
    .await
    .unwrap();
    assert!(
        wait_until(WAIT, async || server
            .get_object("v1", "nodes", "", NODE)
            .is_some())
        .await,
        "kubelet-sim never created its Node"
    );
    // What the installer applies besides RBAC: the shipped DeviceClass.
    let class = objects::all(&s, false)
        .unwrap()
        .into_iter()
        .find(|o| matches!(o, Object::DeviceClass(_)))
        .expect("the DRA mode ships a DeviceClass");
    server
        .create_object(
            "resource.k8s.io/v1",
            "deviceclasses",
            None,
            class.to_value().unwrap(),
        )
        .unwrap();
    // A slice of this driver and node left by an earlier driver (an older naming).
    server
        .create_object(
            "resource.k8s.io/v1",
            "resourceslices",
            None,
            json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{NODE}-old")},
            "spec": {"driver": DRIVER, "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}, "devices": []}}),
        )
        .unwrap();

    // The driver's flags as its DaemonSet passes them, the node's paths pointed at the
    // scratch node; from them what main.rs builds, under the driver's account: slices, then
    // the kubelet plugin.
    let Object::DaemonSet(ds) = objects::dra_plugin_daemon_set(&s) else {
        panic!("the DRA driver is not a DaemonSet")
    };
    let container = &ds.spec.unwrap().template.spec.unwrap().containers[0];
    let mut args = Args::try_parse_from(
        std::iter::once("amdgpu-dra-plugin".to_string()).chain(container.args.clone().unwrap()),
    )
    .unwrap();
    args.node_name = Some(NODE.into());
    args.sysfs_root = tree.sysfs_root();
    args.dev_root = tree.dev_root();
    args.registry_dir = dir.join("plugins_registry");
    args.plugin_dir = Some(dir.join("plugin"));
    args.cdi_dir = dir.join("cdi");
    args.cache_root = dir.join("vgpu").display().to_string();
    assert_eq!(args.driver_name, DRIVER);
    let publisher = SlicePublisher {
        client: dra.clone(),
        driver: args.driver_name.clone(),
        node: NODE.into(),
        sysfs_root: args.sysfs_root.clone(),
        dev_root: args.dev_root.clone(),
        settings: args.registration_settings(),
    };
    let first = publisher.refresh().await.unwrap();
    let driver = Arc::new(
        Driver::new(
            DriverConfig {
                settings: PrepareSettings {
                    driver: args.driver_name.clone(),
                    node: NODE.into(),
                    hook_host_path: args.hook_host_path.clone(),
                    hook_container_path: hami_amd_plugin::allocate_plan::HOOK_CONTAINER_PATH.into(),
                    cache_host_root: args.cache_root.clone(),
                },
                devices: registered(&args),
                cdi_dir: args.cdi_dir.clone(),
                checkpoint: args.plugin_dir().join("checkpoint.json"),
                dmem: None,
            },
            KubeClaims { client: dra },
        )
        .unwrap(),
    );
    let sockets = Sockets::new(&args.registry_dir, &args.plugin_dir(), DRIVER);
    let (stop_plugin, stopped) = tokio::sync::oneshot::channel::<()>();
    let (mut registration, plugin) = serve(driver.clone(), DRIVER, &sockets, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    tokio::time::timeout(WAIT, registration.wait_for(|s| s.is_some()))
        .await
        .expect("kubelet-sim never dialled the registration socket")
        .unwrap();
    assert_eq!(*registration.borrow(), Some(Ok(())));

    // The monitor's pod informer with its DRA reads.
    let mut informer =
        hami_monitor::pods::PodInformer::start(monitor, NODE, &s.values.scheduler.scheduler_name);
    informer.wait_ready().await.unwrap();

    // kube-scheduler's stand-in; a user's claim template and pod.
    let scheduler = tokio::spawn(
        SimKubeScheduler::dra_only(admin.clone(), "default-scheduler", DraOptions::default()).run(),
    );
    server
        .create_object(
            "resource.k8s.io/v1",
            "resourceclaimtemplates",
            Some("default"),
            json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "slice", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"memory": "1Gi", "computeUnits": "8"}}}}]}}}}),
        )
        .unwrap();
    server
        .create_object("v1", "pods", Some("default"), json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dra-pod", "namespace": "default"},
            "spec": {"schedulerName": "default-scheduler",
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "slice"}],
                "containers": [{"name": "main", "image": "rocm/pytorch",
                    "resources": {"claims": [{"name": "gpu"}]}}]}}))
        .unwrap();
    // Allocated and reserved for the pod by the scheduler (whatever the driver may do).
    let reserved = wait_until(WAIT, async || {
        claim_name(&server, "dra-pod")
            .and_then(|c| server.get_object("resource.k8s.io/v1", "resourceclaims", "default", &c))
            .is_some_and(|c| c["status"]["reservedFor"][0]["name"] == "dra-pod")
    })
    .await;
    assert!(reserved, "the scheduler never allocated the pod's claim");
    let claim = claim_name(&server, "dra-pod").unwrap();
    let claim_uid = uid_of(&server, "resource.k8s.io/v1", "resourceclaims", &claim);
    let running = expect_success
        && wait_until(WAIT, async || {
            server
                .get_object("v1", "pods", "default", "dra-pod")
                .is_some_and(|p| p["status"]["phase"] == "Running")
        })
        .await;
    let prepare_error = if expect_success {
        None
    } else {
        let channel = hami_deviceplugin_api::connect_unix(&sockets.dra)
            .await
            .unwrap();
        let resp = DraPluginClient::new(channel)
            .node_prepare_resources(NodePrepareResourcesRequest {
                claims: vec![Claim {
                    namespace: "default".into(),
                    uid: claim_uid.clone(),
                    name: claim.clone(),
                }],
            })
            .await
            .unwrap()
            .into_inner();
        Some(resp.claims[&claim_uid].error.clone())
    };

    // The monitor's view of the pod, once its informer has it with its claim.
    let uid = uid_of(&server, "v1", "pods", "dra-pod");
    let mut monitor_cus = Vec::new();
    let mut monitor_problems = Vec::new();
    wait_until(WAIT, async || {
        let index = informer.index_with_dra().await;
        monitor_problems = index.dra_problems.clone();
        monitor_cus = index
            .get(&uid)
            .map(|p| p.cu_allocated.clone())
            .unwrap_or_default();
        !monitor_cus.is_empty() || !monitor_problems.is_empty()
    })
    .await;

    // The scheduler in the webhook's DRA mode, flags from its Deployment, under its account
    // (the sweeper's grace shortened); the shipped webhook configuration points at it.
    let sched = client_for(&server, &ns, names::SCHEDULER).await;
    let sched_args = SchedulerCli::parse_from(
        std::iter::once("hami-scheduler".to_string()).chain(objects::scheduler_args(&s)),
    )
    .args;
    let mut sched_settings =
        hami_scheduler::config::Settings::resolve(&sched_args, FileConfig::default()).unwrap();
    assert_eq!(sched_settings.webhook.amd_mode, AmdMode::Dra);
    sched_settings.template_sweep = SweepTuning {
        interval: Duration::from_millis(100),
        grace: Duration::from_secs(1),
    };
    let hami_scheduler = Scheduler::start(sched, sched_settings, Arc::new(Leadership::always()));
    let front = SchedulerFront::start(&hami_scheduler, &dir.join("tls"), &s, &admin)
        .await
        .unwrap();
    assert!(
        wait_until(WAIT, async || hami_scheduler.ready()).await,
        "the scheduler never synced"
    );
    // Converted (template created), then reused (409, read, stamped), then swept.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let first_hami = pods
        .create(&PostParams::default(), &hami_pod("hami-a"))
        .await
        .unwrap();
    let template = first_hami.spec.unwrap().resource_claims.unwrap()[0]
        .resource_claim_template_name
        .clone()
        .expect("the webhook did not convert the HAMi pod");
    let reuse_error = match pods
        .create(&PostParams::default(), &hami_pod("hami-b"))
        .await
    {
        Ok(_) => {
            pods.delete("hami-b", &DeleteParams::default())
                .await
                .unwrap();
            None
        }
        Err(e) => Some(e.to_string()),
    };
    pods.delete("hami-a", &DeleteParams::default())
        .await
        .unwrap();
    let swept = wait_until(WAIT, async || {
        server
            .get_object(
                "resource.k8s.io/v1",
                "resourceclaimtemplates",
                "default",
                &template,
            )
            .is_none()
    })
    .await;
    drop(front);

    // The GPU's render node disappears: its device is tainted, the slice replaced.
    tree.remove_dev("dri/renderD128").unwrap();
    let unhealthy = publisher.refresh().await.ok();

    // The pod goes: kubelet-sim unprepares its claim (prepared = in the driver's checkpoint,
    // read before the delete: the unprepare may follow it at once).
    let prepared = driver.checkpoint().await.claims.contains_key(&claim_uid);
    Api::<Pod>::namespaced(admin.clone(), "default")
        .delete("dra-pod", &DeleteParams::default())
        .await
        .unwrap();
    let unprepared = prepared
        && wait_until(WAIT, async || {
            !driver.checkpoint().await.claims.contains_key(&claim_uid)
        })
        .await;

    kubelet_sim.shutdown().await;
    scheduler.abort();
    let _ = stop_plugin.send(());
    let _ = tokio::time::timeout(WAIT, plugin).await;
    Outcome {
        log: server.request_log(),
        first,
        unhealthy,
        running,
        prepare_error,
        monitor_cus,
        monitor_problems,
        unprepared,
        template,
        reuse_error,
        swept,
    }
}

/// The scheduler's DRA-mode rules: every verb needed by some request it made (its other
/// rules are checked in `least_privilege.rs`).
fn unused_scheduler_dra_grants(
    policy: &hami_apiserver::rbac::Policy,
    log: &[RequestRecord],
) -> Vec<String> {
    let dra_rules = rbac::scheduler_dra_cluster_rules();
    unused_grants_among(
        policy,
        log,
        &settings().namespace,
        &[names::SCHEDULER],
        &[],
        |_, rule| dra_rules.contains(rule),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dra_driver_and_monitor_work_under_the_shipped_rbac_and_need_every_grant() {
    let _machine = crate::MACHINE.read().await;
    let shipped = shipped_rbac();
    let policy = policy_of(&shipped);
    let ns = settings().namespace;
    // Wildcards would pass every check below without being least privilege.
    for role in &policy.cluster_roles {
        if ![names::DRA_PLUGIN, names::MONITOR, names::SCHEDULER]
            .contains(&role.metadata.name.as_deref().unwrap())
        {
            continue;
        }
        for rule in role.rules.iter().flatten() {
            let all: Vec<&String> = rule
                .verbs
                .iter()
                .chain(rule.resources.iter().flatten())
                .chain(rule.api_groups.iter().flatten())
                .collect();
            assert!(!all.iter().any(|v| v.contains('*')), "wildcard in {rule:?}");
        }
    }
    let out = run_flow(shipped, true).await;

    assert_eq!(
        out.first.created,
        [format!("{NODE}-amdgpu-hami-rs-io-0")],
        "{:?}",
        out.first
    );
    assert_eq!(out.first.deleted, [format!("{NODE}-old")]);
    let unhealthy = out
        .unhealthy
        .expect("the reconcile after the GPU went failed");
    assert_eq!(unhealthy.updated, out.first.created, "{unhealthy:?}");
    assert!(
        out.running,
        "the DRA pod did not run under the shipped RBAC"
    );
    assert!(
        out.monitor_problems.is_empty(),
        "{:?}",
        out.monitor_problems
    );
    assert_eq!(out.monitor_cus.len(), 1, "{:?}", out.monitor_cus);
    assert!(out.unprepared, "the claim was never unprepared");

    // 1. Nothing was refused (any identity).
    let refused: Vec<&RequestRecord> = out
        .log
        .iter()
        .filter(|r| r.status == 401 || r.status == 403)
        .collect();
    assert!(refused.is_empty(), "refused requests: {refused:#?}");
    // The driver wrote the claim's status itself, under its account.
    assert!(
        out.log.iter().any(|r| r.resource == "resourceclaims/status"
            && r.verb == "patch"
            && r.status == 200
            && r.user.as_deref() == Some(user(names::DRA_PLUGIN).as_str())),
        "the driver never wrote status.devices"
    );

    // 2. Every verb of every rule bound to the driver and the monitor is needed (the
    // monitor's SliceNotEnforced Event grant is used, and checked, in least_privilege.rs:
    // this flow has no unhooked process).
    for sa in accounts() {
        assert!(
            !made_by(&out.log, &ns, sa).1.is_empty(),
            "{sa} made no requests"
        );
    }
    let monitor_events = rbac::monitor_event_rules();
    let unused = unused_grants_among(&policy, &out.log, &ns, &accounts(), &[], |sa, rule| {
        sa != names::MONITOR || !monitor_events.contains(rule)
    });
    assert!(unused.is_empty(), "granted but never used: {unused:#?}");

    // 3. The scheduler's DRA mode: converted, reused and stamped, swept; each of its
    // DRA-mode verbs needed.
    assert_eq!(out.reuse_error, None, "the identical pod was refused");
    assert!(
        out.swept,
        "the unused template {} was never swept",
        out.template
    );
    let scheduler = user(names::SCHEDULER);
    let calls: Vec<(&str, &str, u16)> = out
        .log
        .iter()
        .filter(|r| {
            r.user.as_deref() == Some(scheduler.as_str()) && r.api_group == "resource.k8s.io"
        })
        .map(|r| (r.resource.as_str(), r.verb.as_str(), r.status))
        .collect();
    for call in [
        ("resourceslices", "list", 200),
        ("resourceslices", "watch", 200),
        ("resourceclaimtemplates", "create", 201),
        ("resourceclaimtemplates", "create", 409),
        ("resourceclaimtemplates", "get", 200),
        ("resourceclaimtemplates", "patch", 200),
        ("resourceclaimtemplates", "list", 200),
        ("resourceclaimtemplates", "delete", 200),
    ] {
        assert!(
            calls.contains(&call),
            "the scheduler never made {call:?}: {calls:?}"
        );
    }
    let rules = rbac::scheduler_dra_cluster_rules();
    assert!(
        rules.iter().all(|r| policy
            .cluster_roles
            .iter()
            .any(
                |role| role.metadata.name.as_deref() == Some(names::SCHEDULER)
                    && role.rules.iter().flatten().any(|x| x == r)
            )),
        "the scheduler's ClusterRole lacks its DRA-mode rules"
    );
    let unused = unused_scheduler_dra_grants(&policy, &out.log);
    assert!(unused.is_empty(), "granted but never used: {unused:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_dra_grant_fails_the_operation_that_needs_it() {
    let _machine = crate::MACHINE.read().await;
    let rbac = without(
        shipped_rbac(),
        names::DRA_PLUGIN,
        "resource.k8s.io",
        "resourceclaims/status",
        "patch",
    );
    let rbac = without(
        rbac,
        names::MONITOR,
        "resource.k8s.io",
        "resourceclaims",
        "get",
    );
    let rbac = without(
        rbac,
        names::SCHEDULER,
        "resource.k8s.io",
        "resourceclaimtemplates",
        "patch",
    );
    let out = run_flow(rbac, false).await;

    let error = out.prepare_error.unwrap();
    assert!(
        error.contains("writing status.devices of ResourceClaim default/")
            && error.contains("forbidden"),
        "the driver's prepare error does not say what was refused: {error:?}"
    );
    let denied: Vec<&RequestRecord> = out.log.iter().filter(|r| r.status == 403).collect();
    assert!(
        denied.iter().any(|r| r.resource == "resourceclaims/status"
            && r.verb == "patch"
            && r.user.as_deref() == Some(user(names::DRA_PLUGIN).as_str())),
        "{denied:#?}"
    );
    assert!(
        out.monitor_problems
            .iter()
            .any(|p| p.contains("reading ResourceClaim default/") && p.contains("forbidden")),
        "the monitor did not report the unreadable claim: {:?}",
        out.monitor_problems
    );
    assert!(out.monitor_cus.is_empty());
    assert!(
        denied.iter().any(|r| r.resource == "resourceclaims"
            && r.verb == "get"
            && r.user.as_deref() == Some(user(names::MONITOR).as_str())),
        "{denied:#?}"
    );
    // The webhook created the first pod's template, then denied the pod reusing it: the
    // stamp was refused (the pod is never stored naming a template the sweeper may take).
    let error = out
        .reuse_error
        .expect("the pod reusing the template was admitted");
    assert!(
        error.contains(&format!(
            "cannot mark ResourceClaimTemplate default/{} ",
            out.template
        )) && error.contains(hami_protocol::dra::LAST_USED_ANNOTATION)
            && error.contains("forbidden"),
        "the webhook's denial does not say what was refused: {error:?}"
    );
    assert!(
        denied.iter().any(|r| r.resource == "resourceclaimtemplates"
            && r.verb == "patch"
            && r.user.as_deref() == Some(user(names::SCHEDULER).as_str())),
        "{denied:#?}"
    );
    assert!(out.swept, "the unused template was never swept");
    // Nothing else of theirs was refused: each removal fails only what needs it.
    for r in &denied {
        assert!(
            (r.resource == "resourceclaims/status" && r.verb == "patch")
                || (r.resource == "resourceclaims" && r.verb == "get")
                || (r.resource == "resourceclaimtemplates" && r.verb == "patch")
                // The webhook's denial of the reusing pod (answered 403, as upstream does).
                || (r.resource == "pods" && r.verb == "create" && r.body.contains("\"hami-b\"")),
            "refused beyond the removed grants: {r:?}"
        );
    }
}
