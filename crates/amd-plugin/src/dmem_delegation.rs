//! Can pod cgroups on this node get `dmem.max`? The shell: finds kubelet's `kubepods` cgroup
//! and reads the levels above the pod cgroups (read-only). The decision ([`decide`]), the
//! annotation, messages and Events are the pure core's `hami_amd_core::dmem_delegation`,
//! re-exported here so `dmem_delegation::*` keeps its paths.

use std::path::Path;

pub use hami_amd_core::dmem_delegation::*;
use hami_amd_core::pod_cgroup::SEARCH_DEPTH;

/// Reads the levels above the pod cgroups under `root` and judges them (read-only: a few
/// small files, cheap enough to repeat every publication interval).
pub fn read_delegation(root: &Path) -> DmemDelegation {
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).ok();
    let levels = find_levels(root).unwrap_or_default();
    decide(controllers.as_deref(), &levels)
}

/// The levels from `root` down to the first `kubepods` cgroup found (breadth first, the
/// way the dmem writer searches), then its QoS levels; `None` without one.
fn find_levels(root: &Path) -> Option<Vec<CgroupLevel>> {
    let mut frontier = vec![String::new()];
    let mut kubepods = None;
    'search: for _ in 0..SEARCH_DEPTH {
        let mut next = Vec::new();
        for rel in frontier {
            let dir = if rel.is_empty() {
                root.to_path_buf()
            } else {
                root.join(&rel)
            };
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                let child = if rel.is_empty() {
                    name.clone()
                } else {
                    format!("{rel}/{name}")
                };
                if is_kubepods(&name) {
                    kubepods = Some(child);
                    break 'search;
                }
                // Only levels that may hold kubelet's cgroups (as `pod_cgroup::entry_kind`).
                if name.starts_with("kube") || name.ends_with(".slice") {
                    next.push(child);
                }
            }
        }
        frontier = next;
    }
    let kubepods = kubepods?;
    let read = |rel: &str| CgroupLevel {
        rel: rel.to_owned(),
        subtree_control: std::fs::read_to_string(root.join(rel).join("cgroup.subtree_control"))
            .ok(),
    };
    // The root and every level down to kubepods.
    let mut levels = vec![CgroupLevel {
        rel: String::new(),
        subtree_control: std::fs::read_to_string(root.join("cgroup.subtree_control")).ok(),
    }];
    let parts: Vec<&str> = kubepods.split('/').collect();
    for i in 1..=parts.len() {
        levels.push(read(&parts[..i].join("/")));
    }
    let mut qos: Vec<String> = std::fs::read_dir(root.join(&kubepods))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_qos_level(n))
        .collect();
    qos.sort();
    levels.extend(qos.iter().map(|n| read(&format!("{kubepods}/{n}"))));
    Some(levels)
}
