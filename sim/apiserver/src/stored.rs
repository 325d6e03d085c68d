//! The stored form of an object: its JSON text plus the labels and field-selector values
//! pulled out of it. Kept this way rather than as a `serde_json::Value` tree, which costs
//! about ten times the JSON size; lists and watch events are then plain string copies.

use std::sync::Arc;

use serde_json::Value;

use crate::resources::ResourceType;
use crate::selector::{field_labels, field_value};

/// An object as the store keeps it: JSON text, with labels and field values pulled out.
#[derive(Debug)]
pub struct StoredObject {
    /// The object serialised as JSON.
    pub json: Arc<str>,
    labels: Box<[(Box<str>, Box<str>)]>,
    fields: Box<[(&'static str, Box<str>)]>,
}

impl StoredObject {
    /// Serialises `obj` once and pulls out its labels and the field labels of type `r`.
    pub fn from_value(r: &ResourceType, obj: &Value) -> StoredObject {
        let json: Arc<str> = serde_json::to_string(obj)
            .unwrap_or_else(|_| "{}".into())
            .into();
        let labels = crate::meta::at(obj, "/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.as_str().into(), v.as_str()?.into())))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
            .into_boxed_slice();
        let fields = field_labels(r.plural)
            .iter()
            .map(|f| (*f, field_value(obj, f).into_boxed_str()))
            .collect::<Vec<_>>()
            .into_boxed_slice();
        StoredObject {
            json,
            labels,
            fields,
        }
    }

    /// This object with `metadata.resourceVersion` set to `rv` (what a DELETE's watch event
    /// carries). The text is the one `from_value` would give for the object so changed; it
    /// is edited in place rather than parsed and serialised again. An object whose metadata
    /// has no string resourceVersion (none is stored so) takes the long way.
    pub fn with_resource_version(&self, r: &ResourceType, rv: u64) -> StoredObject {
        if let Some((start, end)) = metadata_rv_span(self.json.as_bytes()) {
            let rv = rv.to_string();
            let mut json = String::with_capacity(self.json.len() - (end - start) + rv.len());
            json.push_str(&self.json[..start]);
            json.push_str(&rv);
            json.push_str(&self.json[end..]);
            return StoredObject {
                json: json.into(),
                labels: self.labels.clone(),
                fields: self.fields.clone(),
            };
        }
        let mut v = self.to_value();
        if let Some(m) = v.as_object_mut() {
            let meta = m
                .entry("metadata")
                .or_insert_with(|| Value::Object(Default::default()));
            if !meta.is_object() {
                *meta = Value::Object(Default::default());
            }
            meta["resourceVersion"] = Value::String(rv.to_string());
        }
        StoredObject::from_value(r, &v)
    }

    /// The object as a JSON tree (parsed on demand).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.json).unwrap_or(Value::Null)
    }

    /// The value of label `key`, if the object has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }

    /// The value of a supported field label (`metadata.name`, `spec.nodeName`, ...).
    pub fn field(&self, field: &str) -> &str {
        self.fields
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, v)| &**v)
            .unwrap_or("")
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.field("metadata.name")
    }

    /// `metadata.namespace`, empty for cluster-scoped objects.
    pub fn namespace(&self) -> &str {
        self.field("metadata.namespace")
    }
}

/// Where the contents of the top-level `metadata.resourceVersion` string lie in compact
/// JSON text (as serde_json writes it): a byte range, or None if it is not there.
fn metadata_rv_span(b: &[u8]) -> Option<(usize, usize)> {
    let value = member(b, 0, b"metadata")?;
    let rv = member(b, value, b"resourceVersion")?;
    (b.get(rv) == Some(&b'"')).then_some(())?;
    let end = string_end(b, rv)?;
    let contents = &b[rv + 1..end - 1];
    // A digit string (every stored resourceVersion): nothing escaped inside.
    contents
        .iter()
        .all(u8::is_ascii_digit)
        .then_some((rv + 1, end - 1))
}

/// The start of the value of member `name` of the object starting at `at`.
fn member(b: &[u8], at: usize, name: &[u8]) -> Option<usize> {
    (b.get(at) == Some(&b'{')).then_some(())?;
    let mut i = at + 1;
    if b.get(i) == Some(&b'}') {
        return None;
    }
    loop {
        let key_end = string_end(b, i)?;
        let key = &b[i + 1..key_end - 1];
        (b.get(key_end) == Some(&b':')).then_some(())?;
        let value = key_end + 1;
        if key == name {
            return Some(value);
        }
        i = value_end(b, value)?;
        match b.get(i)? {
            b',' => i += 1,
            _ => return None,
        }
    }
}

/// The index after the string starting at `at` (its closing quote included).
fn string_end(b: &[u8], at: usize) -> Option<usize> {
    (b.get(at) == Some(&b'"')).then_some(())?;
    let mut i = at + 1;
    loop {
        match b.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// The index after the value starting at `at`.
fn value_end(b: &[u8], at: usize) -> Option<usize> {
    match b.get(at)? {
        b'"' => string_end(b, at),
        b'{' | b'[' => {
            let (mut depth, mut i) = (0usize, at);
            loop {
                match b.get(i)? {
                    b'"' => {
                        i = string_end(b, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let mut i = at;
            while !matches!(b.get(i)?, b',' | b'}' | b']') {
                i += 1;
            }
            Some(i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn extracts_labels_and_fields() {
        let pods = lookup("", "v1", "pods").unwrap();
        let v = json!({"metadata": {"name": "p", "namespace": "ns", "labels": {"a": "1"}}, "spec": {"nodeName": "n1", "hostNetwork": true}, "status": {"phase": "Running"}});
        let s = StoredObject::from_value(pods, &v);
        assert_eq!((s.name(), s.namespace()), ("p", "ns"));
        assert_eq!(s.label("a"), Some("1"));
        assert_eq!(s.label("b"), None);
        assert_eq!(s.field("spec.nodeName"), "n1");
        assert_eq!(s.field("spec.hostNetwork"), "true");
        assert_eq!(s.field("status.phase"), "Running");
        assert_eq!(s.to_value(), v);
    }

    /// The long way: parse, set the resourceVersion, serialise.
    fn reparsed(r: &ResourceType, s: &StoredObject, rv: u64) -> String {
        let mut v = s.to_value();
        v["metadata"]["resourceVersion"] = json!(rv.to_string());
        StoredObject::from_value(r, &v).json.to_string()
    }

    #[test]
    fn a_deleted_objects_text_is_what_reserialising_gives() {
        let events = lookup("events.k8s.io", "v1", "events").unwrap();
        let core = lookup("", "v1", "events").unwrap();
        let pods = lookup("", "v1", "pods").unwrap();
        let tricky = "a \"resourceVersion\":\"1\" {[ \\ }] \u{e9}";
        for (r, v) in [
            (
                events,
                json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "action": "Binding", "note": tricky,
                "regarding": {"kind": "Pod", "name": "p", "resourceVersion": "17"},
                "metadata": {"name": "p.1", "namespace": "default", "resourceVersion": "42",
                    "annotations": {"resourceVersion": tricky},
                    "managedFields": [{"manager": "m", "fieldsV1": {"f:note": {}}}]}}),
            ),
            (
                core,
                json!({"involvedObject": {"resourceVersion": "9", "name": "p"},
                "count": 3, "firstTimestamp": null, "metadata": {"resourceVersion": "7", "name": "x"}}),
            ),
            (
                pods,
                json!({"metadata": {"name": "p", "namespace": "ns", "labels": {"a": "1"},
                "resourceVersion": "123456"}, "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
                "status": {"phase": "Running", "conditions": [[], {}, [1.5, -2, true]]}}),
            ),
        ] {
            let s = StoredObject::from_value(r, &v);
            // The text edit, not the long way, answers these.
            assert!(metadata_rv_span(s.json.as_bytes()).is_some(), "{v}");
            for rv in [8, 43, 1_000_000_007] {
                let d = s.with_resource_version(r, rv);
                assert_eq!(*d.json, reparsed(r, &s, rv), "{v}");
                assert_eq!(d.to_value()["metadata"]["resourceVersion"], rv.to_string());
                assert_eq!((d.name(), d.namespace()), (s.name(), s.namespace()));
                assert_eq!(d.label("a"), s.label("a"));
                assert_eq!(d.field("spec.nodeName"), s.field("spec.nodeName"));
            }
        }
        // No resourceVersion (or not a digit string) in the metadata: the long way.
        for v in [
            json!({"metadata": {"name": "p"}}),
            json!({"metadata": {"name": "p", "resourceVersion": 5}}),
            json!({"kind": "X"}),
        ] {
            let s = StoredObject::from_value(pods, &v);
            assert_eq!(
                *s.with_resource_version(pods, 9).json,
                reparsed(pods, &s, 9)
            );
        }
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "[ -~\\\\\"{}\\[\\],:é]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-zA-Z\"\\\\]{0,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn the_text_edit_agrees_with_reserialising(
            before in any_json(), meta in any_json(), after in any_json(), rv in any::<u64>(),
        ) {
            let pods = lookup("", "v1", "pods").unwrap();
            let mut metadata = match meta {
                Value::Object(m) => m,
                other => [("x".to_string(), other)].into_iter().collect(),
            };
            metadata.insert("resourceVersion".into(), json!("31"));
            let v = json!({"a": before, "metadata": metadata, "resourceVersion": after});
            let s = StoredObject::from_value(pods, &v);
            prop_assert!(metadata_rv_span(s.json.as_bytes()).is_some());
            prop_assert_eq!(&*s.with_resource_version(pods, rv).json, reparsed(pods, &s, rv));
        }
    }
}
