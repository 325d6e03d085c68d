//! Watch semantics: which events a watcher sees (namespace and selectors, with objects
//! entering or leaving a selection turned into ADDED/DELETED as the real server does) and
//! the newline-delimited JSON frames it is sent.

use serde_json::json;

use crate::resources::ResourceType;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{EventType, WatchEvent};
use crate::stored::StoredObject;

/// What one watch request selects.
#[derive(Debug, Clone)]
pub struct WatchFilter {
    /// The resource type watched.
    pub resource: &'static ResourceType,
    /// The namespace of the URL; None watches every namespace.
    pub namespace: Option<String>,
    /// `?labelSelector=`.
    pub labels: LabelSelector,
    /// `?fieldSelector=`.
    pub fields: FieldSelector,
}

impl WatchFilter {
    fn selects(&self, obj: &StoredObject) -> bool {
        self.labels.matches_stored(obj) && self.fields.matches_stored(obj)
    }

    /// The event type this watcher sees for `ev`, or None if the event is not for it.
    pub fn classify(&self, ev: &WatchEvent) -> Option<EventType> {
        if *ev.resource != *self.resource {
            return None;
        }
        if let Some(ns) = &self.namespace
            && ev.namespace != *ns
        {
            return None;
        }
        let now = self.selects(&ev.object);
        let before = ev.prev.as_deref().is_some_and(|p| self.selects(p));
        match ev.event_type {
            EventType::Added => now.then_some(EventType::Added),
            EventType::Deleted => (before || now).then_some(EventType::Deleted),
            EventType::Modified => match (before, now) {
                (true, true) => Some(EventType::Modified),
                (false, true) => Some(EventType::Added),
                (true, false) => Some(EventType::Deleted),
                (false, false) => None,
            },
        }
    }
}

/// One frame: `{"type":"MODIFIED","object":{...}}\n`, using the pre-serialised object.
pub fn event_frame(ty: EventType, object_json: &str) -> String {
    let mut s = String::with_capacity(object_json.len() + 32);
    s.push_str("{\"type\":\"");
    s.push_str(ty.as_str());
    s.push_str("\",\"object\":");
    s.push_str(object_json);
    s.push_str("}\n");
    s
}

/// A BOOKMARK frame carrying only the resourceVersion (and, at the end of the initial
/// events of a streaming list, the `k8s.io/initial-events-end` annotation).
pub fn bookmark_frame(r: &ResourceType, rv: u64, initial_events_end: bool) -> String {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": r.kind, "apiVersion": r.api_version(), "metadata": meta});
    format!("{}\n", json!({"type": "BOOKMARK", "object": obj}))
}

/// An ERROR frame with a Status (410 Expired makes clients relist).
pub fn error_frame(err: &ApiError) -> String {
    format!("{}\n", json!({"type": "ERROR", "object": err.to_status()}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;
    use serde_json::Value;
    use std::sync::Arc;

    fn ev(ty: EventType, prev: Option<Value>, obj: Value) -> WatchEvent {
        let pods = lookup("", "v1", "pods").unwrap();
        WatchEvent {
            rv: 1,
            event_type: ty,
            resource: lookup("", "v1", "pods").unwrap(),
            namespace: "default".into(),
            name: "p".into(),
            object: Arc::new(StoredObject::from_value(pods, &obj)),
            prev: prev.map(|p| Arc::new(StoredObject::from_value(pods, &p))),
        }
    }

    fn on(node: &str) -> Value {
        json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"nodeName": node}})
    }

    #[test]
    fn selection_transitions() {
        let f = WatchFilter {
            resource: lookup("", "v1", "pods").unwrap(),
            namespace: None,
            labels: LabelSelector::default(),
            fields: FieldSelector::parse("spec.nodeName=n1", "pods").unwrap(),
        };
        assert_eq!(
            f.classify(&ev(EventType::Modified, Some(on("")), on("n1"))),
            Some(EventType::Added)
        );
        assert_eq!(
            f.classify(&ev(EventType::Modified, Some(on("n1")), on("n2"))),
            Some(EventType::Deleted)
        );
        assert_eq!(
            f.classify(&ev(EventType::Modified, Some(on("n1")), on("n1"))),
            Some(EventType::Modified)
        );
        assert_eq!(
            f.classify(&ev(EventType::Modified, Some(on("n2")), on("n3"))),
            None
        );
        assert_eq!(f.classify(&ev(EventType::Added, None, on("n2"))), None);
        assert_eq!(
            f.classify(&ev(EventType::Deleted, Some(on("n1")), on("n1"))),
            Some(EventType::Deleted)
        );
        let other_ns = WatchFilter {
            namespace: Some("x".into()),
            fields: FieldSelector::default(),
            ..f.clone()
        };
        assert_eq!(
            other_ns.classify(&ev(EventType::Added, None, on("n1"))),
            None
        );
    }

    #[test]
    fn frames_are_json_lines() {
        let line = event_frame(EventType::Added, "{\"a\":1}");
        let v: Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v["type"], "ADDED");
        let b: Value = serde_json::from_str(
            bookmark_frame(lookup("", "v1", "pods").unwrap(), 7, true).trim_end(),
        )
        .unwrap();
        assert_eq!(b["object"]["metadata"]["resourceVersion"], "7");
        let e: Value =
            serde_json::from_str(error_frame(&ApiError::expired("x")).trim_end()).unwrap();
        assert_eq!(e["object"]["code"], 410);
    }
}
