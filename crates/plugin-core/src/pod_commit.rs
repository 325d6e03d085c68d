//! Writing an Allocate's outcome to the API server, the same for every vendor (SPEC §2.3,
//! §2.4): one merge patch of the pod's annotations (with `bind-phase=success` on the last
//! container, so nothing is half-written), node-lock release by its owner, and on failure
//! `bind-phase=failed` plus the release. Also the per-container accounting directory.

use hami_protocol::names::{node as node_keys, pod as pod_keys};
use hami_protocol::node_lock::{BindPhase, NodeLock, PodRef};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Map, Value, json};

use crate::node_lock_client::{NodeLockClient, api_error_text};

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
        .map_err(|e| format!("cannot read node {node}: {}", api_error_text(&e)))?;
    let lock = current
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(node_keys::MUTEX_LOCK))
        .cloned();
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|e| format!("cannot list pods of node {node}: {}", api_error_text(&e)))?
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
) -> Result<Pod, String> {
    if last {
        annotations.insert(
            pod_keys::BIND_PHASE.into(),
            json!(BindPhase::Success.as_str()),
        );
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
    let written = api
        .patch(
            &target.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
        )
        .await
        .map_err(|e| {
            format!(
                "cannot record the allocation on the pod: {}",
                api_error_text(&e)
            )
        })?;
    if last {
        release_lock(client, node, target).await;
    }
    Ok(written)
}

/// `bind-phase=failed` on the pod (logged when that fails too) and the lock released;
/// the pod as the patch returned it.
pub async fn mark_failed(client: &kube::Client, node: &str, target: &PodRef) -> Option<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
    let patch =
        json!({"metadata": {"annotations": {pod_keys::BIND_PHASE: BindPhase::Failed.as_str()}}});
    let written = match api
        .patch(&target.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(pod) => Some(pod),
        Err(e) => {
            tracing::warn!(pod = %target, "cannot set bind-phase=failed: {}", api_error_text(&e));
            None
        }
    };
    release_lock(client, node, target).await;
    written
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

/// How long a plugin keeps trying to release a lock (conflicts, API hiccups) before it
/// leaves it to expire (D-2).
pub const RELEASE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Records a whole-card hand-over on the pod before Allocate answers (issue 26 item 1):
/// `hami.io/<vendor>-whole-cards` becomes the recorded cards (`existing`) with `cards`
/// added. A failed write fails the Allocate: a card is never handed over unrecorded.
pub async fn record_whole_cards(
    client: &kube::Client,
    target: &PodRef,
    vendor: hami_protocol::names::Vendor,
    existing: Option<&str>,
    cards: &[String],
) -> Result<Pod, String> {
    let key = hami_protocol::whole_cards::key(vendor);
    let value = hami_protocol::whole_cards::merge(existing, cards)
        .map_err(|e| format!("pod {target}: {key}: {e}"))?;
    let api: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
    api.patch(
        &target.name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
    )
    .await
    .map_err(|e| {
        format!(
            "cannot record the whole cards {} on pod {target} ({key}): {}",
            cards.join(","),
            api_error_text(&e)
        )
    })
}

/// Records a Warning Event on a pod (core v1, the pod's namespace) from `component`;
/// a failure is logged (an Event is never worth failing an Allocate for).
pub async fn record_pod_event(
    client: &kube::Client,
    pod: &PodRef,
    component: &str,
    reason: &str,
    message: &str,
) {
    use k8s_openapi::api::core::v1::Event;
    let events: Api<Event> = Api::namespaced(client.clone(), &pod.namespace);
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let ev: Result<Event, _> = serde_json::from_value(json!({
        "metadata": {"generateName": format!("{}.", pod.name)},
        "involvedObject": {"kind": "Pod", "name": pod.name, "namespace": pod.namespace, "apiVersion": "v1"},
        "reason": reason,
        "message": message,
        "type": "Warning",
        "source": {"component": component},
        "count": 1,
    }));
    let Ok(mut ev) = ev else { return };
    ev.first_timestamp = Some(now.clone());
    ev.last_timestamp = Some(now);
    if let Err(e) = events.create(&kube::api::PostParams::default(), &ev).await {
        tracing::warn!(
            "cannot record event {reason} on pod {pod}: {}",
            api_error_text(&e)
        );
    }
}

/// Removes the node lock if `owner` holds it, through the shared node-lock client (retries
/// with backoff until [`RELEASE_DEADLINE`]); a failure is logged, and the lock then expires.
pub async fn release_lock(client: &kube::Client, node: &str, owner: &PodRef) {
    let deadline = std::time::Instant::now() + RELEASE_DEADLINE;
    if let Err(e) = NodeLockClient::new(client.clone())
        .release(node, owner, deadline)
        .await
    {
        tracing::warn!(%node, pod = %owner, "{e}; the lock will expire instead");
    }
}

/// The container's accounting directory, writable by any container user (mode 0777, as
/// the reference), since the application inside runs as whoever the image says.
pub fn create_cache_dir(dir: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
}

/// Writes a container's hook config (issue 14 item 7) at `path` on the host, read-only for
/// everyone, atomically (a temporary file renamed over it), creating its directory. The
/// kubelet bind-mounts it read-only; the hook refuses a config that is not on a read-only
/// mount.
pub fn write_hook_config(path: &str, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let path = std::path::Path::new(path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let temp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    let mut file = std::fs::File::options()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(&temp)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o444))?;
    std::fs::rename(&temp, path)
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
    fn hook_config_is_written_read_only_and_replaced_whole() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("plugin-core-hook-{}", std::process::id()));
        let path = dir.join(".hook-config").join("uid_ctr.conf");
        let path = path.to_str().unwrap();
        write_hook_config(path, "hami-hook-config/1\nmemory-limit=1\n").unwrap();
        write_hook_config(path, "hami-hook-config/1\nmemory-limit=2\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(path).unwrap(),
            "hami-hook-config/1\nmemory-limit=2\n"
        );
        let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444);
        std::fs::remove_dir_all(dir).unwrap();
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
