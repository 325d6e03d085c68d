//! docs/install.md documents every chart value: each leaf of `values.yaml` is named in the
//! install guide's values table, so a value added to the chart cannot ship undocumented
//! (`webui.enabled` once did).
//!
//! A leaf `a.b.c` counts as documented when one table row names it in backticks, either
//! whole (`` `a.b.c` ``) or grouped as the table does: the row names its top-level key (or a
//! path under it) and its remaining path or last segment (`` `nvidiaDevicePlugin.x` ``,
//! `` `deviceSplitCount` ``; "per component (`scheduler`, …): `nodeSelector`").

use std::path::Path;

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Values that are Kubernetes objects passed through whole (documented as one value).
const WHOLE_OBJECTS: [&str; 4] = ["resources", "affinity", "nodeSelector", "labels"];

/// Dotted paths of every leaf: scalars, lists, maps that are empty by default, and the
/// Kubernetes objects of [`WHOLE_OBJECTS`].
fn leaves(prefix: &str, v: &Value, out: &mut Vec<String>) {
    let whole = WHOLE_OBJECTS.contains(&prefix.rsplit('.').next().unwrap_or(prefix));
    match v {
        Value::Object(map) if !map.is_empty() && !whole => {
            for (k, child) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&path, child, out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

/// The backticked tokens of each row of the values table (the rows after "Every chart
/// value" up to the first line that is not part of the table).
fn table_rows(doc: &str) -> Vec<Vec<String>> {
    let start = doc
        .find("Every chart value")
        .expect("docs/install.md has no values table (\"Every chart value …\")");
    doc[start..]
        .lines()
        .skip(1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            row.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

fn documented(path: &str, rows: &[Vec<String>]) -> bool {
    let (top, rest) = path.split_once('.').unwrap_or((path, ""));
    let last = path.rsplit('.').next().unwrap_or(path);
    rows.iter().any(|tokens| {
        let names_top = tokens
            .iter()
            .any(|t| t == top || t.starts_with(&format!("{top}.")));
        let names_rest = rest.is_empty()
            || tokens.iter().any(|t| {
                t == path
                    || t == rest
                    || t == last
                    || t.starts_with(&format!("{path}."))
                    || t.ends_with(&format!(".{rest}"))
                    || t.ends_with(&format!(".{last}"))
                    || t.strip_suffix(".*").is_some_and(|p| path.starts_with(p))
            });
        tokens.iter().any(|t| t == path) || (names_top && names_rest)
    })
}

#[test]
fn every_chart_value_is_in_the_install_guide() {
    let values_text =
        std::fs::read_to_string(root().join("deploy/helm/hami-rs/values.yaml")).unwrap();
    let values: Value = serde_saphyr::from_str(&values_text).unwrap();
    let doc = std::fs::read_to_string(root().join("docs/install.md")).unwrap();
    let rows = table_rows(&doc);
    assert!(rows.len() > 10, "values table not found: {rows:?}");
    let mut paths = Vec::new();
    leaves("", &values, &mut paths);
    assert!(
        paths.len() > 30,
        "values.yaml read as too few leaves: {paths:?}"
    );
    let missing: Vec<&String> = paths.iter().filter(|p| !documented(p, &rows)).collect();
    assert!(
        missing.is_empty(),
        "chart values not in docs/install.md's values table (add a row or name them in one): {missing:?}"
    );
}

#[test]
fn the_check_sees_a_value_missing_from_the_table() {
    let rows = vec![
        vec!["scheduler.replicas".to_owned()],
        vec!["nvidiaDevicePlugin.enabled".to_owned()],
        vec![
            "nvidiaDevicePlugin.deviceSplitCount".to_owned(),
            "hostHookPath".to_owned(),
        ],
        vec![
            "scheduler".to_owned(),
            "monitor".to_owned(),
            "nodeSelector".to_owned(),
        ],
    ];
    assert!(documented("scheduler.replicas", &rows));
    assert!(documented("nvidiaDevicePlugin.hostHookPath", &rows));
    assert!(documented("monitor.nodeSelector", &rows));
    assert!(!documented("webui.enabled", &rows));
    assert!(!documented("scheduler.schedulerName", &rows));
    assert!(!documented("monitor.resources", &rows));
}
