//! The launcher against small scripts of each outcome: an answer, cel-python missing (with
//! a request larger than a pipe holds, written to a script that never reads it), another
//! failure, an answer that is not JSON, an interpreter that does not exist.

use hami_cel_peer::{PeerError, python, script, try_run};
use serde_json::{Value, json};

fn fixture(name: &str) -> std::path::PathBuf {
    script(
        env!("CARGO_MANIFEST_DIR"),
        &format!("tests/fixtures/{name}"),
    )
}

/// Many cases, well over the 64 KiB a pipe buffers.
fn big_request() -> Value {
    let cases: Vec<Value> = (0..5000)
        .map(
            |i| json!({"expression": format!("object.metadata.name == 'pod-{i}'"), "bindings": {}}),
        )
        .collect();
    json!({ "cases": cases })
}

#[test]
fn the_answer_is_the_scripts_json() {
    let request = big_request();
    let back: Value = try_run(&python(), &fixture("echo.py"), &request).unwrap();
    assert_eq!(back, request);
}

#[test]
fn a_missing_cel_python_says_what_to_install() {
    let e = try_run::<Value>(&python(), &fixture("missing.py"), &big_request()).unwrap_err();
    assert!(matches!(e, PeerError::Missing { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("`pip install cel-python`")
            && text.contains("scripts/test.sh")
            && text.contains("celpy_not_installed_anywhere"),
        "{text}"
    );
}

#[test]
fn another_failure_names_the_script_and_its_stderr() {
    let e = try_run::<Value>(&python(), &fixture("fails.py"), &json!({})).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PeerError::Failed { .. }), "{e:?}");
    assert!(
        text.starts_with("fails.py failed") && text.contains("RuntimeError: boom"),
        "{text}"
    );
}

#[test]
fn an_answer_that_is_not_json_is_an_error() {
    let e = try_run::<Vec<Value>>(&python(), &fixture("not_json.py"), &json!({})).unwrap_err();
    assert!(matches!(e, PeerError::Answer { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with("not_json.py answered no JSON"),
        "{e}"
    );
}

#[test]
fn a_missing_interpreter_is_named() {
    let e = try_run::<Value>("/nonexistent/python3", &fixture("echo.py"), &json!({})).unwrap_err();
    assert!(matches!(e, PeerError::Spawn { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("cannot run /nonexistent/python3:"),
        "{e}"
    );
}
