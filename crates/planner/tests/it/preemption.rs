//! Issue 30 item 4: workloads with `priority` (and `preemptible: false`) preempt in a plan
//! as the cluster would — the preempt verb's victims, kube-scheduler's node — through the
//! same `run` `hami plan` calls, plus the scenario's bad priority fields.

use hami_planner::{OutputFormat, PlanArgs, run};
use serde_json::Value;

/// One node, one 8000 MiB card shared by up to 10 pods; `lo-big` (4000 MiB) and four
/// `lo-small` (1000 MiB each) fill it; then `hi` asks for 4000 MiB.
fn one_card(hi_priority: i64, big_extra: &str) -> String {
    format!(
        r#"name: one-card
fleet:
- name: n
  count: 1
  gpus:
  - {{type: AMD Instinct MI300X, count: 1, memory_mib: 8000, cus: 100, share: 10}}
workloads:
- count: 1{big_extra}
  pod:
    metadata: {{name: lo-big}}
    spec:
      containers:
      - {{name: c, resources: {{limits: {{amd.com/gpu: 1, amd.com/gpumem: 4000, amd.com/gpucores: 10}}}}}}
- count: 4
  pod:
    metadata: {{name: lo-small}}
    spec:
      containers:
      - {{name: c, resources: {{limits: {{amd.com/gpu: 1, amd.com/gpumem: 1000, amd.com/gpucores: 10}}}}}}
- count: 1
  priority: {hi_priority}
  pod:
    metadata: {{name: hi}}
    spec:
      containers:
      - {{name: c, resources: {{limits: {{amd.com/gpu: 1, amd.com/gpumem: 4000, amd.com/gpucores: 10}}}}}}
policies: {{gpu: [binpack], node: [binpack]}}
"#
    )
}

fn write(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hami-plan-preempt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn plan_json(name: &str, text: &str) -> Value {
    let mut args = PlanArgs::for_scenario(write(name, text));
    args.output = OutputFormat::Json;
    let out = run(&args).unwrap_or_else(|e| panic!("{e}"));
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["policies"].as_array().unwrap().len(), 1, "{report}");
    report["policies"][0].clone()
}

fn plan_text(name: &str, text: &str) -> String {
    run(&PlanArgs::for_scenario(write(name, text))).unwrap_or_else(|e| panic!("{e}"))
}

fn placed_pods(policy: &Value) -> Vec<String> {
    let mut pods: Vec<String> = policy["placements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pod"].as_str().unwrap().to_owned())
        .collect();
    pods.sort();
    pods
}

fn victims(preemption: &Value) -> Vec<&str> {
    preemption["victims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["pod"].as_str().unwrap())
        .collect()
}

#[test]
fn a_high_priority_pod_evicts_the_fewest_low_priority_slices_on_one_card() {
    let p = plan_json("fewest.yaml", &one_card(1000, ""));
    let preemptions = p["preemptions"].as_array().unwrap();
    assert_eq!(preemptions.len(), 1, "{p}");
    let pre = &preemptions[0];
    assert_eq!(pre["pod"], "default/hi-0");
    assert_eq!(pre["node"], "n-0");
    assert_eq!(pre["priority"], 1000);
    // One 4000 MiB slice rather than four of 1000.
    assert_eq!(victims(pre), ["default/lo-big-0"]);
    assert_eq!(pre["victims"][0]["priority"], 0);
    assert_eq!(pre["victims"][0]["replaced_on"], Value::Null);
    assert_eq!(
        (&p["placed"], &p["evicted"], &p["unplaceable"]),
        (&5.into(), &1.into(), &0.into())
    );
    assert!(placed_pods(&p).contains(&"default/hi-0".to_owned()), "{p}");
    assert!(
        !placed_pods(&p).contains(&"default/lo-big-0".to_owned()),
        "{p}"
    );
    let lo_big = p["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "lo-big")
        .unwrap();
    assert_eq!(lo_big["evicted"], 1);
    let reasons = p["evicted_reasons"].as_array().unwrap();
    assert_eq!(reasons.len(), 1, "{p}");
    assert_eq!(reasons[0]["pods"][0], "default/lo-big-0");
    assert!(
        reasons[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("no available node"),
        "{p}"
    );

    let text = plan_text("fewest.yaml", &one_card(1000, ""));
    assert!(text.contains("EVICTED"), "{text}");
    assert!(
        text.contains(
            "binpack/binpack: preemptions\n  pod default/hi-0 (priority 1000) preempts default/lo-big-0 on node n-0\n    default/lo-big-0 (priority 0) unplaceable after preemption\n"
        ),
        "{text}"
    );
    assert!(text.contains("binpack/binpack: unplaceable after preemption\n  1 pod(s) (default/lo-big-0): no available node"), "{text}");
}

#[test]
fn a_pod_marked_not_preemptible_is_never_evicted() {
    let p = plan_json("keep.yaml", &one_card(1000, "\n  preemptible: false"));
    let pre = &p["preemptions"][0];
    assert_eq!(pre["pod"], "default/hi-0", "{p}");
    let mut v = victims(pre);
    v.sort();
    assert_eq!(
        v,
        [
            "default/lo-small-0",
            "default/lo-small-1",
            "default/lo-small-2",
            "default/lo-small-3"
        ]
    );
    assert!(
        placed_pods(&p).contains(&"default/lo-big-0".to_owned()),
        "{p}"
    );
    assert_eq!(p["evicted"], 4);

    // Only unevictable pods on the card: no preemption, the pod is unplaceable.
    let all_kept = one_card(1000, "\n  preemptible: false").replace(
        "- count: 4\n  pod:",
        "- count: 4\n  preemptible: false\n  pod:",
    );
    let p = plan_json("keep-all.yaml", &all_kept);
    assert_eq!(p["preemptions"], Value::Null, "{p}");
    assert_eq!((&p["placed"], &p["unplaceable"]), (&5.into(), &1.into()));
}

#[test]
fn equal_priority_never_preempts() {
    // Default priority on both sides.
    let p = plan_json("equal0.yaml", &one_card(0, ""));
    assert_eq!(p["preemptions"], Value::Null, "{p}");
    assert_eq!(p["evicted"], Value::Null, "{p}");
    assert_eq!((&p["placed"], &p["unplaceable"]), (&5.into(), &1.into()));
    // Both at 1000.
    let same = one_card(1000, "\n  priority: 1000")
        .replace("- count: 4\n  pod:", "- count: 4\n  priority: 1000\n  pod:");
    let p = plan_json("equal1000.yaml", &same);
    assert_eq!(p["preemptions"], Value::Null, "{p}");
    assert_eq!(p["unplaceable"], 1);
    // Lower than what is placed: nothing either.
    let p = plan_json("lower.yaml", &one_card(-5, ""));
    assert_eq!(p["preemptions"], Value::Null, "{p}");
    let text = plan_text("equal0.yaml", &one_card(0, ""));
    assert!(
        !text.contains("EVICTED") && !text.contains("preempt"),
        "{text}"
    );
}

#[test]
fn a_victim_is_placed_again_where_it_fits() {
    // `lo` goes to the emptier big card (node spread); `hi` wants the whole big card;
    // `lo` then fits on the small card's free half.
    let text = r#"fleet:
- name: big
  count: 1
  gpus: [{type: AMD Big, count: 1, memory_mib: 8000, cus: 100}]
- name: small
  count: 1
  gpus: [{type: AMD Small, count: 1, memory_mib: 3000, cus: 100}]
workloads:
- count: 1
  pod:
    metadata: {name: filler, annotations: {amd.com/use-gputype: Small}}
    spec: {containers: [{name: c, resources: {limits: {amd.com/gpu: 1, amd.com/gpumem: 1500, amd.com/gpucores: 10}}}]}
- count: 1
  pod:
    metadata: {name: lo}
    spec: {containers: [{name: c, resources: {limits: {amd.com/gpu: 1, amd.com/gpumem: 1000, amd.com/gpucores: 10}}}]}
- count: 1
  priority: 100
  pod:
    metadata: {name: hi, annotations: {amd.com/use-gputype: Big}}
    spec: {containers: [{name: c, resources: {limits: {amd.com/gpu: 1, amd.com/gpumem: 8000}}}]}
policies: {gpu: [binpack], node: [spread]}
"#;
    let p = plan_json("replace.yaml", text);
    let pre = &p["preemptions"][0];
    assert_eq!(
        (&pre["pod"], &pre["node"]),
        (&"default/hi-0".into(), &"big-0".into()),
        "{p}"
    );
    assert_eq!(victims(pre), ["default/lo-0"]);
    assert_eq!(pre["victims"][0]["replaced_on"], "small-0");
    assert_eq!(
        (&p["placed"], &p["evicted"], &p["unplaceable"]),
        (&3.into(), &Value::Null, &0.into())
    );
    let lo = p["placements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["pod"] == "default/lo-0")
        .unwrap();
    assert_eq!(lo["node"], "small-0");
    assert!(
        plan_text("replace.yaml", text)
            .contains("    default/lo-0 (priority 0) placed again on small-0\n")
    );
}

#[test]
fn kube_scheduler_picks_the_node_with_the_lowest_victims() {
    // Two cards, each full: one with priority 0 pods, one with priority 5; the node whose
    // highest victim priority is lowest wins, whatever the names' order.
    let text = r#"fleet:
- name: a
  count: 1
  gpus: [{type: AMD A, count: 1, memory_mib: 4000, cus: 100}]
- name: b
  count: 1
  gpus: [{type: AMD B, count: 1, memory_mib: 4000, cus: 100}]
workloads:
- count: 1
  priority: 5
  pod:
    metadata: {name: mid, annotations: {amd.com/use-gputype: A}}
    spec: {containers: [{name: c, resources: {limits: {amd.com/gpu: 1, amd.com/gpumem: 4000}}}]}
- count: 1
  pod:
    metadata: {name: low, annotations: {amd.com/use-gputype: B}}
    spec: {containers: [{name: c, resources: {limits: {amd.com/gpu: 1, amd.com/gpumem: 4000}}}]}
- count: 1
  priority: 10
  pod:
    metadata: {name: hi}
    spec: {containers: [{name: c, resources: {limits: {amd.com/gpu: 1, amd.com/gpumem: 4000}}}]}
policies: {gpu: [binpack], node: [binpack]}
"#;
    let p = plan_json("lowest.yaml", text);
    let pre = &p["preemptions"][0];
    assert_eq!(
        (&pre["node"], victims(pre)),
        (&"b-0".into(), vec!["default/low-0"]),
        "{p}"
    );
    // Deterministic: the same plan twice.
    assert_eq!(plan_json("lowest.yaml", text), p);
}

#[test]
fn bad_priority_fields_name_the_workload_and_field() {
    let err = |text: &str| {
        run(&PlanArgs::for_scenario(write("bad.yaml", text)))
            .unwrap_err()
            .to_string()
    };
    let base = one_card(1000, "");
    let e = err(&base.replace("priority: 1000", "priority: high"));
    assert!(
        e.contains(
            "workloads[2].priority: \"high\" is not a whole number; write an integer such as 1"
        ),
        "{e}"
    );
    let e = err(&base.replace("priority: 1000", "priority: 2.5"));
    assert!(
        e.contains("workloads[2].priority: 2.5 is not a whole number"),
        "{e}"
    );
    let e = err(&base.replace("priority: 1000", "priority: 3000000000"));
    assert!(
        e.contains("workloads[2].priority: 3000000000 is out of range for template \"hi\"")
            && e.contains("-2147483648 to 2147483647"),
        "{e}"
    );
    let e = err(&base.replace("priority: 1000", "priority: -2147483649"));
    assert!(
        e.contains("workloads[2].priority: -2147483649 is out of range"),
        "{e}"
    );
    let e = err(&one_card(1000, "\n  preemptible: no"));
    assert!(
        e.contains("workloads[0].preemptible: \"no\" is not a boolean; write true or false"),
        "{e}"
    );
    let e = err(&one_card(1000, "\n  preemptible: 0"));
    assert!(
        e.contains("workloads[0].preemptible: 0 is not a boolean"),
        "{e}"
    );
    let e = err(&base.replace(
        "metadata: {name: hi}\n    spec:\n",
        "metadata: {name: hi}\n    spec:\n      priority: 7\n",
    ));
    assert!(
        e.contains(
            "workloads[2].priority: 1000 disagrees with the template \"hi\"'s spec.priority 7"
        ),
        "{e}"
    );
    // The bounds themselves are accepted.
    for ok in ["2147483647", "-2147483648"] {
        run(&PlanArgs::for_scenario(write(
            "ok.yaml",
            &base.replace("priority: 1000", &format!("priority: {ok}")),
        )))
        .unwrap();
    }
}

#[test]
fn the_example_scenario_preempts_batch_slices_only() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/scenarios/priorities.yaml"
    );
    let mut args = PlanArgs::for_scenario(path);
    args.output = OutputFormat::Json;
    let report: Value = serde_json::from_str(&run(&args).unwrap()).unwrap();
    let p = &report["policies"][0];
    let preemptions = p["preemptions"].as_array().unwrap();
    assert_eq!(preemptions.len(), 2, "{p}");
    for (i, pre) in preemptions.iter().enumerate() {
        assert_eq!(pre["pod"], format!("default/inference-{i}"));
        let v = victims(pre);
        assert!(v.len() == 1 && v[0].starts_with("default/batch-"), "{pre}");
    }
    let placed = placed_pods(p);
    assert!(
        placed.contains(&"default/pinned-0".to_owned())
            && placed.contains(&"default/pinned-1".to_owned())
    );
    assert_eq!(
        (&p["placed"], &p["evicted"], &p["unplaceable"]),
        (&8.into(), &2.into(), &0.into())
    );
}
