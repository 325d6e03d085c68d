//! The pods the harness keeps alive: a seeded mix of AMD and NVIDIA slices (and, with the
//! DRA node, DRA pods whose claims come from seeded ResourceClaimTemplates) whose sum
//! always fits the stack's nodes, so every pod must end up Running. Like a ReplicaSet,
//! a pod that is deleted or fails admission is replaced by a new one.

use hami_protocol::dra::{COMPUTE_UNITS, DRIVER, MEMORY};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::json;

use crate::rng::Rng;

/// Live AMD pods at most: 12 × 25 % of one MI210 (8 GPUs on the node) always fit.
pub const AMD_PODS: usize = 10;
/// Live NVIDIA pods at most: 3 × (2 GiB, 20 %) of the one 16 GiB stand-in GPU.
pub const NVIDIA_PODS: usize = 3;

/// Live DRA pods at most: 6 claims of at most 16 GiB and 40 CUs fit the DRA node's 8
/// MI210s (64 GiB, 104 CUs each) whatever the allocator's order.
pub const DRA_PODS: usize = 6;
/// How many ResourceClaimTemplates (seeded sizes) the DRA pods draw from.
pub const DRA_TEMPLATES: usize = 4;

/// One seeded ResourceClaimTemplate of the DRA pods: a slice of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraTemplate {
    /// The template's name (namespace `default`).
    pub name: String,
    /// Memory the claim requests, MiB.
    pub mem_mib: u64,
    /// Compute units the claim requests.
    pub cus: u64,
}

/// The DRA pods' templates for `seed`: memory 2–16 GiB, 4–40 CUs (even, so valid on RDNA's
/// WGP step too).
pub fn dra_templates(rng: &mut Rng) -> Vec<DraTemplate> {
    (0..DRA_TEMPLATES)
        .map(|i| DraTemplate {
            name: format!("chaos-dra-{i}"),
            mem_mib: 1024 * rng.between(2, 16),
            cus: 2 * rng.between(2, 20),
        })
        .collect()
}

impl DraTemplate {
    /// The object, as `examples/10-dra-slice.yaml` writes one (ExactCount 1 from the
    /// driver's DeviceClass, memory and computeUnits as consumable capacity).
    pub fn object(&self) -> ResourceClaimTemplate {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": self.name, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {
                    MEMORY: format!("{}Mi", self.mem_mib),
                    COMPUTE_UNITS: self.cus.to_string(),
                }},
            }}]}}},
        }))
        .expect("a valid ResourceClaimTemplate")
    }
}

/// DRA pod `name`: one claim from a seeded template of `templates`, its container running
/// `hami-workload` on the HIP stand-in within the claim's memory (a third ask for more, which
/// the hook must refuse, and fall back to half).
pub fn dra_pod(name: &str, templates: &[DraTemplate], rng: &mut Rng) -> Pod {
    let t = &templates[rng.below(templates.len() as u64) as usize];
    let mem = t.mem_mib;
    let ask = if rng.below(3) == 0 {
        mem + 512
    } else {
        mem / 2
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "chaos"}},
        "spec": {
            // kube-scheduler's own DRA allocation (no extender, no node lock), as the
            // cluster's scheduler profile does it.
            "schedulerName": hami_protocol::names::DEFAULT_SCHEDULER_NAME,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": t.name}],
            "containers": [{"name": "main", "image": "x",
                "command": ["hami-workload", "--runtime", "hip", "--memory-mib", ask.to_string(),
                    "--fallback-mib", (mem / 2).to_string(), "--busy-percent", "2"],
                "resources": {"claims": [{"name": "gpu"}]}}],
        }
    }))
    .expect("a valid pod")
}

/// Which node (and so which vendor's plugin and hooks) a workload pod targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// An AMD pod on the MI210 node.
    Amd,
    /// An NVIDIA pod on the stand-in driver's node.
    Nvidia,
    /// A DRA pod (a ResourceClaim from a template) on the DRA node.
    Dra,
}

/// Pod `name` of `kind`, with seeded sizes and policy. Its container runs `hami-workload`
/// (when the stack runs processes): it allocates half its memory limit, or asks for more
/// than the limit (which the hook must refuse) and falls back to half, and keeps its GPU
/// a little busy.
///
/// # Panics
/// For [`Kind::Dra`], which [`dra_pod`] makes.
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
        Kind::Dra => panic!("DRA pods come from dra_pod"),
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
