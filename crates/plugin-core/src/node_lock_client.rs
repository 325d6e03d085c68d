//! The one node-lock client (SPEC §2.4, D-2) of the scheduler's bind and the plugins'
//! release: every read and write bounded by the caller's deadline, conflicts and transient
//! API errors retried with jittered exponential backoff, refusals that retrying cannot fix
//! (403, 404, 422 …) returned at once. Writes are merge patches carrying
//! `metadata.resourceVersion`, so a lock changed since it was read is never overwritten.
//! The decisions are the pure core `hami_node_lock`'s: what a pod may do with a lock value
//! (`decide`), the steps of one attempt (`lock_attempt`), what to do after a failed one
//! (`lock_retry`: wait, or which error to give up with) and when to try again
//! ([`Backoff`]); this file makes the API calls and sleeps. A wait for a busy lock also ends when the
//! caller's [`LockWaiters`] hear that the node's lock went (the scheduler's node informer
//! tells them), so a bind does not sleep out its backoff next to a free lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hami_node_lock::lock_attempt::{FirstStep, Step, after_owner_check, first_step};
use hami_node_lock::lock_retry::{ACQUIRING, Attempt, LockRetry, Next, RELEASING};
use hami_node_lock::{NodeLock, PodRef};
use hami_protocol::names::node as node_keys;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

// The pure core's types, under the paths the shells and tests have used.
pub use hami_node_lock::{Backoff, LockError, Released, RetryPolicy, TakeOutcome};

/// Unix seconds now (the node lock's timestamps are wall-clock seconds).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A jitter in [0, 1) without a random-number dependency: the sub-second clock mixed with
/// a per-call counter (spreading retries needs no cryptographic quality).
fn jitter() -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let mut x = nanos
        ^ COUNTER
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .rotate_left(17);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// An API error as one line: code, reason and message. kube-rs formats `Error::Api` with
/// a debug dump of the status (`ApiError: … (Status { … })`), which must not reach
/// kubelet, kube-scheduler or Events.
pub fn api_error_text(e: &kube::Error) -> String {
    classify(e).0
}

/// [`api_error_text`], plus whether trying again can help.
fn classify(e: &kube::Error) -> (String, bool) {
    match e {
        kube::Error::Api(s) => {
            let retry = matches!(s.code, 409 | 429 | 500 | 502 | 503 | 504) || s.code == 0;
            (
                format!(
                    "the API server answered {} {}: {}",
                    s.code, s.reason, s.message
                ),
                retry,
            )
        }
        // Connection and protocol errors: transient as far as we can tell.
        other => (other.to_string(), true),
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// One API call bounded by what is left of the deadline.
async fn bounded<T>(
    backoff: &Backoff,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<Result<T, kube::Error>, ()> {
    let left = backoff.remaining(Instant::now());
    if left.is_zero() {
        return Err(());
    }
    tokio::time::timeout(left, call).await.map_err(|_| ())
}

/// Per-node wake-ups for acquires waiting on a busy lock: whoever watches the Nodes calls
/// [`LockWaiters::released`] when it sees a node without a lock, and one acquire waiting on
/// that node tries again at once instead of sleeping out its backoff (a lock goes to one
/// pod, so one waiter is woken per release, oldest first; the others keep their backoff,
/// which stays the fallback for a release nobody saw).
#[derive(Clone, Debug, Default)]
pub struct LockWaiters {
    nodes: Arc<Mutex<HashMap<String, Arc<tokio::sync::Notify>>>>,
}

impl LockWaiters {
    /// No node has waiters yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Notify>>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The wake-up of `node`'s waiters (made on first use).
    fn of(&self, node: &str) -> Arc<tokio::sync::Notify> {
        self.nodes().entry(node.to_owned()).or_default().clone()
    }

    /// `node` was seen without a lock: wake one acquire waiting on it. Costs a map lookup
    /// for a node nobody ever waited on; a wake-up nobody takes is kept for the next
    /// waiter of the node (one early retry at most).
    pub fn released(&self, node: &str) {
        if let Some(notify) = self.nodes().get(node) {
            notify.notify_one();
        }
    }

    /// `node` is gone: drop its entry (an acquire waiting on it keeps its backoff).
    pub fn forget(&self, node: &str) {
        self.nodes().remove(node);
    }
}

/// The node-lock client.
#[derive(Clone)]
pub struct NodeLockClient {
    client: kube::Client,
    policy: RetryPolicy,
    waiters: Option<LockWaiters>,
}

impl NodeLockClient {
    /// A client with the default [`RetryPolicy`].
    pub fn new(client: kube::Client) -> Self {
        Self::with_policy(client, RetryPolicy::default())
    }

    /// A client that backs off as `policy` says.
    pub fn with_policy(client: kube::Client, policy: RetryPolicy) -> Self {
        NodeLockClient {
            client,
            policy,
            waiters: None,
        }
    }

    /// A client whose waits for a busy lock also end when `waiters` hear the node's lock
    /// went ([`LockWaiters::released`]).
    pub fn waking_on(mut self, waiters: LockWaiters) -> Self {
        self.waiters = Some(waiters);
        self
    }

    /// Takes the lock of `node` for `pod`, waiting for a busy lock (D-2) and retrying
    /// conflicts and transient errors until `deadline`. Locks that are expired, stamped
    /// implausibly far in the future, unreadable, or whose owner pod is gone (asked of the
    /// API server, never a cache: a stale answer would double-book a GPU) are taken over.
    pub async fn acquire(
        &self,
        node: &str,
        pod: &PodRef,
        expiry: Duration,
        deadline: Instant,
    ) -> Result<TakeOutcome, LockError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let expiry_seconds = expiry.as_secs() as i64;
        let mut retry = LockRetry::acquiring(self.policy, deadline, node, expiry_seconds);
        let wake = self.waiters.as_ref().map(|w| w.of(node));
        loop {
            // Registered before the node is read, so a release seen during the attempt
            // still ends the wait after it.
            let mut woken = wake.as_ref().map(|n| Box::pin(n.notified()));
            if let Some(w) = woken.as_mut() {
                w.as_mut().enable();
            }
            let failed = match self
                .try_acquire(&nodes, node, pod, expiry_seconds, retry.backoff())
                .await
            {
                Ok(outcome) => return Ok(outcome),
                Err(failed) => failed,
            };
            match retry.after(failed, Instant::now(), jitter()) {
                Next::Wait(wait) => match woken {
                    Some(woken) => {
                        tokio::select! {
                            () = tokio::time::sleep(wait) => {}
                            () = woken => {}
                        }
                    }
                    None => tokio::time::sleep(wait).await,
                },
                Next::GiveUp(e) => return Err(e),
            }
        }
    }

    async fn try_acquire(
        &self,
        nodes: &Api<Node>,
        node: &str,
        pod: &PodRef,
        expiry_seconds: i64,
        backoff: &Backoff,
    ) -> Result<TakeOutcome, Attempt> {
        let what = ACQUIRING;
        let fail = |error: String| {
            Attempt::Fail(LockError::Refused {
                node: node.to_owned(),
                what,
                error,
            })
        };
        let current = match bounded(backoff, nodes.get(node)).await {
            Err(()) => return Err(Attempt::Retry("reading the node timed out".into())),
            Ok(Err(e)) => {
                let (text, retry) = classify(&e);
                return Err(if retry {
                    Attempt::Retry(text)
                } else {
                    fail(format!("cannot read the node: {text}"))
                });
            }
            Ok(Ok(n)) => n,
        };
        let value = current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(node_keys::MUTEX_LOCK))
            .cloned();
        let now = unix_now();
        let step = match first_step(value.as_deref(), pod, now, expiry_seconds) {
            FirstStep::Then(step) => step,
            FirstStep::CheckOwner(owner) => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &owner.namespace);
                let exists = match bounded(backoff, pods.get(&owner.name)).await {
                    Err(()) => {
                        return Err(Attempt::Retry(format!(
                            "checking the lock owner {owner} timed out"
                        )));
                    }
                    Ok(Err(e)) if is_not_found(&e) => false,
                    Ok(Err(e)) => {
                        let (text, retry) = classify(&e);
                        let text = format!("cannot check the lock owner {owner}: {text}");
                        return Err(if retry {
                            Attempt::Retry(text)
                        } else {
                            fail(text)
                        });
                    }
                    Ok(Ok(_)) => true,
                };
                after_owner_check(value.as_deref(), pod, now, expiry_seconds, exists)
            }
        };
        let outcome = match step {
            Step::Done(outcome) => return Ok(outcome),
            Step::Failed(failed) => return Err(failed),
            Step::Write(outcome) => outcome,
        };
        let encoded = match NodeLock::new(now, pod.clone()).encode() {
            Ok(v) => v,
            Err(e) => return Err(fail(e.to_string())),
        };
        let patch = json!({"metadata": {
            "resourceVersion": current.metadata.resource_version,
            "annotations": {node_keys::MUTEX_LOCK: encoded},
        }});
        match bounded(
            backoff,
            nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        {
            Err(()) => Err(Attempt::Retry("writing the lock timed out".into())),
            Ok(Ok(_)) => Ok(outcome),
            Ok(Err(e)) => {
                let (text, retry) = classify(&e);
                Err(if retry {
                    Attempt::Retry(text)
                } else {
                    fail(format!("cannot write the lock: {text}"))
                })
            }
        }
    }

    /// Removes the lock of `node` if `owner` holds it, retrying conflicts and transient
    /// errors until `deadline`. A lock held by someone else, or none, is left alone.
    pub async fn release(
        &self,
        node: &str,
        owner: &PodRef,
        deadline: Instant,
    ) -> Result<Released, LockError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut retry = LockRetry::releasing(self.policy, deadline, node);
        loop {
            let failed = match self.try_release(&nodes, node, owner, retry.backoff()).await {
                Ok(done) => return Ok(done),
                Err(failed) => failed,
            };
            match retry.after(failed, Instant::now(), jitter()) {
                Next::Wait(wait) => tokio::time::sleep(wait).await,
                Next::GiveUp(e) => return Err(e),
            }
        }
    }

    async fn try_release(
        &self,
        nodes: &Api<Node>,
        node: &str,
        owner: &PodRef,
        backoff: &Backoff,
    ) -> Result<Released, Attempt> {
        let what = RELEASING;
        let step = |e: kube::Error, doing: &str| {
            let (text, retry) = classify(&e);
            if retry {
                Attempt::Retry(text)
            } else {
                Attempt::Fail(LockError::Refused {
                    node: node.to_owned(),
                    what,
                    error: format!("{doing}: {text}"),
                })
            }
        };
        let current = match bounded(backoff, nodes.get(node)).await {
            Err(()) => return Err(Attempt::Retry("reading the node timed out".into())),
            Ok(Err(e)) if is_not_found(&e) => return Ok(Released::NotHeld),
            Ok(Err(e)) => return Err(step(e, "cannot read the node")),
            Ok(Ok(n)) => n,
        };
        let held = current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(node_keys::MUTEX_LOCK))
            .is_some_and(|v| NodeLock::parse(v).is_ok_and(|l| l.is_owned_by(owner)));
        if !held {
            return Ok(Released::NotHeld);
        }
        let patch = json!({"metadata": {
            "resourceVersion": current.metadata.resource_version,
            "annotations": {node_keys::MUTEX_LOCK: null},
        }});
        match bounded(
            backoff,
            nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        {
            Err(()) => Err(Attempt::Retry("writing the release timed out".into())),
            Ok(Ok(_)) => Ok(Released::Released),
            Ok(Err(e)) => Err(step(e, "cannot remove the lock")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn jitter_is_in_range(_x in 0u8..8) {
            let j = jitter();
            prop_assert!((0.0..1.0).contains(&j));
        }
    }

    #[test]
    fn errors_are_one_line_without_debug_dumps() {
        let e = kube::Error::Api(
            kube::core::Status::failure("the object has been modified", "Conflict")
                .with_code(409)
                .boxed(),
        );
        let (text, retry) = classify(&e);
        assert!(retry);
        assert_eq!(
            text,
            "the API server answered 409 Conflict: the object has been modified"
        );
        let e = kube::Error::Api(
            kube::core::Status::failure("nodes is forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        );
        assert!(!classify(&e).1, "403 is not retried");
    }
}
