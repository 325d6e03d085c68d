//! The shell of `dmem_delegation`: checks once at plugin start and again every interval
//! (a few small reads), and on a change writes the node's `hami.io/amd-dmem` annotation,
//! records a Node Event and logs once; nothing while the outcome stays the same.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;

use crate::dmem_delegation::{
    ANNOTATION, DmemDelegation, annotation_value, change_event, describe, read_delegation,
};
use crate::node_publisher::record_node_event;

/// Checks the dmem delegation of `cgroup_root` now and then every `every` until `shutdown`
/// turns true, publishing each change on `node`.
pub async fn watch_delegation(
    client: kube::Client,
    node: String,
    cgroup_root: PathBuf,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut seen: Option<DmemDelegation> = None;
    let mut published: Option<String> = None;
    loop {
        let root = cgroup_root.clone();
        let state = tokio::task::spawn_blocking(move || read_delegation(&root))
            .await
            .unwrap_or(DmemDelegation::NoKubepods);
        if seen.as_ref() != Some(&state) {
            let text = describe(&state, &cgroup_root);
            match state {
                DmemDelegation::Delegated => tracing::info!("{text}"),
                _ => tracing::warn!("{text}"),
            }
            if let Some(event) = change_event(seen.as_ref(), &state, &cgroup_root) {
                record_node_event(&client, &node, &event).await;
            }
            seen = Some(state.clone());
        }
        // The annotation until it is written (a failed patch is retried next time).
        let value = annotation_value(&state);
        if published.as_deref() != Some(value.as_str()) {
            let patch = json!({"metadata": {"annotations": {ANNOTATION: value}}});
            match nodes
                .patch(&node, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => published = Some(value),
                Err(e) => tracing::warn!("cannot write {ANNOTATION} on node {node}: {e}"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}
