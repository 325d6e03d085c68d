//! The object store: every served object as JSON, one global resourceVersion, a bounded
//! history of watch events, and the create/get/list/update/patch/delete semantics of the
//! Kubernetes API. Plain synchronous code; the HTTP shell wraps it in a mutex.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::event_ttl::EventExpiry;
use crate::resources::{RESOURCES, ResourceType};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::stored::StoredObject;

mod bind;
mod create;
mod delete;
mod history;
mod list;
#[cfg(test)]
mod tests;
mod update;

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// The object was created.
    Added,
    /// The object was changed.
    Modified,
    /// The object was deleted.
    Deleted,
}

impl EventType {
    /// The watch event `type` string (`ADDED`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change to the store, as kept in the watch history and sent to watchers.
#[derive(Debug)]
pub struct WatchEvent {
    /// The resourceVersion of the change.
    pub rv: u64,
    /// What happened to the object.
    pub event_type: EventType,
    /// The object's resource type.
    pub resource: &'static ResourceType,
    /// The object's namespace, empty for cluster-scoped objects.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The object after the change (for DELETED: its last state, with the deletion's
    /// resourceVersion), serialised once and shared by every watcher.
    pub object: Arc<StoredObject>,
    /// The object before the change (None for ADDED); lets selector watchers see an object
    /// leave or enter their selection.
    pub prev: Option<Arc<StoredObject>>,
}

/// What a write leaves: the object as a tree, and as stored (its JSON text, shared with the
/// watch event) unless nothing was stored (a dry run). The HTTP layer answers with the
/// stored text instead of serialising the tree a second time.
#[derive(Debug, Clone)]
pub struct Committed {
    /// The object after the write.
    pub value: Arc<Value>,
    /// The object as stored; None when the write stored nothing (`dryRun`).
    pub stored: Option<Arc<StoredObject>>,
}

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    /// The object without its `status` (spec, metadata).
    Main,
    /// The `status` subresource.
    Status,
}

/// Options of a list request.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    /// `?labelSelector=`.
    pub labels: LabelSelector,
    /// `?fieldSelector=`.
    pub fields: FieldSelector,
    /// `?limit=`: the most items in one page; None for all.
    pub limit: Option<usize>,
    /// `?continue=`: the token of the previous page.
    pub continue_token: Option<String>,
}

/// A page of a list.
#[derive(Debug, Clone)]
pub struct ListPage {
    /// The objects of this page.
    pub items: Vec<Arc<StoredObject>>,
    /// The resourceVersion the list was taken at.
    pub resource_version: u64,
    /// The token for the next page; None on the last.
    pub continue_token: Option<String>,
    /// `metadata.remainingItemCount`; always None: this server does not count what is left.
    pub remaining: Option<u64>,
}

/// Preconditions and options of a delete.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `preconditions.uid`: the delete fails with 409 unless the object has this uid.
    pub precondition_uid: Option<String>,
    /// `preconditions.resourceVersion`: the delete fails with 409 unless the object is at it.
    pub precondition_rv: Option<String>,
}

impl DeleteOptions {
    /// Reads a `DeleteOptions` body (may be empty).
    pub fn from_body(body: &Value) -> DeleteOptions {
        DeleteOptions {
            precondition_uid: body
                .pointer("/preconditions/uid")
                .and_then(Value::as_str)
                .map(String::from),
            precondition_rv: body
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(String::from),
        }
    }
}

type Key = (String, String);

/// Watch-history entries kept (all types together). Under the soak's churn (~30 writes/s,
/// ~1.8 KiB of JSON each) that is over two minutes of history, ~7 MiB; kube-apiserver's
/// watch cache keeps 100 per type by default and sends older watches to etcd, which keeps
/// up to its 5-minute compaction ([`DEFAULT_HISTORY_AGE`]).
pub const DEFAULT_HISTORY: usize = 4096;

/// Watch-history entries older than this are dropped (a watch from before them gets 410
/// Expired and relists): etcd's default compaction interval under kube-apiserver, after
/// which it answers the same.
pub const DEFAULT_HISTORY_AGE: Duration = Duration::from_secs(300);

pub use crate::event_ttl::{DEFAULT_EVENT_TTL, DEFAULT_MAX_EVENTS};

/// The namespaces a fresh Kubernetes cluster has.
pub const DEFAULT_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Every object, its resourceVersion and the watch history: the state behind the HTTP
/// shell, with no HTTP in it.
pub struct Store {
    rv: u64,
    objects: Vec<BTreeMap<Key, Arc<StoredObject>>>,
    history: VecDeque<Arc<WatchEvent>>,
    history_limit: usize,
    /// When each `history` entry was written (same order and length).
    history_times: VecDeque<Instant>,
    history_max_age: Duration,
    /// Which Events go when (kube-apiserver's event TTL, plus a count bound).
    event_expiry: EventExpiry,
    /// Set while expired Events are being deleted (their deletes are commits too).
    expiring: bool,
    /// Every event with rv > `compacted_rv` is in `history`.
    compacted_rv: u64,
    pending: Vec<Arc<WatchEvent>>,
    /// Who is writing and how; set by the HTTP layer around each write.
    pub ctx: WriteContext,
    /// Internal: skip update bookkeeping of managedFields (apply does its own).
    applying: bool,
    /// Tokens issued by TokenRequests bound to a pod (kept in memory only).
    pub bound_tokens: crate::bound_tokens::BoundTokens,
}

/// See [`Store::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Objects of every type.
    pub objects: usize,
    /// The length of their JSON.
    pub object_bytes: usize,
    /// Of those, Events (core `v1` and `events.k8s.io/v1`).
    pub events: usize,
    /// Watch-history entries.
    pub history: usize,
    /// The JSON they hold (each distinct text once, shared with the live objects included).
    pub history_bytes: usize,
}

/// The request-level options of a write.
#[derive(Debug, Clone)]
pub struct WriteContext {
    /// The field manager (`fieldManager`, or derived from the User-Agent).
    pub manager: String,
    /// `force=true` on an apply patch.
    pub force: bool,
    /// While set, writes are validated and answered but not stored (`dryRun=All`).
    pub dry_run: bool,
}

impl Default for WriteContext {
    fn default() -> Self {
        WriteContext {
            manager: "unknown".into(),
            force: false,
            dry_run: false,
        }
    }
}

fn resource_index(r: &ResourceType) -> usize {
    RESOURCES.iter().position(|x| x == r).unwrap_or(0)
}

fn obj_rv(v: &Value) -> &str {
    crate::meta::at(v, "/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// A `metadata.resourceVersion` that is there but not a string (a number, an object,
/// null) would read as absent and turn a conditional write into an unconditional one; the
/// real server cannot decode it into ObjectMeta and refuses the request. `code` is 400 for
/// a request body, 422 for the result of a patch.
fn check_rv_type(r: &ResourceType, name: &str, obj: &Value, code: u16) -> Result<(), ApiError> {
    let Some(rv) = obj.get("metadata").and_then(|m| m.get("resourceVersion")) else {
        return Ok(());
    };
    if rv.is_string() {
        return Ok(());
    }
    let what = match rv {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::Array(_) => "an array",
        _ => "an object",
    };
    let message = format!(
        "Invalid value: {rv}: metadata.resourceVersion must be a string (as read from the object, e.g. \"17\"), not {what}; leave it out for an unconditional write"
    );
    if code == 422 {
        return Err(ApiError::invalid(
            r.group,
            r.kind,
            name,
            &[("metadata.resourceVersion", message)],
        ));
    }
    Err(ApiError::bad_request(format!(
        "{} {name:?}: metadata.resourceVersion: {message}",
        r.kind
    )))
}

fn set_meta(v: &mut Value, field: &str, value: Value) {
    if !v.get("metadata").is_some_and(Value::is_object) {
        v["metadata"] = json!({});
    }
    v["metadata"][field] = value;
}

fn copy_meta(from: &Value, to: &mut Value, field: &str) {
    match from.get("metadata").and_then(|m| m.get(field)) {
        Some(v) => set_meta(to, field, v.clone()),
        None => {
            if let Some(m) = to.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove(field);
            }
        }
    }
}

fn finalizers_empty(v: &Value) -> bool {
    crate::meta::at(v, "/metadata/finalizers")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
}

impl Default for Store {
    fn default() -> Self {
        Store::new(DEFAULT_HISTORY)
    }
}

impl Store {
    /// An empty store (no namespaces); see [`Store::ensure_default_namespaces`].
    pub fn new(history_limit: usize) -> Store {
        Store {
            rv: 0,
            objects: RESOURCES.iter().map(|_| BTreeMap::new()).collect(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            history_times: VecDeque::new(),
            history_max_age: DEFAULT_HISTORY_AGE,
            event_expiry: EventExpiry::default(),
            expiring: false,
            compacted_rv: 0,
            pending: Vec::new(),
            ctx: WriteContext::default(),
            applying: false,
            bound_tokens: Default::default(),
        }
    }

    /// Events older than `ttl` since their last write are deleted, and the oldest beyond
    /// `max` (defaults: [`DEFAULT_EVENT_TTL`], [`DEFAULT_MAX_EVENTS`]).
    pub fn set_event_bounds(&mut self, ttl: Duration, max: usize) {
        self.event_expiry.ttl = ttl;
        self.event_expiry.max = max;
    }

    /// Watch-history entries older than `age` are dropped (default [`DEFAULT_HISTORY_AGE`]).
    pub fn set_history_max_age(&mut self, age: Duration) {
        self.history_max_age = age;
    }

    /// Creates `default`, `kube-system`, `kube-public` and `kube-node-lease` if missing.
    pub fn ensure_default_namespaces(&mut self) {
        let ns = crate::resources::lookup("", "v1", "namespaces").expect("namespaces are served");
        for name in DEFAULT_NAMESPACES {
            if self.get(ns, "", name).is_err() {
                let _ = self.create(
                    ns,
                    None,
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
                );
            }
        }
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// The oldest resourceVersion a watch may start from.
    pub fn compacted_rv(&self) -> u64 {
        self.compacted_rv
    }

    /// What the store holds right now (objects, Events, watch history), in entries and JSON
    /// bytes: the figures that must stay bounded under churn.
    pub fn stats(&self) -> StoreStats {
        let mut st = StoreStats {
            history: self.history.len(),
            ..StoreStats::default()
        };
        for (r, map) in RESOURCES.iter().zip(&self.objects) {
            st.objects += map.len();
            st.object_bytes += map.values().map(|o| o.json.len()).sum::<usize>();
            if r.plural == "events" {
                st.events += map.len();
            }
        }
        // Texts an entry shares with a stored object or another entry count once.
        let mut seen = std::collections::HashSet::new();
        for ev in &self.history {
            for o in std::iter::once(&ev.object).chain(&ev.prev) {
                if seen.insert(Arc::as_ptr(&o.json) as *const u8) {
                    st.history_bytes += o.json.len();
                }
            }
        }
        st
    }

    /// Number of objects of one type.
    pub fn count(&self, r: &ResourceType) -> usize {
        self.objects[resource_index(r)].len()
    }

    /// Every object of one type (authentication and authorization read Secrets and RBAC).
    pub fn objects_of(&self, r: &ResourceType) -> Vec<Arc<StoredObject>> {
        self.objects[resource_index(r)].values().cloned().collect()
    }

    /// Every object of every type (for persistence snapshots).
    pub fn all_objects(&self) -> Vec<(&'static ResourceType, Arc<StoredObject>)> {
        RESOURCES
            .iter()
            .zip(&self.objects)
            .flat_map(|(r, m)| m.values().map(move |v| (r, v.clone())))
            .collect()
    }

    fn key(r: &ResourceType, ns: Option<&str>, name: &str) -> Key {
        let ns = if r.namespaced {
            ns.unwrap_or("").to_string()
        } else {
            String::new()
        };
        (ns, name.to_string())
    }

    /// 404 unless the namespace exists (the NamespaceLifecycle admission rule for creates).
    pub fn check_namespace(&self, r: &ResourceType, ns: Option<&str>) -> Result<(), ApiError> {
        if !r.namespaced {
            return Ok(());
        }
        let ns = ns.unwrap_or("");
        let nsr = crate::resources::lookup("", "v1", "namespaces").expect("namespaces are served");
        if self.objects[resource_index(nsr)].contains_key(&(String::new(), ns.to_string())) {
            Ok(())
        } else {
            Err(ApiError::not_found("", "namespaces", ns))
        }
    }

    /// An object as a JSON tree.
    pub fn get(&self, r: &ResourceType, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        self.get_stored(r, ns, name).map(|s| Arc::new(s.to_value()))
    }

    /// An object in its stored form (JSON text).
    pub fn get_stored(
        &self,
        r: &ResourceType,
        ns: &str,
        name: &str,
    ) -> Result<Arc<StoredObject>, ApiError> {
        self.objects[resource_index(r)]
            .get(&Self::key(r, Some(ns), name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(r.group, r.plural, name))
    }

    fn stored_at(&self, r: &ResourceType, key: &Key) -> Option<Arc<StoredObject>> {
        self.objects[resource_index(r)].get(key).cloned()
    }
}
