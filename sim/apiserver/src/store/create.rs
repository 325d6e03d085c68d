//! CREATE: type and namespace checks, the prepared object (metadata set, `generateName`
//! resolved) admission sees, and storing it.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::managed_fields;
use crate::meta;
use crate::resources::ResourceType;
use crate::status::ApiError;
use crate::strategy;

use super::{Committed, EventType, Store, check_rv_type, resource_index, set_meta};

impl Store {
    /// Checks apiVersion and kind of a request body against the endpoint; fills them if absent.
    pub(super) fn check_type(r: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
        let Some(m) = obj.as_object_mut() else {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        };
        let want_av = r.api_version();
        match m.get("apiVersion").and_then(Value::as_str) {
            None | Some("") => {
                m.insert("apiVersion".into(), json!(want_av));
            }
            Some(av) if av == want_av => {}
            Some(av) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({want_av})"
                )));
            }
        }
        match m.get("kind").and_then(Value::as_str) {
            None | Some("") => {
                m.insert("kind".into(), json!(r.kind));
            }
            Some(k) if k == r.kind => {}
            Some(k) => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({}) of {}",
                    r.kind,
                    r.group_resource()
                )));
            }
        }
        if let Some(md) = m.get("metadata")
            && !md.is_object()
        {
            return Err(ApiError::bad_request("metadata must be an object"));
        }
        let name = crate::meta::at(obj, "/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        check_rv_type(r, name, obj, 400)
    }

    pub(super) fn check_namespace_field(
        r: &ResourceType,
        ns: Option<&str>,
        obj: &mut Value,
    ) -> Result<(), ApiError> {
        if !r.namespaced {
            if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("namespace");
            }
            return Ok(());
        }
        let ns = ns.unwrap_or("");
        match crate::meta::at(obj, "/metadata/namespace").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != ns => Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            )),
            _ => {
                set_meta(obj, "namespace", json!(ns));
                Ok(())
            }
        }
    }

    /// Defaults, names and validates a new object without storing it (used before admission).
    pub fn prepare_create(
        &self,
        r: &'static ResourceType,
        ns: Option<&str>,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        Self::check_type(r, &mut obj)?;
        crate::quantity::canonicalize_object(r, &mut obj)?;
        if !obj.get("metadata").is_some_and(Value::is_object) {
            obj["metadata"] = json!({});
        }
        Self::check_namespace_field(r, ns, &mut obj)?;
        self.check_namespace(r, ns)?;
        Ok(obj)
    }

    /// Creates an object. Fails with 409 AlreadyExists, 404 for a missing namespace, 422 Invalid.
    pub fn create(
        &mut self,
        r: &'static ResourceType,
        ns: Option<&str>,
        obj: Value,
    ) -> Result<Arc<Value>, ApiError> {
        self.create_committed(r, ns, obj).map(|c| c.value)
    }

    /// [`Store::create`], with the stored form of the object.
    pub fn create_committed(
        &mut self,
        r: &'static ResourceType,
        ns: Option<&str>,
        obj: Value,
    ) -> Result<Committed, ApiError> {
        let mut obj = self.prepare_create(r, ns, obj)?;
        let name = match crate::meta::at(&obj, "/metadata/name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match crate::meta::at(&obj, "/metadata/generateName").and_then(Value::as_str) {
                Some(g) if !g.is_empty() => {
                    let mut n = meta::generate_name(g);
                    // A clash is retried as the real server's client would; a handful of tries suffice.
                    for _ in 0..8 {
                        if !self.objects[resource_index(r)].contains_key(&Self::key(r, ns, &n)) {
                            break;
                        }
                        n = meta::generate_name(g);
                    }
                    set_meta(&mut obj, "name", json!(n));
                    n
                }
                _ => {
                    return Err(ApiError::invalid(
                        r.group,
                        r.kind,
                        "",
                        &[(
                            "metadata.name",
                            "Required value: name or generateName is required".into(),
                        )],
                    ));
                }
            },
        };
        if let Some(e) = meta::name_error(r.plural, &name) {
            return Err(ApiError::invalid(
                r.group,
                r.kind,
                &name,
                &[("metadata.name", format!("Invalid value: {name:?}: {e}"))],
            ));
        }
        let key = Self::key(r, ns, &name);
        if self.objects[resource_index(r)].contains_key(&key) {
            return Err(ApiError::already_exists(r.group, r.plural, &name));
        }
        if r.plural == "secrets" {
            crate::authn::fill_token_secret(&mut obj, ns.unwrap_or_default());
        }
        strategy::prepare_for_create(r, &mut obj);
        let causes = strategy::validate(r, &obj);
        if !causes.is_empty() {
            return Err(ApiError::invalid(r.group, r.kind, &name, &causes));
        }
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.remove("resourceVersion");
            m.remove("managedFields");
            m.insert("uid".into(), json!(meta::new_uid()));
            m.insert("creationTimestamp".into(), json!(meta::now_rfc3339()));
        }
        let mut entries = Vec::new();
        let (manager, av, now) = (
            self.ctx.manager.clone(),
            r.api_version(),
            meta::now_rfc3339(),
        );
        if self.applying {
            let fields = managed_fields::leaf_paths(&obj);
            entries.push(managed_fields::Entry {
                manager,
                operation: "Apply".into(),
                api_version: av,
                time: now,
                subresource: None,
                fields,
            });
        } else {
            managed_fields::record_update(&mut entries, None, &obj, &manager, &av, &now, None);
        }
        managed_fields::write_entries(&mut obj, &entries);
        crate::depth::check(r.group, r.kind, &name, &obj)?;
        Ok(self.commit_full(r, key, obj, None, EventType::Added))
    }
}
