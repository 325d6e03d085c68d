//! Every object of docs/install.md's "Quotas and priorities" section (its YAML blocks: the
//! Namespace, the ResourceQuota with HAMi's keys, the PriorityClass, the sliced pod) is valid
//! for every supported Kubernetes version: PyPI `kubernetes-validate` checks each against
//! the upstream OpenAPI schema (strict: an unknown field is an error), as the chart's objects
//! are checked (`peers`). That the objects do what the section says is
//! `hami-scheduler`'s `tests/it/install_doc_quota.rs`.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::peers::{kube_versions, repo};

/// The YAML documents of the fenced `yaml` blocks of the section whose heading names
/// "Quotas and priorities".
fn documented_objects() -> Vec<Value> {
    let doc = std::fs::read_to_string(repo().join("docs/install.md")).unwrap();
    let mut lines = doc.lines();
    lines
        .by_ref()
        .find(|l| l.starts_with("## ") && l.contains("Quotas and priorities"))
        .expect("docs/install.md has no \"Quotas and priorities\" section");
    let mut objects = Vec::new();
    // The body of the open block; `None` inside a block of another language.
    let mut open: Option<Option<String>> = None;
    for line in lines.take_while(|l| !l.starts_with("## ")) {
        let fence = line.trim_start().strip_prefix("```");
        match (open.take(), fence) {
            (None, Some(info)) => {
                open = Some((info.trim() == "yaml").then(String::new));
            }
            (Some(Some(text)), Some(_)) => {
                for d in text.split("\n---\n") {
                    let v: Value = serde_saphyr::from_str(d)
                        .unwrap_or_else(|e| panic!("a documented object does not parse: {e}\n{d}"));
                    objects.push(v);
                }
            }
            (Some(None), Some(_)) | (None, None) => {}
            (Some(Some(mut text)), None) => {
                text.push_str(line);
                text.push('\n');
                open = Some(Some(text));
            }
            (Some(None), None) => open = Some(None),
        }
    }
    assert!(open.is_none(), "an unclosed fenced block in the section");
    objects
}

const VALIDATE: &str = r#"
import json, sys
try:
    import kubernetes_validate
except ImportError as e:
    print(f"kubernetes-validate is not installed ({e})", file=sys.stderr)
    sys.exit(3)
req = json.load(sys.stdin)
problems = []
for version in req["versions"]:
    for o in req["objects"]:
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except Exception as e:
            what = f'{o.get("kind")} {o.get("metadata", {}).get("name")}'
            problems.append([version, what, str(e).splitlines()[0]])
json.dump(problems, sys.stdout)
"#;

/// `[version, object, first line of the error]` for every object that fails a version.
fn validate(objects: &[Value], versions: &[String]) -> Vec<[String; 3]> {
    let python = std::env::var("HAMI_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(&python)
        .args(["-c", VALIDATE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python} (set HAMI_PYTHON): {e}"));
    let request = json!({"versions": versions, "objects": objects});
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {}
        Some(3) => panic!("a real peer is missing: {stderr} (`pip install kubernetes-validate`)"),
        _ => panic!("kubernetes-validate failed ({}): {stderr}", out.status),
    }
    serde_json::from_slice(&out.stdout).expect("the validator answers JSON")
}

#[test]
fn the_quota_section_objects_are_valid_for_every_supported_version() {
    let objects = documented_objects();
    let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    for kind in ["ResourceQuota", "PriorityClass", "Pod"] {
        assert!(kinds.contains(&kind), "no {kind} in the section: {kinds:?}");
    }
    let versions: Vec<String> = kube_versions()
        .iter()
        .map(|v| v.trim_start_matches('v').to_owned())
        .collect();
    // The check can fail: a misspelt field is caught, in every version.
    let mut misspelt = objects
        .iter()
        .find(|o| o["kind"] == "PriorityClass")
        .unwrap()
        .clone();
    let policy = misspelt
        .as_object_mut()
        .unwrap()
        .remove("preemptionPolicy")
        .expect("the documented PriorityClass names its preemptionPolicy");
    misspelt["preemptionPolicyy"] = policy;
    let mut all = objects.clone();
    all.push(misspelt);
    let problems = validate(&all, &versions);
    let (expected, unexpected): (Vec<_>, Vec<_>) = problems
        .iter()
        .partition(|[_, _, error]| error.contains("preemptionPolicyy"));
    assert!(
        unexpected.is_empty(),
        "docs/install.md's quota section, kubernetes-validate --strict:\n{unexpected:#?}"
    );
    assert_eq!(
        expected.len(),
        versions.len(),
        "the misspelt field is caught in every version: {expected:?}"
    );
}
