//! Issue 32 end to end on the demo's cluster (the real scheduler behind the simulated
//! kube-scheduler's extender calls, the AMD device plugins and kubelet-sim): a pod asking
//! half an MI210 fits no card, `hami defrag plan` proposes a move, `hami defrag apply
//! --execute` reserves its target and evicts through the Eviction API, a
//! PodDisruptionBudget refuses a second eviction and the report says so, the evicted pod's
//! replacement (created here, as its ReplicaSet would) lands on the reserved partition
//! rather than on the capacity the eviction freed, and the pending pod then runs there. A
//! plan made while another owner's reservation holds the partition it chose moves the
//! replica elsewhere.
//!
//! The cards: the demo's 8 MI210s (104 CUs) and 8 MI300X in CPX mode. Each MI210 holds a
//! pinned `filler` (30 %, 31 CUs) and one `web` replica (30 %), so 42 CUs are free on each
//! and `half` (50 %, 52 CUs, MI210 only) fits none. Moving one `web` to an MI300X partition
//! frees 73 CUs on its MI210. Without the reservation its replacement would go back to that
//! MI210 (binpack prefers the fuller node, spread the least used card there) and `half`
//! would still not fit.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hami_demo::{Cluster, DemoArgs, Progress};
use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::node_register::decode_node_devices;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NS: &str = "ml";
const NODE: &str = "mi210-node";
const OTHER_NODE: &str = "mi300x-node";
const OWNER_UID: &str = "rs-web-5d8f-uid";
const HASH: &str = "5d8f";
const WEB_REPLICAS: usize = 8;

/// The `hami` program the workspace built: beside this test binary's directory.
fn hami_program() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    [dir.join("hami"), dir.join("..").join("hami")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "no hami program beside {}: build it first (cargo build -p hami; CI builds the workspace)",
                exe.display()
            )
        })
}

/// Runs `hami defrag ARGS --kubeconfig K` off the runtime's threads (the cluster runs in
/// this process): its exit code, stdout and stderr.
async fn hami(kubeconfig: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(hami_program());
    cmd.arg("defrag")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A pod asking one AMD GPU with `percent` of its CUs and 4 GiB.
fn gpu_pod(name: Option<&str>, percent: u32, annotations: Value, labels: Value) -> Value {
    let mut metadata = json!({"namespace": NS, "labels": labels, "annotations": annotations});
    match name {
        Some(n) => metadata["name"] = json!(n),
        None => metadata["generateName"] = json!(format!("web-{HASH}-")),
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "4096",
                "amd.com/gpucores": percent.to_string()}}}]}})
}

/// A `web` replica as the ReplicaSet `web-5d8f` of Deployment `web` makes it.
fn web_pod(name: Option<&str>) -> Value {
    let mut p = gpu_pod(
        name,
        30,
        json!({}),
        json!({"app": "web", "pod-template-hash": HASH}),
    );
    p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "name": format!("web-{HASH}"), "uid": OWNER_UID, "controller": true}]);
    p
}

fn budget(allowed: i32) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": allowed, "currentHealthy": WEB_REPLICAS,
            "desiredHealthy": WEB_REPLICAS - 1, "expectedPods": WEB_REPLICAS}})
}

async fn create(pods: &Api<Pod>, pod: Value) -> Pod {
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap()
}

async fn all_pods(pods: &Api<Pod>) -> Vec<Pod> {
    pods.list(&ListParams::default()).await.unwrap().items
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && p.metadata.deletion_timestamp.is_none()
}

/// The card a placed pod holds (its only AMD device).
fn card(p: &Pod) -> Option<String> {
    let text = p
        .metadata
        .annotations
        .as_ref()?
        .get("hami.io/amd-devices-allocated")?;
    let runs = decode_pod_devices(text).ok()?;
    runs.into_iter().flatten().next().map(|d| d.uuid)
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

async fn until<T>(what: &str, seconds: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out ({seconds}s) waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Plays the ReplicaSet controller of `web`: whenever fewer than [`WEB_REPLICAS`] of its
/// pods are live, creates one from the template (same ownerReference and template hash).
fn replica_set(pods: Api<Pod>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Ok(list) = pods.list(&ListParams::default().labels("app=web")).await {
                let live = list
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .count();
                for _ in live..WEB_REPLICAS {
                    let pod: Pod = serde_json::from_value(web_pod(None)).unwrap();
                    let _ = pods.create(&PostParams::default(), &pod).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

#[test]
fn a_half_card_pod_runs_after_defrag_moves_a_replica_to_its_reservation() {
    let _machine = crate::MACHINE.blocking_write();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = std::env::temp_dir().join(format!("hami-defrag-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args = DemoArgs {
        once: true,
        api_listen: "127.0.0.1:0".parse().unwrap(),
        examples: dir.join("no-examples"),
        kubeconfig_out: dir.join("kubeconfig"),
        settle_seconds: 25,
        scenario: None,
        ui_listen: "127.0.0.1:0".parse().unwrap(),
        dra: false,
    };
    runtime.block_on(async {
        let mut sink = Vec::new();
        let mut progress = Progress::new(&mut sink);
        // No workload program: the pods' containers run no processes (kubelet-sim still
        // takes each through the device plugin's Allocate and reports it Running).
        let cluster = Cluster::start_with(&args, None, &mut progress)
            .await
            .unwrap();
        scenario(&cluster).await;
        cluster.shutdown().await;
    });
}

async fn scenario(cluster: &Cluster) {
    let api = &cluster.api;
    api.create_object(
        "v1",
        "namespaces",
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
    )
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NS);
    let kubeconfig = cluster.kubeconfig.clone();
    let node = api.get_object("v1", "nodes", "", NODE).unwrap();
    let register = node["metadata"]["annotations"]["hami.io/node-amd-register"]
        .as_str()
        .unwrap();
    let cards: Vec<String> = decode_node_devices(register)
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(cards.len(), 8, "the demo's MI210 node: {cards:?}");
    let node = api.get_object("v1", "nodes", "", OTHER_NODE).unwrap();
    let register = node["metadata"]["annotations"]["hami.io/node-amd-register"]
        .as_str()
        .unwrap();
    let partitions: Vec<String> = decode_node_devices(register)
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect();
    // Each partition's MiB and CUs.
    let shapes: BTreeMap<String, (u64, u32)> = decode_node_devices(register)
        .unwrap()
        .into_iter()
        .map(|d| (d.id, (d.devmem, d.devcore)))
        .collect();

    // One pinned filler per card (bare pods: the planner never moves them), then the web
    // replicas: the default node policy (binpack) takes them to the MI210 node, where the
    // fillers are, and the default GPU policy (spread) one per card.
    for (i, uuid) in cards.iter().enumerate() {
        let filler = gpu_pod(
            Some(&format!("filler-{i}")),
            30,
            json!({"amd.com/use-gpuuuid": uuid, "amd.com/use-gputype": "MI210"}),
            json!({"app": "filler"}),
        );
        create(&pods, filler).await;
    }
    until("the fillers run", 60, async || {
        let l = all_pods(&pods).await;
        (l.iter().filter(|p| running(p)).count() == cards.len()).then_some(())
    })
    .await;
    api.create_object("policy/v1", "poddisruptionbudgets", Some(NS), budget(1))
        .unwrap();
    for i in 0..WEB_REPLICAS {
        create(&pods, web_pod(Some(&format!("web-{HASH}-{i}")))).await;
    }
    let webs: BTreeMap<String, String> = until("the web replicas run", 90, async || {
        let l = all_pods(&pods).await;
        let webs: BTreeMap<String, String> = l
            .iter()
            .filter(|p| name(p).starts_with("web-") && running(p))
            .filter_map(|p| Some((card(p)?, name(p))))
            .collect();
        (webs.len() == WEB_REPLICAS).then_some(webs)
    })
    .await;
    assert_eq!(
        webs.keys().collect::<BTreeSet<_>>(),
        cards.iter().collect::<BTreeSet<_>>(),
        "one web replica per card (spread): {webs:?}"
    );

    // Half a card fits nowhere: 42 CUs free on each MI210, 52 asked.
    create(
        &pods,
        gpu_pod(
            Some("half"),
            50,
            json!({"amd.com/use-gputype": "MI210"}),
            json!({"app": "half"}),
        ),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let half = pods.get("half").await.unwrap();
    assert!(card(&half).is_none() && !running(&half), "{half:?}");

    // The plan: one move of a web replica off the MI210 node, to an MI300X partition (the
    // planner makes room on one node by moving pods to others).
    let (code, plan_text, stderr) = hami(
        &kubeconfig,
        &[
            "plan",
            "--pending-pod",
            "ml/half",
            "--min-age-seconds",
            "0",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{plan_text}\n{stderr}");
    let mut plan: Value = serde_json::from_str(&plan_text).unwrap();
    let moves = plan["moves"].as_array().unwrap().clone();
    assert_eq!(moves.len(), 1, "{plan}");
    let mv = &moves[0];
    let moved = mv["pod"]
        .as_str()
        .unwrap()
        .trim_start_matches("ml/")
        .to_owned();
    let from = mv["from"]["cards"][0]["card"].as_str().unwrap().to_owned();
    let to = mv["to"]["cards"][0]["card"].as_str().unwrap().to_owned();
    assert_eq!(
        (mv["from"]["node"].as_str(), mv["to"]["node"].as_str()),
        (Some(NODE), Some(OTHER_NODE)),
        "{plan}"
    );
    assert_eq!(webs[&from], moved, "{plan}");
    assert!(partitions.contains(&to), "{plan}");

    // A plan made while a defrag reservation is in force leaves the reserved capacity
    // alone: with `to` held whole for another owner's replacement, the move goes to
    // another partition (the same plan went to `to` before).
    let held = &shapes[&to];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let reservation = json!({"owner_uid": "rs-other-uid", "owner": "ReplicaSet/other",
        "cards": [[to, held.0, held.1]], "reserved_at": now - 10, "expires_at": now + 600});
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let annotate = |value: Value| {
        Patch::Merge(json!({"metadata": {"annotations": {
            "reservation.defrag.hami.io/other-evicted-uid": value}}}))
    };
    nodes
        .patch(
            OTHER_NODE,
            &PatchParams::default(),
            &annotate(json!(reservation.to_string())),
        )
        .await
        .unwrap();
    let (code, replanned, stderr) = hami(
        &kubeconfig,
        &[
            "plan",
            "--pending-pod",
            "ml/half",
            "--min-age-seconds",
            "0",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{replanned}\n{stderr}");
    let replanned: Value = serde_json::from_str(&replanned).unwrap();
    let moves_now = replanned["moves"].as_array().unwrap();
    assert_eq!(moves_now.len(), 1, "{replanned}");
    let elsewhere = moves_now[0]["to"]["cards"][0]["card"].as_str().unwrap();
    assert!(
        elsewhere != to && partitions.iter().any(|p| p == elsewhere),
        "the plan targets {to}, which a reservation holds: {replanned}"
    );
    // Released: the scheduler must see it gone before the replacement is placed.
    nodes
        .patch(OTHER_NODE, &PatchParams::default(), &annotate(Value::Null))
        .await
        .unwrap();
    until("the scheduler sees the reservation gone", 30, async || {
        cluster
            .scheduler
            .state()
            .reservations
            .on(OTHER_NODE)
            .is_empty()
            .then_some(())
    })
    .await;

    // A second move in the same step, under the same budget (allowing 1): its eviction
    // is refused once the first spends the budget. It moves another replica to another
    // idle partition.
    let other_card = partitions.iter().find(|c| **c != to).unwrap().clone();
    let (second_from, second_pod) = webs
        .iter()
        .find(|(c, _)| **c != from)
        .map(|(c, n)| (c.clone(), n.clone()))
        .unwrap();
    let second_uid = pods.get(&second_pod).await.unwrap().metadata.uid.unwrap();
    let mut second = mv.clone();
    second["pod"] = json!(format!("ml/{second_pod}"));
    second["uid"] = json!(second_uid);
    second["from"]["cards"][0]["card"] = json!(second_from);
    second["to"]["cards"][0]["card"] = json!(other_card);
    plan["moves"].as_array_mut().unwrap().push(second);
    let plan_path = dir_of(&kubeconfig).join("plan.json");
    std::fs::write(&plan_path, plan.to_string()).unwrap();

    // The ReplicaSet controller, played here (the stand-in runs none).
    let controller = replica_set(pods.clone());
    let out = hami(
        &kubeconfig,
        &[
            "apply",
            plan_path.to_str().unwrap(),
            "--execute",
            "--min-age-seconds",
            "0",
            "--pdb-wait-seconds",
            "1",
            "-o",
            "json",
        ],
    )
    .await;
    let (code, report, stderr) = out;
    assert_eq!(
        code,
        Some(1),
        "a blocked step fails the run\n{report}\n{stderr}"
    );
    let report: Value = serde_json::from_str(&report).unwrap();
    let step = &report["steps"][0];
    assert_eq!(step["outcome"], "blocked_by_pdb", "{report}");
    let detail = step["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!(
            "the PodDisruptionBudget of ml/{second_pod} refused its eviction"
        )) && detail.contains(&format!("evicted before it: ml/{moved}")),
        "{detail}"
    );
    assert!(
        pods.get_opt(&second_pod).await.unwrap().is_some(),
        "the refused replica stays"
    );

    // The replacement lands on the reserved card, not on the one the eviction freed; then
    // the half-card pod runs on the freed one.
    let replacement = until("the replacement runs", 90, async || {
        all_pods(&pods).await.into_iter().find(|p| {
            let n = name(p);
            n.starts_with("web-") && !webs.values().any(|w| *w == n) && running(p)
        })
    })
    .await;
    assert_eq!(
        card(&replacement).as_deref(),
        Some(to.as_str()),
        "the replacement {} takes the reservation on {to}, not the freed {from}",
        name(&replacement)
    );
    let half = until("the half-card pod runs", 90, async || {
        pods.get("half").await.ok().filter(running)
    })
    .await;
    assert_eq!(card(&half).as_deref(), Some(from.as_str()));
    // The evicted replica's reservation stays on its target until it expires (its step did
    // not finish); the refused one's was released. The scheduler read it when the node
    // changed and holds its decoded value.
    let reserved: Vec<String> = {
        let n = api.get_object("v1", "nodes", "", OTHER_NODE).unwrap();
        n["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .keys()
            .filter_map(|k| k.strip_prefix("reservation.defrag.hami.io/"))
            .map(String::from)
            .collect()
    };
    assert_eq!(reserved, vec![mv["uid"].as_str().unwrap().to_owned()]);
    let state = cluster.scheduler.state();
    let entries = state.reservations.on(OTHER_NODE);
    assert_eq!(entries.len(), 1);
    let r = entries[0]
        .reservation
        .as_ref()
        .expect("a well-formed reservation");
    assert_eq!(
        (r.owner_uid.as_str(), r.template_hash.as_deref()),
        (OWNER_UID, Some(HASH))
    );
    drop(state);
    controller.abort();
}

fn dir_of(kubeconfig: &Path) -> PathBuf {
    kubeconfig.parent().unwrap().to_owned()
}
