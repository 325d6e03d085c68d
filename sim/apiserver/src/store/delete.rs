//! DELETE: preconditions, finalizers (deletionTimestamp set, the object kept until they
//! are gone), and a namespace's objects deleted with it.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::meta;
use crate::resources::{RESOURCES, ResourceType};
use crate::status::ApiError;

use super::{
    DeleteOptions, EventType, Key, Store, finalizers_empty, obj_rv, resource_index, set_meta,
};

impl Store {
    /// Deletes an object. With finalizers it only gets a `deletionTimestamp` (MODIFIED) and
    /// goes away when the last finalizer is removed. Namespaces take their contents with them.
    pub fn delete(
        &mut self,
        r: &'static ResourceType,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Arc<Value>, ApiError> {
        let current = self.get(r, ns, name)?;
        if r.plural == "namespaces" && ["default", "kube-system", "kube-public"].contains(&name) {
            return Err(ApiError::forbidden(format!(
                "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
            )));
        }
        if let Some(uid) = &opts.precondition_uid {
            let have = current
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or("");
            if have != uid {
                return Err(ApiError::conflict(
                    r.group,
                    r.plural,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                    ),
                ));
            }
        }
        if let Some(rv) = &opts.precondition_rv {
            let have = obj_rv(&current);
            if have != rv {
                return Err(ApiError::conflict(
                    r.group,
                    r.plural,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have}"
                    ),
                ));
            }
        }
        let key = Self::key(r, Some(ns), name);
        if !finalizers_empty(&current) {
            if current.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(current);
            }
            let mut new = (*current).clone();
            set_meta(&mut new, "deletionTimestamp", json!(meta::now_rfc3339()));
            set_meta(&mut new, "deletionGracePeriodSeconds", json!(0));
            let prev = self.stored_at(r, &key);
            return Ok(self.commit(r, key, new, prev, EventType::Modified));
        }
        if r.plural == "namespaces" {
            // No namespace controller runs here: the namespace's objects go at once.
            for rt in RESOURCES.iter().filter(|x| x.namespaced) {
                let keys: Vec<Key> = self.objects[resource_index(rt)]
                    .keys()
                    .filter(|k| k.0 == name)
                    .cloned()
                    .collect();
                for k in keys {
                    if let Some(prev) = self.objects[resource_index(rt)].get(&k).cloned() {
                        self.commit_delete(rt, k, prev);
                    }
                }
            }
        }
        let prev = self.stored_at(r, &key);
        Ok(self.commit(r, key, (*current).clone(), prev, EventType::Deleted))
    }
}
