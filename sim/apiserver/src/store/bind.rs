//! `pods/binding`: a pod is bound to a node once.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::meta;
use crate::status::ApiError;

use super::{EventType, Store};

impl Store {
    /// `pods/binding`: sets `spec.nodeName` once (409 if already bound).
    pub fn bind(&mut self, ns: &str, name: &str, binding: &Value) -> Result<Arc<Value>, ApiError> {
        let pods = crate::resources::lookup("", "v1", "pods").expect("pods are served");
        let current = self.get(pods, ns, name)?;
        let target_kind = binding
            .pointer("/target/kind")
            .and_then(Value::as_str)
            .unwrap_or("Node");
        let node = binding
            .pointer("/target/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        if node.is_empty() || (!target_kind.is_empty() && target_kind != "Node") {
            return Err(ApiError::invalid(
                "",
                "Binding",
                name,
                &[("target", "Invalid value: must name a Node".into())],
            ));
        }
        if current.pointer("/metadata/deletionTimestamp").is_some() {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        if let Some(existing) = current
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                &format!("pod {name} is already assigned to node \"{existing}\""),
            ));
        }
        if let Some(uid) = binding
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            && current.pointer("/metadata/uid").and_then(Value::as_str) != Some(uid)
        {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                "Precondition failed: UID mismatch",
            ));
        }
        let mut new = (*current).clone();
        new["spec"]["nodeName"] = json!(node);
        if let Some(ann) = binding
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
        {
            for (k, v) in ann {
                if !new["metadata"]
                    .get("annotations")
                    .is_some_and(Value::is_object)
                {
                    new["metadata"]["annotations"] = json!({});
                }
                new["metadata"]["annotations"][k] = v.clone();
            }
        }
        if !new.get("status").is_some_and(Value::is_object) {
            new["status"] = json!({});
        }
        let cond = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": meta::now_rfc3339()});
        match new["status"]
            .get_mut("conditions")
            .and_then(Value::as_array_mut)
        {
            Some(cs) => {
                cs.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
                cs.push(cond);
            }
            None => new["status"]["conditions"] = json!([cond]),
        }
        let key = Self::key(pods, Some(ns), name);
        let prev = self.stored_at(pods, &key);
        Ok(self.commit(pods, key, new, prev, EventType::Modified))
    }
}
