//! `hami defrag plan` against an API server: a fragmented node where a 1/2-card pod cannot
//! fit, the moves that make room, a PodDisruptionBudget that keeps its pods in place, the
//! JSON plan, and bad input with exit code 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hami_apiserver::{ApiServer, Config, RunningApiServer};
use hami_defrag_core::Plan;
use serde_json::{Value, json};

const REGISTER_N2: &str = r#"[{"id":"G3","index":0,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#;
const REGISTER: &str = r#"[{"id":"G1","index":0,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true},{"id":"G2","index":1,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#;

/// A running pod (created now: its age is 0) of ReplicaSet `app`, labelled `app`, holding
/// `mib` and 13 CUs of `node`'s `card`.
pub(crate) fn placed(name: &str, app: &str, node: &str, card: &str, mib: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml",
        "labels": {"app": app},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app, "uid": format!("rs-{app}"), "controller": true}],
        "annotations": {"hami.io/vgpu-node": node,
            "hami.io/amd-devices-allocated": format!("{card},AMD Instinct MI210,{mib},13:;")}},
        "spec": {"nodeName": node, "schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": mib.to_string(), "amd.com/gpucores": "12"}}}]},
        "status": {"phase": "Running"}})
}

fn pdb(app: &str, allowed: i32) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": app, "namespace": "ml"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
        "status": {"disruptionsAllowed": allowed, "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2}})
}

/// Node n1 with two MI210s (64 GiB, 104 CUs), each holding a `web` pod (its budget allows
/// 1 disruption) and a `frozen` one (its budget allows none), 20000 MiB each, and node n2
/// with one MI210 holding a 40000 MiB `frozen` pod: 25536 MiB free on every card, so a pod
/// asking half a card (32768 MiB) fits none; `ml/half` is that pod, pending. A `web` pod
/// fits n2 (the planner moves pods to another node: an evicted pod's replacement).
pub(crate) async fn fragmented(test: &str) -> (RunningApiServer, PathBuf) {
    fragmented_on(Config::default(), test).await
}

async fn fragmented_on(config: Config, test: &str) -> (RunningApiServer, PathBuf) {
    let api = ApiServer::start(config).await.unwrap();
    let create = |version: &str, resource: &str, ns: Option<&str>, object: Value| {
        api.create_object(version, resource, ns, object).unwrap();
    };
    create(
        "v1",
        "nodes",
        None,
        json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "annotations": {"hami.io/node-amd-register": REGISTER}}}),
    );
    create(
        "v1",
        "namespaces",
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}),
    );
    create(
        "v1",
        "nodes",
        None,
        json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n2", "annotations": {"hami.io/node-amd-register": REGISTER_N2}}}),
    );
    create(
        "v1",
        "pods",
        Some("ml"),
        placed("web-a", "web", "n1", "G1", 20000),
    );
    create(
        "v1",
        "pods",
        Some("ml"),
        placed("frozen-c", "frozen", "n1", "G1", 20000),
    );
    create(
        "v1",
        "pods",
        Some("ml"),
        placed("web-b", "web", "n1", "G2", 20000),
    );
    create(
        "v1",
        "pods",
        Some("ml"),
        placed("frozen-d", "frozen", "n1", "G2", 20000),
    );
    create(
        "v1",
        "pods",
        Some("ml"),
        placed("frozen-e", "frozen", "n2", "G3", 40000),
    );
    create(
        "policy/v1",
        "poddisruptionbudgets",
        Some("ml"),
        pdb("web", 1),
    );
    create(
        "policy/v1",
        "poddisruptionbudgets",
        Some("ml"),
        pdb("frozen", 0),
    );
    create(
        "v1",
        "pods",
        Some("ml"),
        json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "half", "namespace": "ml"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "32768", "amd.com/gpucores": "50"}}}]}}),
    );
    let kubeconfig = std::env::temp_dir().join(format!(
        "hami-defrag-{test}-{}.kubeconfig",
        std::process::id()
    ));
    api.write_kubeconfig(&kubeconfig).unwrap();
    (api, kubeconfig)
}

async fn hami(kubeconfig: &Path, args: &[&str]) -> Output {
    let kubeconfig = kubeconfig.to_owned();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_hami"))
            .args(["defrag", "plan", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

pub(crate) fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_moves_a_pod_so_a_half_card_pod_fits_and_keeps_pdb_blocked_pods() {
    let (_api, kubeconfig) = fragmented("plan").await;

    // Just created: by default too young to move, and the plan says so.
    let out = hami(&kubeconfig, &["--pending-pod", "ml/half"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("NOT reached (0 move(s)"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("pod ml/web-a stays: running ")
                && l.ends_with("s, younger than the minimum age 600s")),
        "{stdout}"
    );

    let out = hami(
        &kubeconfig,
        &["--pending-pod", "ml/half", "--min-age-seconds", "0"],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("reached (1 move(s)"), "{stdout}");
    assert!(stdout.contains("The pod then fits on node n1."), "{stdout}");
    let moves: Vec<&str> = stdout.lines().filter(|l| l.starts_with("0 ")).collect();
    assert_eq!(moves.len(), 1, "{stdout}");
    assert!(
        moves[0].contains("ml/web-") && moves[0].contains("n2/G3") && moves[0].contains("allows 1"),
        "a web pod moves to n2: {stdout}"
    );
    // The frozen pods are never moved, and the plan says why.
    for pod in ["ml/frozen-c", "ml/frozen-d", "ml/frozen-e"] {
        assert!(!moves[0].contains(pod), "{stdout}");
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{pod}: "))
                    && l.contains("PodDisruptionBudget ml/frozen allows no disruption now")),
            "{pod} listed as kept: {stdout}"
        );
    }

    // The JSON is the core's Plan (and the kept pods).
    let out = hami(
        &kubeconfig,
        &[
            "--pending-pod",
            "ml/half",
            "--min-age-seconds",
            "0",
            "-o",
            "json",
        ],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let plan: Plan = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert!(plan.reached, "{plan:?}");
    assert_eq!(plan.pod_fits_on.as_deref(), Some("n1"));
    assert_eq!(plan.moves.len(), 1, "{plan:?}");
    let step = &plan.moves[0];
    assert!(step.pod.starts_with("ml/web-"), "{step:?}");
    assert_eq!(
        (step.from.node.as_str(), step.to.node.as_str()),
        ("n1", "n2"),
        "{step:?}"
    );
    assert_eq!(step.to.cards[0].card, "G3", "{step:?}");
    assert_eq!(step.from.cards[0].mem_mib, 20000);
    let kept: Value = serde_json::from_str(&stdout).unwrap();
    assert!(kept["protected"]["ml/frozen-c"].is_string(), "{stdout}");

    // YAML parses as the same plan.
    let out = hami(
        &kubeconfig,
        &[
            "--pending-pod",
            "ml/half",
            "--min-age-seconds",
            "0",
            "-o",
            "yaml",
        ],
    )
    .await;
    let yaml: Plan = serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert_eq!(yaml, plan);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_exit_code_2_and_what_to_change() {
    let (_api, kubeconfig) = fragmented("bad").await;
    let cases: [(&[&str], &str); 6] = [
        (&["--pending-pod", "ml/ghost"], "no such pod"),
        (&["--pending-pod", "ghost"], "NAMESPACE/NAME"),
        (
            &["--pending-pod", "ml/web-a"],
            "already holds GPU slices on node n1",
        ),
        (&[], "--pending-pod"),
        (
            &["--pending-pod", "ml/half", "--min-free-percent", "50"],
            "cannot be used with",
        ),
        (&["--min-free-percent", "150"], "whole number from 1 to 100"),
    ];
    for (args, want) in cases {
        let out = hami(&kubeconfig, args).await;
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stdout}\n{stderr}");
        assert!(stderr.contains(want), "{args:?}: want {want:?} in {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }
    // A card target the cluster cannot reach says what blocks it (exit 0: a plan).
    let out = hami(&kubeconfig, &["--free-cards", "4", "--type", "MI210"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("NOT reached") && stdout.contains("only 3 healthy card(s)"),
        "{stdout}"
    );
    let out = hami(&kubeconfig, &["--free-cards", "1"]).await;
    assert_eq!(out.status.code(), Some(2), "--free-cards needs --type");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_right_to_list_budgets_the_plan_warns_and_moves_nothing_by_default() {
    let config = Config {
        auth: Some(hami_apiserver::authn::AuthConfig::default()),
        ..Config::default()
    };
    let (api, _) = fragmented_on(config, "no-pdb-rights").await;
    let rbac = "rbac.authorization.k8s.io/v1";
    api.create_object(
        rbac,
        "clusterroles",
        None,
        json!({"apiVersion": rbac, "kind": "ClusterRole",
        "metadata": {"name": "gpu-viewer"},
        "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list"]}]}),
    )
    .unwrap();
    api.create_object(rbac, "clusterrolebindings", None, json!({"apiVersion": rbac, "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpu-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpu-viewer"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": "ml"}]}))
        .unwrap();
    let token = api.service_account_token("ml", "viewer").unwrap();
    let kubeconfig = std::env::temp_dir().join(format!(
        "hami-defrag-viewer-{}.kubeconfig",
        std::process::id()
    ));
    std::fs::write(&kubeconfig, api.kubeconfig_yaml_with_token(&token)).unwrap();

    let out = hami(
        &kubeconfig,
        &["--pending-pod", "ml/half", "--min-age-seconds", "0"],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("warning: listing PodDisruptionBudgets was refused")
            && stderr.contains("list on poddisruptionbudgets (API group policy)"),
        "{stderr}"
    );
    assert!(stdout.contains("NOT reached (0 move(s)"), "{stdout}");
    assert!(
        stdout.contains("ml/web-a: no PodDisruptionBudget covers it"),
        "the budget allowing 1 is unknown: {stdout}"
    );
}

/// Three one-card nodes (1000 MiB, 100 CUs), node policy spread: `small` puts one 300 MiB
/// pod on each, so the `half` pod (800 MiB) that follows fits none; moving one `small`
/// pod to a neighbour frees a card.
const SCENARIO: &str = r#"
name: fragmented
fleet:
  - name: n
    count: 3
    gpus:
      - {vendor: amd, type: AMD Instinct MI210, count: 1, memory_mib: 1000, cus: 100}
workloads:
  - count: 3
    pod:
      metadata: {name: small}
      spec:
        containers:
          - {name: c, image: x, resources: {limits: {amd.com/gpu: 1, amd.com/gpumem: 300, amd.com/gpucores: 10}}}
  - count: 1
    pod:
      metadata: {name: half}
      spec:
        containers:
          - {name: c, image: x, resources: {limits: {amd.com/gpu: 1, amd.com/gpumem: 800, amd.com/gpucores: 50}}}
policies:
  gpu: [binpack]
  node: [spread]
"#;

/// `hami defrag plan` on `file` with `args`, no cluster.
fn on_scenario(file: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hami"))
        .args(["defrag", "plan", "--scenario"])
        .arg(file)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn plan_on_a_scenario_file_moves_one_pod_and_refuses_a_bad_file() {
    let file = std::env::temp_dir().join(format!("hami-defrag-{}.yaml", std::process::id()));
    std::fs::write(&file, SCENARIO).unwrap();
    // No budgets in a scenario: by default every pod stays, and the plan says why.
    let out = on_scenario(&file, &["--pending-pod", "default/half-0"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("NOT reached") && stdout.contains("no PodDisruptionBudget covers it"),
        "{stdout}"
    );

    let out = on_scenario(
        &file,
        &[
            "--pending-pod",
            "default/half-0",
            "--allow-without-pdb",
            "-o",
            "json",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let plan: Plan = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert!(plan.reached, "{plan:?}");
    assert_eq!(plan.moves.len(), 1, "{plan:?}");
    assert!(plan.moves[0].pod.starts_with("default/small-"), "{plan:?}");
    assert_eq!(
        plan.pod_fits_on.as_deref(),
        Some(plan.moves[0].from.node.as_str()),
        "{plan:?}"
    );

    // A placed pod is not pending; a file that is not a scenario names the field.
    let out = on_scenario(&file, &["--pending-pod", "default/small-0"]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    std::fs::write(&file, "fleet: []\nworkloads: 7\n").unwrap();
    let out = on_scenario(&file, &["--min-free-percent", "50"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stderr.contains("workloads"), "{stderr}");
    let _ = std::fs::remove_file(&file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pod_fact_the_cluster_holds_keeps_its_pod_in_place_for_its_own_reason() {
    let (api, kubeconfig) = fragmented("facts").await;
    let create = |version: &str, resource: &str, ns: Option<&str>, object: Value| {
        api.create_object(version, resource, ns, object).unwrap();
    };
    let mut pods: Vec<(Value, &str)> = Vec::new();
    let mut crit = placed("crit", "crit", "n1", "G1", 1000);
    crit["spec"]["priorityClassName"] = json!("system-node-critical");
    pods.push((crit, "critical pod"));
    let mut mirror = placed("mirror", "mirror", "n1", "G1", 1000);
    mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"] = json!("abc");
    pods.push((mirror, "static pod"));
    let mut gang = placed("gang", "gang", "n1", "G1", 1000);
    gang["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!("job-1");
    pods.push((gang, "gang member"));
    let mut ds = placed("ds", "ds", "n1", "G2", 1000);
    ds["metadata"]["ownerReferences"][0]["kind"] = json!("DaemonSet");
    pods.push((ds, "DaemonSet pod"));
    let mut bare = placed("bare", "bare", "n1", "G2", 1000);
    bare["metadata"]["ownerReferences"] = json!([]);
    pods.push((bare, "no controller recreates it"));
    pods.push((
        placed("lonely", "lonely", "n1", "G2", 1000),
        "only replica of ReplicaSet/lonely",
    ));
    // Two budgets cover twice-*: the tightest decides.
    for name in ["twice-1", "twice-2"] {
        pods.push((
            placed(name, "twice", "n2", "G3", 1000),
            "PodDisruptionBudget ml/twice-zero allows no disruption now",
        ));
    }
    for (pod, _) in &pods {
        create("v1", "pods", Some("ml"), pod.clone());
    }
    let mut loose = pdb("twice", 3);
    loose["metadata"]["name"] = json!("twice-loose");
    create("policy/v1", "poddisruptionbudgets", Some("ml"), loose);
    let mut zero = pdb("twice", 0);
    zero["metadata"]["name"] = json!("twice-zero");
    zero["spec"]["selector"] = json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["twice", "other"]}]});
    create("policy/v1", "poddisruptionbudgets", Some("ml"), zero);
    // A budget of another namespace covers none of ml's pods.
    create(
        "v1",
        "namespaces",
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}),
    );
    let mut elsewhere = pdb("web", 0);
    elsewhere["metadata"]["namespace"] = json!("other");
    create(
        "policy/v1",
        "poddisruptionbudgets",
        Some("other"),
        elsewhere,
    );

    let out = hami(
        &kubeconfig,
        &[
            "--min-free-percent",
            "50",
            "--min-age-seconds",
            "0",
            "-o",
            "json",
        ],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let kept: Value = serde_json::from_str(&stdout).unwrap();
    let kept = &kept["protected"];
    for (pod, why) in &pods {
        let name = format!("ml/{}", pod["metadata"]["name"].as_str().unwrap());
        let said = kept[&name]
            .as_str()
            .unwrap_or_else(|| panic!("{name} not kept: {kept}"));
        assert!(said.starts_with(why), "{name}: {said}");
    }
    for movable in ["ml/web-a", "ml/web-b"] {
        assert!(kept.get(movable).is_none(), "{movable}: {kept}");
    }
}
