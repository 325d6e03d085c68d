//! `hami inspect` as a user runs it: the real binary, files and stdin, exit codes.

use std::io::Write;
use std::process::{Command, Output, Stdio};

const POD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/pod-two-by-two.yaml"
);
const NODE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/node-mi210.yaml"
);

fn hami(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hami"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hami");
    let mut pipe = child.stdin.take().expect("stdin");
    pipe.write_all(stdin.unwrap_or_default())
        .expect("write stdin");
    drop(pipe);
    child.wait_with_output().expect("wait for hami")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn pod_with_init_and_two_app_containers_of_two_gpus() {
    let text = stdout(&hami(&["inspect", "pod", POD], None));
    let expected = "\
Pod ml/trainer   node: gpu-node-1   bind-phase: success
CONTAINER   KIND  ASKED                         DEVICE                                TYPE                 MEMORY     CORES    CU RANGES
fetch-data  init  -                             -
worker      app   2× AMD: 16384 MiB, 25% cores  8eff74b5-0000-1000-801b-b56457addd1b  AMD Instinct MI300X  16384 MiB  76 CUs   0-227 (pod)
                                                8eff74b5-0000-1000-801b-b56457addd1c  AMD Instinct MI300X  16384 MiB  76 CUs   0-75
evaluator   app   2× AMD: 8192 MiB, 50% cores   8eff74b5-0000-1000-801b-b56457addd1b  AMD Instinct MI300X  8192 MiB   152 CUs  0-227 (pod)
                                                8eff74b5-0000-1000-801b-b56457addd1d  AMD Instinct MI300X  8192 MiB   152 CUs  0-151
";
    assert_eq!(text, expected);
}

#[test]
fn pod_as_json_from_stdin() {
    let yaml = std::fs::read(POD).unwrap();
    let text = stdout(&hami(
        &["inspect", "pod", "-", "--output", "json"],
        Some(&yaml),
    ));
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    let containers = report["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 3);
    assert_eq!(containers[0]["kind"], "init");
    assert_eq!(containers[0]["got"].as_array().unwrap().len(), 0);
    assert_eq!(containers[2]["name"], "evaluator");
    assert_eq!(containers[2]["asked"][0]["cores_percent"], 50);
    assert_eq!(containers[2]["got"][1]["cores"], 152);
    assert_eq!(containers[2]["got"][1]["cu_ranges"], "0-151");
    assert_eq!(report["bind_phase"], "success");
}

#[test]
fn pending_pod_and_unpadded_reference_annotation() {
    // Written by the reference scheduler: no run for the init container, plugin not done.
    let yaml = std::fs::read_to_string(POD)
        .unwrap()
        .replace("hami.io/bind-phase: success", "hami.io/bind-phase: allocating")
        .replace(r#"hami.io/amd-devices-to-allocate: ";;;""#, r#"hami.io/amd-devices-to-allocate: "a,AMD X,1,76:b,AMD X,1,76:;c,AMD X,1,152:d,AMD X,1,152:;""#)
        .replace(r#"hami.io/amd-devices-allocated: ";8eff"#, r#"hami.io/amd-devices-allocated: "8eff"#);
    let text = stdout(&hami(&["inspect", "pod", "-"], Some(yaml.as_bytes())));
    assert!(text.contains("bind-phase: allocating"), "{text}");
    assert!(
        text.contains("note: hami.io/amd-devices-allocated has 2 runs for 3 containers"),
        "{text}"
    );
    assert!(
        text.contains(
            "worker      app   2× AMD: 16384 MiB, 25% cores  8eff74b5-0000-1000-801b-b56457addd1b"
        ),
        "{text}"
    );
}

#[test]
fn node_devices_lock_and_health() {
    let text = stdout(&hami(&["inspect", "node", NODE], None));
    assert!(
        text.starts_with("Node gpu-node-2\nVENDOR  INDEX  ID"),
        "{text}"
    );
    assert!(text.contains("AMD     1      19ff740f-0000-1000-8001-ead3a2ecd4a6  AMD Instinct MI210  10      65520 MiB  104 CUs  0     hami-core  healthy    0000:63:00.0  0000:43:00.0"), "{text}");
    assert!(
        text.contains("UNHEALTHY"),
        "a device without health is unhealthy: {text}"
    );
    assert!(
        text.contains("node lock: held by ml/trainer since 2026-08-21T06:20:39Z"),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&stdout(&hami(
        &["inspect", "node", NODE, "-o", "json"],
        None,
    )))
    .unwrap();
    assert_eq!(json["devices"][1]["health"], false);
    assert_eq!(json["devices"][0]["xgmi_peers"][0], "0000:43:00.0");
}

/// Bad input: one line on stderr naming what to fix, exit status 2, nothing on stdout.
fn assert_bad(args: &[&str], stdin: &[u8], expected: &str) {
    let out = hami(args, Some(stdin));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains(expected),
        "{args:?}: expected {expected:?} in {stderr}"
    );
}

#[test]
fn bad_inputs_exit_2_with_one_line_naming_the_field() {
    let pod = std::fs::read_to_string(POD).unwrap();
    let pod_args = ["inspect", "pod", "-"];
    assert_bad(&pod_args, b"", "the input is empty");
    assert_bad(&pod_args, b"{\"kind\": \"Pod\", ", "not valid JSON");
    assert_bad(&pod_args, b"kind: Pod\nspec: [", "not valid YAML");
    assert_bad(&pod_args, b"\xff\xfe", "stdin");
    assert_bad(
        &pod_args,
        std::fs::read(NODE).unwrap().as_slice(),
        "kind: expected Pod",
    );
    assert_bad(
        &pod_args,
        b"kind: Pod\nspec:\n  containers: {}\n",
        "spec.containers",
    );
    assert_bad(
        &pod_args,
        pod.replace("amd.com/gpucores: 25", "amd.com/gpucores: 250")
            .as_bytes(),
        "spec.containers[0].resources.limits[amd.com/gpucores]: 250 is out of range",
    );
    assert_bad(
        &pod_args,
        pod.replace("amd.com/gpu: 2\n", "amd.com/gpu: 1.5\n")
            .as_bytes(),
        "spec.containers[0].resources.limits[amd.com/gpu]: \"1.5\" is not a whole number",
    );
    assert_bad(
        &pod_args,
        pod.replace(
            "AMD Instinct MI300X,8192,152:8eff",
            "AMD Instinct MI300X,8192:8eff",
        )
        .as_bytes(),
        "metadata.annotations[hami.io/amd-devices-allocated]: container 2, device 0",
    );
    assert_bad(
        &pod_args,
        pod.replace(r#""0-75""#, r#""75-0""#).as_bytes(),
        "metadata.annotations[hami.io/amd-cu-allocated]",
    );
    assert_bad(
        &pod_args,
        pod.replace(
            r#"hami.io/amd-devices-to-allocate: ";;;""#,
            r#"hami.io/amd-devices-to-allocate: ";;;;;""#,
        )
        .as_bytes(),
        "has 5 container runs but the pod has 3 containers",
    );
    let node = std::fs::read_to_string(NODE).unwrap();
    assert_bad(
        &["inspect", "node", "-"],
        node.replace(r#""count":10,"devmem":65520,"devcore":104,"type":"AMD Instinct MI210","numa":0,"mode":"hami-core","health":true"#, r#""count":-10,"devmem":65520,"devcore":104,"type":"AMD Instinct MI210","numa":0,"mode":"hami-core","health":true"#).as_bytes(),
        "metadata.annotations[hami.io/node-amd-register]: device 0, field \"count\"",
    );
    assert_bad(
        &["inspect", "node", "/nonexistent/node.yaml"],
        b"",
        "cannot read /nonexistent/node.yaml",
    );
    let dir = std::env::temp_dir().join(format!("hami-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let binary = dir.join("binary.yaml");
    std::fs::write(&binary, b"kind: Pod\n\xc3\x28\n").unwrap();
    assert_bad(
        &["inspect", "pod", binary.to_str().unwrap()],
        b"",
        "not UTF-8",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

mod inspect_whole_cards;
