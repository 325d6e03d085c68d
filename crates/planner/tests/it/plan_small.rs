//! `hami plan` on examples/scenarios/small.yaml and on bad scenario files, through the same
//! `run` the CLI calls.

use std::collections::BTreeSet;

use hami_amd_discovery::registration::RegistrationSettings;
use hami_planner::fleet::capture_devices;
use hami_planner::scenario::CaptureName;
use hami_planner::{OutputFormat, PlanArgs, PlanError, run};
use serde_json::Value;

const SMALL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/scenarios/small.yaml"
);

fn json(args: &mut PlanArgs) -> Value {
    args.output = OutputFormat::Json;
    serde_json::from_str(&run(args).unwrap()).unwrap()
}

fn policy<'a>(report: &'a Value, gpu: &str, node: &str) -> &'a Value {
    report["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["gpu_policy"] == gpu && p["node_policy"] == node)
        .unwrap_or_else(|| panic!("no {gpu}/{node} in {report}"))
}

/// (node, GPU ids) of a placed pod.
fn placed(policy: &Value, pod: &str) -> (String, Vec<String>) {
    let p = policy["placements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pod"] == pod)
        .unwrap_or_else(|| panic!("{pod} not placed: {policy}"));
    (
        p["node"].as_str().unwrap().to_owned(),
        p["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["id"].as_str().unwrap().to_owned())
            .collect(),
    )
}

#[test]
fn small_scenario_placements_and_rejections() {
    let report = json(&mut PlanArgs::for_scenario(SMALL));
    assert_eq!(report["nodes"], 3);
    assert_eq!(report["gpus"], 18);
    assert_eq!(report["pods"], 13);
    assert_eq!(report["policies"].as_array().unwrap().len(), 4);
    for p in report["policies"].as_array().unwrap() {
        assert_eq!(p["placed"], 11, "{p}");
        assert_eq!(p["unplaceable"], 2, "{p}");
        let reasons = p["reasons"].as_array().unwrap();
        let reason_of = |pod: &str| {
            reasons
                .iter()
                .find(|r| r["pods"].as_array().unwrap().iter().any(|x| x == pod))
                .map(|r| r["reason"].as_str().unwrap().to_owned())
                .unwrap_or_else(|| panic!("{pod} has no reason: {p}"))
        };
        assert_eq!(
            reason_of("default/bad-cores-0"),
            "pod default/bad-cores-0: spec.containers[0].resources.limits[amd.com/gpucores]: 150 is out of range; write a percentage of the GPU's compute as an integer from 1 to 100"
        );
        let huge = reason_of("default/huge-0");
        assert!(
            huge.starts_with("no available node, 3 nodes do not meet: ")
                && huge.contains(
                    "container app: 8/8 CardInsufficientMemory (on 2 nodes: mi210-0,mi210-1)"
                ),
            "{huge}"
        );
    }

    // GPU binpack: quarter-GPU pods fill one card (4 × 26 of 104 CUs) before the next.
    let bb = policy(&report, "binpack", "binpack");
    let infer: Vec<_> = (0..6)
        .map(|i| placed(bb, &format!("default/infer-{i}")))
        .collect();
    assert!(infer.iter().all(|(node, _)| node == "mi210-0"));
    assert!(infer[..4].iter().all(|p| p.1 == infer[0].1));
    assert_ne!(infer[4].1, infer[0].1);
    assert_eq!(infer[4].1, infer[5].1);
    assert_eq!(bb["nodes_used"], 2);

    // Node spread + GPU spread: alternate nodes, never two on one card.
    let ss = policy(&report, "spread", "spread");
    let infer: Vec<_> = (0..6)
        .map(|i| placed(ss, &format!("default/infer-{i}")))
        .collect();
    let nodes: Vec<&str> = infer.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        nodes,
        [
            "mi210-0", "mi210-1", "mi210-0", "mi210-1", "mi210-0", "mi210-1"
        ]
    );
    let distinct: BTreeSet<_> = infer.iter().cloned().collect();
    assert_eq!(distinct.len(), 6);
    assert_eq!(ss["nodes_used"], 3);
    // Spread touches more GPUs than binpack.
    assert!(ss["gpus_busy"].as_u64() > bb["gpus_busy"].as_u64());

    // The 4-GPU link-bind pod gets four pairwise XGMI peers under every policy.
    let mi210 = capture_devices(CaptureName::Mi210Xgmi, &RegistrationSettings::default()).unwrap();
    for p in report["policies"].as_array().unwrap() {
        let (_, ids) = placed(p, "default/train-0");
        assert_eq!(ids.len(), 4);
        let devs: Vec<_> = ids
            .iter()
            .map(|id| mi210.iter().find(|d| &d.id == id).unwrap())
            .collect();
        for a in &devs {
            for b in &devs {
                if a.id != b.id {
                    let bdf = b.custom_info.pci_bdf.as_ref().unwrap();
                    assert!(
                        a.custom_info.xgmi_peers.contains(bdf),
                        "{} / {}",
                        a.id,
                        b.id
                    );
                }
            }
        }
        // NVIDIA pods land on the A100 node.
        assert_eq!(placed(p, "default/cuda-0").0, "a100-0");
    }
}

#[test]
fn small_scenario_table() {
    let mut args = PlanArgs::for_scenario(SMALL);
    args.placements = true;
    args.gpu_policy = vec!["spread".into()];
    args.node_policy = vec!["binpack".into()];
    let table = run(&args).unwrap();
    assert!(
        table.starts_with("What-if plan small: 3 nodes, 18 GPUs, 13 pods\n"),
        "{table}"
    );
    assert!(
        table.contains("GPU POLICY  NODE POLICY  PLACED  UNPLACEABLE"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("spread "))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cells[..5],
        ["spread", "binpack", "11", "2", "3/3"],
        "{row}"
    );
    assert_eq!(
        table
            .lines()
            .filter(|l| l.starts_with("spread ") || l.starts_with("binpack "))
            .count(),
        1
    );
    assert!(table.contains("1 pod(s) (default/bad-cores-0): pod default/bad-cores-0: spec.containers[0].resources.limits[amd.com/gpucores]: 150 is out of range"), "{table}");
    assert!(table.contains("spread/binpack: placements"), "{table}");
    assert!(table.contains("default/train-0"), "{table}");
}

fn scenario_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hami-planner-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn plan_error(name: &str, text: &str) -> PlanError {
    run(&PlanArgs::for_scenario(scenario_file(name, text))).unwrap_err()
}

#[test]
fn bad_scenario_files_give_clear_errors() {
    let good = std::fs::read_to_string(SMALL).unwrap();

    let e = plan_error(
        "capture.yaml",
        &good.replace("capture: mi210-xgmi", "capture: mi250x"),
    );
    assert_eq!(e.exit_code(), 2);
    let msg = e.to_string();
    assert!(msg.contains("capture.yaml: fleet[0].capture: unknown capture \"mi250x\"; use one of mi210-xgmi, mi300x-cpx, one-gpu"), "{msg}");

    let e = plan_error("negative.yaml", &good.replace("count: 6\n", "count: -6\n"));
    assert_eq!(e.exit_code(), 2);
    let msg = e.to_string();
    assert!(msg.contains("workloads[0].count: -6 is negative"), "{msg}");

    let e = plan_error(
        "nodes.yaml",
        &good.replace("    count: 2\n    capture", "    count: -1\n    capture"),
    );
    assert!(
        e.to_string().contains("fleet[0].count: -1 is negative"),
        "{e}"
    );

    let e = plan_error("bad.yaml", "fleet:\n  - name: a\n   count: 1\n");
    assert_eq!(e.exit_code(), 2);
    assert!(matches!(e, PlanError::Yaml { .. }), "{e}");
    assert!(e.to_string().contains("bad.yaml is not valid YAML"), "{e}");

    let e = plan_error(
        "unknown.yaml",
        &good.replace(
            "    capture: mi210-xgmi",
            "    capture: mi210-xgmi\n    gpu_count: 8",
        ),
    );
    assert!(
        e.to_string()
            .contains("fleet[0].gpu_count: unknown field `gpu_count`"),
        "{e}"
    );

    let e = plan_error("podtypo.yaml", &good.replace("            resources:\n              limits:\n                amd.com/gpu: 1\n                amd.com/gpumem: 16384", "            resource:\n              limits:\n                amd.com/gpu: 1\n                amd.com/gpumem: 16384"));
    assert!(
        e.to_string()
            .contains("workloads[0].pod.spec.containers[0].resource: unknown field"),
        "{e}"
    );

    let missing = run(&PlanArgs::for_scenario("/nonexistent/scenario.yaml")).unwrap_err();
    assert!(
        missing
            .to_string()
            .starts_with("cannot read scenario /nonexistent/scenario.yaml"),
        "{missing}"
    );

    let mut args = PlanArgs::for_scenario(SMALL);
    args.gpu_policy = vec!["fastest".into()];
    let e = run(&args).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--gpu-policy: \"fastest\" is not a GPU policy: write binpack, spread or mutex, optionally with numa (e.g. binpack,numa)"
    );
}

#[test]
fn example_scenarios_parse() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let s = hami_planner::scenario::parse_scenario(&text, &path.display().to_string())
            .unwrap_or_else(|e| panic!("{e}"));
        if path.ends_with("fleet-1000.yaml") {
            assert_eq!(s.fleet.iter().map(|g| g.count).sum::<u32>(), 1000);
            assert_eq!(s.workloads.iter().map(|w| w.count).sum::<u32>(), 10_000);
        }
        seen += 1;
    }
    assert!(seen >= 2);
}
