//! The running scheduler: informer-fed state, and the filter and bind operations that the
//! HTTP shell serves. Decisions are made by the pure cores under a short lock; API calls
//! happen outside it. What bind does with a pod, and in which order, is
//! [`crate::bind_plan`]'s decision.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, ResourceQuota};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use tracing::{info, warn};

use crate::bind_plan::{
    AfterFailure, AllocatingConflict, BindPlan, after_allocating_conflict, after_failure,
    allocating_patch, binding, plan_bind,
};
use crate::config::Settings;
use crate::extender::{
    EventNote, ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
    candidate_names,
};
use crate::informer::{self, Informer};
use crate::kube_error;
use crate::metrics::Metrics;
use crate::quota::QuotaWarning;
use crate::quota_gate::filter_within_quota;
use crate::state::{ClusterState, pod_name};
use crate::watch_health::Verdict;
use hami_plugin_core::node_lock_client::{LockWaiters, NodeLockClient, TakeOutcome, unix_now};
use hami_protocol::node_lock::PodRef;

/// The state, locked. A panic while holding the lock cannot leave the state half-updated
/// in a way that matters more than stopping; keep serving.
fn lock(state: &Mutex<ClusterState>) -> MutexGuard<'_, ClusterState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Posts a warning Event (`QuotaValueIgnored`) on each ResourceQuota whose value is
/// ignored, while this replica leads (one replica speaks for the scheduler).
async fn quota_warning_events(
    mut warnings: tokio::sync::mpsc::UnboundedReceiver<QuotaWarning>,
    recorder: Recorder,
    leader: Arc<crate::leader::Leadership>,
) {
    while let Some(w) = warnings.recv().await {
        warn!(quota = %format!("{}/{}", w.namespace, w.quota), key = %w.key, "{w}");
        if !leader.is_leader() {
            continue;
        }
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ResourceQuota".into()),
            namespace: Some(w.namespace.clone()),
            name: Some(w.quota.clone()),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: crate::quota::QUOTA_INVALID_REASON.to_owned(),
            note: Some(w.to_string().chars().take(1000).collect()),
            // The recorder folds Events of one action and reason on one object into a
            // series that keeps the first note: one action per key keeps each key's own.
            action: format!("Ignore {}", w.key),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &reference).await {
            warn!(error = %kube_error::text(&e), "cannot record the QuotaValueIgnored event");
        }
    }
}

/// The scheduler of one replica: its API client, settings, watched state, leadership and metrics;
/// the HTTP shells call into it.
pub struct Scheduler {
    /// The API client (its ServiceAccount's rights).
    pub client: Client,
    /// The resolved settings.
    pub settings: Settings,
    state: Arc<Mutex<ClusterState>>,
    /// The node, pod and ResourceQuota watches' health: filter and `/readyz` refuse while
    /// one is not live (listed, and making progress); without the quotas a namespace's
    /// limits could not be enforced (issue 30).
    pub informers: [Arc<Informer>; 3],
    /// Set by leader election; always true when it is off.
    pub leader: Arc<crate::leader::Leadership>,
    recorder: Recorder,
    /// Filter and bind latencies and refusals.
    pub metrics: Metrics,
    /// The informer tasks, ended with the scheduler (a replica that is stopped stops
    /// watching too).
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The webhook's DRA mode: ResourceSlice shapes, claim templates, their sweeper.
    dra: crate::dra_templates::DraFront,
    /// Binds waiting on a node's lock, woken by the node informer when the lock goes.
    lock_waiters: LockWaiters,
    /// The preempt verb's PodDisruptionBudget watch (`crate::preempt`).
    pub(crate) preempt: crate::preempt::PreemptFront,
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Scheduler {
    /// Starts the supervised informers; the scheduler is ready once both have listed.
    pub fn start(
        client: Client,
        settings: Settings,
        leader: Arc<crate::leader::Leadership>,
    ) -> Arc<Self> {
        // D-4: only pods placed under our schedulerName hold devices.
        let state = ClusterState::for_scheduler(&settings.scheduler_name);
        let reporter = Reporter {
            controller: settings.scheduler_name.clone(),
            instance: None,
        };
        let state = Arc::new(Mutex::new(state));
        let nodes = Informer::new("nodes", settings.watch);
        let pods = Informer::new("pods", settings.watch);
        let quotas = Informer::new("resourcequotas", settings.watch);
        let lock_waiters = LockWaiters::new();
        let recorder = Recorder::new(client.clone(), reporter);
        // Set before the quota informer lists, so the first list's bad values are reported.
        let (warned, warnings) = tokio::sync::mpsc::unbounded_channel();
        lock(&state).quota.set_sink(Box::new(move |w| {
            let _ = warned.send(w);
        }));
        // DRA pods that wait where they would have preempted (none upstream: KEP-5690).
        let (dra_waits, dra_waiting) = tokio::sync::mpsc::unbounded_channel();
        let wakes = informer::Wakes::locks(lock_waiters.clone());
        let pod_wakes = informer::Wakes {
            dra_waits: Some(dra_waits),
            ..wakes.clone()
        };
        let tasks = vec![
            tokio::spawn(quota_warning_events(
                warnings,
                recorder.clone(),
                leader.clone(),
            )),
            tokio::spawn(crate::dra_wait::events(
                dra_waiting,
                recorder.clone(),
                leader.clone(),
            )),
            informer::spawn::<ResourceQuota>(
                client.clone(),
                quotas.clone(),
                state.clone(),
                wakes.clone(),
                leader.terms(),
            ),
            informer::spawn::<Node>(
                client.clone(),
                nodes.clone(),
                state.clone(),
                wakes,
                leader.terms(),
            ),
            informer::spawn::<Pod>(
                client.clone(),
                pods.clone(),
                state.clone(),
                pod_wakes,
                leader.terms(),
            ),
        ];
        let dra = crate::dra_templates::DraFront::new(
            client.clone(),
            leader.clone(),
            settings.template_sweep,
        );
        if settings.webhook.amd_mode == crate::dra_claims::AmdMode::Dra {
            dra.start();
        }
        let preempt = crate::preempt::PreemptFront::started(client.clone());
        Arc::new(Scheduler {
            dra,
            recorder,
            client,
            settings,
            state,
            informers: [nodes, pods, quotas],
            leader,
            metrics: Metrics::new(),
            tasks,
            lock_waiters,
            preempt,
        })
    }

    /// The webhook's DRA side (started with `--amd-mode=dra`, else on first use).
    pub fn dra(&self) -> &crate::dra_templates::DraFront {
        &self.dra
    }

    /// The watched state, locked (a poisoned lock is taken over: see [`lock`]).
    pub fn state(&self) -> MutexGuard<'_, ClusterState> {
        lock(&self.state)
    }

    /// Both informers have listed at least once since they (re)started.
    pub fn synced(&self) -> bool {
        self.informers
            .iter()
            .all(|i| !matches!(i.verdict(), Verdict::NotListed | Verdict::Dead { .. }))
    }

    /// Why the informers' view cannot be trusted now (a watch not listed, failing,
    /// stalled or dead), if it cannot.
    pub fn view_problem(&self) -> Option<String> {
        let problems: Vec<String> = self.informers.iter().filter_map(|i| i.problem()).collect();
        (!problems.is_empty()).then(|| problems.join("; "))
    }

    /// Ready to serve (`/readyz`): both watches live. Leadership is not part of it: a
    /// follower serves the webhook and forwards the extender's calls to the leader, and a
    /// rolling update's new pod must become Ready while the old one still leads.
    pub fn ready(&self) -> bool {
        self.view_problem().is_none()
    }

    /// What a replica that does not lead answers.
    pub fn not_leader(&self) -> String {
        format!(
            "this {} replica is not the leader",
            self.settings.scheduler_name
        )
    }

    fn not_ready_reason(&self) -> Option<String> {
        if !self.leader.is_leader() {
            return Some(format!(
                "{}; kube-scheduler should call the leader (it retries)",
                self.not_leader()
            ));
        }
        self.view_problem().or_else(|| self.catching_up())
    }

    /// Whether Filter and the preempt verb decide now: this replica leads, its watches are
    /// live and have listed since its term began ([`Self::catching_up`]).
    pub fn decides(&self) -> bool {
        self.not_ready_reason().is_none()
    }

    /// Why a replica that just took over does not decide yet: an informer has not listed
    /// since the term began, so its view may miss the last leader's latest writes (a watch
    /// can lag; a list cannot) and a decision could double-book a GPU or a quota (D-23).
    pub fn catching_up(&self) -> Option<String> {
        let term = self.leader.term();
        let behind: Vec<&str> = self
            .informers
            .iter()
            .filter(|i| i.listed_in_term() < term)
            .map(|i| i.kind)
            .collect();
        (!behind.is_empty()).then(|| {
            format!(
                "this replica just became the leader and is listing {} again before it decides (the last leader's latest writes may not have reached its watches); kube-scheduler retries",
                behind.join(", ")
            )
        })
    }

    /// The extender's filter.
    pub async fn filter(self: &Arc<Self>, args: ExtenderArgs) -> ExtenderFilterResult {
        let started = Instant::now();
        let result = self.filter_inner(args).await;
        self.metrics
            .observe_filter(started.elapsed(), result.error.is_empty());
        result
    }

    async fn filter_inner(self: &Arc<Self>, mut args: ExtenderArgs) -> ExtenderFilterResult {
        let Some(pod) = args.pod.take() else {
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
        // The request is ours: its names move into the decision instead of being copied.
        let names = args
            .nodenames
            .take()
            .unwrap_or_else(|| candidate_names(&args));
        let decision = {
            let mut state = self.state();
            // A plugin that stopped refreshing is withdrawn by time alone (`heartbeat`).
            state.expire_heartbeats(Instant::now());
            // Under the same lock: two pods racing for the last of a quota never both pass.
            filter_within_quota(&mut state, &pod, &names, &self.settings.filter, unix_now())
        };
        self.metrics.count_refusals(&decision.refusals);
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
                    error: format!(
                        "cannot record the decision on pod {}: {}",
                        pod_name(&pod),
                        kube_error::text(&e)
                    ),
                    ..Default::default()
                };
            }
            // Leadership lapsed while the patch was in flight (issue 30, the handover
            // window): the write may have landed after another replica took over, and that
            // replica's first decisions may not have seen it. Voided here, so kube-scheduler
            // binds nothing on it and asks the new leader, which decides again (the pod's
            // annotations then count as held there until its decision replaces them: more
            // taken, never less). While still leader, the write landed before any other
            // replica could lead, so the new leader's sync after taking over sees it.
            if !self.leader.is_leader() {
                self.state().release(&patch.uid);
                return ExtenderFilterResult {
                    error: format!(
                        "lost the leadership while recording the decision on pod {}: voided; {}",
                        pod_name(&pod),
                        "kube-scheduler should call the leader (it retries)"
                    ),
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
        // Read fresh: the scheduler keeps no copy of pods (bind needs one lookup).
        let pod = api.get(&args.pod_name).await.map_err(|e| {
            format!(
                "cannot read pod {}/{}: {}",
                args.pod_namespace,
                args.pod_name,
                kube_error::text(&e)
            )
        })?;
        let held_on = pod
            .metadata
            .uid
            .as_deref()
            .and_then(|uid| self.state().holding(uid).map(|h| h.node.clone()));
        let BindPlan {
            owner,
            takes_lock,
            already_bound,
        } = match plan_bind(
            args,
            &pod,
            held_on.as_deref(),
            &self.settings.filter.defaults,
        ) {
            Ok(plan) => plan,
            Err(refusal) => {
                if refusal.event {
                    self.bind_failed(&pod, &refusal.message);
                }
                return Err(refusal.message);
            }
        };
        if already_bound {
            // A repeated bind (its first answer was lost): the bind that bound the pod took
            // the node lock for the device plugin; touching it here would undo that.
            info!(pod = %owner, node = %args.node, "already bound there: a repeated bind, answered as done");
            return Ok(());
        }
        let deadline = Instant::now() + self.settings.bind_lock_wait;
        let locks = NodeLockClient::new(self.client.clone()).waking_on(self.lock_waiters.clone());
        // Whether this bind wrote the lock (not found it already the pod's): only then may
        // its failure remove it.
        let mut wrote_lock = false;
        if takes_lock {
            match locks
                .acquire(&args.node, &owner, self.settings.node_lock_expiry, deadline)
                .await
            {
                Ok(outcome) => wrote_lock = outcome != TakeOutcome::AlreadyHeld,
                Err(e) => {
                    let e = e.to_string();
                    self.bind_failed(&pod, &e);
                    return Err(e);
                }
            }
        }
        let result = async {
            if takes_lock {
                self.mark_allocating(&api, args, &pod).await?;
            }
            api.create_subresource::<_, serde_json::Value>(
                "binding",
                &args.pod_name,
                &PostParams::default(),
                &binding(args, pod.metadata.uid.as_deref()),
            )
            .await
            .map_err(|e| {
                format!(
                    "cannot bind pod {}/{} to {}: {}",
                    args.pod_namespace,
                    args.pod_name,
                    args.node,
                    kube_error::text(&e)
                )
            })?;
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
                // Another bind of this pod may have bound it meanwhile (our write then
                // fails with "already assigned"): read it again before undoing anything.
                let now = api.get_opt(&args.pod_name).await.ok().flatten();
                match after_failure(args, pod.metadata.uid.as_deref(), now.as_ref(), wrote_lock) {
                    AfterFailure::Bound { release } => {
                        if release {
                            self.release_after_bind(&locks, &args.node, &owner).await;
                        }
                        info!(pod = %owner, node = %args.node, error = %e, "bound by another bind of the pod; answered as done");
                        Ok(())
                    }
                    AfterFailure::Failed { release } => {
                        if release {
                            self.release_after_bind(&locks, &args.node, &owner).await;
                        }
                        self.bind_failed(&pod, &e);
                        Err(e)
                    }
                }
            }
        }
    }

    /// Marks `pod` allocating, conditional on it being as read: after a conflict, read again
    /// and marked again while it is unbound (a few times), never once it is bound (another
    /// bind of it got there, and its plugin may have written success).
    async fn mark_allocating(
        &self,
        api: &Api<Pod>,
        args: &ExtenderBindingArgs,
        pod: &Pod,
    ) -> Result<(), String> {
        let failed = |e: &kube::Error| {
            format!(
                "cannot mark pod {}/{} allocating: {}",
                args.pod_namespace,
                args.pod_name,
                kube_error::text(e)
            )
        };
        let uid = pod.metadata.uid.as_deref();
        let mut resource_version = pod.metadata.resource_version.clone();
        let mut conflicts = 0;
        loop {
            let patch = allocating_patch(unix_now(), resource_version.as_deref());
            let e = match api
                .patch(
                    &args.pod_name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            let conflict = matches!(&e, kube::Error::Api(s) if s.code == 409);
            conflicts += 1;
            if !conflict || conflicts > 3 {
                return Err(failed(&e));
            }
            let now = api.get(&args.pod_name).await.map_err(|_| failed(&e))?;
            match after_allocating_conflict(uid, &now) {
                AllocatingConflict::Again {
                    resource_version: rv,
                } => resource_version = rv,
                AllocatingConflict::Settle => return Err(failed(&e)),
            }
        }
    }

    /// Removes the node lock this bind wrote, if the pod still holds it (bounded; a lock
    /// left behind expires).
    async fn release_after_bind(&self, locks: &NodeLockClient, node: &str, owner: &PodRef) {
        let release_by = Instant::now() + std::time::Duration::from_secs(5);
        if let Err(release) = locks.release(node, owner, release_by).await {
            warn!(error = %release, "lock release after a bind failed; it will expire");
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
    pub(crate) fn publish(self: &Arc<Self>, pod: &Pod, note: EventNote) {
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
                warn!(error = %kube_error::text(&e), reason = note.reason, "cannot record event");
            }
        });
    }
}
