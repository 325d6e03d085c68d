//! The KFD topology (`class/kfd/kfd/topology/nodes/*`): one node per CPU socket and per
//! GPU (or GPU partition), with its properties, links and memory banks.

use std::collections::BTreeMap;
use std::path::Path;

use crate::sysfs::{SysfsError, list_dir, read_properties};

/// KFD io/p2p link type of an XGMI link.
pub const LINK_TYPE_XGMI: u32 = 11;

/// Where the topology lives below the sysfs root.
pub const TOPOLOGY_NODES: &str = "class/kfd/kfd/topology/nodes";

/// One KFD node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KfdNode {
    /// The node directory number.
    pub id: u32,
    /// The node's `properties` file, key → value as written.
    pub properties: BTreeMap<String, String>,
    /// `(type, node_to)` of every io_link and p2p_link.
    pub links: Vec<(u32, u32)>,
    /// Sum of `mem_banks/*/properties size_in_bytes`, when the node has memory banks.
    pub mem_bytes: Option<u64>,
}

impl KfdNode {
    /// A property parsed as an integer; `None` when absent or not a number.
    pub fn u64(&self, name: &str) -> Option<u64> {
        self.properties.get(name).and_then(|v| v.parse().ok())
    }

    /// Render minor (0 on CPU nodes).
    pub fn render_minor(&self) -> u32 {
        self.u64("drm_render_minor").unwrap_or(0) as u32
    }

    /// A GPU node has SIMDs and a render node; CPU nodes have neither.
    pub fn is_gpu(&self) -> bool {
        self.u64("simd_count").unwrap_or(0) > 0 || self.render_minor() > 0
    }

    /// Effective (active) CUs: `simd_count / simd_per_cu`; 0 when either is missing.
    /// Saturates at `u32::MAX` (discovery refuses anything above a real GPU's count).
    pub fn compute_units(&self) -> u32 {
        match (self.u64("simd_count"), self.u64("simd_per_cu")) {
            (Some(simds), Some(per_cu)) if per_cu > 0 => {
                u32::try_from(simds / per_cu).unwrap_or(u32::MAX)
            }
            _ => 0,
        }
    }

    /// KFD nodes whose GPUs this one reaches over XGMI.
    pub fn xgmi_targets(&self) -> impl Iterator<Item = u32> + '_ {
        self.links
            .iter()
            .filter(|(kind, _)| *kind == LINK_TYPE_XGMI)
            .map(|(_, to)| *to)
    }
}

/// Why the topology could not be read at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error(
        "no KFD topology at {0}: the amdgpu driver is not loaded, or --sysfs-root points to the wrong place"
    )]
    /// The topology directory is absent or cannot be listed.
    Missing(String),
}

/// Reads every node; a node whose `properties` cannot be read is reported and skipped.
pub fn read_topology(sysfs_root: &Path) -> Result<(Vec<KfdNode>, Vec<String>), TopologyError> {
    let dir = sysfs_root.join(TOPOLOGY_NODES);
    if !dir.is_dir() {
        return Err(TopologyError::Missing(dir.display().to_string()));
    }
    let mut nodes = Vec::new();
    let mut warnings = Vec::new();
    let names = list_dir(&dir).map_err(|e| TopologyError::Missing(e.to_string()))?;
    for name in names {
        let Ok(id) = name.parse::<u32>() else {
            continue;
        };
        match read_node(&dir.join(&name), id) {
            Ok(node) => nodes.push(node),
            Err(e) => warnings.push(format!("KFD node {id} skipped: {e}")),
        }
    }
    nodes.sort_by_key(|n| n.id);
    Ok((nodes, warnings))
}

fn read_node(dir: &Path, id: u32) -> Result<KfdNode, SysfsError> {
    let properties = read_properties(&dir.join("properties"))?;
    let mut links = Vec::new();
    for kind in ["io_links", "p2p_links"] {
        for link in list_dir(&dir.join(kind))? {
            // A broken link only loses a peer, never the GPU.
            if let Ok(props) = read_properties(&dir.join(kind).join(&link).join("properties")) {
                let get = |n: &str| props.get(n).and_then(|v| v.parse::<u32>().ok());
                if let (Some(t), Some(to)) = (get("type"), get("node_to")) {
                    links.push((t, to));
                }
            }
        }
    }
    let mut mem_bytes = None;
    for bank in list_dir(&dir.join("mem_banks"))? {
        if let Ok(props) = read_properties(&dir.join("mem_banks").join(&bank).join("properties"))
            && let Some(size) = props
                .get("size_in_bytes")
                .and_then(|v| v.parse::<u64>().ok())
        {
            *mem_bytes.get_or_insert(0) += size;
        }
    }
    Ok(KfdNode {
        id,
        properties,
        links,
        mem_bytes,
    })
}

/// PCI address of a KFD node, function 0: `domain:bus:device.0` where bus is
/// `location_id >> 8` and device `(location_id >> 3) & 0x1f`; the low 3 bits are the
/// partition index on partitioned GPUs, not the PCI function.
pub fn kfd_bdf(node: &KfdNode) -> String {
    let domain = node.u64("domain").unwrap_or(0);
    let location = node.u64("location_id").unwrap_or(0);
    format!(
        "{domain:04x}:{:02x}:{:02x}.0",
        (location >> 8) & 0xff,
        (location >> 3) & 0x1f
    )
}
