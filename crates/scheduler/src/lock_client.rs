//! The node lock of SPEC §2.4 against the API server: acquire with a merge patch that
//! carries `metadata.resourceVersion` (a 409 means someone else wrote first), release only
//! by the owner. D-2: a busy lock is waited for, bounded by a deadline, instead of failing
//! the bind at once; locks whose owner is gone or that are older than the expiry are taken
//! over. The decision itself is `hami_protocol::node_lock::decide`.

use std::time::{Duration, Instant};

use hami_protocol::names::node as node_keys;
use hami_protocol::node_lock::{LockDecision, NodeLock, PodRef, TakeOverReason, decide};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Unix seconds now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 409)
}

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 404)
}

/// Does the lock owner still exist? Asked of the API server, not a cache: taking over a
/// live pod's lock on stale information would double-book a GPU.
async fn owner_exists(client: &Client, owner: &PodRef) -> Result<bool, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &owner.namespace);
    match pods.get(&owner.name).await {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(format!("cannot check the lock owner {owner}: {e}")),
    }
}

/// Takes the lock of `node` for `pod`, waiting for a busy lock until `deadline`.
pub async fn acquire(
    client: &Client,
    node: &str,
    pod: &PodRef,
    expiry: Duration,
    deadline: Instant,
) -> Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut backoff = Duration::from_millis(50);
    loop {
        let current = nodes
            .get(node)
            .await
            .map_err(|e| format!("cannot read node {node}: {e}"))?;
        let rv = current.metadata.resource_version.clone();
        let value = current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(node_keys::MUTEX_LOCK))
            .cloned();
        let now = unix_now();
        // First decide as if the owner exists; only a would-be takeover asks the API.
        let mut decision = decide(value.as_deref(), pod, now, expiry.as_secs() as i64, |_| {
            true
        });
        if let LockDecision::Busy {
            owner: Some(owner), ..
        } = &decision
            && !owner_exists(client, owner).await?
        {
            decision = LockDecision::TakeOver {
                reason: TakeOverReason::OwnerGone,
            };
        }
        match decision {
            LockDecision::AlreadyHeld => return Ok(()),
            LockDecision::Take | LockDecision::TakeOver { .. } => {
                let value = NodeLock::new(now, pod.clone())
                    .encode()
                    .map_err(|e| e.to_string())?;
                let patch = json!({"metadata": {"resourceVersion": rv, "annotations": {node_keys::MUTEX_LOCK: value}}});
                match nodes
                    .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => return Ok(()),
                    // Someone else wrote the node first: look again.
                    Err(e) if is_conflict(&e) => continue,
                    Err(e) => return Err(format!("cannot lock node {node}: {e}")),
                }
            }
            LockDecision::Busy { owner, age_seconds } => {
                if Instant::now() + backoff > deadline {
                    let owner = owner
                        .map(|o| o.to_string())
                        .unwrap_or_else(|| "an unnamed owner".into());
                    return Err(format!(
                        "node {node} is locked by {owner} since {age_seconds}s; gave up waiting (it expires after {}s)",
                        expiry.as_secs()
                    ));
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// Removes the lock if `pod` owns it.
pub async fn release(client: &Client, node: &str, pod: &PodRef) -> Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..5 {
        let current = nodes
            .get(node)
            .await
            .map_err(|e| format!("cannot read node {node}: {e}"))?;
        let value = current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(node_keys::MUTEX_LOCK));
        let Some(value) = value else { return Ok(()) };
        if !NodeLock::parse(value).is_ok_and(|l| l.is_owned_by(pod)) {
            return Ok(());
        }
        let patch = json!({"metadata": {"resourceVersion": current.metadata.resource_version, "annotations": {node_keys::MUTEX_LOCK: null}}});
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(format!("cannot release the lock of node {node}: {e}")),
        }
    }
    Err(format!(
        "cannot release the lock of node {node}: it kept changing"
    ))
}
