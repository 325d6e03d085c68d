//! The pods bound to this plugin's node, as Allocate and GetPreferredAllocation read them:
//! a node-scoped reflector (watch with `spec.nodeName=<node>`) instead of a LIST per call,
//! the node's lock value read fresh (the lock protocol needs it), and a GET only for a lock
//! owner the cache has not seen (it is locked before it is bound, so the watch shows it
//! last).
//!
//! The plugin's own pod patches are kept beside the cache until the watch delivers them
//! ([`overlay`], pure): the next container's Allocate of the same pod must see its consumed
//! run, and the watch may lag behind the patch's answer. While the watch is not ready (its
//! first list pending, or the API server refusing it) every read is a LIST, as before; and
//! while it has not shown a pod this plugin wrote at all (it lags, or is down after the API
//! server restarted or ended it, its store kept as it last was), the read is a LIST too:
//! that pod's devices would otherwise look free to the next pod (two pods with the same CUs).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use hami_protocol::names::node as node_keys;
use hami_protocol::node_lock::PodRef;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, watcher};

use crate::kube_error::text as api_error_text;
use crate::pod_choice::pod_ref;

/// How long the first read waits for the watch's first list before it LISTs instead.
const FIRST_SYNC: Duration = Duration::from_secs(5);

/// How long a lock owner the watch has not shown is waited for before it is read by
/// itself: kubelet may call as soon as it sees the pod bound, a moment before the watch
/// here delivers the binding; an owner that is not bound yet never shows.
const OWNER_WAIT: Duration = Duration::from_millis(500);

/// The node's pods, watched.
pub struct NodePods {
    client: kube::Client,
    node: String,
    store: Store<Pod>,
    written: Mutex<BTreeMap<PodRef, Pod>>,
    first_wait: tokio::sync::OnceCell<()>,
    /// Woken at every event the watch delivers.
    delivered: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for NodePods {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NodePods {
    /// Starts the watch of `node`'s pods (on the current tokio runtime).
    pub fn start(client: kube::Client, node: &str) -> Arc<Self> {
        let (store, writer) = reflector::store::<Pod>();
        let stream = reflector::reflector(
            writer,
            watcher(
                Api::<Pod>::all(client.clone()),
                watcher::Config::default().fields(&format!("spec.nodeName={node}")),
            )
            .default_backoff(),
        );
        let name = node.to_owned();
        let delivered = Arc::new(tokio::sync::Notify::new());
        let wake = delivered.clone();
        let task = tokio::spawn(async move {
            let mut last: Option<String> = None;
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(_) => {
                        last = None;
                        wake.notify_waiters();
                    }
                    Err(e) => {
                        let text = e.to_string();
                        // Said once per distinct error, not on every backoff retry.
                        if last.as_deref() != Some(text.as_str()) {
                            tracing::warn!(node = %name, error = %text, "the watch of the node's pods failed; Allocate lists them meanwhile");
                        }
                        last = Some(text);
                    }
                }
            }
        });
        Arc::new(Self {
            client,
            node: node.to_owned(),
            store,
            written: Mutex::new(BTreeMap::new()),
            first_wait: tokio::sync::OnceCell::new(),
            delivered,
            task,
        })
    }

    /// The node's lock value, read fresh from the API server.
    pub async fn lock(&self) -> Result<Option<String>, String> {
        let node = &self.node;
        let current = Api::<Node>::all(self.client.clone())
            .get(node)
            .await
            .map_err(|e| format!("cannot read node {node}: {}", api_error_text(&e)))?;
        Ok(current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(node_keys::MUTEX_LOCK))
            .cloned())
    }

    /// The pods bound to the node: the watched ones with this plugin's newer writes, or a
    /// LIST while the watch is not ready.
    pub async fn pods(&self) -> Result<Vec<Pod>, String> {
        if !self.ready().await {
            return self.list().await;
        }
        let cached: Vec<Pod> = self.store.state().iter().map(|p| (**p).clone()).collect();
        {
            let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
            if !unseen_writes(&cached, &written) {
                return Ok(overlay(cached, &mut written));
            }
        }
        // Read fresh: the LIST shows every write of ours (a pod it does not show is gone).
        let listed = self.list().await?;
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        Ok(overlay_listed(listed, &mut written))
    }

    /// The pods bound to the node, LISTed from the API server.
    pub async fn list(&self) -> Result<Vec<Pod>, String> {
        let node = &self.node;
        Ok(Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(|e| format!("cannot list pods of node {node}: {}", api_error_text(&e)))?
            .items)
    }

    /// The lock's owner `pod`, which the pods read last did not show: from the watch if it
    /// delivers it within a moment, else read from the API server (`None`: no such pod).
    pub async fn owner(&self, pod: &PodRef) -> Result<Option<Pod>, String> {
        let deadline = tokio::time::Instant::now() + OWNER_WAIT;
        while self.ready().await {
            let delivered = self.delivered.notified();
            if let Some(p) = self.store.state().iter().find(|p| pod_ref(p) == *pod) {
                return Ok(Some((**p).clone()));
            }
            if tokio::time::timeout_at(deadline, delivered).await.is_err() {
                break;
            }
        }
        self.get(pod).await
    }

    /// One pod read from the API server; `None` when it does not exist.
    pub async fn get(&self, pod: &PodRef) -> Result<Option<Pod>, String> {
        Api::<Pod>::namespaced(self.client.clone(), &pod.namespace)
            .get_opt(&pod.name)
            .await
            .map_err(|e| format!("pod {pod} cannot be read: {}", api_error_text(&e)))
    }

    /// Remembers a pod as this plugin's patch returned it, until the watch shows it.
    pub fn wrote(&self, pod: Pod) {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        written.insert(pod_ref(&pod), pod);
    }

    /// Whether the watch has listed the node's pods (the first call waits a while for it).
    async fn ready(&self) -> bool {
        let wait = self.first_wait.get().is_none();
        let limit = if wait { FIRST_SYNC } else { Duration::ZERO };
        let ready = matches!(
            tokio::time::timeout(limit, self.store.wait_until_ready()).await,
            Ok(Ok(()))
        );
        let _ = self.first_wait.set(());
        ready
    }
}

/// The resource version as a number (the API server's are; when one is not, only equal
/// versions count as caught up).
fn version(pod: &Pod) -> Option<&str> {
    pod.metadata.resource_version.as_deref()
}

/// Whether the watched copy `cached` already holds the write `written` (or a later change).
pub fn caught_up(cached: &Pod, written: &Pod) -> bool {
    match (version(cached), version(written)) {
        (Some(c), Some(w)) => match (c.parse::<u64>(), w.parse::<u64>()) {
            (Ok(c), Ok(w)) => c >= w,
            _ => c == w,
        },
        _ => true,
    }
}

/// Whether the watched pods lack a pod this plugin wrote (pure): the watch has not delivered
/// it at all, or delivered its deletion; only a fresh read tells which.
pub fn unseen_writes(cached: &[Pod], written: &BTreeMap<PodRef, Pod>) -> bool {
    written
        .keys()
        .any(|w| !cached.iter().any(|pod| pod_ref(pod) == *w))
}

/// A fresh LIST with this plugin's writes it does not hold yet in their place (pure). Writes
/// of pods the LIST does not show are forgotten (the pods are gone); the others are kept
/// until the watch shows them, which only the watch can tell (the next read goes on
/// LISTing until it does).
pub fn overlay_listed(listed: Vec<Pod>, written: &mut BTreeMap<PodRef, Pod>) -> Vec<Pod> {
    written.retain(|w, _| listed.iter().any(|pod| pod_ref(pod) == *w));
    listed
        .into_iter()
        .map(|pod| match written.get(&pod_ref(&pod)) {
            Some(mine) if !caught_up(&pod, mine) => mine.clone(),
            _ => pod,
        })
        .collect()
}

/// The watched pods with this plugin's writes the watch has not delivered yet in their
/// place (pure). Writes the watch caught up with, or of pods it no longer shows (deleted,
/// or not seen yet: such a lock owner is read again), are forgotten.
pub fn overlay(cached: Vec<Pod>, written: &mut BTreeMap<PodRef, Pod>) -> Vec<Pod> {
    let mut kept = BTreeMap::new();
    let pods = cached
        .into_iter()
        .map(|pod| match written.remove(&pod_ref(&pod)) {
            Some(mine) if !caught_up(&pod, &mine) => {
                kept.insert(pod_ref(&mine), mine.clone());
                mine
            }
            _ => pod,
        })
        .collect();
    *written = kept;
    pods
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, rv: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv,
                "annotations": {"hami.io/bind-phase": phase}},
        }))
        .unwrap()
    }

    fn phase(p: &Pod) -> &str {
        crate::pod_choice::annotation(p, "hami.io/bind-phase").unwrap()
    }

    #[test]
    fn own_writes_stand_until_the_watch_delivers_them() {
        let mut written = BTreeMap::new();
        written.insert(PodRef::new("ns", "a"), pod("a", "12", "success"));
        written.insert(PodRef::new("ns", "gone"), pod("gone", "9", "success"));
        // The watch still shows a's state before the patch: the write stands in for it.
        let pods = overlay(
            vec![pod("a", "10", "allocating"), pod("b", "11", "x")],
            &mut written,
        );
        assert_eq!(pods.iter().map(phase).collect::<Vec<_>>(), ["success", "x"]);
        // A pod the watch does not show is forgotten; a's write is kept until caught up.
        // (The shell reads such a list only from a LIST, never from a lagging watch.)
        assert_eq!(
            written.keys().cloned().collect::<Vec<_>>(),
            [PodRef::new("ns", "a")]
        );
        let pods = overlay(vec![pod("a", "13", "failed")], &mut written);
        assert_eq!(phase(&pods[0]), "failed");
        assert!(written.is_empty());
        // Versions that are not numbers: caught up only when equal.
        assert!(!caught_up(&pod("a", "x1", ""), &pod("a", "x2", "")));
        assert!(caught_up(&pod("a", "x2", ""), &pod("a", "x2", "")));
    }

    #[test]
    fn a_write_the_watch_has_not_shown_at_all_asks_for_a_fresh_read() {
        let mut written = BTreeMap::new();
        written.insert(PodRef::new("ns", "a"), pod("a", "12", "success"));
        // Shown (even an older copy): the overlay stands in, no fresh read.
        assert!(!unseen_writes(&[pod("a", "10", "allocating")], &written));
        // Not shown: its devices would look free.
        assert!(unseen_writes(&[pod("b", "11", "x")], &written));
        assert!(unseen_writes(&[], &written));
        assert!(!unseen_writes(&[], &BTreeMap::new()));
        // A LIST that shows the write keeps it (the watch has still not shown it: the next
        // read lists again); a pod the LIST does not show is gone and forgotten.
        written.insert(PodRef::new("ns", "gone"), pod("gone", "9", "success"));
        let pods = overlay_listed(vec![pod("a", "12", "success")], &mut written);
        assert_eq!(pods.iter().map(phase).collect::<Vec<_>>(), ["success"]);
        assert_eq!(
            written.keys().cloned().collect::<Vec<_>>(),
            [PodRef::new("ns", "a")]
        );
        assert!(unseen_writes(&[pod("b", "11", "x")], &written));
        // A LIST older than the write (a lagging read): the write stands in.
        let pods = overlay_listed(vec![pod("a", "10", "allocating")], &mut written);
        assert_eq!(phase(&pods[0]), "success");
    }
}
