//! The scenario parser's unit tests (moved out of `scenario.rs` to keep it under 800 lines).

use super::*;

const MINIMAL: &str = "fleet:\n- name: n\n  count: 1\n  capture: one-gpu\nworkloads:\n- count: 2\n  pod:\n    metadata: {name: p}\n    spec:\n      containers:\n      - name: c\n        resources: {limits: {amd.com/gpu: 1, amd.com/gpumem: 1024}}\n";

fn err(text: &str) -> String {
    parse_scenario(text, "s.yaml").unwrap_err().to_string()
}

#[test]
fn minimal_scenario_defaults() {
    let s = parse_scenario(MINIMAL, "s.yaml").unwrap();
    assert_eq!(s.name, "s.yaml");
    assert_eq!(s.fleet[0].count, 1);
    assert_eq!(
        s.fleet[0].gpus,
        GpuSource::Capture {
            capture: CaptureName::OneGpu,
            settings: RegistrationSettings::default()
        }
    );
    assert_eq!(s.workloads[0].count, 2);
    let limits = s.workloads[0].pod.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .unwrap()
        .limits
        .clone()
        .unwrap();
    assert_eq!(limits["amd.com/gpumem"].0, "1024");
    assert_eq!(s.gpu_policies.len(), 2);
    assert_eq!(
        s.node_policies,
        vec![NodePolicy::Binpack, NodePolicy::Spread]
    );
}

#[test]
fn bad_inputs_name_the_field() {
    let e = err(&MINIMAL.replace("one-gpu", "mi250"));
    assert!(
        e.contains("fleet[0].capture") && e.contains("unknown capture \"mi250\""),
        "{e}"
    );
    let e = err(&MINIMAL.replace("count: 1", "count: -3"));
    assert!(
        e.contains("fleet[0].count") && e.contains("-3 is negative"),
        "{e}"
    );
    let e = err(&MINIMAL.replace("count: 2", "count: -1"));
    assert!(
        e.contains("workloads[0].count") && e.contains("negative"),
        "{e}"
    );
    let e = err(&MINIMAL.replace("capture: one-gpu", "captur: one-gpu"));
    assert!(
        e.contains("fleet[0].captur") && e.contains("unknown field"),
        "{e}"
    );
    let e = err(&MINIMAL.replace("resources:", "resorces:"));
    assert!(
        e.contains("workloads[0].pod.spec.containers[0].resorces") && e.contains("unknown field"),
        "{e}"
    );
    let e = err("fleet: [\n");
    assert!(e.contains("not valid YAML"), "{e}");
    let e = err(&MINIMAL.replace("metadata: {name: p}", "metadata: {}"));
    assert!(
        e.contains("workloads[0].pod.metadata.name") && e.contains("missing"),
        "{e}"
    );
    let e = err(&format!("{MINIMAL}policies: {{gpu: [fastest]}}\n"));
    assert!(
        e.contains("policies.gpu[0]") && e.contains("fastest"),
        "{e}"
    );
    let e = err("");
    assert!(e.contains("empty"), "{e}");
    // YAML 1.1 booleans stay strings.
    let s = parse_scenario(&MINIMAL.replace("name: n", "name: no"), "s.yaml").unwrap();
    assert_eq!(s.fleet[0].name, "no");
    let e = err(&MINIMAL.replace("count: 2", "count: 1.5"));
    assert!(
        e.contains("workloads[0].count: 1.5 is not a whole number"),
        "{e}"
    );
    let e = err("workloads: []\n");
    assert!(e.contains("missing field `fleet`"), "{e}");
}

#[test]
fn inline_models() {
    let text = "fleet:\n- name: a\n  count: 2\n  gpus:\n  - {type: AMD Instinct MI250X, count: 8, memory_mib: 65536, cus: 110, numa: 0}\n  - {vendor: nvidia, type: NVIDIA-A100, count: 2, memory_mib: 40960, share: 4}\nworkloads: []\n";
    let s = parse_scenario(text, "s.yaml").unwrap();
    let GpuSource::Models(models) = &s.fleet[0].gpus else {
        panic!("models expected")
    };
    assert_eq!(models[0].cores, 110);
    assert_eq!(models[0].share, 10);
    assert_eq!(models[1].cores, 100);
    assert_eq!(models[1].numa, -1);
    let e = err(&text.replace("AMD Instinct MI250X", "Instinct MI250X"));
    assert!(
        e.contains("fleet[0].gpus[0].type") && e.contains("\"AMD\""),
        "{e}"
    );
    let e = err(&text.replace(", cus: 110", ""));
    assert!(
        e.contains("fleet[0].gpus[0].cus") && e.contains("missing"),
        "{e}"
    );
    let e = err(&text.replace("share: 4", "share: 4, xgmi: true"));
    assert!(
        e.contains("fleet[0].gpus[1].xgmi") && e.contains("AMD GPUs only"),
        "{e}"
    );
    let e = err(&text.replace("memory_mib: 40960", "memory_mib: 0"));
    assert!(e.contains("fleet[0].gpus[1].memory_mib"), "{e}");
}

#[test]
fn priority_and_preemptible_are_written_into_the_template() {
    let text = MINIMAL.replace(
        "- count: 2\n",
        "- count: 2\n  priority: -7\n  preemptible: false\n",
    );
    let s = parse_scenario(&text, "s.yaml").unwrap();
    let w = &s.workloads[0];
    assert_eq!(w.priority(), -7);
    assert_eq!(w.pod.spec.as_ref().unwrap().priority, Some(-7));
    assert_eq!(
        w.pod.metadata.labels.as_ref().unwrap()[PREEMPTIBLE_LABEL],
        "false"
    );
    // Left out: priority 0, no label (as an unlabelled pod without a PriorityClass).
    let s = parse_scenario(MINIMAL, "s.yaml").unwrap();
    assert_eq!(s.workloads[0].priority(), 0);
    assert_eq!(s.workloads[0].pod.metadata.labels, None);
    let text = MINIMAL.replace("- count: 2\n", "- count: 2\n  preemptible: true\n");
    let s = parse_scenario(&text, "s.yaml").unwrap();
    assert_eq!(s.workloads[0].pod.metadata.labels, None);
}
