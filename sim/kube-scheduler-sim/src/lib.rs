//! A simulated kube-scheduler for tests and the demo: it watches pending pods that name our
//! scheduler, calls the extender's `/filter` with `nodenames` (nodeCacheCapable) and `/bind`
//! exactly as kube-scheduler's HTTP extender client does, retries unschedulable pods with
//! kube-scheduler's backoff (1 s doubling to 10 s), and records the events kube-scheduler
//! records (`Scheduled`, `FailedScheduling`). Like kube-scheduler, it runs one scheduling
//! cycle (filter) at a time and binds asynchronously.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::Mutex;
use tracing::{debug, warn};

use hami_scheduler::extender::{ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult};
use hami_scheduler::extender_client::ExtenderClient;

const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The simulated kube-scheduler of one scheduler name (see the module doc).
pub struct SimKubeScheduler {
    client: Client,
    scheduler_name: String,
    extender: ExtenderClient,
    recorder: Recorder,
}

#[derive(Default)]
struct Backoff {
    next_try: HashMap<String, (Instant, Duration)>,
}

impl SimKubeScheduler {
    /// Places pods whose `schedulerName` is `scheduler_name` through `extender`, recording events
    /// as `default-scheduler`.
    pub fn new(
        client: Client,
        scheduler_name: impl Into<String>,
        extender: ExtenderClient,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "default-scheduler".into(),
                instance: None,
            },
        );
        Self {
            client,
            scheduler_name: scheduler_name.into(),
            extender,
            recorder,
        }
    }

    fn wants(&self, pod: &Pod) -> bool {
        let spec = pod.spec.as_ref();
        spec.and_then(|s| s.scheduler_name.as_deref()) == Some(self.scheduler_name.as_str())
            && spec
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or("")
                .is_empty()
            && pod.metadata.deletion_timestamp.is_none()
            && matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                None | Some("Pending")
            )
    }

    /// Runs until the task is dropped.
    pub async fn run(self) {
        let this = Arc::new(self);
        let (nodes, node_writer) = reflector::store::<Node>();
        let node_api: Api<Node> = Api::all(this.client.clone());
        tokio::spawn(
            reflector::reflector(
                node_writer,
                watcher(node_api, watcher::Config::default()).default_backoff(),
            )
            .for_each(|_| async {}),
        );
        let (pods, pod_writer) = reflector::store::<Pod>();
        let pod_api: Api<Pod> = Api::all(this.client.clone());
        tokio::spawn(
            reflector::reflector(
                pod_writer,
                watcher(pod_api, watcher::Config::default()).default_backoff(),
            )
            .for_each(|_| async {}),
        );
        let _ = nodes.wait_until_ready().await;
        let _ = pods.wait_until_ready().await;
        let backoff = Arc::new(Mutex::new(Backoff::default()));
        let binding: Arc<Mutex<std::collections::HashSet<String>>> = Arc::default();
        loop {
            let mut queue: Vec<Arc<Pod>> =
                pods.state().into_iter().filter(|p| this.wants(p)).collect();
            // Oldest first, like the scheduling queue's default ordering.
            queue.sort_by_key(|p| {
                (
                    p.metadata.creation_timestamp.clone().map(|t| t.0),
                    p.name_any(),
                )
            });
            let mut worked = false;
            for pod in queue {
                let uid = pod.uid().unwrap_or_default();
                if binding.lock().await.contains(&uid) {
                    continue;
                }
                if let Some((at, _)) = backoff.lock().await.next_try.get(&uid)
                    && Instant::now() < *at
                {
                    continue;
                }
                worked = true;
                this.schedule_one(&pod, &nodes, backoff.clone(), binding.clone())
                    .await;
            }
            if !worked {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    async fn schedule_one(
        self: &Arc<Self>,
        pod: &Arc<Pod>,
        nodes: &Store<Node>,
        backoff: Arc<Mutex<Backoff>>,
        binding: Arc<Mutex<std::collections::HashSet<String>>>,
    ) {
        let uid = pod.uid().unwrap_or_default();
        let names: Vec<String> = nodes
            .state()
            .iter()
            .filter(|n| {
                !n.spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false)
            })
            .map(|n| n.name_any())
            .collect();
        let args = json!({ "pod": pod.as_ref(), "nodenames": names });
        let filtered: Result<ExtenderFilterResult, String> =
            self.extender.call("filter", &args).await;
        let node = match filtered {
            Ok(result) if !result.error.is_empty() => Err(result.error),
            Ok(result) => match result.nodenames.and_then(|n| n.into_iter().next()) {
                Some(node) => Ok(node),
                None => {
                    let reasons: Vec<String> = result
                        .failed_nodes
                        .iter()
                        .map(|(n, r)| format!("{n}: {r}"))
                        .collect();
                    Err(format!(
                        "0/{} nodes are available: {}",
                        names.len(),
                        reasons.join("; ")
                    ))
                }
            },
            Err(e) => Err(e),
        };
        let node = match node {
            Ok(node) => node,
            Err(message) => {
                self.failed(pod, &uid, &message, &backoff).await;
                return;
            }
        };
        binding.lock().await.insert(uid.clone());
        let this = self.clone();
        let pod = pod.clone();
        tokio::spawn(async move {
            let args = ExtenderBindingArgs {
                pod_name: pod.name_any(),
                pod_namespace: pod.namespace().unwrap_or_else(|| "default".into()),
                pod_uid: uid.clone(),
                node: node.clone(),
            };
            let result: Result<ExtenderBindingResult, String> =
                this.extender.call("bind", &args).await;
            let bound = matches!(&result, Ok(r) if r.error.is_empty());
            match result {
                Ok(r) if r.error.is_empty() => {
                    backoff.lock().await.next_try.remove(&uid);
                    this.event(
                        &pod,
                        EventType::Normal,
                        "Scheduled",
                        format!(
                            "Successfully assigned {}/{} to {node}",
                            args.pod_namespace, args.pod_name
                        ),
                    )
                    .await;
                }
                Ok(r) => {
                    this.failed(
                        &pod,
                        &uid,
                        &format!("binding rejected: {}", r.error),
                        &backoff,
                    )
                    .await
                }
                Err(e) => {
                    this.failed(&pod, &uid, &format!("binding rejected: {e}"), &backoff)
                        .await
                }
            }
            // A bound pod stays out of the queue until the informer shows its nodeName
            // (the main loop forgets it then); a failed one waits for its backoff.
            if !bound {
                binding.lock().await.remove(&uid);
            }
        });
    }

    async fn failed(&self, pod: &Pod, uid: &str, message: &str, backoff: &Mutex<Backoff>) {
        debug!(pod = %pod.name_any(), %message, "unschedulable");
        {
            let mut b = backoff.lock().await;
            let delay = b
                .next_try
                .get(uid)
                .map(|(_, d)| (*d * 2).min(MAX_BACKOFF))
                .unwrap_or(INITIAL_BACKOFF);
            b.next_try
                .insert(uid.to_owned(), (Instant::now() + delay, delay));
        }
        self.event(
            pod,
            EventType::Warning,
            "FailedScheduling",
            message.to_owned(),
        )
        .await;
    }

    async fn event(&self, pod: &Pod, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Scheduling".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &pod.object_ref(&())).await {
            warn!(error = %e, "cannot record event");
        }
    }
}
