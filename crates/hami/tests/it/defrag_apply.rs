//! `hami defrag apply` against the embedded API server (its `pods/eviction` honours
//! PodDisruptionBudgets): a dry run touches nothing; executed, the planned pod is evicted,
//! its target reserved meanwhile, an Event recorded, and the step waits for the owner's
//! replacement, which the test creates as the ReplicaSet controller would (the stand-in
//! runs no controllers); a budget that refuses the second eviction of a step stops it; a
//! plan gone stale skips its move and touches nothing; a freshly moved pod is not moved
//! again; a malformed plan file exits 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hami_apiserver::RunningApiServer;
use serde_json::{Value, json};

use crate::defrag::{fragmented, placed, text};

async fn run(kubeconfig: &Path, args: &[&str]) -> Output {
    let kubeconfig = kubeconfig.to_owned();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_hami"))
            .arg("defrag")
            .args(&args)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// `hami defrag plan` for ml/half (ages 0 allowed), written to a file: its path and JSON.
async fn plan_file(kubeconfig: &Path, test: &str) -> (PathBuf, Value) {
    let out = run(
        kubeconfig,
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
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let plan: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(plan["moves"].as_array().unwrap().len(), 1, "{plan}");
    let path = std::env::temp_dir().join(format!("hami-apply-{test}-{}.json", std::process::id()));
    std::fs::write(&path, &stdout).unwrap();
    (path, plan)
}

fn pod_name(plan: &Value, i: usize) -> String {
    plan["moves"][i]["pod"]
        .as_str()
        .unwrap()
        .trim_start_matches("ml/")
        .to_string()
}

fn exists(api: &RunningApiServer, name: &str) -> bool {
    api.get_object("v1", "pods", "ml", name).is_some()
}

/// Sets pod ml/`name`'s phase to Running (the stand-in keeps no status on create; a
/// Running pod is what the eviction checks its budget for).
async fn running(kubeconfig: &Path, name: &str) {
    let pods =
        kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client(kubeconfig).await, "ml");
    let status = json!({"status": {"phase": "Running"}});
    pods.patch_status(name, &Default::default(), &kube::api::Patch::Merge(&status))
        .await
        .unwrap();
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(8);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_touches_nothing_and_execute_moves_the_pod_once_its_replacement_runs() {
    let (api, kubeconfig) = fragmented("apply").await;
    let (path, plan) = plan_file(&kubeconfig, "apply").await;
    for pod in ["web-a", "web-b"] {
        running(&kubeconfig, pod).await;
    }
    let moved = pod_name(&plan, 0);
    let p = path.to_str().unwrap();

    // The same refusals as plan: by default the just-created pod is too young.
    let out = run(&kubeconfig, &["apply", p]).await;
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains(&format!(
            "skipped (step 0) ml/{moved}: refused by policy: running "
        )) && stdout.contains("younger than the minimum age 600s"),
        "{stdout}"
    );
    let out = run(&kubeconfig, &["apply", p, "--min-age-seconds", "0"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("Dry run (add --execute to evict): steps: 1"),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("ml/{moved} -> n2 G3")), "{stdout}");
    assert!(stdout.contains("would run"), "{stdout}");
    assert!(exists(&api, &moved), "a dry run evicts nothing");
    // The same plan written as YAML reads the same.
    let out = run(
        &kubeconfig,
        &[
            "plan",
            "--pending-pod",
            "ml/half",
            "--min-age-seconds",
            "0",
            "-o",
            "yaml",
        ],
    )
    .await;
    let yaml = path.with_extension("yaml");
    std::fs::write(&yaml, &out.stdout).unwrap();
    let out = run(
        &kubeconfig,
        &[
            "apply",
            yaml.to_str().unwrap(),
            "--min-age-seconds",
            "0",
            "-o",
            "json",
        ],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["executed"], false);
    assert_eq!(summary["steps"][0]["outcome"], "would_run", "{summary}");
    assert_eq!(summary["steps"][0]["moves"][0][0], format!("ml/{moved}"));

    // Executed: the test plays the ReplicaSet controller, creating the replacement on n2
    // once the pod is evicted; meanwhile n2 carries the reservation for the owner.
    let uid = plan["moves"][0]["uid"].as_str().unwrap().to_string();
    let key = format!("reservation.defrag.hami.io/{uid}");
    let child = {
        let kubeconfig = kubeconfig.clone();
        let path = path.clone();
        tokio::spawn(async move {
            run(
                &kubeconfig,
                &[
                    "apply",
                    path.to_str().unwrap(),
                    "--execute",
                    "--min-age-seconds",
                    "0",
                    "--ready-wait-seconds",
                    "8",
                ],
            )
            .await
        })
    };
    until("the eviction", || !exists(&api, &moved)).await;
    let node = api.get_object("v1", "nodes", "", "n2").unwrap();
    let reservation: Value = serde_json::from_str(
        node["metadata"]["annotations"][&key]
            .as_str()
            .expect("a reservation on n2"),
    )
    .unwrap();
    assert_eq!(reservation["owner_uid"], "rs-web");
    assert_eq!(reservation["cards"][0][0], "G3");
    api.create_object(
        "v1",
        "pods",
        Some("ml"),
        placed("web-new", "web", "n2", "G3", 20000),
    )
    .unwrap();
    // Not yet running: the step still waits.
    assert!(!child.is_finished());
    running(&kubeconfig, "web-new").await;
    let out = child.await.unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("step 0 from n1: moved"), "{stdout}");
    assert!(
        stdout.contains("Summary: 1 pod(s) moved, 0 skipped, 0 step(s) blocked"),
        "{stdout}"
    );
    // The replacement is marked, the reservation released, the budget spent, an Event left.
    let new = api.get_object("v1", "pods", "ml", "web-new").unwrap();
    assert!(
        new["metadata"]["labels"]["hami.io/defrag-moved-at"]
            .as_str()
            .is_some_and(|t| t.parse::<u64>().is_ok()),
        "{new}"
    );
    let node = api.get_object("v1", "nodes", "", "n2").unwrap();
    assert!(
        node["metadata"]["annotations"].get(&key).is_none(),
        "{node}"
    );
    let pdb = api
        .get_object("policy/v1", "poddisruptionbudgets", "ml", "web")
        .unwrap();
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0);
    let events = events(&kubeconfig).await;
    let ev = events
        .iter()
        .find(|e| e["reason"] == "DefragEvicted")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(ev["involvedObject"]["name"], moved.as_str());
    let msg = ev["message"].as_str().unwrap();
    assert!(
        msg.contains("plan step 0") && msg.contains("to n2 G3"),
        "{msg}"
    );
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// The Events of namespace ml.
async fn events(kubeconfig: &Path) -> Vec<Value> {
    let list =
        kube::Api::<k8s_openapi::api::core::v1::Event>::namespaced(client(kubeconfig).await, "ml")
            .list(&Default::default())
            .await
            .unwrap();
    list.items
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_refusing_the_second_eviction_stops_the_step() {
    let (api, kubeconfig) = fragmented("apply-pdb").await;
    let (path, mut plan) = plan_file(&kubeconfig, "apply-pdb").await;
    for pod in ["web-a", "web-b"] {
        running(&kubeconfig, pod).await;
    }
    // A node added after the plan: the second move's target.
    api.create_object(
        "v1",
        "nodes",
        None,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n3", "annotations": {"hami.io/node-amd-register":
            r#"[{"id":"G4","index":0,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#}}}),
    )
    .unwrap();
    // One step moving both web pods (each read as allowed: the budget allows 1 now): the
    // first eviction spends it, the second is refused.
    let first = pod_name(&plan, 0);
    let other = if first == "web-a" { "web-b" } else { "web-a" };
    let other_pod = api.get_object("v1", "pods", "ml", other).unwrap();
    let mut second = plan["moves"][0].clone();
    second["pod"] = json!(format!("ml/{other}"));
    second["uid"] = other_pod["metadata"]["uid"].clone();
    second["from"]["cards"][0]["card"] = json!(if other == "web-a" { "G1" } else { "G2" });
    second["to"]["node"] = json!("n3");
    second["to"]["cards"][0]["card"] = json!("G4");
    plan["moves"].as_array_mut().unwrap().push(second);
    std::fs::write(&path, plan.to_string()).unwrap();
    let p = path.to_str().unwrap();
    let out = run(
        &kubeconfig,
        &[
            "apply",
            p,
            "--execute",
            "--min-age-seconds",
            "0",
            "--pdb-wait-seconds",
            "1",
            "--ready-wait-seconds",
            "1",
        ],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "blocked by pdb: the PodDisruptionBudget of ml/{other} refused its eviction for 1s (evicted before it: ml/{first})"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 step(s) blocked by a PodDisruptionBudget"),
        "{stdout}"
    );
    assert!(!exists(&api, &first));
    assert!(exists(&api, other), "the refused pod stays");
    // The refused pod's reservation (n3) is released; the evicted one's (n2) stays until it
    // expires, for its replacement.
    let reservations = |node: &str| -> Vec<String> {
        let n = api.get_object("v1", "nodes", "", node).unwrap();
        n["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with("reservation.defrag.hami.io/"))
            .cloned()
            .collect()
    };
    assert_eq!(reservations("n3"), Vec::<String>::new());
    assert_eq!(
        reservations("n2"),
        vec![format!(
            "reservation.defrag.hami.io/{}",
            plan["moves"][0]["uid"].as_str().unwrap()
        )]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_or_freshly_moved_pod_is_skipped_and_nothing_else_touched() {
    let (api, kubeconfig) = fragmented("apply-stale").await;
    let (path, plan) = plan_file(&kubeconfig, "apply-stale").await;
    let moved = pod_name(&plan, 0);
    let p = path.to_str().unwrap();
    let pods_before = |api: &RunningApiServer| {
        ["web-a", "web-b", "frozen-c", "frozen-d", "frozen-e", "half"]
            .iter()
            .filter(|n| exists(api, n))
            .count()
    };

    // A fresh marker: the pod was moved a minute ago.
    let pods =
        kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client(&kubeconfig).await, "ml");
    let minute_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 60;
    let label =
        json!({"metadata": {"labels": {"hami.io/defrag-moved-at": minute_ago.to_string()}}});
    pods.patch(
        &moved,
        &Default::default(),
        &kube::api::Patch::Merge(&label),
    )
    .await
    .unwrap();
    let out = run(
        &kubeconfig,
        &["apply", p, "--execute", "--min-age-seconds", "0"],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("Steps: 0"), "{stdout}");
    assert!(
        stdout.contains(&format!("skipped (step 0) ml/{moved}: moved by defrag 6")),
        "{stdout}"
    );
    // With a TTL under a minute the marker no longer protects it (a dry run: the step would run).
    let out = run(
        &kubeconfig,
        &[
            "apply",
            p,
            "--min-age-seconds",
            "0",
            "--marker-ttl-seconds",
            "30",
        ],
    )
    .await;
    let (stdout, _) = text(&out);
    assert!(stdout.contains("would run"), "{stdout}");

    // The pod is gone (its replacement not yet there): the move is stale.
    pods.delete(&moved, &Default::default()).await.unwrap();
    let out = run(
        &kubeconfig,
        &["apply", p, "--execute", "--min-age-seconds", "0"],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("Steps: 0"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "skipped (step 0) ml/{moved}: pod ml/{moved} (uid "
        )),
        "{stdout}"
    );
    assert!(stdout.contains(") is gone"), "{stdout}");
    assert_eq!(pods_before(&api), 5, "only the deleted pod is missing");
    assert!(
        events(&kubeconfig)
            .await
            .iter()
            .all(|e| e["reason"] != "DefragEvicted")
    );
    let pdb = api
        .get_object("policy/v1", "poddisruptionbudgets", "ml", "web")
        .unwrap();
    assert_eq!(
        pdb["status"]["disruptionsAllowed"], 1,
        "no eviction spent it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_plan_file_exits_2_naming_the_problem() {
    let (_api, kubeconfig) = fragmented("apply-bad").await;
    let dir = std::env::temp_dir();
    let cases: [(&str, &str, &str); 4] = [
        ("bad.json", "{\"moves\": [", "is not a plan (JSON)"),
        ("bad.yaml", "target: x\nmoves: 3\n", "is not a plan (YAML)"),
        (
            "no-uid.json",
            r#"{"target":"t","shortfall_before":1,"shortfall_after":0,"reached":true,"pod_fits_on":null,"blocked":[],"blockers_left_out":0,
               "moves":[{"step":0,"pod":"ml/web-a","uid":"","from":{"node":"n1","cards":[]},"to":{"node":"n2","cards":[]},"why":"","pdb":"","gain":"","shortfall_after":0}]}"#,
            "move 0 (ml/web-a) needs a namespace/name pod, its uid and from/to nodes",
        ),
        ("missing.json", "", "cannot read plan"),
    ];
    for (name, body, want) in cases {
        let path = dir.join(format!("hami-apply-{}-{name}", std::process::id()));
        if name != "missing.json" {
            std::fs::write(&path, body).unwrap();
        }
        let out = run(&kubeconfig, &["apply", path.to_str().unwrap()]).await;
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{name}: {stdout}\n{stderr}");
        assert!(
            stderr.contains(want) && stderr.contains(&path.display().to_string()),
            "{name}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_does_not_move_a_freshly_moved_pod_again() {
    let (_api, kubeconfig) = fragmented("plan-marked").await;
    let pods =
        kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client(&kubeconfig).await, "ml");
    let minute_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 60;
    let label =
        json!({"metadata": {"labels": {"hami.io/defrag-moved-at": minute_ago.to_string()}}});
    for pod in ["web-a", "web-b"] {
        pods.patch(pod, &Default::default(), &kube::api::Patch::Merge(&label))
            .await
            .unwrap();
    }
    let args = [
        "plan",
        "--pending-pod",
        "ml/half",
        "--min-age-seconds",
        "0",
        "-o",
        "json",
    ];
    let out = run(&kubeconfig, &args).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let plan: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(plan["moves"], json!([]), "{plan}");
    for pod in ["ml/web-a", "ml/web-b"] {
        let why = plan["protected"][pod].as_str().unwrap_or_default();
        assert!(why.starts_with("moved by defrag 6"), "{pod}: {plan}");
    }
    // Past a shorter TTL the marker no longer protects.
    let mut args = args.to_vec();
    args.extend(["--marker-ttl-seconds", "30"]);
    let out = run(&kubeconfig, &args).await;
    let plan: Value = serde_json::from_str(&text(&out).0).unwrap();
    assert_eq!(plan["moves"].as_array().unwrap().len(), 1, "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_error_aborts_its_step_and_the_next_step_does_not_run() {
    let (api, kubeconfig) = fragmented("apply-abort").await;
    let (path, mut plan) = plan_file(&kubeconfig, "apply-abort").await;
    api.create_object(
        "v1",
        "nodes",
        None,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n3", "annotations": {"hami.io/node-amd-register":
            r#"[{"id":"G4","index":0,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#}}}),
    )
    .unwrap();
    // A second step: the other web pod to n3.
    let first = pod_name(&plan, 0);
    let other = if first == "web-a" { "web-b" } else { "web-a" };
    let other_pod = api.get_object("v1", "pods", "ml", other).unwrap();
    let mut second = plan["moves"][0].clone();
    second["step"] = json!(1);
    second["pod"] = json!(format!("ml/{other}"));
    second["uid"] = other_pod["metadata"]["uid"].clone();
    second["from"]["cards"][0]["card"] = json!(if other == "web-a" { "G1" } else { "G2" });
    second["to"]["node"] = json!("n3");
    second["to"]["cards"][0]["card"] = json!("G4");
    plan["moves"].as_array_mut().unwrap().push(second);
    std::fs::write(&path, plan.to_string()).unwrap();
    for pod in ["web-a", "web-b"] {
        running(&kubeconfig, pod).await;
    }
    api.faults()
        .fail_next(Some("create"), Some("pods/eviction"), 1, 500);
    let p = path.to_str().unwrap();
    let out = run(
        &kubeconfig,
        &[
            "apply",
            p,
            "--execute",
            "--min-age-seconds",
            "0",
            "--pdb-wait-seconds",
            "5",
        ],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("step 0 from n1: aborted: evicting ml/{first}: ")),
        "{stdout}"
    );
    assert!(stdout.contains("injected fault"), "{stdout}");
    assert!(
        stdout.contains("step 1 from n1: not run: an earlier step did not finish"),
        "{stdout}"
    );
    assert!(stdout.contains("0 pod(s) moved, 0 skipped, 0 step(s) blocked by a PodDisruptionBudget, 1 aborted, 0 waiting, 1 not run"), "{stdout}");
    assert!(
        exists(&api, "web-a") && exists(&api, "web-b"),
        "nothing evicted"
    );
    let n2 = api.get_object("v1", "nodes", "", "n2").unwrap();
    assert!(
        !n2["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.starts_with("reservation.defrag.hami.io/")),
        "released: {n2}"
    );
}
