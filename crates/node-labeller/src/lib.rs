//! `k8s-node-labeller`: `amd.com/gpu.*` labels of a node from the same sysfs discovery as
//! the device plugin, recomputed periodically and applied by merge patch (labels we no
//! longer produce are removed; other labels are untouched).

use std::collections::BTreeMap;

use hami_amd_discovery::discovery::{Discovery, Gpu};

/// Every label kind we manage (`amd.com/gpu.<kind>` and `amd.com/gpu.<kind>.<value>`).
pub const KINDS: &[&str] = &[
    "family",
    "device-id",
    "product-name",
    "vram",
    "simd-count",
    "cu-count",
    "driver-version",
    "compute-memory-partition",
    "compute-partitioning-supported",
    "memory-partitioning-supported",
];

/// The libdrm family name of a GFX target.
pub fn family(gfx_target_version: u32) -> Option<&'static str> {
    Some(match gfx_target_version / 10_000 {
        8 => "VI",
        9 => "AI",
        10 => "NV",
        11 => "GC_11_0_0",
        12 => "GC_12_0_0",
        _ => return None,
    })
}

/// A label value Kubernetes accepts: `[A-Za-z0-9._-]`, at most 63, alphanumeric ends.
pub fn label_value(text: &str) -> String {
    let mut v: String = text
        .chars()
        .filter(|c| *c != '(' && *c != ')')
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    v.truncate(63);
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

fn values(gpu: &Gpu) -> Vec<(&'static str, Option<String>)> {
    vec![
        ("family", family(gpu.gfx_target_version).map(str::to_owned)),
        ("device-id", Some(format!("{:04x}", gpu.device_id))),
        ("product-name", Some(gpu.market_name.clone())),
        (
            "vram",
            Some(format!(
                "{}G",
                ((gpu.vram_bytes >> 20) as f64 / 1024.0).round() as u64
            )),
        ),
        ("simd-count", Some(gpu.simd_count.to_string())),
        ("cu-count", Some(gpu.compute_units().to_string())),
        ("driver-version", gpu.driver_version.clone()),
        (
            "compute-memory-partition",
            match (&gpu.compute_partition, &gpu.memory_partition) {
                (Some(c), Some(m)) => Some(format!(
                    "{}_{}",
                    c.to_ascii_lowercase(),
                    m.to_ascii_lowercase()
                )),
                _ => None,
            },
        ),
        (
            "compute-partitioning-supported",
            Some(gpu.partitioning_supported.to_string()),
        ),
        (
            "memory-partitioning-supported",
            Some(gpu.partitioning_supported.to_string()),
        ),
    ]
}

/// Labels for the node: one value across GPUs → `amd.com/gpu.<kind>=<value>`; several →
/// `amd.com/gpu.<kind>.<value>=<count>` (the reference's encoding).
pub fn labels(discovery: &Discovery) -> BTreeMap<String, String> {
    let mut per_kind: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    for gpu in &discovery.gpus {
        for (kind, value) in values(gpu) {
            if let Some(v) = value.map(|v| label_value(&v)).filter(|v| !v.is_empty()) {
                *per_kind.entry(kind).or_default().entry(v).or_default() += 1;
            }
        }
    }
    let mut out = BTreeMap::new();
    for (kind, counts) in per_kind {
        if counts.len() == 1 {
            let (v, _) = counts.into_iter().next().unwrap_or_default();
            out.insert(format!("amd.com/gpu.{kind}"), v);
        } else {
            for (v, n) in counts {
                out.insert(format!("amd.com/gpu.{kind}.{v}"), n.to_string());
            }
        }
    }
    out
}

/// The merge-patch `labels` object: `desired`, plus `null` for our labels no longer wanted.
pub fn label_patch(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> serde_json::Map<String, serde_json::Value> {
    let mut patch = serde_json::Map::new();
    for key in current.keys() {
        let ours = KINDS.iter().any(|k| {
            key == &format!("amd.com/gpu.{k}") || key.starts_with(&format!("amd.com/gpu.{k}."))
        });
        if ours && !desired.contains_key(key) {
            patch.insert(key.clone(), serde_json::Value::Null);
        }
    }
    for (k, v) in desired {
        if current.get(k) != Some(v) {
            patch.insert(k.clone(), serde_json::Value::String(v.clone()));
        }
    }
    patch
}
