//! The node, pod and ResourceQuota informers: a supervised list-then-watch loop per kind
//! that feeds [`ClusterState`] directly and keeps nothing else. Objects are decoded one list page
//! (500) or one event at a time and reduced to what decisions need by the state's own
//! upserts (a pod that holds no device costs the state nothing), instead of being kept in
//! full, `managedFields` included, as a reflector store does.
//!
//! Every step reports to a [`WatchHealth`]: each request and each wait for the next event
//! is bounded by `stall_after`, so a hung connection is noticed, dropped and re-opened;
//! a task that ends (a panic) is restarted by its supervisor after a backoff. What to
//! request next (relist or watch again, from which resourceVersion, after which wait) and
//! when to restart are [`crate::watch_cycle`]'s decisions; this file makes the requests.
//!
//! What an informer sees also wakes whoever waits on it ([`Wakes`]): the node informer tells
//! the binds waiting on a node's lock when it sees the node without one, so they try again at
//! once; the pod informer hands every pod to the DRA-wait notice ([`crate::dra_wait`]).

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::UnboundedSender;
use tracing::{info, warn};

use crate::dra_wait::Waiting;
use crate::quota_book::quota_key;
use crate::state::ClusterState;
use crate::watch_cycle::{Outcome, Restart, Restarts, Step, TaskEnd, WatchCycle};
use crate::watch_health::{Verdict, WatchHealth, WatchReport, WatchTuning, explain};
use hami_plugin_core::node_lock_client::LockWaiters;
use hami_protocol::names::node as node_keys;

/// The health of one informer, shared with the HTTP shell.
#[derive(Debug)]
pub struct Informer {
    /// The resource kind watched (`nodes`, `pods`), for logs and errors.
    pub kind: &'static str,
    tuning: WatchTuning,
    health: Mutex<WatchHealth>,
    /// The leadership term current when its last complete list began (D-23's fence).
    listed_in_term: AtomicU64,
}

impl Informer {
    /// An informer of `kind`, healthy until its watch says otherwise.
    pub fn new(kind: &'static str, tuning: WatchTuning) -> Arc<Self> {
        Arc::new(Informer {
            kind,
            tuning,
            health: Mutex::new(WatchHealth::new(Instant::now())),
            listed_in_term: AtomicU64::new(0),
        })
    }

    fn health(&self) -> MutexGuard<'_, WatchHealth> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn report(&self, report: WatchReport) {
        self.health().report(report, Instant::now());
    }

    /// The watch's health now.
    pub fn verdict(&self) -> Verdict {
        self.health().verdict(&self.tuning, Instant::now())
    }

    /// The leadership term current when its last complete list began: a view that shows
    /// every write made before that term began.
    pub fn listed_in_term(&self) -> u64 {
        self.listed_in_term.load(Ordering::Acquire)
    }

    /// Why this informer's view cannot be trusted now, if it cannot.
    pub fn problem(&self) -> Option<String> {
        explain(self.kind, &self.verdict())
    }
}

/// The kinds an informer feeds into the state.
pub trait Fed:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + 'static
{
    /// Applies an added or changed object to the state.
    fn apply(state: &mut ClusterState, object: &Self);
    /// Removes a deleted object from the state.
    fn delete(state: &mut ClusterState, object: &Self);
    /// Keys of the state's entries of this kind (to drop the ones a relist no longer shows).
    fn known(state: &ClusterState) -> Vec<String>;
    /// The object's state key (node name, pod UID); `None` when it has none yet.
    fn key(object: &Self) -> Option<String>;
    /// Drops the state's entry with this key.
    fn forget(state: &mut ClusterState, key: &str);
    /// After an added or changed object was applied (outside the state's lock): wake whoever
    /// waits on what it shows.
    fn seen(_object: &Self, _wakes: &Wakes) {}
    /// After a deleted object was removed.
    fn gone(_object: &Self, _wakes: &Wakes) {}
}

/// Whom the informers wake with what they see (shell-side hooks, kept out of the state).
#[derive(Clone)]
pub struct Wakes {
    /// Binds waiting on a node's lock.
    pub lock_waiters: LockWaiters,
    /// Where DRA pods that wait where they would have preempted are sent (the leader posts
    /// their Event); `None` where nobody listens.
    pub dra_waits: Option<UnboundedSender<Waiting>>,
}

impl Wakes {
    /// Wakes the binds waiting on `lock_waiters`, and nobody else.
    pub fn locks(lock_waiters: LockWaiters) -> Self {
        Wakes {
            lock_waiters,
            dra_waits: None,
        }
    }
}

impl Fed for Node {
    fn apply(state: &mut ClusterState, node: &Node) {
        state.upsert_node(node);
        // A malformed defrag reservation is ignored; said once per node, key and value.
        for problem in state.reservations.take_problems() {
            warn!("{problem}");
        }
    }
    fn delete(state: &mut ClusterState, node: &Node) {
        if let Some(name) = &node.metadata.name {
            state.remove_node(name);
        }
    }
    fn known(state: &ClusterState) -> Vec<String> {
        state.node_names().cloned().collect()
    }
    fn key(node: &Node) -> Option<String> {
        node.metadata.name.clone()
    }
    fn forget(state: &mut ClusterState, key: &str) {
        state.remove_node(key);
    }
    /// A node without a lock: a bind waiting for its lock may take it now.
    fn seen(node: &Node, wakes: &Wakes) {
        let locked = node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(node_keys::MUTEX_LOCK));
        if let (false, Some(name)) = (locked, &node.metadata.name) {
            wakes.lock_waiters.released(name);
        }
    }
    fn gone(node: &Node, wakes: &Wakes) {
        if let Some(name) = &node.metadata.name {
            wakes.lock_waiters.forget(name);
        }
    }
}

impl Fed for Pod {
    fn apply(state: &mut ClusterState, pod: &Pod) {
        state.upsert_pod(pod);
    }
    fn delete(state: &mut ClusterState, pod: &Pod) {
        if let Some(uid) = &pod.metadata.uid {
            state.remove_pod(uid);
        }
    }
    /// Every UID the state keeps anything of ([`ClusterState::kept_pod_uids`]): a pod
    /// deleted while the watch was down must leave nothing behind (victim facts outlive a
    /// slice a re-filter released; whole cards, nominations, defrag reservation owners and
    /// DRA quota charges are kept for pods that hold no slice).
    fn known(state: &ClusterState) -> Vec<String> {
        state.kept_pod_uids().into_iter().collect()
    }
    fn key(pod: &Pod) -> Option<String> {
        pod.metadata.uid.clone()
    }
    fn forget(state: &mut ClusterState, key: &str) {
        state.remove_pod(key);
    }
    /// A DRA pod that waits where it would have preempted: its notice (the leader posts it).
    fn seen(pod: &Pod, wakes: &Wakes) {
        if let (Some(to), Some(waiting)) = (&wakes.dra_waits, crate::dra_wait::waiting(pod)) {
            let _ = to.send(waiting);
        }
    }
}

/// Namespace quotas (issue 30): kept in the state's quota book, keyed `namespace/name`.
impl Fed for ResourceQuota {
    fn apply(state: &mut ClusterState, quota: &ResourceQuota) {
        state.quota.apply_quota(quota);
    }
    fn delete(state: &mut ClusterState, quota: &ResourceQuota) {
        if let Some(key) = Self::key(quota) {
            state.quota.remove_quota(&key);
        }
    }
    fn known(state: &ClusterState) -> Vec<String> {
        state.quota.quota_keys()
    }
    fn key(quota: &ResourceQuota) -> Option<String> {
        let namespace = quota.metadata.namespace.as_deref().unwrap_or("default");
        Some(quota_key(namespace, quota.metadata.name.as_deref()?))
    }
    fn forget(state: &mut ClusterState, key: &str) {
        state.quota.remove_quota(key);
    }
}

/// Page size of the informers' lists (client-go's and kube-rs's default).
const PAGE: u32 = 500;

/// Runs the informer for `K` forever: a supervisor that restarts the watch loop when its
/// task ends.
pub fn spawn<K: Fed>(
    client: Client,
    informer: Arc<Informer>,
    state: Arc<Mutex<ClusterState>>,
    wakes: Wakes,
    terms: tokio::sync::watch::Receiver<u64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut restarts = Restarts::new();
        loop {
            let task = tokio::spawn(watch_loop::<K>(
                Api::all(client.clone()),
                informer.clone(),
                state.clone(),
                wakes.clone(),
                terms.clone(),
            ));
            let end = match task.await {
                Ok(()) => TaskEnd::Returned,
                Err(e) if e.is_panic() => TaskEnd::Panicked,
                Err(_) => TaskEnd::Cancelled,
            };
            let Restart::After(wait) = restarts.on(end) else {
                return; // cancelled: the scheduler is shutting down
            };
            let why = match end {
                TaskEnd::Panicked => "the watch loop panicked",
                _ => "the watch loop returned",
            };
            warn!(kind = informer.kind, "{why}; restarting it");
            informer.report(WatchReport::TaskExited(why.to_owned()));
            tokio::time::sleep(wait).await;
        }
    })
}

fn lock(state: &Mutex<ClusterState>) -> MutexGuard<'_, ClusterState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// The informer task: a thin driver of [`WatchCycle`], which decides what to request next
/// and how long to wait first.
async fn watch_loop<K: Fed>(
    api: Api<K>,
    informer: Arc<Informer>,
    state: Arc<Mutex<ClusterState>>,
    wakes: Wakes,
    mut terms: tokio::sync::watch::Receiver<u64>,
) {
    let tuning = informer.tuning;
    let mut cycle = WatchCycle::new();
    let mut next = cycle.start();
    loop {
        if !next.after.is_zero() {
            tokio::time::sleep(next.after).await;
        }
        let outcome = match next.step {
            Step::List => {
                let term = *terms.borrow_and_update();
                match list::<K>(&api, &informer, &state, &wakes, tuning.stall_after).await {
                    Ok(resource_version) => {
                        informer.listed_in_term.store(term, Ordering::Release);
                        informer.report(WatchReport::Listed);
                        Outcome::Listed { resource_version }
                    }
                    Err(e) => {
                        informer.report(WatchReport::Error(e));
                        Outcome::ListFailed
                    }
                }
            }
            Step::Watch { from } => {
                let watched = watch_once::<K>(
                    &api, &informer, &state, &wakes, &mut cycle, &from, &mut terms,
                );
                match watched.await {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        warn!(kind = informer.kind, error = %e, "watch failed; retrying");
                        informer.report(WatchReport::Error(e));
                        Outcome::WatchFailed
                    }
                }
            }
        };
        next = cycle.on(outcome);
    }
}

/// Lists every object page by page into the state; returns the list's resourceVersion.
async fn list<K: Fed>(
    api: &Api<K>,
    informer: &Informer,
    state: &Mutex<ClusterState>,
    wakes: &Wakes,
    bound: Duration,
) -> Result<String, String> {
    let mut seen = HashSet::new();
    let mut token: Option<String> = None;
    let rv = loop {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let page = tokio::time::timeout(bound, api.list(&params))
            .await
            .map_err(|_| {
                format!(
                    "listing {} took longer than {}s",
                    informer.kind,
                    bound.as_secs()
                )
            })?
            .map_err(|e| format!("listing {}: {}", informer.kind, crate::kube_error::text(&e)))?;
        {
            let mut s = lock(state);
            for object in &page.items {
                if let Some(key) = K::key(object) {
                    seen.insert(key);
                }
                K::apply(&mut s, object);
            }
        }
        for object in &page.items {
            K::seen(object, wakes);
        }
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break page.metadata.resource_version.unwrap_or_default();
        }
    };
    let mut s = lock(state);
    for key in K::known(&s) {
        if !seen.contains(&key) {
            K::forget(&mut s, &key);
        }
    }
    info!(kind = informer.kind, count = seen.len(), "listed");
    Ok(rv)
}

/// One watch request from `from`, followed until it ends: [`Outcome::WatchClosed`] or
/// [`Outcome::Gone`], or the error that ended it. Each event's resourceVersion goes to
/// `cycle` as the next resume point.
async fn watch_once<K: Fed>(
    api: &Api<K>,
    informer: &Informer,
    state: &Mutex<ClusterState>,
    wakes: &Wakes,
    cycle: &mut WatchCycle,
    from: &str,
    terms: &mut tokio::sync::watch::Receiver<u64>,
) -> Result<Outcome, String> {
    let tuning = &informer.tuning;
    let kind = informer.kind;
    let params =
        WatchParams::default().timeout(tuning.watch_timeout.as_secs().clamp(1, 290) as u32);
    let stream = tokio::time::timeout(tuning.stall_after, api.watch(&params, from))
        .await
        .map_err(|_| {
            format!(
                "the {kind} watch request got no answer within {}s",
                tuning.stall_after.as_secs()
            )
        })?
        .map_err(|e| match e {
            // The resourceVersion is too old for the server's history: list again.
            kube::Error::Api(s) if s.code == 410 => None,
            e => Some(format!("watching {kind}: {}", crate::kube_error::text(&e))),
        });
    let stream = match stream {
        Ok(stream) => stream,
        Err(None) => {
            info!(kind, "watch history expired (410); listing again");
            return Ok(Outcome::Gone);
        }
        Err(Some(e)) => return Err(e),
    };
    informer.report(WatchReport::WatchStarted);
    let stream = stream.into_stream();
    futures::pin_mut!(stream);
    loop {
        // A term begun (this replica took over) ends the watch: list again (D-23). Without a
        // sender (shutting down) there is no term to wait for.
        let new_term = async {
            if terms.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let next = tokio::select! {
            next = tokio::time::timeout(tuning.stall_after, stream.try_next()) => next,
            () = new_term => {
                info!(kind, "this replica began a leadership term; listing again before it decides");
                return Ok(Outcome::NewTerm);
            }
        };
        let next = next
            .map_err(|_| {
                format!(
                    "the {kind} watch delivered nothing for {}s (not even the server's timeout); reconnecting",
                    tuning.stall_after.as_secs()
                )
            })?
            .map_err(|e| format!("the {kind} watch broke: {}", crate::kube_error::text(&e)))?;
        let Some(event) = next else {
            informer.report(WatchReport::StreamEnded);
            return Ok(Outcome::WatchClosed);
        };
        match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                remember(cycle, &o);
                K::apply(&mut lock(state), &o);
                K::seen(&o, wakes);
            }
            WatchEvent::Deleted(o) => {
                remember(cycle, &o);
                K::delete(&mut lock(state), &o);
                K::gone(&o, wakes);
            }
            WatchEvent::Bookmark(b) => cycle.saw_version(&b.metadata.resource_version),
            WatchEvent::Error(e) if e.code == 410 => {
                info!(kind, "watch history expired (410); listing again");
                return Ok(Outcome::Gone);
            }
            WatchEvent::Error(e) => {
                return Err(format!(
                    "the {kind} watch answered {} {}: {}",
                    e.code, e.reason, e.message
                ));
            }
        }
        informer.report(WatchReport::Event);
    }
}

fn remember<K: Resource>(cycle: &mut WatchCycle, object: &K) {
    if let Some(v) = &object.meta().resource_version {
        cycle.saw_version(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_apiserver::{ApiServer, Config};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{DeleteParams, PostParams};

    /// A kind whose apply panics on one object: the watch task dies while it exists.
    impl Fed for ConfigMap {
        fn apply(_: &mut ClusterState, cm: &ConfigMap) {
            assert!(
                cm.metadata.name.as_deref() != Some("boom"),
                "apply panics on boom"
            );
        }
        fn delete(_: &mut ClusterState, _: &ConfigMap) {}
        fn known(_: &ClusterState) -> Vec<String> {
            Vec::new()
        }
        fn key(cm: &ConfigMap) -> Option<String> {
            cm.metadata.uid.clone()
        }
        fn forget(_: &mut ClusterState, _: &str) {}
    }

    /// What a relist does with the keys it did not see (`list`'s last step).
    fn relist_without<K: Fed>(state: &mut ClusterState, seen: &[&str]) {
        for key in K::known(state) {
            if !seen.contains(&key.as_str()) {
                K::forget(state, &key);
            }
        }
    }

    #[test]
    fn a_relist_forgets_every_trace_of_a_pod_deleted_while_the_watch_was_down() {
        let mut state = ClusterState::new();
        state.upsert_node(
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "n", "annotations": {
                "hami.io/node-amd-register": r#"[{"id":"G","count":10,"devmem":1000,"devcore":100,"type":"AMD X","health":true}]"#
            }}}))
            .unwrap(),
        );
        let pod = |uid: &str, extra: serde_json::Value| -> Pod {
            let mut value = serde_json::json!({
                "metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": {
                    "hami.io/vgpu-node": "n", "hami.io/amd-devices-allocated": "G,AMD X,100,10:;"}},
                "spec": {"schedulerName": "hami-scheduler", "nodeName": "n", "containers": [
                    {"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
                "status": {"phase": "Running"}
            });
            for (k, v) in extra.as_object().into_iter().flatten() {
                value[k.as_str()] = v.clone();
            }
            serde_json::from_value(value).unwrap()
        };
        // A slice holder whose slice a re-filter released: its victim facts stay until
        // the pod's next event, which never comes (deleted during the gap).
        state.upsert_pod(&pod("released", serde_json::json!({})));
        state.release("released");
        assert!(state.holding("released").is_none());
        assert!(state.victim_facts().get("released").is_some());
        // A pod nominated after a preemption, not bound: kept though it holds nothing.
        state.upsert_pod(&pod(
            "nominated",
            serde_json::json!({
                "metadata": {"name": "nominated", "namespace": "ns", "uid": "nominated"},
                "spec": {"schedulerName": "hami-scheduler", "containers": [
                    {"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
                "status": {"phase": "Pending", "nominatedNodeName": "n"}}),
        ));
        assert_eq!(state.nominations().len(), 1);
        // A ReplicaSet's pod Filter placed while a defrag reservation is in force (issue
        // 32): who owns it is recorded at once, before the informer shows its holding; its
        // decision was then voided (the patch failed). Only the owner record is left.
        state.upsert_node(
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "m", "annotations": {
                "hami.io/node-amd-register": r#"[{"id":"H","count":10,"devmem":1000,"devcore":100,"type":"AMD X","health":true}]"#,
                "reservation.defrag.hami.io/evicted": r#"{"owner_uid":"rs-uid","owner":"ReplicaSet/rs","cards":[["H",100,10]],"reserved_at":0,"expires_at":4000000000}"#
            }}}))
            .unwrap(),
        );
        assert!(!state.reservations.is_empty());
        let placed: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "placed", "namespace": "ns", "uid": "placed",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "rs", "uid": "rs-uid", "controller": true}]},
            "spec": {"schedulerName": "hami-scheduler", "containers": [
                {"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap();
        state.upsert_pod(&placed);
        state.reservations.note_placed(&placed);
        state.release("placed");
        assert!(state.reservations.owner("placed").is_some());
        // A DRA-mode pod (D-29): charged to its namespace's quota from its annotation,
        // holding no slice.
        state.upsert_pod(&pod(
            "dra",
            serde_json::json!({
                "metadata": {"name": "dra", "namespace": "team", "uid": "dra", "annotations": {
                    "hami.io/dra-quota-charge": "amd.com/gpumem=4096"}},
                "spec": {"containers": [{"name": "c"}]}}),
        ));
        assert!(!state.quota.ledger().used("team").is_zero());
        // A pod that stays.
        state.upsert_pod(&pod("stays", serde_json::json!({})));

        relist_without::<Pod>(&mut state, &["stays"]);
        assert!(state.victim_facts().get("released").is_none());
        assert!(state.nominations().is_empty());
        assert!(state.holding("stays").is_some());
        assert_eq!(state.victim_facts().len(), 1);
        assert!(
            state.reservations.owner("placed").is_none(),
            "a deleted pod's owner record outlived the relist"
        );
        assert!(
            state.quota.ledger().used("team").is_zero(),
            "a deleted DRA pod's quota charge outlived the relist"
        );
        assert_eq!(
            state.kept_pod_uids(),
            HashSet::from(["stays".to_owned()]),
            "the relist left records of pods it did not list"
        );
    }

    async fn until(what: &str, informer: &Informer, f: impl Fn(&Verdict) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v = informer.verdict();
            if f(&v) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: still {v:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_watch_task_is_reported_and_restarted() {
        let api = ApiServer::start(Config::default()).await.unwrap();
        let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
        let informer = Informer::new("configmaps", WatchTuning::default());
        let state = Arc::new(Mutex::new(ClusterState::new()));
        let task = spawn::<ConfigMap>(
            client.clone(),
            informer.clone(),
            state,
            Wakes::locks(LockWaiters::new()),
            tokio::sync::watch::Sender::new(0).subscribe(),
        );
        until("listed", &informer, Verdict::is_live).await;
        let cms: Api<ConfigMap> = Api::namespaced(client, "default");
        let boom: ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "boom"}})).unwrap();
        cms.create(&PostParams::default(), &boom).await.unwrap();
        until(
            "the dead task is seen",
            &informer,
            |v| matches!(v, Verdict::Dead { error } if error.contains("panicked")),
        )
        .await;
        assert!(
            informer
                .problem()
                .unwrap()
                .contains("configmaps watch task ended")
        );
        cms.delete("boom", &DeleteParams::default()).await.unwrap();
        until("restarted and listed again", &informer, Verdict::is_live).await;
        task.abort();
    }
}
