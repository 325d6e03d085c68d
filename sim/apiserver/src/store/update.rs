//! UPDATE and PATCH: resourceVersion preconditions, the status subresource kept apart,
//! managedFields recorded, apply-patch creates, and storing an admitted update.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::managed_fields;
use crate::meta;
use crate::patch::{self, PatchType};
use crate::resources::ResourceType;
use crate::status::ApiError;
use crate::strategy;

use super::{
    Committed, EventType, Store, Subresource, check_rv_type, copy_meta, finalizers_empty, obj_rv,
    set_meta,
};

/// Whether a `/status` write keeps the metadata it carries, as upstream's pod and node
/// status strategies do (they reset only the spec, and for pods the ownerReferences). Every
/// other status strategy here keeps the stored metadata (custom resources, claims, PDBs).
fn status_write_keeps_metadata(r: &ResourceType) -> bool {
    r.group.is_empty() && matches!(r.plural, "pods" | "nodes")
}

/// podStatusStrategy / nodeStatusStrategy.PrepareForUpdate: the written object is kept (its
/// labels, annotations and finalizers included: anyone allowed to write a pod's status can
/// change them, which is why admission must see these writes), with the stored spec. Pods
/// also keep their stored ownerReferences (old kubelets corrupted them) and, when the write
/// clears it, the stored `status.qosClass`. The generation is never the writer's (upstream's
/// BeforeUpdate); uid, timestamps and resourceVersion are restored by the caller.
fn status_write_with_metadata(r: &ResourceType, current: &Value, mut obj: Value) -> Value {
    match current.get("spec") {
        Some(s) => obj["spec"] = s.clone(),
        None => {
            if let Some(m) = obj.as_object_mut() {
                m.remove("spec");
            }
        }
    }
    copy_meta(current, &mut obj, "generation");
    if r.plural == "pods" {
        copy_meta(current, &mut obj, "ownerReferences");
        let qos = obj.pointer("/status/qosClass").and_then(Value::as_str);
        if qos.is_none_or(str::is_empty)
            && let Some(old) = current.pointer("/status/qosClass")
            && let Some(o) = obj.as_object_mut()
        {
            let st = o.entry("status").or_insert_with(|| json!({}));
            if st.is_null() {
                *st = json!({});
            }
            if let Some(st) = st.as_object_mut() {
                st.insert("qosClass".into(), old.clone());
            }
        }
    }
    obj
}

impl Store {
    /// Replaces an object (PUT). A non-empty `metadata.resourceVersion` must match (409 Conflict).
    pub fn update(
        &mut self,
        r: &'static ResourceType,
        ns: &str,
        name: &str,
        obj: Value,
        sub: Subresource,
    ) -> Result<Arc<Value>, ApiError> {
        let current = self.get(r, ns, name)?;
        self.update_from(r, ns, name, obj, sub, current)
            .map(|c| c.value)
    }

    /// `update` against an already-parsed current state (saves a parse on the patch path).
    fn update_from(
        &mut self,
        r: &'static ResourceType,
        ns: &str,
        name: &str,
        mut obj: Value,
        sub: Subresource,
        current: Arc<Value>,
    ) -> Result<Committed, ApiError> {
        Self::check_type(r, &mut obj)?;
        crate::quantity::canonicalize_object(r, &mut obj)?;
        match obj.pointer("/metadata/name").and_then(Value::as_str) {
            Some(n) if n == name => {}
            Some("") | None => set_meta(&mut obj, "name", json!(name)),
            Some(n) => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
        }
        Self::check_namespace_field(r, Some(ns), &mut obj)?;
        let rv = obj_rv(&obj);
        if !rv.is_empty() && rv != obj_rv(&current) {
            return Err(ApiError::conflict(
                r.group,
                r.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let mut new = match sub {
            Subresource::Status if status_write_keeps_metadata(r) => {
                status_write_with_metadata(r, &current, obj)
            }
            Subresource::Status => {
                let mut n = (*current).clone();
                match obj.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Some(m) = n.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                n
            }
            Subresource::Main => {
                if strategy::has_status_subresource(r) {
                    match current.get("status") {
                        Some(s) => obj["status"] = s.clone(),
                        None => {
                            if let Some(m) = obj.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                obj
            }
        };
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
        ] {
            copy_meta(&current, &mut new, f);
        }
        if r.plural == "namespaces" {
            new["spec"] = current.get("spec").cloned().unwrap_or(Value::Null);
        }
        let causes = strategy::validate_update(r, &current, &new);
        if !causes.is_empty() {
            return Err(ApiError::invalid(r.group, r.kind, name, &causes));
        }
        if new.pointer("/metadata/managedFields").is_none() {
            copy_meta(&current, &mut new, "managedFields");
        }
        if new == *current {
            // A no-op write does not bump the resourceVersion, as in Kubernetes.
            return Ok(self.unchanged(r, ns, name, current));
        }
        if !self.applying {
            let mut entries = managed_fields::read_entries(&new);
            let subres = (sub == Subresource::Status).then_some("status");
            let (manager, now) = (self.ctx.manager.clone(), meta::now_rfc3339());
            managed_fields::record_update(
                &mut entries,
                Some(&current),
                &new,
                &manager,
                &r.api_version(),
                &now,
                subres,
            );
            managed_fields::write_entries(&mut new, &entries);
        }
        crate::depth::check(r.group, r.kind, name, &new)?;
        let key = Self::key(r, Some(ns), name);
        if current.pointer("/metadata/deletionTimestamp").is_some() && finalizers_empty(&new) {
            let prev = self.stored_at(r, &key);
            return Ok(self.commit_full(r, key, new, prev, EventType::Deleted));
        }
        let prev = self.stored_at(r, &key);
        Ok(self.commit_full(r, key, new, prev, EventType::Modified))
    }

    /// What a write that changed nothing answers: the object as it is stored.
    fn unchanged(&self, r: &ResourceType, ns: &str, name: &str, current: Arc<Value>) -> Committed {
        Committed {
            value: current,
            stored: self.get_stored(r, ns, name).ok(),
        }
    }

    /// Stores an UPDATE that mutating admission has seen: `obj` is what [`Store::update`] or
    /// [`Store::patch`] prepared under `dryRun` (its managedFields already recorded, before
    /// admission as upstream's field manager does), as the webhooks left it. `expected_rv` is
    /// the resourceVersion it was prepared against: 409 if the object changed since (the
    /// caller prepares again). Validation and the subresource's field resets run again, on
    /// the admitted object (a webhook's change to the spec of a status write is dropped, as
    /// upstream's status strategy drops it).
    pub fn commit_admitted(
        &mut self,
        r: &'static ResourceType,
        ns: &str,
        name: &str,
        mut obj: Value,
        sub: Subresource,
        expected_rv: &str,
    ) -> Result<Arc<Value>, ApiError> {
        let current = self.get(r, ns, name)?;
        if obj_rv(&current) != expected_rv {
            return Err(ApiError::conflict(
                r.group,
                r.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        set_meta(&mut obj, "resourceVersion", json!(expected_rv));
        // The main resource's prepared managedFields are kept as they are; a status write
        // keeps the stored metadata, so its entry is recorded again here.
        self.applying = sub == Subresource::Main;
        let out = self.update_from(r, ns, name, obj, sub, current);
        self.applying = false;
        out.map(|c| c.value)
    }

    /// Applies a patch (PATCH). A `metadata.resourceVersion` left in the patched object that
    /// differs from the stored one is a precondition failure (409). Apply patches create
    /// missing objects, as server-side apply does.
    pub fn patch(
        &mut self,
        r: &'static ResourceType,
        ns: &str,
        name: &str,
        ty: PatchType,
        body: &Value,
        sub: Subresource,
    ) -> Result<Arc<Value>, ApiError> {
        self.patch_committed(r, ns, name, ty, body, sub)
            .map(|c| c.value)
    }

    /// [`Store::patch`], with the stored form of the object.
    pub fn patch_committed(
        &mut self,
        r: &'static ResourceType,
        ns: &str,
        name: &str,
        ty: PatchType,
        body: &Value,
        sub: Subresource,
    ) -> Result<Committed, ApiError> {
        let current = match self.get(r, ns, name) {
            Ok(c) => c,
            Err(e) if ty == PatchType::Apply && sub == Subresource::Main => {
                let mut obj = body.clone();
                if !obj.is_object() {
                    return Err(ApiError::bad_request("an apply patch must be an object"));
                }
                if obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| n != name)
                {
                    return Err(e);
                }
                set_meta(&mut obj, "name", json!(name));
                self.applying = true;
                let out = self.create_committed(r, Some(ns), obj);
                self.applying = false;
                return out;
            }
            Err(e) => return Err(e),
        };
        if ty == PatchType::Apply {
            // Server-side apply requires the apiVersion and kind in the body.
            let av = body.get("apiVersion").and_then(Value::as_str);
            let kind = body.get("kind").and_then(Value::as_str);
            if av != Some(r.api_version().as_str()) || kind != Some(r.kind) {
                return Err(ApiError::bad_request(format!(
                    "apply patches must name apiVersion {:?} and kind {:?}",
                    r.api_version(),
                    r.kind
                )));
            }
        }
        let patched = if ty == PatchType::Apply {
            if !body.is_object() {
                return Err(ApiError::bad_request("an apply patch must be an object"));
            }
            let mut entries = managed_fields::read_entries(&current);
            let before = entries.clone();
            let (manager, now) = (self.ctx.manager.clone(), meta::now_rfc3339());
            let mut merged = managed_fields::apply(
                &mut entries,
                &current,
                body,
                &manager,
                &r.api_version(),
                &now,
                self.ctx.force,
            )
            .map_err(|c| {
                let mut e = ApiError::conflict(r.group, r.plural, name, "");
                e.message = managed_fields::conflict_message(&c);
                e
            })?;
            let same_fields = entries.len() == before.len()
                && entries.iter().zip(&before).all(|(a, b)| {
                    a.manager == b.manager && a.operation == b.operation && a.fields == b.fields
                });
            let mut without_mf = merged.clone();
            copy_meta(&current, &mut without_mf, "managedFields");
            if same_fields && without_mf == *current {
                // Re-applying the same configuration changes nothing (not even timestamps).
                return Ok(self.unchanged(r, ns, name, current));
            }
            managed_fields::write_entries(&mut merged, &entries);
            merged
        } else {
            patch::apply(ty, &current, body)?
        };
        if !patched.is_object() {
            return Err(ApiError::bad_request(
                "the patched document is not an object",
            ));
        }
        check_rv_type(r, name, &patched, 422)?;
        let rv = obj_rv(&patched);
        if !rv.is_empty() && rv != obj_rv(&current) {
            return Err(ApiError::conflict(
                r.group,
                r.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        if patched
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .is_some_and(|n| n != name)
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object does not match the name on the URL ({name})"
            )));
        }
        let mut patched = patched;
        set_meta(&mut patched, "resourceVersion", json!(obj_rv(&current)));
        self.applying = ty == PatchType::Apply;
        let out = self.update_from(r, ns, name, patched, sub, current);
        self.applying = false;
        out
    }
}
