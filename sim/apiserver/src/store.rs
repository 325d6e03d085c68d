//! The object store: every served object as JSON, one global resourceVersion, a bounded
//! history of watch events, and the create/get/list/update/patch/delete semantics of the
//! Kubernetes API. Plain synchronous code; the HTTP shell wraps it in a mutex.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::event_ttl::EventExpiry;
use crate::managed_fields;
use crate::meta;
use crate::patch::{self, PatchType};
use crate::resources::{RESOURCES, ResourceType};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::stored::StoredObject;
use crate::strategy;

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
    v.pointer("/metadata/resourceVersion")
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
    match from.pointer(&format!("/metadata/{field}")) {
        Some(v) => set_meta(to, field, v.clone()),
        None => {
            if let Some(m) = to.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove(field);
            }
        }
    }
}

fn finalizers_empty(v: &Value) -> bool {
    v.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
}

/// Encodes a continue token (opaque to clients): list resourceVersion and the last key returned.
fn encode_continue(rv: u64, key: &Key) -> String {
    let raw = format!("{rv}\u{0}{}\u{0}{}", key.0, key.1);
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(token: &str) -> Result<(u64, Key), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Result<Vec<u8>, _> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16))
        .collect();
    let raw = String::from_utf8(bytes.map_err(|_| bad())?).map_err(|_| bad())?;
    let mut parts = raw.split('\u{0}');
    let rv = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let ns = parts.next().ok_or_else(bad)?.to_string();
    let name = parts.next().ok_or_else(bad)?.to_string();
    Ok((rv, (ns, name)))
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

    /// Drains the events produced by writes since the last call (for broadcasting).
    pub fn take_events(&mut self) -> Vec<Arc<WatchEvent>> {
        std::mem::take(&mut self.pending)
    }

    /// Undoes the writes behind `events` (as taken by [`Store::take_events`], newest last):
    /// each object goes back to its state before, and the events leave the watch history.
    /// For a write that could not be journaled, so that it is neither acknowledged nor seen.
    pub fn revert(&mut self, events: &[Arc<WatchEvent>]) {
        for ev in events.iter().rev() {
            let key = (ev.namespace.clone(), ev.name.clone());
            let map = &mut self.objects[resource_index(ev.resource)];
            match &ev.prev {
                Some(prev) => {
                    map.insert(key, prev.clone());
                }
                None => {
                    map.remove(&key);
                }
            }
            if self.history.back().is_some_and(|h| Arc::ptr_eq(h, ev)) {
                self.history.pop_back();
                self.history_times.pop_back();
            }
        }
    }

    /// Forgets the watch history: any watch from an older resourceVersion gets 410 Expired.
    pub fn expire_history(&mut self) {
        self.history.clear();
        self.history_times.clear();
        self.compacted_rv = self.rv;
    }

    /// Inserts an object exactly as given (restore from persistence); no event is produced.
    /// Objects that break the nesting-depth rule are refused, as a write of them would be.
    pub fn restore(&mut self, r: &'static ResourceType, obj: Value) -> Result<(), ApiError> {
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        crate::depth::check(r.group, r.kind, &name, &obj)?;
        if let Ok(rv) = obj_rv(&obj).parse::<u64>() {
            self.rv = self.rv.max(rv);
        }
        if r.plural == "events" {
            // The TTL of a restored Event starts again, as a restarted server's would.
            self.event_expiry.written(
                (resource_index(r), (ns.clone(), name.clone())),
                Instant::now(),
            );
        }
        self.objects[resource_index(r)]
            .insert((ns, name), Arc::new(StoredObject::from_value(r, &obj)));
        self.compacted_rv = self.rv;
        Ok(())
    }

    /// Removes an object without an event (restore from persistence).
    pub fn restore_delete(&mut self, r: &'static ResourceType, ns: &str, name: &str, rv: u64) {
        let key = (ns.to_string(), name.to_string());
        if r.plural == "events" {
            self.event_expiry.deleted(&(resource_index(r), key.clone()));
        }
        self.objects[resource_index(r)].remove(&key);
        self.rv = self.rv.max(rv);
        self.compacted_rv = self.rv;
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

    /// Lists objects of one type, in one namespace or all (`ns = None`), sorted by namespace and name.
    pub fn list(
        &self,
        r: &ResourceType,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<ListPage, ApiError> {
        let map = &self.objects[resource_index(r)];
        let ns = if r.namespaced {
            ns.filter(|n| !n.is_empty())
        } else {
            None
        };
        let start: Option<Key> = match &opts.continue_token {
            Some(t) if !t.is_empty() => Some(decode_continue(t)?.1),
            _ => None,
        };
        let matches = |k: &Key, v: &StoredObject| {
            ns.is_none_or(|n| k.0 == n)
                && opts.labels.matches_stored(v)
                && opts.fields.matches_stored(v)
        };
        let limit = opts.limit.filter(|l| *l > 0);
        let mut items = Vec::new();
        let mut last_key: Option<&Key> = None;
        let mut more = false;
        let lower = match (&start, ns) {
            (Some(s), _) => std::ops::Bound::Excluded(s.clone()),
            (None, Some(n)) => std::ops::Bound::Included((n.to_string(), String::new())),
            (None, None) => std::ops::Bound::Unbounded,
        };
        for (k, v) in map.range((lower, std::ops::Bound::Unbounded)) {
            if let Some(n) = ns
                && k.0.as_str() > n
            {
                break;
            }
            if !matches(k, v) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                more = true;
                break;
            }
            items.push(v.clone());
            last_key = Some(k);
        }
        let continue_token = if more {
            last_key.map(|k| encode_continue(self.rv, k))
        } else {
            None
        };
        Ok(ListPage {
            items,
            resource_version: self.rv,
            continue_token,
            remaining: None,
        })
    }

    /// Commits a new state of an object: bumps the resourceVersion, stores it, records the event.
    fn commit(
        &mut self,
        r: &'static ResourceType,
        key: Key,
        mut obj: Value,
        prev: Option<Arc<StoredObject>>,
        ty: EventType,
    ) -> Arc<Value> {
        if self.ctx.dry_run {
            return Arc::new(obj);
        }
        self.rv += 1;
        set_meta(&mut obj, "resourceVersion", json!(self.rv.to_string()));
        let stored = Arc::new(StoredObject::from_value(r, &obj));
        let idx = resource_index(r);
        let map = &mut self.objects[idx];
        if ty == EventType::Deleted {
            map.remove(&key);
        } else {
            map.insert(key.clone(), stored.clone());
        }
        let now = Instant::now();
        if r.plural == "events" {
            if ty == EventType::Deleted {
                self.event_expiry.deleted(&(idx, key.clone()));
            } else {
                self.event_expiry.written((idx, key.clone()), now);
            }
        }
        let ev = Arc::new(WatchEvent {
            rv: self.rv,
            event_type: ty,
            resource: r,
            namespace: key.0,
            name: key.1,
            object: stored,
            prev,
        });
        let obj = Arc::new(obj);
        self.history.push_back(ev.clone());
        self.history_times.push_back(now);
        while self.history.len() > self.history_limit
            || self
                .history_times
                .front()
                .is_some_and(|t| now.duration_since(*t) > self.history_max_age)
        {
            self.history_times.pop_front();
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
        self.pending.push(ev);
        if r.group == "events.k8s.io" && r.plural == "events" {
            self.mirror_event(ty, &obj);
        }
        if !self.expiring {
            self.expire_events(now);
        }
        obj
    }

    /// Deletes the Events past their TTL or beyond the count bound (DELETED events for
    /// watchers and the journal; an `events.k8s.io` Event takes its core mirror along).
    fn expire_events(&mut self, now: Instant) {
        self.expiring = true;
        while let Some((idx, key)) = self.event_expiry.next_expired(now) {
            let r = &RESOURCES[idx];
            if let Some(prev) = self.objects[idx].get(&key).cloned() {
                self.commit(r, key, prev.to_value(), Some(prev), EventType::Deleted);
            }
        }
        self.expiring = false;
    }

    /// Keeps the core `v1` copy of an `events.k8s.io/v1` Event (see `event_mirror`).
    fn mirror_event(&mut self, ty: EventType, event: &Value) {
        let Some(core) = crate::resources::lookup("", "v1", "events") else {
            return;
        };
        let ns = event.pointer("/metadata/namespace").and_then(Value::as_str);
        let name = event
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let key = Self::key(core, ns, name);
        let prev = self.stored_at(core, &key);
        match ty {
            EventType::Deleted => {
                if let Some(prev) = prev {
                    let last = prev.to_value();
                    self.commit(core, key, last, Some(prev), EventType::Deleted);
                }
            }
            _ => {
                let mirrored = crate::event_mirror::to_core(event);
                let kind = if prev.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                self.commit(core, key, mirrored, prev, kind);
            }
        }
    }

    /// Checks apiVersion and kind of a request body against the endpoint; fills them if absent.
    fn check_type(r: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
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
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        check_rv_type(r, name, obj, 400)
    }

    fn check_namespace_field(
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
        match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
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
        let mut obj = self.prepare_create(r, ns, obj)?;
        let name = match obj.pointer("/metadata/name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match obj
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
            {
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
        Ok(self.commit(r, key, obj, None, EventType::Added))
    }

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
    ) -> Result<Arc<Value>, ApiError> {
        Self::check_type(r, &mut obj)?;
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
            return Ok(current);
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
            return Ok(self.commit(r, key, new, prev, EventType::Deleted));
        }
        let prev = self.stored_at(r, &key);
        Ok(self.commit(r, key, new, prev, EventType::Modified))
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
        out
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
                let out = self.create(r, Some(ns), obj);
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
                return Ok(current);
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
                        self.commit(rt, k, prev.to_value(), Some(prev), EventType::Deleted);
                    }
                }
            }
        }
        let prev = self.stored_at(r, &key);
        Ok(self.commit(r, key, (*current).clone(), prev, EventType::Deleted))
    }

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

    /// History events of type `r` after `from_rv`; 410 Expired if that is older than the history kept.
    pub fn events_since(
        &self,
        r: &ResourceType,
        from_rv: u64,
    ) -> Result<Vec<Arc<WatchEvent>>, ApiError> {
        if from_rv < self.compacted_rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {from_rv} ({})",
                self.compacted_rv + 1
            )));
        }
        let start = self.history.partition_point(|e| e.rv <= from_rv);
        Ok(self
            .history
            .iter()
            .skip(start)
            .filter(|e| *e.resource == *r)
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;
    use proptest::prelude::*;

    fn pods() -> &'static ResourceType {
        lookup("", "v1", "pods").unwrap()
    }
    fn cms() -> &'static ResourceType {
        lookup("", "v1", "configmaps").unwrap()
    }

    fn store() -> Store {
        let mut s = Store::new(100);
        s.ensure_default_namespaces();
        s.take_events();
        s
    }

    fn pod(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    }

    #[test]
    fn create_sets_metadata_and_conflicts() {
        let mut s = store();
        let p = s.create(pods(), Some("default"), pod("a")).unwrap();
        assert_eq!(p["metadata"]["namespace"], "default");
        assert_eq!(p["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert_eq!(p["status"]["phase"], "Pending");
        assert_eq!(
            p["metadata"]["resourceVersion"],
            s.resource_version().to_string()
        );
        assert_eq!(
            s.create(pods(), Some("default"), pod("a"))
                .unwrap_err()
                .code,
            409
        );
        assert_eq!(
            s.create(pods(), Some("nope"), pod("a")).unwrap_err().code,
            404
        );
        assert_eq!(
            s.create(pods(), Some("default"), pod("Bad_Name"))
                .unwrap_err()
                .code,
            422
        );
        let mut wrong = pod("b");
        wrong["kind"] = json!("ConfigMap");
        assert_eq!(
            s.create(pods(), Some("default"), wrong).unwrap_err().code,
            400
        );
        let g = s
            .create(
                cms(),
                Some("default"),
                json!({"metadata": {"generateName": "cm-"}}),
            )
            .unwrap();
        assert!(g["metadata"]["name"].as_str().unwrap().starts_with("cm-"));
        assert_eq!(s.take_events().len(), 2);
    }

    #[test]
    fn update_requires_current_resource_version() {
        let mut s = store();
        let c = s
            .create(
                cms(),
                Some("default"),
                json!({"metadata": {"name": "c"}, "data": {"a": "1"}}),
            )
            .unwrap();
        let mut stale = (*c).clone();
        stale["data"]["a"] = json!("2");
        let u = s
            .update(cms(), "default", "c", stale.clone(), Subresource::Main)
            .unwrap();
        assert_ne!(
            u["metadata"]["resourceVersion"],
            c["metadata"]["resourceVersion"]
        );
        stale["data"]["a"] = json!("3");
        assert_eq!(
            s.update(cms(), "default", "c", stale, Subresource::Main)
                .unwrap_err()
                .reason,
            "Conflict"
        );
        // No-op updates keep the resourceVersion.
        let same = s
            .update(cms(), "default", "c", (*u).clone(), Subresource::Main)
            .unwrap();
        assert_eq!(
            same["metadata"]["resourceVersion"],
            u["metadata"]["resourceVersion"]
        );
    }

    #[test]
    fn status_subresource_separation() {
        let mut s = store();
        let p = s.create(pods(), Some("default"), pod("a")).unwrap();
        let mut m = (*p).clone();
        m["status"]["phase"] = json!("Running");
        m["metadata"]["labels"]["x"] = json!("y");
        let main = s
            .update(pods(), "default", "a", m.clone(), Subresource::Main)
            .unwrap();
        assert_eq!(main["status"]["phase"], "Pending");
        assert_eq!(main["metadata"]["labels"]["x"], "y");
        m["metadata"]["resourceVersion"] = main["metadata"]["resourceVersion"].clone();
        m["metadata"]["labels"]["x"] = json!("z");
        let st = s
            .update(pods(), "default", "a", m, Subresource::Status)
            .unwrap();
        assert_eq!(st["status"]["phase"], "Running");
        assert_eq!(st["metadata"]["labels"]["x"], "y");
    }

    #[test]
    fn patch_precondition_and_apply_create() {
        let mut s = store();
        let c = s
            .create(cms(), Some("default"), json!({"metadata": {"name": "c"}}))
            .unwrap();
        let rv = c["metadata"]["resourceVersion"].clone();
        let ok = s
            .patch(
                cms(),
                "default",
                "c",
                PatchType::Merge,
                &json!({"metadata": {"resourceVersion": rv}, "data": {"k": "v"}}),
                Subresource::Main,
            )
            .unwrap();
        assert_eq!(ok["data"]["k"], "v");
        let err = s
            .patch(
                cms(),
                "default",
                "c",
                PatchType::Merge,
                &json!({"metadata": {"resourceVersion": rv}, "data": {"k": "w"}}),
                Subresource::Main,
            )
            .unwrap_err();
        assert_eq!(err.code, 409);
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "n"}, "data": {"a": "b"}});
        let created = s
            .patch(
                cms(),
                "default",
                "n",
                PatchType::Apply,
                &body,
                Subresource::Main,
            )
            .unwrap();
        assert_eq!(created["data"]["a"], "b");
        assert_eq!(
            s.patch(
                cms(),
                "default",
                "zz",
                PatchType::Merge,
                &json!({}),
                Subresource::Main
            )
            .unwrap_err()
            .code,
            404
        );
    }

    #[test]
    fn finalizers_delay_deletion() {
        let mut s = store();
        s.create(
            cms(),
            Some("default"),
            json!({"metadata": {"name": "c", "finalizers": ["a/b"]}}),
        )
        .unwrap();
        let d = s
            .delete(cms(), "default", "c", &DeleteOptions::default())
            .unwrap();
        assert!(d["metadata"]["deletionTimestamp"].is_string());
        assert!(s.get(cms(), "default", "c").is_ok());
        s.patch(
            cms(),
            "default",
            "c",
            PatchType::Merge,
            &json!({"metadata": {"finalizers": null}}),
            Subresource::Main,
        )
        .unwrap();
        assert_eq!(s.get(cms(), "default", "c").unwrap_err().code, 404);
        let evs = s.take_events();
        assert_eq!(
            evs.iter().map(|e| e.event_type).collect::<Vec<_>>(),
            vec![EventType::Added, EventType::Modified, EventType::Deleted]
        );
    }

    #[test]
    fn dry_run_changes_nothing() {
        let mut s = store();
        let rv = s.resource_version();
        s.ctx.dry_run = true;
        let p = s.create(pods(), Some("default"), pod("a")).unwrap();
        assert_eq!(p["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert_eq!(
            s.create(pods(), Some("default"), pod("Bad"))
                .unwrap_err()
                .code,
            422
        );
        s.ctx.dry_run = false;
        assert!(s.get(pods(), "default", "a").is_err());
        assert_eq!(s.resource_version(), rv);
        assert!(s.take_events().is_empty());
    }

    #[test]
    fn binding_once() {
        let mut s = store();
        s.create(pods(), Some("default"), pod("a")).unwrap();
        let b = json!({"target": {"kind": "Node", "name": "n1"}});
        let p = s.bind("default", "a", &b).unwrap();
        assert_eq!(p["spec"]["nodeName"], "n1");
        assert_eq!(s.bind("default", "a", &b).unwrap_err().code, 409);
    }

    #[test]
    fn history_expiry() {
        let mut s = Store::new(3);
        s.ensure_default_namespaces();
        assert!(s.events_since(cms(), 0).is_err());
        let rv = s.resource_version();
        s.create(cms(), Some("default"), json!({"metadata": {"name": "c"}}))
            .unwrap();
        assert_eq!(s.events_since(cms(), rv).unwrap().len(), 1);
        s.expire_history();
        assert_eq!(s.events_since(cms(), rv).unwrap_err().code, 410);
        assert!(
            s.events_since(cms(), s.resource_version())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn namespace_delete_cascades() {
        let mut s = store();
        let nsr = lookup("", "v1", "namespaces").unwrap();
        s.create(nsr, None, json!({"metadata": {"name": "t"}}))
            .unwrap();
        s.create(cms(), Some("t"), json!({"metadata": {"name": "c"}}))
            .unwrap();
        s.delete(nsr, "", "t", &DeleteOptions::default()).unwrap();
        assert_eq!(
            s.delete(nsr, "", "kube-system", &DeleteOptions::default())
                .unwrap_err()
                .code,
            403
        );
        assert!(s.get(cms(), "t", "c").is_err());
    }

    proptest! {
        // Paging with any limit returns every matching object exactly once, in order.
        #[test]
        fn pagination_is_complete(n in 0usize..40, limit in 1usize..10, labelled in proptest::collection::vec(any::<bool>(), 40)) {
            let mut s = store();
            for (i, l) in labelled.iter().enumerate().take(n) {
                let ns = if i % 2 == 0 { "default" } else { "kube-system" };
                let mut c = json!({"metadata": {"name": format!("c{i:02}")}});
                if *l { c["metadata"]["labels"] = json!({"l": "y"}); }
                s.create(cms(), Some(ns), c).unwrap();
            }
            let opts = ListOptions { labels: LabelSelector::parse("l=y").unwrap(), ..Default::default() };
            let all = s.list(cms(), None, &opts).unwrap().items;
            let mut paged = Vec::new();
            let mut token = None;
            loop {
                let o = ListOptions { limit: Some(limit), continue_token: token.clone(), ..opts.clone() };
                let page = s.list(cms(), None, &o).unwrap();
                prop_assert!(page.items.len() <= limit);
                paged.extend(page.items);
                token = page.continue_token;
                if token.is_none() { break; }
            }
            let json = |v: &[Arc<StoredObject>]| v.iter().map(|o| o.json.to_string()).collect::<Vec<_>>();
            prop_assert_eq!(json(&paged), json(&all));
            prop_assert_eq!(all.len(), (0..n).filter(|i| labelled[*i]).count());
            let one_ns = s.list(cms(), Some("default"), &opts).unwrap().items;
            prop_assert!(one_ns.iter().all(|o| o.namespace() == "default"));
        }
    }
}
