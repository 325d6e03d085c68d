//! `hami plan` as a user runs it (`hami-demo --scenario`: sim/demo/tests/it/demo_cli.rs).

use std::process::Command;

const SMALL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/scenarios/small.yaml"
);

fn hami(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hami"))
        .args(args)
        .output()
        .expect("run hami")
}

#[test]
fn plan_compares_policies_and_names_the_rejected_pod() {
    let out = hami(&[
        "plan",
        "--scenario",
        SMALL,
        "--gpu-policy",
        "binpack",
        "--node-policy",
        "binpack",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines().any(|l| l
            .split_whitespace()
            .collect::<Vec<_>>()
            .starts_with(&["binpack", "binpack", "11", "2"])),
        "{text}"
    );
    assert!(
        text.contains("default/bad-cores-0") && text.contains("from 1 to 100"),
        "{text}"
    );
}

#[test]
fn a_bad_scenario_names_the_field_and_exits_2() {
    let dir = std::env::temp_dir().join(format!("hami-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    let text = std::fs::read_to_string(SMALL).unwrap();
    let first_capture = text
        .lines()
        .find(|l| l.trim_start().starts_with("capture:"))
        .expect("small.yaml uses a capture");
    std::fs::write(
        &bad,
        text.replacen(
            first_capture,
            &first_capture.replace(first_capture.trim_start(), "capture: mi250x"),
            1,
        ),
    )
    .unwrap();
    let out = hami(&["plan", "--scenario", bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("capture: unknown capture \"mi250x\""),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
