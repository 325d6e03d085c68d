//! The store as a running server shares it: the synchronous [`Store`] (objects, versions,
//! selectors, patches) behind one lock, the journal of a data dir, and the watch fan-out.
//! No HTTP here: the shell (`http/`) parses requests, calls these and renders answers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{broadcast, watch};

use crate::persistence::Persistence;
use crate::service_accounts::ServiceAccounts;
use crate::status::ApiError;
use crate::store::{EventType, ListOptions, Store, WatchEvent, WriteContext};
use crate::stored::StoredObject;
use crate::watch::WatchFilter;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The shared store of a server.
pub struct SharedStore {
    store: Mutex<Store>,
    events: broadcast::Sender<Arc<WatchEvent>>,
    /// Bumped to end every open watch.
    closer: watch::Sender<u64>,
    persistence: Option<Mutex<Persistence>>,
    /// Set once the server stops: watches that start later end at once.
    stopping: AtomicBool,
    /// Why the journal cannot be written (writes are refused from then on).
    journal_broken: Mutex<Option<String>>,
    /// The serviceaccount and root-CA controllers, run after every write that touches
    /// what they keep (`Config::service_accounts`).
    service_accounts: Option<ServiceAccounts>,
}

/// How a watch starts: what to send first, then the live feed from `last_rv` on.
pub struct WatchStart {
    /// Events to send before the live feed (the current objects as ADDED, or the history
    /// replayed from the requested resourceVersion).
    pub initial: Vec<(EventType, Arc<StoredObject>)>,
    /// The resourceVersion the initial list was taken at (for the initial-events-end
    /// bookmark of `sendInitialEvents`).
    pub listed_at: Option<u64>,
    /// The requested resourceVersion is older than the history kept (410 Expired).
    pub expired: Option<ApiError>,
    /// The server is stopping: the watch ends at once.
    pub stopping: bool,
    /// The live feed: every change to the store, filtered by the watch itself.
    pub rx: broadcast::Receiver<Arc<WatchEvent>>,
    /// Changes when [`SharedStore::close_all_watches`] is called: the watch ends then.
    pub closer: watch::Receiver<u64>,
    /// The live feed sends events after this resourceVersion.
    pub last_rv: u64,
}

impl SharedStore {
    /// `watch_buffer`: events buffered per watcher before a slow one is ended with 410.
    pub fn new(store: Store, persistence: Option<Persistence>, watch_buffer: usize) -> Self {
        let (events, _) = broadcast::channel(watch_buffer.max(16));
        let (closer, _) = watch::channel(0u64);
        SharedStore {
            store: Mutex::new(store),
            events,
            closer,
            persistence: persistence.map(Mutex::new),
            stopping: AtomicBool::new(false),
            journal_broken: Mutex::new(None),
            service_accounts: None,
        }
    }

    /// Runs the serviceaccount and root-CA controllers in the writes that need them.
    pub fn with_service_accounts(mut self, controllers: ServiceAccounts) -> Self {
        self.service_accounts = Some(controllers);
        self
    }

    /// Runs the controllers over every namespace now (at start: namespaces restored from
    /// the data dir, and the CA of this run in `kube-root-ca.crt`).
    pub fn run_controllers(&self) -> Result<(), ApiError> {
        self.write(|s| {
            if let Some(c) = &self.service_accounts {
                c.reconcile(s);
            }
            Ok(())
        })
    }

    /// Runs a write against the store, then journals and broadcasts its events, all under
    /// the store lock so that watchers and the journal see writes in resourceVersion order.
    /// A write the journal does not take is undone and answered 500 (never acknowledged,
    /// never seen by a watcher), and every later write 503 until the server restarts.
    pub fn write<T>(
        &self,
        f: impl FnOnce(&mut Store) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let mut store = lock(&self.store);
        if let Some(why) = lock(&self.journal_broken).as_ref() {
            return Err(ApiError::new(
                503,
                "ServiceUnavailable",
                format!(
                    "writes are refused: the data dir cannot be written ({why}); fix it and restart the server"
                ),
            ));
        }
        let out = f(&mut store);
        let mut events = store.take_events();
        if let Some(c) = &self.service_accounts
            && events.iter().any(|e| {
                e.resource.group.is_empty() && ServiceAccounts::concerns(e.resource.plural)
            })
        {
            // In the same write: a namespace is never seen without its account.
            c.reconcile(&mut store);
            events.extend(store.take_events());
        }
        if !events.is_empty() {
            if let Some(p) = &self.persistence
                && let Err(e) = lock(p).append(&events)
            {
                store.revert(&events);
                tracing::error!("journal write failed, write undone: {e}");
                *lock(&self.journal_broken) = Some(e.to_string());
                return Err(ApiError::internal(format!(
                    "the change could not be written to the data dir ({e}), so it was not made; writes are refused until the server restarts"
                )));
            }
            for ev in events {
                // No receivers is fine.
                let _ = self.events.send(ev);
            }
        }
        out
    }

    /// `write` on behalf of a request (field manager, force, dry run).
    pub fn write_ctx<T>(
        &self,
        ctx: &WriteContext,
        f: impl FnOnce(&mut Store) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        self.write(|s| {
            s.ctx = ctx.clone();
            let out = f(s);
            s.ctx = WriteContext::default();
            out
        })
    }

    /// Runs `f` on the store under its lock.
    pub fn read<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        f(&lock(&self.store))
    }

    /// Ends every open watch (clients see the stream end and re-watch).
    pub fn close_all_watches(&self) {
        self.closer.send_modify(|g| *g += 1);
    }

    /// Stops watching for good: open watches end, new ones end at once.
    pub fn stop(&self) {
        // Before the watches close: a watch that starts after this sees it.
        self.stopping.store(true, Ordering::SeqCst);
        self.close_all_watches();
    }

    /// Starts a watch of `filter` from resourceVersion `from` (None: the current objects
    /// first). Subscribes under the store lock, so no write falls between what is replayed
    /// and the live feed.
    pub fn watch(
        &self,
        filter: &WatchFilter,
        from: Option<u64>,
        send_initial_events: bool,
    ) -> Result<WatchStart, ApiError> {
        let closer = self.closer.subscribe();
        let store = lock(&self.store);
        let rx = self.events.subscribe();
        let rv = store.resource_version();
        let mut start = WatchStart {
            initial: Vec::new(),
            listed_at: None,
            expired: None,
            stopping: self.stopping.load(Ordering::SeqCst),
            rx,
            closer,
            last_rv: rv,
        };
        if start.stopping {
            return Ok(start);
        }
        if from.is_none() || send_initial_events {
            let opts = ListOptions {
                labels: filter.labels.clone(),
                fields: filter.fields.clone(),
                ..Default::default()
            };
            let page = store.list(filter.resource, filter.namespace.as_deref(), &opts)?;
            start.initial = page
                .items
                .into_iter()
                .map(|o| (EventType::Added, o))
                .collect();
            start.listed_at = Some(rv);
            return Ok(start);
        }
        let from = from.unwrap_or(rv);
        match store.events_since(filter.resource, from) {
            Ok(evs) => {
                start.initial = evs
                    .iter()
                    .filter_map(|ev| filter.classify(ev).map(|t| (t, ev.object.clone())))
                    .collect();
                start.last_rv = rv.max(from);
            }
            Err(e) => start.expired = Some(e),
        }
        Ok(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;
    use crate::selector::{FieldSelector, LabelSelector};
    use serde_json::json;

    fn filter() -> WatchFilter {
        WatchFilter {
            resource: lookup("", "v1", "configmaps").unwrap(),
            namespace: Some("default".into()),
            labels: LabelSelector::default(),
            fields: FieldSelector::default(),
        }
    }

    fn create(s: &SharedStore, name: &str) -> u64 {
        let cms = lookup("", "v1", "configmaps").unwrap();
        s.write(|st| st.create(cms, Some("default"), json!({"metadata": {"name": name}})))
            .unwrap();
        s.read(|st| st.resource_version())
    }

    #[test]
    fn watch_fan_out_without_http() {
        let mut store = Store::new(3);
        store.ensure_default_namespaces();
        let s = SharedStore::new(store, None, 16);
        let a = create(&s, "a");
        // From now: the current objects, then the live feed in order.
        let mut w = s.watch(&filter(), None, false).unwrap();
        assert_eq!(w.initial.len(), 1);
        assert_eq!(w.last_rv, a);
        create(&s, "b");
        let ev = w.rx.try_recv().unwrap();
        assert_eq!((ev.name.as_str(), ev.event_type), ("b", EventType::Added));
        // From a version in the history: replayed; from before it: 410.
        let r = s.watch(&filter(), Some(a), false).unwrap();
        assert_eq!(r.initial.len(), 1);
        for n in ["c", "d", "e"] {
            create(&s, n);
        }
        assert_eq!(
            s.watch(&filter(), Some(a), false)
                .unwrap()
                .expired
                .unwrap()
                .code,
            410
        );
        // Stopping ends open watches and every later one.
        let open = s.watch(&filter(), None, false).unwrap();
        s.stop();
        assert!(open.closer.has_changed().unwrap());
        assert!(s.watch(&filter(), None, false).unwrap().stopping);
    }

    #[test]
    fn a_write_the_journal_refuses_is_undone_not_acknowledged() {
        let dir = std::env::temp_dir().join(format!("hami-state-{}", crate::meta::new_uid()));
        let mut store = Store::new(100);
        let mut p = Persistence::open(&dir, &mut store).unwrap();
        store.ensure_default_namespaces();
        p.append(&store.take_events()).unwrap();
        let s = SharedStore::new(store, Some(p), 16);
        create(&s, "kept");
        let mut w = s.watch(&filter(), None, false).unwrap();
        let history_before = s.read(|st| st.events_since(filter().resource, 0).map(|e| e.len()));
        lock(s.persistence.as_ref().unwrap()).write_to_dev_full();
        let cms = lookup("", "v1", "configmaps").unwrap();
        let e = s
            .write(|st| st.create(cms, Some("default"), json!({"metadata": {"name": "lost"}})))
            .unwrap_err();
        assert_eq!(e.code, 500, "{e}");
        assert!(e.message.contains("not made"), "{e}");
        assert!(
            s.read(|st| st.get(cms, "default", "lost").is_err()),
            "undone"
        );
        assert!(w.rx.try_recv().is_err(), "no watcher saw it");
        assert_eq!(
            s.read(|st| st.events_since(filter().resource, 0).map(|e| e.len())),
            history_before
        );
        // An update of an existing object is undone too, and later writes are refused.
        let e = s
            .write(|st| {
                st.patch(
                    cms,
                    "default",
                    "kept",
                    crate::patch::PatchType::Merge,
                    &json!({"data": {"k": "v"}}),
                    crate::store::Subresource::Main,
                )
            })
            .unwrap_err();
        assert_eq!(e.code, 503, "{e}");
        assert!(s.read(|st| {
            st.get(cms, "default", "kept")
                .unwrap()
                .get("data")
                .is_none()
        }));
        // What a restart finds agrees with what was answered.
        drop(s);
        let mut again = Store::new(100);
        let _p = Persistence::open(&dir, &mut again).unwrap();
        assert!(again.get(cms, "default", "kept").is_ok());
        assert!(again.get(cms, "default", "lost").is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_store_side_knows_no_http() {
        // The split this file documents: objects, versions, selectors, patches and the
        // fan-out never touch the HTTP stack (that is http/ and connections.rs).
        for (file, text) in [
            ("state.rs", include_str!("state.rs")),
            ("store/mod.rs", include_str!("store/mod.rs")),
            ("store/bind.rs", include_str!("store/bind.rs")),
            ("store/create.rs", include_str!("store/create.rs")),
            ("store/delete.rs", include_str!("store/delete.rs")),
            ("store/history.rs", include_str!("store/history.rs")),
            ("store/list.rs", include_str!("store/list.rs")),
            ("store/update.rs", include_str!("store/update.rs")),
            ("selector.rs", include_str!("selector.rs")),
            ("patch.rs", include_str!("patch.rs")),
            ("strategic_merge.rs", include_str!("strategic_merge.rs")),
            ("managed_fields.rs", include_str!("managed_fields.rs")),
            ("watch.rs", include_str!("watch.rs")),
            ("persistence.rs", include_str!("persistence.rs")),
            ("codec.rs", include_str!("codec.rs")),
        ] {
            let code = text.split("#[cfg(test)]").next().unwrap_or(text);
            for http in ["axum::", "hyper::", "hyper_util::", "http::"] {
                let used = code
                    .lines()
                    .any(|l| !l.trim_start().starts_with("//") && l.contains(http));
                assert!(!used, "{file} uses {http}");
            }
        }
    }
}
