//! The running scheduler: informer-fed state, and the filter and bind operations that the
//! HTTP shell serves. Decisions are made by the pure cores under a short lock; API calls
//! happen outside it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use futures::StreamExt;
use hami_protocol::names::pod as pod_keys;
use hami_protocol::node_lock::{BindPhase, PodRef};
use hami_protocol::requests::pod_requests;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde_json::json;
use tracing::{info, warn};

use crate::config::Settings;
use crate::extender::{
    EventNote, ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
    candidate_names, decide_filter,
};
use crate::lock_client::{self, unix_now};
use crate::metrics::Metrics;
use crate::state::{ClusterState, pod_name};

pub struct Scheduler {
    pub client: Client,
    pub settings: Settings,
    state: Mutex<ClusterState>,
    pods: Store<Pod>,
    nodes_synced: AtomicBool,
    pods_synced: AtomicBool,
    /// Set by leader election; always true when it is off.
    pub leader: Arc<crate::leader::Leadership>,
    recorder: Recorder,
    pub metrics: Metrics,
}

impl Scheduler {
    /// Starts the informers; the scheduler is ready once both have listed.
    pub fn start(
        client: Client,
        settings: Settings,
        leader: Arc<crate::leader::Leadership>,
    ) -> Arc<Self> {
        let (pod_store, pod_writer) = reflector::store();
        let reporter = Reporter {
            controller: settings.scheduler_name.clone(),
            instance: None,
        };
        let scheduler = Arc::new(Scheduler {
            recorder: Recorder::new(client.clone(), reporter),
            client: client.clone(),
            settings,
            state: Mutex::new(ClusterState::new()),
            pods: pod_store,
            nodes_synced: AtomicBool::new(false),
            pods_synced: AtomicBool::new(false),
            leader,
            metrics: Metrics::new(),
        });
        let s = scheduler.clone();
        tokio::spawn(async move {
            let api: Api<Node> = Api::all(s.client.clone());
            let stream = watcher(api, watcher::Config::default()).default_backoff();
            futures::pin_mut!(stream);
            let mut buffer = Vec::new();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Init) => buffer.clear(),
                    Ok(watcher::Event::InitApply(node)) => buffer.push(node),
                    Ok(watcher::Event::InitDone) => {
                        s.state().reset_nodes(buffer.iter());
                        buffer.clear();
                        s.nodes_synced.store(true, Ordering::Release);
                    }
                    Ok(watcher::Event::Apply(node)) => s.state().upsert_node(&node),
                    Ok(watcher::Event::Delete(node)) => {
                        if let Some(name) = &node.metadata.name {
                            s.state().remove_node(name);
                        }
                    }
                    Err(e) => warn!(error = %e, "node watch failed; retrying"),
                }
            }
        });
        let s = scheduler.clone();
        tokio::spawn(async move {
            let api: Api<Pod> = Api::all(s.client.clone());
            let stream = reflector::reflector(
                pod_writer,
                watcher(api, watcher::Config::default()).default_backoff(),
            );
            futures::pin_mut!(stream);
            let mut buffer = Vec::new();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Init) => buffer.clear(),
                    Ok(watcher::Event::InitApply(pod)) => buffer.push(pod),
                    Ok(watcher::Event::InitDone) => {
                        s.state().reset_pods(buffer.iter());
                        buffer.clear();
                        s.pods_synced.store(true, Ordering::Release);
                    }
                    Ok(watcher::Event::Apply(pod)) => s.state().upsert_pod(&pod),
                    Ok(watcher::Event::Delete(pod)) => {
                        if let Some(uid) = &pod.metadata.uid {
                            s.state().remove_pod(uid);
                        }
                    }
                    Err(e) => warn!(error = %e, "pod watch failed; retrying"),
                }
            }
        });
        scheduler
    }

    pub fn state(&self) -> MutexGuard<'_, ClusterState> {
        // A panic while holding the lock cannot leave the state half-updated in a way
        // that matters more than stopping; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn synced(&self) -> bool {
        self.nodes_synced.load(Ordering::Acquire) && self.pods_synced.load(Ordering::Acquire)
    }

    /// Ready to decide: synced and the leader.
    pub fn ready(&self) -> bool {
        self.synced() && self.leader.is_leader()
    }

    fn not_ready_reason(&self) -> Option<String> {
        if !self.leader.is_leader() {
            return Some(format!(
                "this {} replica is not the leader; kube-scheduler should call the leader (it retries)",
                self.settings.scheduler_name
            ));
        }
        if !self.synced() {
            return Some("the scheduler has not finished listing nodes and pods yet; retry".into());
        }
        None
    }

    /// The extender's filter.
    pub async fn filter(self: &Arc<Self>, args: ExtenderArgs) -> ExtenderFilterResult {
        let started = Instant::now();
        let result = self.filter_inner(args).await;
        self.metrics
            .observe_filter(started.elapsed(), result.error.is_empty());
        result
    }

    async fn filter_inner(self: &Arc<Self>, args: ExtenderArgs) -> ExtenderFilterResult {
        let Some(pod) = args.pod.clone() else {
            return ExtenderFilterResult {
                error: "filter request carries no pod".into(),
                ..Default::default()
            };
        };
        if let Some(reason) = self.not_ready_reason() {
            return ExtenderFilterResult {
                error: reason,
                ..Default::default()
            };
        }
        let names = candidate_names(&args);
        let decision = decide_filter(
            &mut self.state(),
            &pod,
            &names,
            &self.settings.filter,
            unix_now(),
        );
        if let Some(patch) = &decision.patch {
            let api: Api<Pod> = Api::namespaced(
                self.client.clone(),
                pod.metadata.namespace.as_deref().unwrap_or("default"),
            );
            let name = pod.metadata.name.clone().unwrap_or_default();
            if let Err(e) = api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch.merge_patch()),
                )
                .await
            {
                self.state().release(&patch.uid);
                return ExtenderFilterResult {
                    error: format!("cannot record the decision on pod {}: {e}", pod_name(&pod)),
                    ..Default::default()
                };
            }
        }
        if let Some(note) = decision.event.clone() {
            self.publish(&pod, note);
        }
        decision.result
    }

    /// The extender's bind.
    pub async fn bind(self: &Arc<Self>, args: ExtenderBindingArgs) -> ExtenderBindingResult {
        let started = Instant::now();
        let result = self.bind_inner(&args).await;
        self.metrics.observe_bind(started.elapsed(), result.is_ok());
        match result {
            Ok(()) => ExtenderBindingResult::default(),
            Err(error) => ExtenderBindingResult { error },
        }
    }

    async fn bind_inner(self: &Arc<Self>, args: &ExtenderBindingArgs) -> Result<(), String> {
        if !self.leader.is_leader() {
            return Err(self.not_ready_reason().unwrap_or_default());
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &args.pod_namespace);
        let pod = match self
            .pods
            .get(&ObjectRef::new(&args.pod_name).within(&args.pod_namespace))
        {
            Some(pod) => (*pod).clone(),
            None => api.get(&args.pod_name).await.map_err(|e| {
                format!(
                    "pod {}/{} not found: {e}",
                    args.pod_namespace, args.pod_name
                )
            })?,
        };
        if !args.pod_uid.is_empty() && pod.metadata.uid.as_deref() != Some(args.pod_uid.as_str()) {
            return Err(format!(
                "pod {}/{} has uid {:?}, not {:?}: it was re-created; kube-scheduler will retry",
                args.pod_namespace, args.pod_name, pod.metadata.uid, args.pod_uid
            ));
        }
        let owner = PodRef::new(&args.pod_namespace, &args.pod_name);
        let deadline = Instant::now() + self.settings.bind_lock_wait;
        // Every pod that asks for GPUs takes the node lock, whatever the informer has seen
        // of the filter's patch so far.
        let placed_by_us = pod_requests(&pod, &self.settings.filter.defaults)
            .is_ok_and(|r| r.iter().any(|c| !c.is_empty()));
        if let Some(uid) = &pod.metadata.uid
            && let Some(holding) = self.state().holding(uid)
            && holding.node != args.node
        {
            let e = format!(
                "filter placed pod {owner} on {} but bind asks for {}; the pod will be filtered again",
                holding.node, args.node
            );
            self.bind_failed(&pod, &e);
            return Err(e);
        }
        if placed_by_us
            && let Err(e) = lock_client::acquire(
                &self.client,
                &args.node,
                &owner,
                self.settings.node_lock_expiry,
                deadline,
            )
            .await
        {
            self.bind_failed(&pod, &e);
            return Err(e);
        }
        let result = async {
            if placed_by_us {
                let now = unix_now();
                let patch = json!({"metadata": {"annotations": {
                    pod_keys::BIND_PHASE: BindPhase::Allocating.as_str(),
                    pod_keys::BIND_TIME: now.to_string(),
                }}});
                api.patch(&args.pod_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| format!("cannot mark pod {}/{} allocating: {e}", args.pod_namespace, args.pod_name))?;
            }
            let binding = json!({
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": args.pod_name, "namespace": args.pod_namespace, "uid": pod.metadata.uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
            });
            api.create_subresource::<_, serde_json::Value>("binding", &args.pod_name, &PostParams::default(), &binding)
                .await
                .map_err(|e| format!("cannot bind pod {}/{} to {}: {e}", args.pod_namespace, args.pod_name, args.node))?;
            Ok::<(), String>(())
        }
        .await;
        match result {
            Ok(()) => {
                info!(pod = %owner, node = %args.node, "bound");
                self.publish(
                    &pod,
                    EventNote {
                        reason: "BindingSucceed",
                        warning: false,
                        message: format!("Successfully binding node [{}] to {owner}", args.node),
                    },
                );
                Ok(())
            }
            Err(e) => {
                if placed_by_us
                    && let Err(release) =
                        lock_client::release(&self.client, &args.node, &owner).await
                {
                    warn!(error = %release, "lock release after a failed bind failed");
                }
                self.bind_failed(&pod, &e);
                Err(e)
            }
        }
    }

    fn bind_failed(self: &Arc<Self>, pod: &Pod, error: &str) {
        self.publish(
            pod,
            EventNote {
                reason: "BindingFailed",
                warning: true,
                message: error.to_owned(),
            },
        );
    }

    /// Records an Event on the pod without holding up the response.
    fn publish(self: &Arc<Self>, pod: &Pod, note: EventNote) {
        let reference: ObjectReference = pod.object_ref(&());
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            let event = Event {
                type_: if note.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: note.reason.to_owned(),
                note: Some(note.message.chars().take(1000).collect()),
                action: note
                    .reason
                    .trim_end_matches("Succeed")
                    .trim_end_matches("Failed")
                    .to_owned(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, &reference).await {
                warn!(error = %e, reason = note.reason, "cannot record event");
            }
        });
    }
}
