//! Label and field selectors: parsing the query-string syntax and matching objects.
//!
//! Hand-written on purpose: the parser must accept and refuse exactly what apimachinery's
//! `labels.Parse` and `fields.ParseSelector` do (a field term splits at its first operator,
//! backslash escapes in field values), and no maintained Rust crate parses either grammar:
//! kube-core's `Selector` only builds and prints label selectors for clients, and it has no
//! field selectors.

use serde_json::Value;
use std::collections::BTreeSet;

use crate::status::ApiError;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelReq {
    /// `key=value` or `key==value`: the label is present with that value.
    Eq(String, String),
    /// `key!=value`: the label is absent or has another value.
    NotEq(String, String),
    /// `key in (a,b)`: the label is present with one of the values.
    In(String, BTreeSet<String>),
    /// `key notin (a,b)`: the label is absent or has none of the values.
    NotIn(String, BTreeSet<String>),
    /// `key`: the label is present.
    Exists(String),
    /// `!key`: the label is absent.
    NotExists(String),
}

/// A parsed label selector: all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelReq>);

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn parse_set(rest: &str, whole: &str) -> Result<BTreeSet<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: found '{rest}', expected: '(' in {whole:?}"
            ))
        })?;
    let mut set = BTreeSet::new();
    for v in inner.split(',') {
        let v = v.trim();
        if !valid_value(v) {
            return Err(ApiError::bad_request(format!(
                "invalid label value: {v:?} in selector {whole:?}"
            )));
        }
        set.insert(v.to_string());
    }
    Ok(set)
}

impl LabelSelector {
    /// Parses `?labelSelector=` text; an empty string selects everything, bad syntax is 400.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for part in split_top_level(s) {
            let p = part.trim();
            let bad = || {
                ApiError::bad_request(format!(
                    "unable to parse requirement: {p:?} in label selector {s:?}"
                ))
            };
            let req = if let Some(k) = p.strip_prefix('!') {
                LabelReq::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = p.split_once("!=") {
                LabelReq::NotEq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = p.split_once("==") {
                LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = p.split_once('=') {
                LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, rest)) = p.split_once(" notin ") {
                LabelReq::NotIn(k.trim().to_string(), parse_set(rest, s)?)
            } else if let Some((k, rest)) = p.split_once(" in ") {
                LabelReq::In(k.trim().to_string(), parse_set(rest, s)?)
            } else if p.contains(' ') || p.contains('(') {
                return Err(bad());
            } else {
                LabelReq::Exists(p.to_string())
            };
            let (key, value) = match &req {
                LabelReq::Eq(k, v) | LabelReq::NotEq(k, v) => (k, Some(v)),
                LabelReq::In(k, _)
                | LabelReq::NotIn(k, _)
                | LabelReq::Exists(k)
                | LabelReq::NotExists(k) => (k, None),
            };
            if !valid_key(key) || value.is_some_and(|v| !valid_value(v)) {
                return Err(bad());
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// No requirement: every object matches.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Matches against `metadata.labels` of an object.
    pub fn matches(&self, obj: &Value) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        self.matches_with(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }

    /// Matches against a stored object's labels.
    pub fn matches_stored(&self, obj: &crate::stored::StoredObject) -> bool {
        self.0.is_empty() || self.matches_with(|k| obj.label(k))
    }

    fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, set) => get(k).is_some_and(|x| set.contains(x)),
            LabelReq::NotIn(k, set) => get(k).is_none_or(|x| !set.contains(x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// The canonical query-string form (`a=b,c!=d,e in (f,g),h notin (i),j,!k`), which
/// [`LabelSelector::parse`] reads back to the same selector (the fuzz target
/// `apiserver_selectors` holds it to that).
impl std::fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(",");
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                LabelReq::Eq(k, v) => write!(f, "{k}={v}")?,
                LabelReq::NotEq(k, v) => write!(f, "{k}!={v}")?,
                LabelReq::In(k, s) => write!(f, "{k} in ({})", set(s))?,
                LabelReq::NotIn(k, s) => write!(f, "{k} notin ({})", set(s))?,
                LabelReq::Exists(k) => f.write_str(k)?,
                LabelReq::NotExists(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

/// A parsed field selector: `field=value` / `field!=value` terms, all of which must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

/// The field labels each resource supports in field selectors (as the real server does;
/// anything else is a 400 "field label not supported").
fn supported_fields(plural: &str) -> &'static [&'static str] {
    match plural {
        "pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "nodes" => &["spec.unschedulable"],
        // resource.k8s.io/v1's field label conversion: metadata.name, spec.nodeName and
        // spec.driver, nothing else (no spec.pool.name; no metadata.namespace, see
        // `selectable`). A slice without a nodeName reads as "".
        "resourceslices" => &["spec.nodeName", "spec.driver"],
        "namespaces" => &["status.phase"],
        "secrets" => &["type"],
        "events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reportingController",
        ],
        _ => &[],
    }
}

/// Whether a field selector may name `field` on `plural`. Nodes, Namespaces and
/// ResourceSlices register their own conversions upstream, which (unlike the default one)
/// refuse `metadata.namespace`.
fn selectable(plural: &str, field: &str) -> bool {
    field == "metadata.name"
        || (field == "metadata.namespace"
            && !matches!(plural, "nodes" | "namespaces" | "resourceslices"))
        || supported_fields(plural).contains(&field)
}

/// The 400's message for a field label `plural` does not support, as kube-apiserver words
/// it (the ResourceSlice conversion names the kind).
fn unsupported_field(plural: &str, field: &str) -> String {
    match plural {
        "resourceslices" => {
            format!("field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: {field}")
        }
        _ => format!("field label not supported: {field}"),
    }
}

/// Every field label a resource stores for selectors, `metadata.name` and
/// `metadata.namespace` first (the store reads both even where selectors may not).
pub fn field_labels(plural: &str) -> Vec<&'static str> {
    let mut v = vec!["metadata.name", "metadata.namespace"];
    v.extend_from_slice(supported_fields(plural));
    v
}

/// The value of a field label on an object, formatted as the server formats it.
pub fn field_value(obj: &Value, field: &str) -> String {
    let mut cur = obj;
    for seg in field.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => {
                return match field {
                    "spec.hostNetwork" | "spec.unschedulable" => "false".into(),
                    _ => String::new(),
                };
            }
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The canonical query-string form (`f=v,g!=w`, values escaped), which
/// [`FieldSelector::parse`] reads back to the same selector.
impl std::fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (field, eq, value)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = if *eq { "=" } else { "!=" };
            write!(f, "{field}{op}{}", escape_value(value))?;
        }
        Ok(())
    }
}

/// Splits a field selector on the commas that are not escaped (`\,`).
fn split_unescaped_commas(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// The field, operator (`true` for `=`/`==`) and raw value of one term: the first operator
/// from the left wins, as in apimachinery's `splitTerm` (so `a==b=c` is `a`, `==`, `b=c`,
/// which then fails for the unescaped `=`).
fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    let mut escaped = false;
    for (i, c) in term.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        if c == '\\' {
            escaped = true;
            continue;
        }
        let rest = &term[i..];
        for (op, eq) in [("!=", false), ("==", true), ("=", true)] {
            if let Some(value) = rest.strip_prefix(op) {
                return Some((&term[..i], eq, value));
            }
        }
    }
    None
}

/// A field selector value with its escapes (`\\`, `\,`, `\=`) undone; an unescaped `,` or
/// `=`, or any other escape, is an error (apimachinery's `UnescapeValue`).
fn unescape_value(v: &str) -> Result<String, String> {
    let mut out = String::with_capacity(v.len());
    let mut escaped = false;
    for c in v.chars() {
        if escaped {
            if !matches!(c, '\\' | ',' | '=') {
                return Err(format!("invalid escape sequence: '\\{c}'"));
            }
            out.push(c);
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            ',' | '=' => return Err(format!("unescaped rune: '{c}'")),
            _ => out.push(c),
        }
    }
    if escaped {
        return Err("invalid escape sequence: a trailing '\\'".into());
    }
    Ok(out)
}

/// The inverse of [`unescape_value`].
fn escape_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl FieldSelector {
    /// Parses `field=value,field!=value` as kube-apiserver does: terms split on unescaped
    /// commas, the first operator in a term wins, values unescaped (`\,`, `\=`, `\\`).
    pub fn parse(s: &str, plural: &str) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector(terms));
        }
        for part in split_unescaped_commas(s) {
            let p = part.trim();
            let Some((field, eq, value)) = split_term(p) else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{p}'"
                )));
            };
            let field = field.trim();
            if !selectable(plural, field) {
                return Err(ApiError::bad_request(unsupported_field(plural, field)));
            }
            let value = unescape_value(value.trim()).map_err(|e| {
                ApiError::bad_request(format!("invalid field selector: '{s}': {e}"))
            })?;
            terms.push((field.to_string(), eq, value));
        }
        Ok(FieldSelector(terms))
    }

    /// No term: every object matches.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every term holds for `obj`; a field the object lacks reads as "" (or "false"
    /// for `spec.hostNetwork` and `spec.unschedulable`).
    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|(f, eq, v)| (field_value(obj, f) == *v) == *eq)
    }

    /// Matches against a stored object's pre-extracted field values.
    pub fn matches_stored(&self, obj: &crate::stored::StoredObject) -> bool {
        self.0.iter().all(|(f, eq, v)| (obj.field(f) == v) == *eq)
    }

    /// The value the selector pins `field` to with `=`, if any (used to narrow a list).
    pub fn pinned(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(f, eq, _)| f == field && *eq)
            .map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "web", "tier": "fe"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m("app=web"));
        assert!(m("app==web"));
        assert!(!m("app!=web"));
        assert!(m("app in (web,db)"));
        assert!(!m("app notin (web, db)"));
        assert!(m("app,tier"));
        assert!(!m("!app"));
        assert!(m("!missing"));
        assert!(m("missing notin (x)"));
        assert!(!m("missing in (x)"));
        assert!(m("app in (web),tier=fe"));
        assert!(m(""));
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a b").is_err());
        assert!(LabelSelector::parse("app=we b").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        let m = |s: &str| FieldSelector::parse(s, "pods").unwrap().matches(&o);
        assert!(m("spec.nodeName=n1"));
        assert!(m("spec.nodeName!=n2,status.phase=Running"));
        assert!(m("metadata.name=a,metadata.namespace=ns"));
        assert!(!m("spec.nodeName="));
        assert!(FieldSelector::parse("spec.bogus=x", "pods").is_err());
        assert!(FieldSelector::parse("spec.nodeName=x", "configmaps").is_err());
        assert!(FieldSelector::parse("nonsense", "pods").is_err());
        // The first operator wins; an unescaped `=` or `,` in a value is refused, escaped
        // ones are the characters (found by the apiserver_selectors fuzz target).
        assert!(FieldSelector::parse("status.phase==a==b", "pods").is_err());
        let fs = FieldSelector::parse(r"spec.nodeName=a\=b\,c\\,status.phase!=x", "pods").unwrap();
        assert_eq!(fs.0[0], ("spec.nodeName".into(), true, r"a=b,c\".into()));
        assert_eq!(fs.0[1], ("status.phase".into(), false, "x".into()));
        assert_eq!(FieldSelector::parse(&fs.to_string(), "pods").unwrap(), fs);
        assert!(FieldSelector::parse(r"spec.nodeName=a\x", "pods").is_err());
        assert!(FieldSelector::parse("spec.nodeName=a\\", "pods").is_err());
        let unscheduled = json!({"metadata": {"name": "b"}, "spec": {}});
        assert!(
            FieldSelector::parse("spec.nodeName=", "pods")
                .unwrap()
                .matches(&unscheduled)
        );
    }

    #[test]
    fn resourceslice_field_selectors_are_upstreams() {
        let slice = json!({"metadata": {"name": "s1"}, "spec": {"nodeName": "n1", "driver": "d.example.com", "pool": {"name": "n1"}}});
        let all_nodes = json!({"metadata": {"name": "s2"}, "spec": {"allNodes": true, "driver": "d.example.com", "pool": {"name": "p"}}});
        let m = |s: &str, o: &Value| {
            FieldSelector::parse(s, "resourceslices")
                .unwrap()
                .matches(o)
        };
        assert!(m("spec.nodeName=n1,spec.driver=d.example.com", &slice));
        assert!(!m("spec.nodeName=n1,spec.driver=other", &slice));
        assert!(m("metadata.name=s1", &slice));
        assert!(m("spec.nodeName=", &all_nodes));
        assert!(!m("spec.nodeName=n1", &all_nodes));
        assert!(m("spec.driver!=x", &all_nodes));
        for bad in [
            "spec.pool.name=n1",
            "metadata.namespace=x",
            "spec.devices=x",
        ] {
            let e = FieldSelector::parse(bad, "resourceslices").unwrap_err();
            let field = bad.split('=').next().unwrap();
            assert_eq!(
                e.message,
                format!(
                    "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: {field}"
                )
            );
            assert_eq!(e.code, 400);
        }
        // as for nodes and namespaces (core/v1's conversions)
        for plural in ["nodes", "namespaces"] {
            let e = FieldSelector::parse("metadata.namespace=x", plural).unwrap_err();
            assert_eq!(e.message, "field label not supported: metadata.namespace");
            assert!(FieldSelector::parse("metadata.name=x", plural).is_ok());
        }
        // other resource.k8s.io kinds have only the metadata fields
        assert!(FieldSelector::parse("spec.nodeName=n1", "resourceclaims").is_err());
        assert!(FieldSelector::parse("metadata.namespace=ns", "resourceclaims").is_ok());
    }

    proptest! {
        #[test]
        fn eq_and_noteq_are_complements(k in "[a-z]{1,5}", v in "[a-z0-9]{0,5}", w in "[a-z0-9]{0,5}") {
            let o = obj(json!({ k.clone(): w.clone() }));
            let eq = LabelSelector::parse(&format!("{k}={v}")).unwrap().matches(&o);
            let ne = LabelSelector::parse(&format!("{k}!={v}")).unwrap().matches(&o);
            prop_assert_ne!(eq, ne);
            prop_assert_eq!(eq, v == w);
            let inn = LabelSelector::parse(&format!("{k} in ({v})")).unwrap().matches(&o);
            let notin = LabelSelector::parse(&format!("{k} notin ({v})")).unwrap().matches(&o);
            prop_assert_ne!(inn, notin);
        }
    }
}

/// Matches a structured `metav1.LabelSelector` (`matchLabels` + `matchExpressions`, as in
/// webhook namespace/object selectors) against a label map. An empty or absent selector
/// matches everything.
pub fn structured_selector_matches(selector: Option<&Value>, labels: Option<&Value>) -> bool {
    let Some(sel) = selector.filter(|s| s.is_object()) else {
        return true;
    };
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in ml {
            if get(k) != v.as_str() {
                return false;
            }
        }
    }
    if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
        for e in exprs {
            let key = e.get("key").and_then(Value::as_str).unwrap_or("");
            let values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let have = get(key);
            let ok = match e.get("operator").and_then(Value::as_str).unwrap_or("") {
                "In" => have.is_some_and(|h| values.contains(&h)),
                "NotIn" => have.is_none_or(|h| !values.contains(&h)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                _ => false,
            };
            if !ok {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod structured_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn structured() {
        let labels = json!({"a": "1", "b": "2"});
        let m = |s: Value| structured_selector_matches(Some(&s), Some(&labels));
        assert!(m(json!({})));
        assert!(m(json!({"matchLabels": {"a": "1"}})));
        assert!(!m(json!({"matchLabels": {"a": "2"}})));
        assert!(m(
            json!({"matchExpressions": [{"key": "b", "operator": "In", "values": ["2", "3"]}]})
        ));
        assert!(!m(
            json!({"matchExpressions": [{"key": "c", "operator": "Exists"}]})
        ));
        assert!(m(
            json!({"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}, {"key": "a", "operator": "NotIn", "values": ["9"]}]})
        ));
        assert!(structured_selector_matches(None, None));
    }
}
