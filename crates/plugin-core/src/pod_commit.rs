//! Writing an Allocate's outcome to the API server, the same for every vendor (SPEC §2.3,
//! §2.4): one merge patch of the pod's annotations (with `bind-phase=success` on the last
//! container, so nothing is half-written), node-lock release by its owner, and on failure
//! `bind-phase=failed` plus the release. Also the per-container accounting directory.

use hami_protocol::names::{node as node_keys, pod as pod_keys};
use hami_protocol::node_lock::{BindPhase, NodeLock, PodRef};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Map, Value, json};

/// What an Allocate reads first, the same for every vendor: the node's lock value (fresh
/// from the API server, as the lock protocol needs) and the pods bound to the node.
pub async fn node_lock_and_pods(
    client: &kube::Client,
    node: &str,
) -> Result<(Option<String>, Vec<Pod>), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes
        .get(node)
        .await
        .map_err(|e| format!("cannot read node {node}: {e}"))?;
    let lock = current
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(node_keys::MUTEX_LOCK))
        .cloned();
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|e| format!("cannot list pods of node {node}: {e}"))?
        .items;
    Ok((lock, pods))
}

/// Patches the pod's `annotations` in one merge patch; with `last`, also
/// `bind-phase=success` and then releases the node lock held by the pod.
pub async fn commit_allocation(
    client: &kube::Client,
    node: &str,
    target: &PodRef,
    mut annotations: Map<String, Value>,
    last: bool,
) -> Result<(), String> {
    if last {
        annotations.insert(
            pod_keys::BIND_PHASE.into(),
            json!(BindPhase::Success.as_str()),
        );
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
    api.patch(
        &target.name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
    )
    .await
    .map_err(|e| format!("cannot record the allocation on the pod: {e}"))?;
    if last {
        release_lock(client, node, target).await;
    }
    Ok(())
}

/// `bind-phase=failed` on the pod (logged when that fails too) and the lock released.
pub async fn mark_failed(client: &kube::Client, node: &str, target: &PodRef) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
    let patch =
        json!({"metadata": {"annotations": {pod_keys::BIND_PHASE: BindPhase::Failed.as_str()}}});
    if let Err(e) = api
        .patch(&target.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        tracing::warn!(pod = %target, "cannot set bind-phase=failed: {e}");
    }
    release_lock(client, node, target).await;
}

/// Fails when the node lock is held by a pod other than `target` (value as read).
pub fn check_lock_owner(lock: Option<&str>, target: &PodRef) -> Result<(), String> {
    if let Some(value) = lock
        && let Ok(l) = NodeLock::parse(value)
        && l.owner.as_ref().is_some_and(|o| o != target)
    {
        return Err(format!("the node lock is held by another pod ({value})"));
    }
    Ok(())
}

/// Removes the node lock if `owner` holds it (a few tries on conflicts).
pub async fn release_lock(client: &kube::Client, node: &str, owner: &PodRef) {
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..5 {
        let Ok(n) = nodes.get(node).await else {
            continue;
        };
        let Some(value) = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(node_keys::MUTEX_LOCK))
        else {
            return;
        };
        if !NodeLock::parse(value).is_ok_and(|l| l.is_owned_by(owner)) {
            return;
        }
        let patch = json!({"metadata": {
            "resourceVersion": n.metadata.resource_version,
            "annotations": {node_keys::MUTEX_LOCK: null},
        }});
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => return,
            Err(e) => tracing::warn!(%node, "releasing the node lock failed, retrying: {e}"),
        }
    }
}

/// The container's accounting directory, writable by any container user (mode 0777, as
/// the reference), since the application inside runs as whoever the image says.
pub fn create_cache_dir(dir: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_of_another_pod_is_refused() {
        let me = PodRef::new("ns", "a");
        assert!(check_lock_owner(None, &me).is_ok());
        assert!(check_lock_owner(Some("2026-08-04T10:00:00Z,ns,a"), &me).is_ok());
        assert!(check_lock_owner(Some("2026-08-04T10:00:00Z"), &me).is_ok());
        assert!(
            check_lock_owner(Some("2026-08-04T10:00:00Z,ns,b"), &me)
                .unwrap_err()
                .contains("another pod")
        );
    }

    #[test]
    fn cache_dir_is_world_writable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("plugin-core-cache-{}", std::process::id()));
        let path = dir.join("uid_ctr");
        create_cache_dir(path.to_str().unwrap()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o777);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
