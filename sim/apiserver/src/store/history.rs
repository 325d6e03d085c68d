//! Committing a change: the one global resourceVersion, the bounded history of watch
//! events watches resume from (by count and age), Events' TTL and their core/v1 mirror,
//! reverting a batch that could not be persisted, and replaying the journal (`restore`).

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use crate::resources::{RESOURCES, ResourceType};
use crate::status::ApiError;
use crate::stored::StoredObject;

use super::{Committed, EventType, Key, Store, WatchEvent, obj_rv, resource_index, set_meta};

impl Store {
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

    /// Commits a new state of an object: bumps the resourceVersion, stores it, records the event.
    pub(super) fn commit(
        &mut self,
        r: &'static ResourceType,
        key: Key,
        obj: Value,
        prev: Option<Arc<StoredObject>>,
        ty: EventType,
    ) -> Arc<Value> {
        self.commit_full(r, key, obj, prev, ty).value
    }

    /// [`Store::commit`], with the stored form too.
    pub(super) fn commit_full(
        &mut self,
        r: &'static ResourceType,
        key: Key,
        mut obj: Value,
        prev: Option<Arc<StoredObject>>,
        ty: EventType,
    ) -> Committed {
        if self.ctx.dry_run {
            return Committed {
                value: Arc::new(obj),
                stored: None,
            };
        }
        self.rv += 1;
        set_meta(&mut obj, "resourceVersion", json!(self.rv.to_string()));
        let stored = Arc::new(StoredObject::from_value(r, &obj));
        self.record(r, key, stored.clone(), prev, ty, Some(&obj));
        Committed {
            value: Arc::new(obj),
            stored: Some(stored),
        }
    }

    /// Deletes a stored object as [`Store::commit`] would with its last state, without
    /// parsing it: the DELETED event carries the same text with the deletion's
    /// resourceVersion (expired Events and their mirrors, a namespace's contents).
    pub(super) fn commit_delete(
        &mut self,
        r: &'static ResourceType,
        key: Key,
        prev: Arc<StoredObject>,
    ) {
        if self.ctx.dry_run {
            return;
        }
        self.rv += 1;
        let stored = Arc::new(prev.with_resource_version(r, self.rv));
        self.record(r, key, stored, Some(prev), EventType::Deleted, None);
    }

    /// A committed change's bookkeeping: the object stored (or removed), Events' TTL, the
    /// watch event in the history and for the broadcast, the Event mirror, expired Events.
    /// `value` is the object as a tree, where the caller has it (not for a delete).
    fn record(
        &mut self,
        r: &'static ResourceType,
        key: Key,
        stored: Arc<StoredObject>,
        prev: Option<Arc<StoredObject>>,
        ty: EventType,
        value: Option<&Value>,
    ) {
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
        // In resourceVersion order: the Event before its mirror.
        self.pending.push(ev.clone());
        if r.group == "events.k8s.io" && r.plural == "events" {
            self.mirror_event(ty, &ev.namespace, &ev.name, value);
        }
        if !self.expiring {
            self.expire_events(now);
        }
    }

    /// Deletes the Events past their TTL or beyond the count bound (DELETED events for
    /// watchers and the journal; an `events.k8s.io` Event takes its core mirror along).
    fn expire_events(&mut self, now: Instant) {
        self.expiring = true;
        while let Some((idx, key)) = self.event_expiry.next_expired(now) {
            let r = &RESOURCES[idx];
            if let Some(prev) = self.objects[idx].get(&key).cloned() {
                self.commit_delete(r, key, prev);
            }
        }
        self.expiring = false;
    }

    /// Keeps the core `v1` copy of the `events.k8s.io/v1` Event `ns`/`name` (see
    /// `event_mirror`); `event` is its new state (None for a delete).
    fn mirror_event(&mut self, ty: EventType, ns: &str, name: &str, event: Option<&Value>) {
        let Some(core) = crate::resources::lookup("", "v1", "events") else {
            return;
        };
        let key = Self::key(core, Some(ns), name);
        let prev = self.stored_at(core, &key);
        match (ty, event) {
            (EventType::Deleted, _) | (_, None) => {
                if let Some(prev) = prev {
                    self.commit_delete(core, key, prev);
                }
            }
            (_, Some(event)) => {
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

    /// Inserts an object exactly as given (restore from persistence); no event is produced.
    /// Objects that break the nesting-depth rule are refused, as a write of them would be.
    pub fn restore(&mut self, r: &'static ResourceType, obj: Value) -> Result<(), ApiError> {
        let ns = crate::meta::at(&obj, "/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let name = crate::meta::at(&obj, "/metadata/name")
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
}
