//! `hami inspect pod` shows the whole cards a pod HAMi did not place holds (issue 26 item
//! 1): the device plugin's `hami.io/<vendor>-whole-cards` record, as the scheduler counts it
//! (`hami_protocol::whole_cards::held_cards`), printed escaped like every cluster text.
//! The real binary, the pod on stdin.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

fn inspect(pod: &Value, json_output: bool) -> String {
    let mut args = vec!["inspect", "pod", "-"];
    if json_output {
        args.extend(["--output", "json"]);
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_hami"))
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hami");
    let mut pipe = child.stdin.take().expect("stdin");
    pipe.write_all(pod.to_string().as_bytes())
        .expect("write stdin");
    drop(pipe);
    let out: Output = child.wait_with_output().expect("wait for hami");
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A pod bound to `n1` asking for `count` of `resource`, with `annotations`.
fn pod(resource: &str, count: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "plain", "namespace": "ml", "annotations": annotations},
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "x",
            "resources": {"limits": {resource: count}}}]},
        "status": {"phase": "Running"}
    })
}

#[test]
fn a_plain_pods_whole_cards_are_shown_escaped_with_their_annotation() {
    // Two asked, three recorded: the two counted; a bidi override in an id is escaped.
    let plain = pod(
        "amd.com/gpu",
        "2",
        json!({"hami.io/amd-whole-cards": "CARD-A,CARD-\u{202e}B,CARD-X"}),
    );
    let text = inspect(&plain, false);
    assert!(
        text.lines()
            .any(|l| l == r"whole cards: CARD-A, CARD-\u{202e}B (hami.io/amd-whole-cards)"),
        "{text}"
    );
    assert!(
        !text.contains('\u{202e}') && !text.contains("CARD-X"),
        "{text}"
    );
    let report: Value = serde_json::from_str(&inspect(&plain, true)).unwrap();
    assert_eq!(
        report["whole_cards"],
        json!([{"vendor": "AMD", "annotation": "hami.io/amd-whole-cards",
            "cards": ["CARD-A", "CARD-\u{202e}B"]}])
    );

    let nv = pod(
        "nvidia.com/gpu",
        "1",
        json!({"hami.io/nvidia-whole-cards": "GPU-1"}),
    );
    assert!(
        inspect(&nv, false)
            .lines()
            .any(|l| l == "whole cards: GPU-1 (hami.io/nvidia-whole-cards)")
    );
}

#[test]
fn a_placed_pods_record_holds_nothing_and_a_garbled_one_is_a_note() {
    // HAMi placed it: its holdings are its device lists; the record is not believed.
    let mut placed = pod(
        "amd.com/gpu",
        "1",
        json!({"hami.io/amd-whole-cards": "CARD-A"}),
    );
    placed["spec"]["schedulerName"] = json!("hami-scheduler");
    let text = inspect(&placed, false);
    assert!(!text.contains("whole cards"), "{text}");
    assert!(
        serde_json::from_str::<Value>(&inspect(&placed, true)).unwrap()["whole_cards"].is_null()
    );
    // A value that does not decode: the report still prints, and says why.
    let garbled = pod(
        "amd.com/gpu",
        "1",
        json!({"hami.io/amd-whole-cards": "CARD-A,,"}),
    );
    let text = inspect(&garbled, false);
    assert!(!text.contains("whole cards:"), "{text}");
    assert!(
        text.lines().any(
            |l| l.starts_with("note: annotation hami.io/amd-whole-cards: ")
                && l.ends_with("it holds no card")
        ),
        "{text}"
    );
}
