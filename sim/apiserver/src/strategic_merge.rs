//! Strategic merge patch (`application/strategic-merge-patch+json`) for the built-in types
//! served here. Maps merge recursively (null deletes a key); lists follow the patch strategy
//! Kubernetes declares on the Go field (`patchStrategy:"merge" patchMergeKey:"..."`), which we
//! keep as a table keyed by the field path; lists without a strategy are replaced.
//! Directives: `$patch: replace|delete|merge` (maps and list items), `$retainKeys`,
//! `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>`.

use serde_json::{Map, Value};

/// How a list field merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// No patch strategy: the patch's list replaces the original.
    Replace,
    /// Items are objects identified by this key.
    MergeByKey(&'static str),
    /// A list of scalars merged as a set (e.g. `metadata.finalizers`).
    MergePrimitives,
}

/// The strategy of the list at `path` (field names from the object root, list indices omitted).
pub fn list_strategy(path: &[&str]) -> ListStrategy {
    use ListStrategy::*;
    let n = path.len();
    let last = path.last().copied().unwrap_or("");
    let parent = if n >= 2 { path[n - 2] } else { "" };
    let is_container =
        |p: &str| matches!(p, "containers" | "initContainers" | "ephemeralContainers");
    match (parent, last) {
        ("metadata", "finalizers") => MergePrimitives,
        ("metadata", "ownerReferences") => MergeByKey("uid"),
        ("spec", c) if is_container(c) => MergeByKey("name"),
        (c, "env") if is_container(c) => MergeByKey("name"),
        (c, "volumeMounts") if is_container(c) => MergeByKey("mountPath"),
        (c, "volumeDevices") if is_container(c) => MergeByKey("devicePath"),
        (c, "ports") if is_container(c) => MergeByKey("containerPort"),
        ("spec", "volumes") => MergeByKey("name"),
        ("spec", "imagePullSecrets") => MergeByKey("name"),
        ("spec", "hostAliases") => MergeByKey("ip"),
        ("spec", "taints") => MergeByKey("key"),
        ("spec", "podCIDRs") => MergePrimitives,
        ("status", "conditions") => MergeByKey("type"),
        ("status", "addresses") => MergeByKey("type"),
        ("status", "podIPs") => MergeByKey("ip"),
        ("", "webhooks") => MergeByKey("name"),
        ("", "secrets") if n == 1 => MergeByKey("name"),
        _ => Replace,
    }
}

/// Applies a strategic merge patch to `original`, returning the patched document.
pub fn strategic_merge(original: &Value, patch: &Value) -> Result<Value, String> {
    let Value::Object(p) = patch else {
        return Err("strategic merge patch must be a JSON object".into());
    };
    let mut path = Vec::new();
    match merge_map(original.as_object(), p, &mut path)? {
        Some(m) => Ok(Value::Object(m)),
        None => Err("a strategic merge patch may not delete the whole object".into()),
    }
}

/// Merges map `patch` onto `orig`. `None` means "delete this map" (`$patch: delete`).
fn merge_map<'a>(
    orig: Option<&Map<String, Value>>,
    patch: &'a Map<String, Value>,
    path: &mut Vec<&'a str>,
) -> Result<Option<Map<String, Value>>, String> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("delete") => return Ok(None),
        Some("replace") => {
            let mut m = patch.clone();
            m.remove("$patch");
            strip_directives(&mut m);
            return Ok(Some(m));
        }
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch type: {other:?} in map")),
    }
    let mut out = orig.cloned().unwrap_or_default();
    if let Some(keys) = patch.get("$retainKeys") {
        let keys: Vec<&str> = keys
            .as_array()
            .ok_or("$retainKeys must be a list")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        out.retain(|k, _| keys.contains(&k.as_str()));
    }
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = v
                .as_array()
                .ok_or("$deleteFromPrimitiveList must be a list")?;
            if let Some(Value::Array(list)) = out.get_mut(field) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        path.push(k.as_str());
        match v {
            Value::Null => {
                out.remove(k);
            }
            Value::Object(pm) => {
                let orig_child = out.get(k).and_then(Value::as_object);
                match merge_map(orig_child, pm, path)? {
                    Some(m) => {
                        out.insert(k.clone(), Value::Object(m));
                    }
                    None => {
                        out.remove(k);
                    }
                }
            }
            Value::Array(pl) => {
                let orig_list = out.get(k).and_then(Value::as_array);
                let merged = merge_list(orig_list, pl, path)?;
                out.insert(k.clone(), Value::Array(merged));
            }
            scalar => {
                out.insert(k.clone(), scalar.clone());
            }
        }
        path.pop();
    }
    // `$setElementOrder/<field>` only orders the result; apply it for keyed lists.
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$setElementOrder/") {
            path.push(field);
            let strategy = list_strategy(path);
            path.pop();
            if let (Some(Value::Array(list)), Some(order)) = (out.get_mut(field), v.as_array()) {
                reorder(list, order, strategy);
            }
        }
    }
    Ok(Some(out))
}

/// Orders `list` like `order` (items not named there keep their place at the end).
fn reorder(list: &mut Vec<Value>, order: &[Value], strategy: ListStrategy) {
    let ident = |item: &Value| -> Option<Value> {
        match strategy {
            ListStrategy::MergeByKey(key) => item.get(key).cloned(),
            ListStrategy::MergePrimitives => Some(item.clone()),
            ListStrategy::Replace => None,
        }
    };
    let order_ids: Vec<Option<Value>> = order.iter().map(&ident).collect();
    let mut ordered = Vec::with_capacity(list.len());
    let mut rest: Vec<Value> = std::mem::take(list);
    for id in order_ids.into_iter().flatten() {
        if let Some(pos) = rest.iter().position(|x| ident(x).as_ref() == Some(&id)) {
            ordered.push(rest.remove(pos));
        }
    }
    ordered.extend(rest);
    *list = ordered;
}

fn strip_directives(m: &mut Map<String, Value>) {
    m.retain(|k, _| !k.starts_with('$'));
    for v in m.values_mut() {
        match v {
            Value::Object(child) => strip_directives(child),
            Value::Array(items) => {
                for i in items {
                    if let Value::Object(child) = i {
                        strip_directives(child);
                    }
                }
            }
            _ => {}
        }
    }
}

fn merge_list<'a>(
    orig: Option<&Vec<Value>>,
    patch: &'a [Value],
    path: &mut Vec<&'a str>,
) -> Result<Vec<Value>, String> {
    let strategy = list_strategy(path);
    // `{"$patch": "replace"}` as a list item replaces the whole list with the other items.
    let replace_marker = |v: &Value| {
        v.get("$patch").and_then(Value::as_str) == Some("replace")
            && v.as_object().is_some_and(|m| m.len() == 1)
    };
    if patch.iter().any(replace_marker) {
        return Ok(patch
            .iter()
            .filter(|v| !replace_marker(v))
            .map(|v| {
                let mut v = v.clone();
                if let Value::Object(m) = &mut v {
                    strip_directives(m);
                }
                v
            })
            .collect());
    }
    match strategy {
        ListStrategy::Replace => Ok(patch
            .iter()
            .map(|v| {
                let mut v = v.clone();
                if let Value::Object(m) = &mut v {
                    strip_directives(m);
                }
                v
            })
            .collect()),
        ListStrategy::MergePrimitives => {
            let mut out = orig.cloned().unwrap_or_default();
            for v in patch {
                if !out.contains(v) {
                    out.push(v.clone());
                }
            }
            Ok(out)
        }
        ListStrategy::MergeByKey(key) => {
            let mut out = orig.cloned().unwrap_or_default();
            for item in patch {
                let Value::Object(pm) = item else {
                    return Err(format!(
                        "list {} items must be objects (merge key {key:?})",
                        path.join(".")
                    ));
                };
                let Some(id) = pm.get(key) else {
                    return Err(format!(
                        "map: {item} does not contain declared merge key: {key}"
                    ));
                };
                let pos = out.iter().position(|o| o.get(key) == Some(id));
                let delete = pm.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        out.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => match merge_map(out[i].as_object(), pm, path)? {
                        Some(m) => out[i] = Value::Object(m),
                        None => {
                            out.remove(i);
                        }
                    },
                    (None, false) => {
                        if let Some(m) = merge_map(None, pm, path)? {
                            out.push(Value::Object(m));
                        }
                    }
                }
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
            "spec": {
                "containers": [
                    {"name": "main", "image": "busybox", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                    {"name": "side", "image": "nginx"}
                ],
                "volumes": [{"name": "v1", "emptyDir": {}}],
                "tolerations": [{"key": "t1"}]
            }
        })
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        let out = strategic_merge(
            &pod(),
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        assert_eq!(out["spec"], pod()["spec"]);
    }

    #[test]
    fn containers_merge_by_name() {
        let out = strategic_merge(
            &pod(),
            &json!({"spec": {"containers": [{"name": "main", "image": "alpine", "env": [{"name": "B", "value": "x"}, {"name": "C", "value": "3"}]}]}}),
        )
        .unwrap();
        let cs = out["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[0]["image"], "alpine");
        assert_eq!(cs[1]["name"], "side");
        assert_eq!(
            cs[0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "x"}, {"name": "C", "value": "3"}])
        );
    }

    #[test]
    fn delete_and_replace_directives() {
        let out = strategic_merge(
            &pod(),
            &json!({"spec": {"containers": [{"name": "side", "$patch": "delete"}], "volumes": [{"$patch": "replace"}, {"name": "v2"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"].as_array().unwrap().len(), 1);
        assert_eq!(out["spec"]["volumes"], json!([{"name": "v2"}]));
        let out = strategic_merge(
            &pod(),
            &json!({"metadata": {"labels": {"$patch": "replace", "z": "9"}}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"z": "9"}));
    }

    #[test]
    fn lists_without_strategy_replace_and_primitives_union() {
        let out = strategic_merge(&pod(), &json!({"spec": {"tolerations": [{"key": "t2"}]}, "metadata": {"finalizers": ["y", "x"]}})).unwrap();
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "t2"}]));
        assert_eq!(out["metadata"]["finalizers"], json!(["x", "y"]));
        let out = strategic_merge(
            &pod(),
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!([]));
    }

    #[test]
    fn set_element_order_is_applied_and_stripped() {
        let out = strategic_merge(
            &pod(),
            &json!({"spec": {"$setElementOrder/containers": [{"name": "side"}, {"name": "main"}], "containers": [{"name": "side", "image": "x"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"][0]["name"], "side");
        assert_eq!(out["spec"]["containers"][0]["image"], "x");
        assert!(out["spec"].get("$setElementOrder/containers").is_none());
    }

    #[test]
    fn missing_merge_key_is_an_error() {
        assert!(
            strategic_merge(&pod(), &json!({"spec": {"containers": [{"image": "x"}]}})).is_err()
        );
        assert!(strategic_merge(&pod(), &json!([1])).is_err());
    }

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<i32>().prop_map(|i| json!(i)),
            "[a-z]{0,4}".prop_map(Value::String)
        ]
    }

    proptest! {
        // Without lists, a strategic merge patch is exactly an RFC 7386 merge patch.
        #[test]
        fn agrees_with_merge_patch_on_maps(
            orig in proptest::collection::btree_map("[a-d]", proptest::collection::btree_map("[a-d]", scalar(), 0..4), 0..4),
            patch in proptest::collection::btree_map("[a-d]", proptest::collection::btree_map("[a-d]", scalar(), 0..4), 0..4),
        ) {
            let o = serde_json::to_value(&orig).unwrap();
            let p = serde_json::to_value(&patch).unwrap();
            let mut expected = o.clone();
            json_patch::merge(&mut expected, &p);
            prop_assert_eq!(strategic_merge(&o, &p).unwrap(), expected);
        }
    }
}
