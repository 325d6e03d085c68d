//! Field ownership (`metadata.managedFields`) and server-side apply conflicts.
//!
//! Ownership is tracked per field manager and operation (`Apply` or `Update`) as sets of
//! leaf paths, stored in the `FieldsV1` format (`{"f:spec":{"f:holderIdentity":{}}}`).
//! Maps are walked; lists and scalars are leaves (Kubernetes tracks associative list items
//! by key, which this model treats as one atomic field — see README).
//! - An update (create, PUT, non-apply PATCH) makes its manager own the leaves it changed
//!   and takes them from every other manager.
//! - An apply must not change a leaf another manager owns (409 Conflict) unless forced;
//!   forcing takes ownership. Leaves the manager applied before and no longer applies are
//!   removed from the object when nobody else owns them.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// A field path from the object root (map keys only).
pub type Path = Vec<String>;

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The field manager (`?fieldManager=`, or the client's user agent).
    pub manager: String,
    /// `Apply` or `Update`, as in Kubernetes.
    pub operation: String,
    /// The apiVersion the fields were written through.
    pub api_version: String,
    /// RFC 3339 time of the manager's last write.
    pub time: String,
    /// `status` when the write went through that subresource.
    pub subresource: Option<String>,
    /// The fields this manager owns (`fieldsV1`, decoded).
    pub fields: BTreeSet<Path>,
}

/// Metadata fields that are not owned by anyone (identity and server-set fields).
fn untracked(path: &[String]) -> bool {
    match path {
        [top] => top == "apiVersion" || top == "kind",
        [m, f] if m == "metadata" => matches!(
            f.as_str(),
            "name"
                | "namespace"
                | "uid"
                | "resourceVersion"
                | "generation"
                | "creationTimestamp"
                | "deletionTimestamp"
                | "deletionGracePeriodSeconds"
                | "managedFields"
                | "selfLink"
                | "generateName"
        ),
        _ => false,
    }
}

fn collect_leaves(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                path.push(k.clone());
                if !untracked(path) {
                    collect_leaves(child, path, out);
                }
                path.pop();
            }
        }
        _ => {
            if !path.is_empty() {
                out.insert(path.clone());
            }
        }
    }
}

/// Every tracked leaf path of a document.
pub fn leaf_paths(v: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    collect_leaves(v, &mut Vec::new(), &mut out);
    out
}

fn diff_walk(
    old: Option<&Value>,
    new: Option<&Value>,
    path: &mut Path,
    changed: &mut BTreeSet<Path>,
    removed: &mut BTreeSet<Path>,
) {
    match (old, new) {
        (Some(Value::Object(a)), Some(Value::Object(b))) if !a.is_empty() && !b.is_empty() => {
            for (k, bv) in b {
                path.push(k.clone());
                if !untracked(path) {
                    diff_walk(a.get(k), Some(bv), path, changed, removed);
                }
                path.pop();
            }
            for (k, av) in a {
                if !b.contains_key(k) {
                    path.push(k.clone());
                    if !untracked(path) {
                        diff_walk(Some(av), None, path, changed, removed);
                    }
                    path.pop();
                }
            }
        }
        (_, Some(n)) => {
            if old != Some(n) {
                // Whatever was below the old value is gone; the new leaves are changed.
                if let Some(o) = old {
                    let mut gone = BTreeSet::new();
                    collect_leaves(o, path, &mut gone);
                    removed.extend(gone);
                }
                collect_leaves(n, path, changed);
            }
        }
        (Some(o), None) => collect_leaves(o, path, removed),
        (None, None) => {}
    }
}

/// Leaves whose value changed (or appeared) from `old` to `new`, and leaves that disappeared.
pub fn diff(old: &Value, new: &Value) -> (BTreeSet<Path>, BTreeSet<Path>) {
    let (mut changed, mut removed) = (BTreeSet::new(), BTreeSet::new());
    diff_walk(
        Some(old),
        Some(new),
        &mut Vec::new(),
        &mut changed,
        &mut removed,
    );
    removed.retain(|p| !changed.contains(p));
    (changed, removed)
}

/// The value at `path` in `v`, if every key on the way exists.
pub fn value_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(k))
}

fn remove_at(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for k in parents {
        match cur.get_mut(k) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

/// `FieldsV1` JSON for a set of paths.
pub fn to_fields_v1(paths: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    // One key buffer: the paths come sorted, so most steps find their map already there
    // and allocate nothing.
    let mut key = String::new();
    for p in paths {
        let mut cur = &mut root;
        for k in p {
            key.clear();
            key.push_str("f:");
            key.push_str(k);
            if !cur.contains_key(key.as_str()) {
                cur.insert(key.clone(), Value::Object(Map::new()));
            }
            cur = cur
                .get_mut(key.as_str())
                .and_then(Value::as_object_mut)
                .expect("built as objects");
        }
    }
    Value::Object(root)
}

fn from_fields_v1_walk(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
    let Some(m) = v.as_object() else { return };
    let mut any_child = false;
    for (k, child) in m {
        if let Some(name) = k.strip_prefix("f:") {
            any_child = true;
            path.push(name.to_string());
            from_fields_v1_walk(child, path, out);
            path.pop();
        } else if k.starts_with("k:") || k.starts_with("v:") || k.starts_with("i:") {
            // Items of an associative list: we track the whole list as one field.
            any_child = false;
            break;
        }
    }
    if !any_child && !path.is_empty() {
        out.insert(path.clone());
    }
}

/// Paths of a `FieldsV1` tree (also reads entries written by other servers).
pub fn from_fields_v1(v: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    from_fields_v1_walk(v, &mut Vec::new(), &mut out);
    out
}

/// Reads `metadata.managedFields`.
pub fn read_entries(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| Entry {
                    manager: e
                        .get("manager")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    operation: e
                        .get("operation")
                        .and_then(Value::as_str)
                        .unwrap_or("Update")
                        .to_string(),
                    api_version: e
                        .get("apiVersion")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    time: e
                        .get("time")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    subresource: e
                        .get("subresource")
                        .and_then(Value::as_str)
                        .map(String::from),
                    fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `metadata.managedFields` (entries without fields are dropped).
pub fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version, "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&e.fields)});
            if let Some(s) = &e.subresource {
                v["subresource"] = json!(s);
            }
            v
        })
        .collect();
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            m.remove("managedFields");
        } else {
            m.insert("managedFields".into(), Value::Array(list));
        }
    }
}

fn entry_mut<'a>(
    entries: &'a mut Vec<Entry>,
    manager: &str,
    operation: &str,
    api_version: &str,
    now: &str,
    subresource: Option<&str>,
) -> &'a mut Entry {
    let pos = entries.iter().position(|e| {
        e.manager == manager && e.operation == operation && e.subresource.as_deref() == subresource
    });
    let i = match pos {
        Some(i) => i,
        None => {
            entries.push(Entry {
                manager: manager.into(),
                operation: operation.into(),
                api_version: api_version.into(),
                time: now.into(),
                subresource: subresource.map(String::from),
                fields: BTreeSet::new(),
            });
            entries.len() - 1
        }
    };
    let e = &mut entries[i];
    e.time = now.to_string();
    e.api_version = api_version.to_string();
    e
}

/// Bookkeeping of an update by `manager` from `old` (None on create) to `new`.
pub fn record_update(
    entries: &mut Vec<Entry>,
    old: Option<&Value>,
    new: &Value,
    manager: &str,
    api_version: &str,
    now: &str,
    subresource: Option<&str>,
) {
    let (changed, removed) = match old {
        Some(o) => diff(o, new),
        None => (leaf_paths(new), BTreeSet::new()),
    };
    if changed.is_empty() && removed.is_empty() {
        return;
    }
    for e in entries.iter_mut() {
        e.fields.retain(|p| {
            !removed.contains(p)
                && !(changed.contains(p) && (e.manager != manager || e.operation != "Update"))
        });
    }
    entry_mut(entries, manager, "Update", api_version, now, subresource)
        .fields
        .extend(changed);
    entries.retain(|e| !e.fields.is_empty());
}

/// A field another manager owns with a different value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The manager that owns the field.
    pub manager: String,
    /// The conflicting field.
    pub path: Path,
}

/// Server-side apply by `manager` of `applied` onto `current`: checks conflicts, then
/// returns the merged object and updates the entries. `force` takes ownership instead.
pub fn apply(
    entries: &mut Vec<Entry>,
    current: &Value,
    applied: &Value,
    manager: &str,
    api_version: &str,
    now: &str,
    force: bool,
) -> Result<Value, Vec<Conflict>> {
    let applied_paths = leaf_paths(applied);
    let mut conflicts = Vec::new();
    for p in &applied_paths {
        if value_at(current, p) == value_at(applied, p) {
            continue;
        }
        for e in entries.iter() {
            if e.manager != manager
                && e.fields
                    .iter()
                    .any(|f| f == p || f.starts_with(p) || p.starts_with(f))
            {
                conflicts.push(Conflict {
                    manager: e.manager.clone(),
                    path: p.clone(),
                });
            }
        }
    }
    if !conflicts.is_empty() && !force {
        conflicts.dedup();
        return Err(conflicts);
    }
    let mut merged = current.clone();
    json_patch::merge(&mut merged, applied);
    let previous: BTreeSet<Path> = entries
        .iter()
        .filter(|e| e.manager == manager && e.operation == "Apply")
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    for stale in previous.difference(&applied_paths) {
        let owned_by_others = entries
            .iter()
            .any(|e| !(e.manager == manager && e.operation == "Apply") && e.fields.contains(stale));
        if !owned_by_others {
            remove_at(&mut merged, stale);
        }
    }
    if force {
        for e in entries.iter_mut().filter(|e| e.manager != manager) {
            e.fields.retain(|f| {
                !applied_paths
                    .iter()
                    .any(|p| f == p || f.starts_with(p) || p.starts_with(f))
            });
        }
    }
    entry_mut(entries, manager, "Apply", api_version, now, None).fields = applied_paths;
    entries.retain(|e| !e.fields.is_empty());
    Ok(merged)
}

/// The message of a 409 apply conflict, as Kubernetes words it.
pub fn conflict_message(conflicts: &[Conflict]) -> String {
    let parts: Vec<String> = conflicts
        .iter()
        .map(|c| format!("conflict with \"{}\": .{}", c.manager, c.path.join(".")))
        .collect();
    let n = conflicts.len();
    format!(
        "Apply failed with {n} conflict{}: {}",
        if n == 1 { "" } else { "s" },
        parts.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> Path {
        s.split('.').map(String::from).collect()
    }

    #[test]
    fn leaves_skip_identity_fields() {
        let v = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "labels": {"x": "1"}}, "data": {"k": "v"}, "spec": {"list": [1], "empty": {}}});
        let l = leaf_paths(&v);
        assert_eq!(
            l,
            [
                p("metadata.labels.x"),
                p("data.k"),
                p("spec.list"),
                p("spec.empty")
            ]
            .into_iter()
            .collect()
        );
        assert_eq!(from_fields_v1(&to_fields_v1(&l)), l);
    }

    #[test]
    fn fields_v1_from_kubernetes() {
        let real = json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:image": {}}}}});
        assert_eq!(
            from_fields_v1(&real),
            [p("metadata.labels.app"), p("spec.containers")]
                .into_iter()
                .collect()
        );
    }

    #[test]
    fn updates_take_ownership() {
        let mut entries = Vec::new();
        let a = json!({"metadata": {"name": "x"}, "data": {"k": "1", "j": "2"}});
        record_update(&mut entries, None, &a, "creator", "v1", "t", None);
        let b = json!({"metadata": {"name": "x"}, "data": {"k": "9", "j": "2"}});
        record_update(&mut entries, Some(&a), &b, "editor", "v1", "t", None);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].fields, [p("data.j")].into_iter().collect());
        assert_eq!(entries[1].fields, [p("data.k")].into_iter().collect());
        let mut obj = b.clone();
        write_entries(&mut obj, &entries);
        assert_eq!(read_entries(&obj), entries);
    }

    #[test]
    fn apply_conflicts_force_and_prunes() {
        let mut entries = Vec::new();
        let cur = json!({"metadata": {"name": "l"}, "spec": {}});
        let a = json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": 5}});
        let after_a = apply(&mut entries, &cur, &a, "mgr-a", "v1", "t", false).unwrap();
        assert_eq!(after_a["spec"]["holderIdentity"], "a");
        // another manager changing the holder conflicts
        let b = json!({"spec": {"holderIdentity": "b"}});
        let err = apply(&mut entries, &after_a, &b, "mgr-b", "v1", "t", false).unwrap_err();
        assert_eq!(
            err,
            vec![Conflict {
                manager: "mgr-a".into(),
                path: p("spec.holderIdentity")
            }]
        );
        assert_eq!(
            conflict_message(&err),
            "Apply failed with 1 conflict: conflict with \"mgr-a\": .spec.holderIdentity"
        );
        // applying the same value is not a conflict (shared ownership)
        assert!(
            apply(
                &mut entries.clone(),
                &after_a,
                &json!({"spec": {"holderIdentity": "a"}}),
                "mgr-b",
                "v1",
                "t",
                false
            )
            .is_ok()
        );
        // force takes it over
        let forced = apply(&mut entries, &after_a, &b, "mgr-b", "v1", "t", true).unwrap();
        assert_eq!(forced["spec"]["holderIdentity"], "b");
        assert!(
            !entries
                .iter()
                .find(|e| e.manager == "mgr-a")
                .unwrap()
                .fields
                .contains(&p("spec.holderIdentity"))
        );
        // mgr-a stops applying leaseDurationSeconds: it is removed (nobody else owns it)
        let pruned = apply(
            &mut entries,
            &forced,
            &json!({"spec": {"renewTime": "now"}}),
            "mgr-a",
            "v1",
            "t",
            false,
        )
        .unwrap();
        assert!(pruned["spec"].get("leaseDurationSeconds").is_none());
        assert_eq!(pruned["spec"]["holderIdentity"], "b");
    }

    proptest! {
        // diff(old, new) names exactly the leaves whose value differs.
        #[test]
        fn diff_matches_leaf_comparison(
            a in proptest::collection::btree_map("[a-c]", proptest::collection::btree_map("[a-c]", 0u8..3, 0..3), 0..3),
            b in proptest::collection::btree_map("[a-c]", proptest::collection::btree_map("[a-c]", 0u8..3, 0..3), 0..3),
        ) {
            let (va, vb) = (serde_json::to_value(&a).unwrap(), serde_json::to_value(&b).unwrap());
            let (changed, removed) = diff(&va, &vb);
            let (la, lb) = (leaf_paths(&va), leaf_paths(&vb));
            let expect_changed: BTreeSet<Path> = lb.iter().filter(|p| value_at(&va, p) != value_at(&vb, p)).cloned().collect();
            let expect_removed: BTreeSet<Path> = la.difference(&lb).filter(|p| !expect_changed.contains(*p)).cloned().collect();
            prop_assert_eq!(changed, expect_changed);
            prop_assert_eq!(removed, expect_removed);
        }
    }
}
