//! The node patches both plugins' publishers write: the register annotation with its
//! heartbeat, and the node capacity of `--report-node-capacity`. The wire formats are the
//! protocol crate's (`node_register`, `handshake`); this is only the API call around them.

use hami_protocol::handshake;
use hami_protocol::names::Vendor;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Writes the register annotation `register_key` of `node` (`value`, the encoded device
/// list; `None` removes it) and `vendor`'s heartbeat in the same merge patch. The heartbeat
/// goes with the register annotation: nothing offered, nothing to keep alive.
pub async fn publish_register(
    nodes: &Api<Node>,
    node: &str,
    register_key: &str,
    vendor: Vendor,
    value: Option<String>,
    handshake_period_secs: u64,
) -> Result<(), String> {
    let beat = value
        .as_ref()
        .map(|_| handshake::format(crate::node_lock_client::unix_now(), handshake_period_secs));
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                register_key: value,
                handshake::key(vendor): beat,
            }}})),
        )
        .await
        .map_err(|e| format!("cannot publish {register_key} on node {node}: {e}"))?;
    Ok(())
}

/// Sets `node`'s capacity and allocatable of the two extended resources (`memory_key`,
/// `cores_key`) to `memory` and `cores`.
pub async fn report_capacity(
    nodes: &Api<Node>,
    node: &str,
    (memory_key, memory): (&str, u64),
    (cores_key, cores): (&str, u64),
) -> Result<(), String> {
    let caps = json!({memory_key: memory.to_string(), cores_key: cores.to_string()});
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": caps, "allocatable": caps}})),
        )
        .await
        .map_err(|e| format!("cannot report node capacity: {e}"))?;
    Ok(())
}
