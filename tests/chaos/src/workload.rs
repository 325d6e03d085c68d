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

/// Which node (and so which vendor's plugin and hooks) a workload pod targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// An AMD pod on the MI210 node.
    Amd,
    /// An NVIDIA pod on the stand-in driver's node.
    Nvidia,
}

/// Pod `name` of `kind`, with seeded sizes and policy. Its container runs `hami-workload`
/// (when the stack runs processes): it allocates half its memory limit, or asks for more
/// than the limit (which the hook must refuse) and falls back to half, and keeps its GPU
/// a little busy.
pub fn pod(name: &str, kind: Kind, rng: &mut Rng) -> Pod {
    let policy = if rng.below(2) == 0 {
        "binpack"
    } else {
        "spread"
    };
    let (limits, mem, runtime) = match kind {
        Kind::Amd => {
            let mem = 1024 * rng.between(1, 6);
            let limits = json!({
                "amd.com/gpu": "1",
                "amd.com/gpumem": mem.to_string(),
                "amd.com/gpucores": rng.between(5, 25).to_string(),
            });
            (limits, mem, "hip")
        }
        Kind::Nvidia => {
            let mem = 512 * rng.between(1, 4);
            let limits = json!({
                "nvidia.com/gpu": "1",
                "nvidia.com/gpumem": mem.to_string(),
                "nvidia.com/gpucores": rng.between(5, 20).to_string(),
            });
            (limits, mem, "cuda")
        }
    };
    let ask = if rng.below(3) == 0 {
        mem + 512
    } else {
        mem / 2
    };
    let command = json!([
        "hami-workload",
        "--runtime",
        runtime,
        "--memory-mib",
        ask.to_string(),
        "--fallback-mib",
        (mem / 2).to_string(),
        "--busy-percent",
        "2",
    ]);
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "chaos"},
            "annotations": {"hami.io/gpu-scheduler-policy": policy}},
        "spec": {"containers": [{"name": "main", "image": "x", "command": command,
            "resources": {"limits": limits}}]}
    }))
    .expect("a valid pod")
}
