//! The pods the harness keeps alive: a seeded mix of AMD and NVIDIA slices whose sum
//! always fits the stack's nodes, so every pod must end up Running. Like a ReplicaSet,
//! a pod that is deleted or fails admission is replaced by a new one.

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use crate::rng::Rng;

/// Live AMD pods at most: 12 × 25 % of one MI210 (8 GPUs on the node) always fit.
pub const AMD_PODS: usize = 10;
/// Live NVIDIA pods at most: 3 × (2 GiB, 20 %) of the one 16 GiB stand-in GPU.
pub const NVIDIA_PODS: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Amd,
    Nvidia,
}

/// Pod `name` of `kind`, with seeded sizes and policy.
pub fn pod(name: &str, kind: Kind, rng: &mut Rng) -> Pod {
    let policy = if rng.below(2) == 0 {
        "binpack"
    } else {
        "spread"
    };
    let limits = match kind {
        Kind::Amd => json!({
            "amd.com/gpu": "1",
            "amd.com/gpumem": (1024 * rng.between(1, 6)).to_string(),
            "amd.com/gpucores": rng.between(5, 25).to_string(),
        }),
        Kind::Nvidia => json!({
            "nvidia.com/gpu": "1",
            "nvidia.com/gpumem": (512 * rng.between(1, 4)).to_string(),
            "nvidia.com/gpucores": rng.between(5, 20).to_string(),
        }),
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "chaos"},
            "annotations": {"hami.io/gpu-scheduler-policy": policy}},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}
    }))
    .expect("a valid pod")
}
