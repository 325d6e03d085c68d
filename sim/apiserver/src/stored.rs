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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;
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
}
