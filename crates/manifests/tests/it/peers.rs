//! The real peers of the chart tests, run through `helm_peer.py`: Helm v4's engine (PyPI
//! `helm-python-sdk`, which bundles `libhelm_c.so`) renders and lints the chart, and PyPI
//! `kubernetes-validate` checks every rendered object against the upstream OpenAPI schemas
//! (strict: unknown fields are errors). `.ci/run` installs both; a machine without them
//! fails these tests with what to install.

#![allow(dead_code)] // each test file uses a different part

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;
use serde_json::{Value, json};

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub(crate) fn chart_dir() -> PathBuf {
    repo().join("deploy/helm/hami-rs")
}

/// Every Kubernetes minor version the installation supports, as Helm's `--kube-version`.
pub(crate) fn kube_versions() -> Vec<String> {
    hami_manifests::settings::SUPPORTED_MINORS
        .map(|m| format!("v1.{m}.0"))
        .collect()
}

/// One `helm template` / `helm lint` run.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub name: String,
    pub namespace: String,
    pub kube_version: String,
    /// The user-supplied values (`--set`, `-f`), as Helm receives them.
    pub values: Value,
    pub api_versions: Vec<String>,
    pub lint: bool,
    pub validate: bool,
}

impl Case {
    pub(crate) fn new(name: &str, namespace: &str, kube_version: &str, values: Value) -> Case {
        Case {
            name: name.into(),
            namespace: namespace.into(),
            kube_version: kube_version.into(),
            values,
            api_versions: Vec::new(),
            lint: true,
            validate: true,
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct Answer {
    pub helm_sdk_version: String,
    pub validator_versions: Vec<String>,
    pub parsed_sets: Vec<Vec<Value>>,
    pub cases: Vec<Rendered>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Problem {
    pub object: String,
    pub version: String,
    pub error: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Rendered {
    pub name: String,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub merged_values: Value,
    #[serde(default)]
    pub manifests: BTreeMap<String, String>,
    #[serde(default)]
    pub lint: Option<Value>,
    #[serde(default)]
    pub schema_version: Option<String>,
    #[serde(default)]
    pub validation: Vec<Problem>,
    #[serde(default)]
    pub not_validated: Vec<String>,
}

impl Rendered {
    /// Every rendered object (NOTES.txt left out), in template order.
    pub(crate) fn objects(&self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        for (path, text) in &self.manifests {
            if !path.ends_with(".yaml") {
                continue;
            }
            let mut doc = String::new();
            let mut flush = |doc: &mut String| {
                if doc
                    .lines()
                    .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
                {
                    let v: Value = serde_saphyr::from_str(doc).unwrap_or_else(|e| {
                        panic!("{path}: Helm's output does not parse: {e}\n{doc}")
                    });
                    out.push((path.clone(), v));
                }
                doc.clear();
            };
            for line in text.lines() {
                if line.trim_end() == "---" {
                    flush(&mut doc);
                } else {
                    doc.push_str(line);
                    doc.push('\n');
                }
            }
            flush(&mut doc);
        }
        out
    }

    /// Panics unless Helm rendered, `helm lint --strict` found nothing above info, and every
    /// object with an upstream schema validated.
    pub(crate) fn assert_clean(&self) {
        if let Some(e) = &self.error {
            panic!("{}: Helm refused to render: {e}", self.name);
        }
        if let Some(lint) = &self.lint {
            let bad: Vec<&Value> = lint["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|m| m["severity"].as_i64().unwrap_or(3) >= 2)
                .collect();
            assert!(
                bad.is_empty() && lint["errors"].as_array().is_none_or(|e| e.is_empty()),
                "{}: helm lint --strict: {lint}",
                self.name
            );
        }
        assert!(
            self.validation.is_empty(),
            "{}: kubernetes-validate --strict (schemas {:?}):\n{}",
            self.name,
            self.schema_version,
            self.validation
                .iter()
                .map(|p| format!("  {} [{}]: {}", p.object, p.version, p.error))
                .collect::<Vec<_>>()
                .join("\n")
        );
        // Only CRD kinds have no upstream schema.
        for kind in &self.not_validated {
            assert!(
                [
                    "cert-manager.io/v1/Issuer",
                    "cert-manager.io/v1/Certificate",
                    "monitoring.coreos.com/v1/ServiceMonitor"
                ]
                .contains(&kind.as_str()),
                "{}: no upstream schema for {kind}",
                self.name
            );
        }
    }
}

/// Runs the peers on `cases`; `parse_sets` are `(set | set-string, expression)` pairs for
/// Helm's own parser.
pub(crate) fn run(cases: &[Case], parse_sets: &[Vec<(String, String)>]) -> Answer {
    let python = std::env::var("HAMI_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/helm_peer.py");
    let request = json!({
        "chart": chart_dir(),
        "parse_sets": parse_sets,
        "cases": cases.iter().map(|c| json!({
            "name": c.name, "namespace": c.namespace, "kube_version": c.kube_version,
            "values": c.values, "api_versions": c.api_versions, "lint": c.lint,
            "validate": c.validate,
        })).collect::<Vec<_>>(),
    });
    let mut child = Command::new(&python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {python} (set HAMI_PYTHON to a Python 3 with helm-python-sdk and kubernetes-validate): {e}")
        });
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
        Some(3) => panic!(
            "a real peer is missing: {stderr} (`pip install helm-python-sdk kubernetes-validate`, as scripts/test.sh does)"
        ),
        _ => panic!("helm_peer.py failed ({}): {stderr}", out.status),
    }
    serde_json::from_slice(&out.stdout).expect("helm_peer.py answers JSON")
}

/// A documented command line, its namespace and its `(set | set-string, expression)` pairs.
pub(crate) type DocumentedCommand = (String, String, Vec<(String, String)>);

/// `--set`/`--set-string` expressions and the namespace of every `helm install`/`helm
/// upgrade` command in docs/install.md (continuation lines joined), with the command itself.
pub(crate) fn documented_helm_commands() -> Vec<DocumentedCommand> {
    let text = std::fs::read_to_string(repo().join("docs/install.md")).unwrap();
    let joined = text.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        let line = line.trim();
        let Some(rest) = line
            .strip_prefix("helm install ")
            .or_else(|| line.strip_prefix("helm upgrade "))
        else {
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let mut namespace = "default".to_string();
        let mut sets = Vec::new();
        let mut i = 0;
        while i < words.len() {
            match words[i] {
                "-n" | "--namespace" => {
                    namespace = words[i + 1].to_string();
                    i += 1;
                }
                "--set" | "--set-string" => {
                    sets.push((words[i][2..].to_string(), words[i + 1].to_string()));
                    i += 1;
                }
                w if w.starts_with("--set-file") || w.starts_with("--set-json") => {
                    panic!("docs/install.md: `{line}`: use --set or --set-string")
                }
                w if w.starts_with("--namespace=") => {
                    namespace = w["--namespace=".len()..].to_string()
                }
                w if w.starts_with("-f") || w.starts_with("--values") => {
                    panic!(
                        "docs/install.md: `{line}`: use --set (the test renders exactly the documented command)"
                    )
                }
                _ => {}
            }
            i += 1;
        }
        out.push((line.to_string(), namespace, sets));
    }
    out
}

/// Deep merge of `b` into `a` (what Helm does with several `--set` flags).
pub(crate) fn merge(a: &mut Value, b: &Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}
