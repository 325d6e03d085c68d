//! The checks behind every fuzz target (`tests/fuzz/src/main.rs` runs the one `HAMI_FUZZ_TARGET`
//! names), as plain functions of
//! the input bytes that panic when an invariant breaks.
//!
//! Kept apart from the libFuzzer wrappers so that the checked-in corpora (`tests/fuzz/corpus/`)
//! replay through exactly the same assertions under `cargo test` on every machine, and a
//! crash found once stays a regression test. Each check states what must hold:
//! decoders are total (no panic on any input, errors are the typed ones) and what they
//! accept round-trips: `decode(encode(decode(x))) == decode(x)`.

mod apiserver;
mod control_plane;
mod dra;
mod dra_identity;
mod node;
mod plugin_inputs;
mod protocol_codecs;

pub use apiserver::{
    apiserver_json_body, apiserver_patch, apiserver_protobuf_body, apiserver_selectors,
    apiserver_yaml_body,
};
pub use control_plane::{admission_review, extender_json};
pub use dra::{dra_checkpoint, dra_claim_status, dra_kubelet_messages, dra_selector, dra_webhook};
pub use dra_identity::dra_claim_identity;
pub use node::{fdinfo, hami_core_region, hip_region, kfd_properties};
pub use plugin_inputs::{hook_config, kubelet_messages, run_mapping};
pub use protocol_codecs::{
    cu_allocated, cu_list, defrag_reservation, device_list, hsa_cu_mask, identity, memory_limit,
    node_lock, node_register, pod_requests, quantity, rfc3339, selection,
};

/// A fuzz target: its name (the corpus folder and binary name) and its check.
pub type Target = (&'static str, fn(&[u8]));

/// Every target (its corpus is `tests/fuzz/corpus/<name>/`).
pub const TARGETS: &[Target] = &[
    ("node_register", node_register),
    ("device_list", device_list),
    ("cu_allocated", cu_allocated),
    ("defrag_reservation", defrag_reservation),
    ("node_lock", node_lock),
    ("cu_list", cu_list),
    ("hsa_cu_mask", hsa_cu_mask),
    ("memory_limit", memory_limit),
    ("quantity", quantity),
    ("identity", identity),
    ("rfc3339", rfc3339),
    ("selection", selection),
    ("pod_requests", pod_requests),
    ("hami_core_region", hami_core_region),
    ("hip_region", hip_region),
    ("fdinfo", fdinfo),
    ("kfd_properties", kfd_properties),
    ("extender_json", extender_json),
    ("admission_review", admission_review),
    ("hook_config", hook_config),
    ("kubelet_messages", kubelet_messages),
    ("run_mapping", run_mapping),
    ("apiserver_json_body", apiserver_json_body),
    ("apiserver_yaml_body", apiserver_yaml_body),
    ("apiserver_protobuf_body", apiserver_protobuf_body),
    ("apiserver_patch", apiserver_patch),
    ("apiserver_selectors", apiserver_selectors),
    ("dra_checkpoint", dra_checkpoint),
    ("dra_webhook", dra_webhook),
    ("dra_selector", dra_selector),
    ("dra_claim_status", dra_claim_status),
    ("dra_kubelet_messages", dra_kubelet_messages),
    ("dra_claim_identity", dra_claim_identity),
];

/// Text of the input when it is UTF-8: most wire formats are strings (annotations, env
/// values), so non-UTF-8 bytes never reach their decoders in production.
pub(crate) fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}
