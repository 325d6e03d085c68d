//! What others write into the cluster reaches an operator's terminal only as visible text
//! (issue 27 item 5): Event messages, names and reasons with escape sequences, carriage
//! returns, line feeds and bidi overrides are printed escaped, one line per entry; and a
//! reader that stops early (`hami status | head`) ends `hami` quietly, without a panic.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config, RunningApiServer};
use serde_json::json;

/// What no line printed to a terminal may contain.
fn assert_terminal_safe(text: &str) {
    for bad in [
        '\u{1b}', '\r', '\u{7f}', '\u{9b}', '\u{202e}', '\u{2066}', '\t',
    ] {
        assert!(
            !text.contains(bad),
            "{:?} reached the terminal: {text:?}",
            bad
        );
    }
}

fn kubeconfig(api: &RunningApiServer, name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "hami-hostile-{name}-{}.kubeconfig",
        std::process::id()
    ));
    api.write_kubeconfig(&path).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_messages_and_device_names_are_printed_escaped_on_one_line() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    // A device type with an escape sequence and a bidi override, as a node's registration
    // (written by whoever may patch the node) could carry.
    let register = r#"[{"id":"G1","index":1,"count":10,"devmem":65536,"devcore":104,"type":"MI210\u001b[5m\u0007\u202egpj.exe","health":true}]"#;
    api.create_object("v1", "nodes", None, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "annotations": {"hami.io/node-amd-register": register}}}))
        .unwrap();
    api.create_object(
        "v1",
        "namespaces",
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}),
    )
    .unwrap();
    api.create_object("v1", "pods", Some("ml"), json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waiting", "namespace": "ml"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": "4"}}}]}}))
        .unwrap();
    // Anyone who may create Events in the namespace writes this note: it clears the
    // screen, overwrites its own line with a carriage return and forges a table line.
    let note = "no node\u{1b}[2J\u{1b}[1;1H\rall fine\nNode forged (8 GPUs, 8 idle)\n  ml/other: \u{9b}31mok\u{7f}\ttab";
    api.create_object("events.k8s.io/v1", "events", Some("ml"), json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "waiting.1", "namespace": "ml"}, "eventTime": "2026-11-29T10:00:00.000000Z", "reason": "FilteringFailed",
        "action": "Filtering", "reportingController": "hami-scheduler", "reportingInstance": "x", "type": "Warning",
        "regarding": {"kind": "Pod", "namespace": "ml", "name": "waiting"}, "note": note}))
        .unwrap();
    let kubeconfig = kubeconfig(&api, "event");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_hami"))
            .args(["status", "--all", "--kubeconfig"])
            .arg(&kubeconfig)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_terminal_safe(&text);
    assert!(
        !text.lines().any(|l| l.starts_with("Node forged")),
        "a line feed in a message forged a node heading: {text}"
    );
    // The whole note on the pod's one line, every hidden character shown as an escape.
    let pending: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "Pending GPU pods:")
        .skip(1)
        .collect();
    assert_eq!(
        pending,
        [
            "  ml/waiting: no node\\e[2J\\e[1;1H\\rall fine\\nNode forged (8 GPUs, 8 idle)\\n  ml/other: \\u{9b}31mok\\u{7f}\\ttab"
        ],
        "{text}"
    );
    let g1 = text
        .lines()
        .find(|l| l.trim_start().starts_with("G1 "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(g1.contains("MI210\\e[5m\\u{7}\\u{202e}gpj.exe"), "{g1}");
}

#[test]
fn inspect_prints_a_nodes_foreign_text_escaped() {
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "annotations": {
        "hami.io/node-amd-register": r#"[{"id":"G1\u001b[8m","index":0,"count":10,"devmem":65536,"devcore":104,"type":"MI210\u202e","health":true}]"#,
        "hami.io/mutex.lock": "2026-08-04T10:00:00Z,ml,\u{1b}[2Jowner\rfake"}}});
    let mut child = Command::new(env!("CARGO_BIN_EXE_hami"))
        .args(["inspect", "node", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(node.to_string().as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_terminal_safe(&text);
    assert!(
        text.contains("G1\\e[8m") && text.contains("MI210\\u{202e}"),
        "{text}"
    );
    assert!(text.contains("node lock: "), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("fake")),
        "the lock line stays one line: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_early_ends_hami_status_quietly() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    // A report far longer than a pipe's buffer (64 KiB by default; up to 1 MiB when
    // raised): 8 nodes × 400 GPUs, about 110 bytes a line with --all.
    for n in 0..8 {
        let gpus: Vec<serde_json::Value> = (0..400)
            .map(|i| json!({"id": format!("GPU-{n}-{i:04}-0000-1000-801b-b56457addd1b"), "index": i, "count": 10,
                "devmem": 65536, "devcore": 104, "type": "AMD Instinct MI210", "health": true}))
            .collect();
        api.create_object("v1", "nodes", None, json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("node-{n}"), "annotations": {"hami.io/node-amd-register": serde_json::to_string(&gpus).unwrap()}}}))
            .unwrap();
    }
    let kubeconfig = kubeconfig(&api, "pipe");
    let (status, stderr, read) = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hami"))
            .args(["status", "--all", "--kubeconfig"])
            .arg(&kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Like `head -c 100`: read a little, then close the pipe.
        let mut stdout = child.stdout.take().unwrap();
        let mut head = [0u8; 100];
        stdout.read_exact(&mut head).unwrap();
        drop(stdout);
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "hami status still runs 120 s after its reader left"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        (status, stderr, head)
    })
    .await
    .unwrap();
    assert!(read.starts_with(b"Node node-0 (400 GPUs"), "{read:?}");
    assert!(
        !stderr.contains("panicked") && !stderr.to_lowercase().contains("broken pipe"),
        "{stderr}"
    );
    assert_eq!(status.code(), Some(0), "{status:?}: {stderr}");
}
