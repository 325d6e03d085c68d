//! GPU discovery from sysfs only (no C library): PCI functions bound to amdgpu, their DRM
//! nodes, XCP partition platform devices, joined with the KFD topology by render minor.
//!
//! A broken card (missing files, no render node, no KFD node, CU count 0, `unique_id` 0) is
//! skipped with a warning that names the cause; the other cards are kept.

use std::collections::BTreeMap;
use std::path::Path;

use hami_protocol::identity::partition_index_from_location_id;

use crate::kfd_topology::{KfdNode, TopologyError, kfd_bdf, read_topology};
use crate::sysfs::{drm_minors, list_dir, read_int, read_optional, read_trimmed};

/// AMD's PCI vendor id.
pub const AMD_VENDOR_ID: i64 = 0x1002;

const AMDGPU_DRIVER: &str = "bus/pci/drivers/amdgpu";
const PLATFORM_DEVICES: &str = "devices/platform";

/// One hardware compute partition of a card; an unpartitioned card has exactly one, index 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Partition index (low 3 bits of KFD `location_id`).
    pub index: u8,
    /// kubelet device key: the PCI address for partition 0, `amdgpu_xcp_<n>` for others.
    pub device_key: String,
    /// KFD topology node (`topology/nodes/<n>`) of this partition.
    pub kfd_node: u32,
    /// DRM card minor (`card<card>`).
    pub card: u32,
    /// DRM render minor (`renderD<render>`).
    pub render: u32,
    /// Effective CUs of this partition.
    pub compute_units: u32,
    /// This partition's own memory (KFD `mem_banks`), when the kernel reports it.
    pub mem_bytes: Option<u64>,
}

/// One physical GPU (PCI function bound to amdgpu) with its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// PCI address as sysfs names it (lower case), e.g. `0000:05:00.0`.
    pub bdf: String,
    /// PCI device id (`device`).
    pub device_id: u16,
    /// NUMA node, -1 when unknown.
    pub numa: i32,
    /// `mem_info_vram_total`, in bytes.
    pub vram_bytes: u64,
    /// Registered product type (always contains `AMD`).
    pub market_name: String,
    /// `current_compute_partition`, e.g. `CPX`; `None` when the GPU cannot be partitioned.
    pub compute_partition: Option<String>,
    /// `current_memory_partition`, e.g. `NPS1`; `None` when the GPU cannot be partitioned.
    pub memory_partition: Option<String>,
    /// Whether the GPU can be repartitioned (`available_compute_partition` exists).
    pub partitioning_supported: bool,
    /// KFD `gfx_target_version` (e.g. 90402 for gfx942); 0 when unknown or out of range.
    pub gfx_target_version: u32,
    /// KFD `unique_id` (ASIC serial), shared by all partitions.
    pub unique_id: u64,
    /// CUs per WGP: 2 on RDNA (gfx10+ consumer parts), 1 on GCN/CDNA.
    pub cu_per_wgp: u32,
    /// KFD `num_cp_queues` of the card's first node; 0 when out of range.
    pub compute_queues: u32,
    /// KFD `simd_count` of the card's first node.
    pub simd_count: u32,
    /// PCI addresses of other GPUs reachable over XGMI, sorted.
    pub xgmi_peers: Vec<String>,
    /// amdgpu module version (`driver/module/version`), if readable.
    pub driver_version: Option<String>,
    /// Sorted by index; never empty.
    pub partitions: Vec<Partition>,
}

impl Gpu {
    /// A card counts as partitioned when it runs a multi-partition compute mode or more
    /// than one partition was found.
    pub fn is_partitioned(&self) -> bool {
        self.partitions.len() > 1
            || self
                .compute_partition
                .as_deref()
                .is_some_and(|m| !m.eq_ignore_ascii_case("SPX"))
    }

    /// Effective CUs of the whole card.
    pub fn compute_units(&self) -> u32 {
        self.partitions.iter().map(|p| p.compute_units).sum()
    }
}

/// What discovery found, plus what it had to leave out and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovery {
    /// The GPUs found, each with its partitions.
    pub gpus: Vec<Gpu>,
    /// One line per GPU or partition left out or corrected, saying why.
    pub warnings: Vec<String>,
}

/// Whether a GFX target is RDNA, whose CUs pair into WGPs: gfx10, gfx11, gfx12.
/// (gfx9xx = GCN/CDNA, including all Instinct parts, has no WGPs.)
pub fn cu_per_wgp(gfx_target_version: u32) -> u32 {
    if (100_000..=129_999).contains(&gfx_target_version) {
        2
    } else {
        1
    }
}

/// Market names of common parts, used when sysfs has no `product_name`.
fn known_market_name(device_id: u16) -> Option<&'static str> {
    Some(match device_id {
        0x6860..=0x686f => "AMD Radeon Instinct MI25",
        0x66a0 | 0x66a1 => "AMD Instinct MI50",
        0x738c => "AMD Instinct MI100",
        0x7408 => "AMD Instinct MI250X",
        0x740c => "AMD Instinct MI250X / MI250",
        0x740f => "AMD Instinct MI210",
        0x74a1 => "AMD Instinct MI300X",
        0x74a2 => "AMD Instinct MI308X",
        0x74a5 => "AMD Instinct MI325X",
        0x74b5 => "AMD Instinct MI300X VF",
        0x744c => "AMD Radeon RX 7900 XTX",
        0x7448 => "AMD Radeon PRO W7900",
        0x7550 => "AMD Radeon RX 9070 XT",
        _ => return None,
    })
}

/// The registered type: sysfs `product_name` (prefixed with `AMD` when it lacks it), else
/// a known market name, else `AMD GPU <device id>`. Characters the device-list format
/// reserves (`,` `:` `;`) are replaced by spaces.
pub fn market_name(product_name: Option<&str>, device_id: u16) -> String {
    let cleaned = product_name.map(sanitize_name);
    let name = match cleaned.as_deref().filter(|n| !n.is_empty()) {
        Some(n) if n.to_ascii_uppercase().contains("AMD") => n.to_owned(),
        Some(n) => format!("AMD {n}"),
        None => known_market_name(device_id)
            .map(str::to_owned)
            .unwrap_or_else(|| format!("AMD GPU {device_id:04x}")),
    };
    name.replace([',', ':', ';'], " ")
}

/// Longest registered type kept (real market names are under 40 characters).
pub const MAX_NAME_CHARS: usize = 64;

/// A name as it may be published: printable ASCII only (newlines, NUL, ESC and other
/// control or non-ASCII bytes become spaces), runs of spaces collapsed, trimmed, and cut to
/// [`MAX_NAME_CHARS`].
pub fn sanitize_name(raw: &str) -> String {
    let mut out = String::new();
    for c in raw.chars() {
        let c = if c.is_ascii_graphic() { c } else { ' ' };
        if c == ' ' && (out.is_empty() || out.ends_with(' ')) {
            continue;
        }
        if out.len() >= MAX_NAME_CHARS {
            break;
        }
        out.push(c);
    }
    out.trim_end().to_owned()
}

/// Largest CU count of one device (partition or card) taken as real: the largest parts
/// have 304 CUs; anything beyond this is a broken `simd_count`/`simd_per_cu`.
pub const MAX_COMPUTE_UNITS: u32 = 1024;

/// Smallest VRAM of a card taken as real (64 MiB); a smaller `mem_info_vram_total` would
/// publish 0 MiB.
pub const MIN_VRAM_BYTES: u64 = 64 << 20;

/// Largest VRAM of a card taken as real (64 TiB).
pub const MAX_VRAM_BYTES: u64 = 64 << 40;

struct PciFunction {
    bdf: String,
    device_id: u16,
    numa: i32,
    vram_bytes: Option<u64>,
    product_name: Option<String>,
    compute_partition: Option<String>,
    memory_partition: Option<String>,
    partitioning_supported: bool,
    driver_version: Option<String>,
    card: Option<u32>,
    render: Option<u32>,
}

fn read_pci_function(
    dir: &Path,
    bdf: &str,
    warnings: &mut Vec<String>,
) -> Result<PciFunction, String> {
    let vendor = read_int(&dir.join("vendor")).map_err(|e| e.to_string())?;
    if vendor != AMD_VENDOR_ID {
        return Err(format!(
            "vendor {vendor:#06x} is not AMD ({AMD_VENDOR_ID:#06x})"
        ));
    }
    let device_id = read_int(&dir.join("device")).map_err(|e| e.to_string())?;
    let device_id =
        u16::try_from(device_id).map_err(|_| format!("device id {device_id} is out of range"))?;
    let numa = match read_int(&dir.join("numa_node")) {
        Ok(n) => i32::try_from(n).unwrap_or(-1).max(-1),
        Err(e) => {
            warnings.push(format!("GPU {bdf}: NUMA node unknown ({e}); reporting -1"));
            -1
        }
    };
    let vram_bytes = read_int(&dir.join("mem_info_vram_total"))
        .ok()
        .and_then(|v| u64::try_from(v).ok());
    let numa = if numa > 4095 {
        warnings.push(format!(
            "GPU {bdf}: numa_node {numa} is out of range; reporting -1"
        ));
        -1
    } else {
        numa
    };
    let opt = |name: &str, warnings: &mut Vec<String>| match read_optional(&dir.join(name)) {
        Ok(v) => v,
        Err(e) => {
            warnings.push(format!("GPU {bdf}: {e}; ignored"));
            None
        }
    };
    let product_name = opt("product_name", warnings);
    if let Some(raw) = &product_name
        && sanitize_name(raw) != raw.trim()
    {
        warnings.push(format!(
            "GPU {bdf}: product_name has control characters or is too long; published as {:?}",
            market_name(Some(raw), device_id)
        ));
    }
    let (card, render) = drm_minors(dir).map_err(|e| e.to_string())?;
    Ok(PciFunction {
        bdf: bdf.to_ascii_lowercase(),
        device_id,
        numa,
        vram_bytes,
        product_name,
        compute_partition: opt("current_compute_partition", warnings)
            .map(|s| sanitize_name(&s).to_ascii_uppercase())
            .filter(|s| !s.is_empty()),
        memory_partition: opt("current_memory_partition", warnings)
            .map(|s| sanitize_name(&s).to_ascii_uppercase())
            .filter(|s| !s.is_empty()),
        partitioning_supported: dir.join("available_compute_partition").exists(),
        driver_version: read_trimmed(&dir.join("driver/module/version"))
            .ok()
            .map(|v| sanitize_name(&v))
            .filter(|v| !v.is_empty()),
        card,
        render,
    })
}

/// Discovers the GPUs below `sysfs_root`.
pub fn discover(sysfs_root: &Path) -> Result<Discovery, TopologyError> {
    let (nodes, mut warnings) = read_topology(sysfs_root)?;
    let by_render: BTreeMap<u32, &KfdNode> = nodes
        .iter()
        .filter(|n| n.is_gpu() && n.render_minor() > 0)
        .map(|n| (n.render_minor(), n))
        .collect();

    // 1. PCI functions: each is a card; its own render node is partition 0 (or the whole card).
    let driver_dir = sysfs_root.join(AMDGPU_DRIVER);
    let mut cards: Vec<(PciFunction, Vec<Partition>, &KfdNode)> = Vec::new();
    for name in list_dir(&driver_dir).unwrap_or_default() {
        if !looks_like_bdf(&name) {
            continue;
        }
        let dir = driver_dir.join(&name);
        let pci = match read_pci_function(&dir, &name, &mut warnings) {
            Ok(pci) => pci,
            Err(why) => {
                warnings.push(format!("GPU {name} skipped: {why}"));
                continue;
            }
        };
        let Some(render) = pci.render else {
            warnings.push(format!(
                "GPU {name} skipped: no renderD* entry under {}/drm (the card has no render node, so containers could not use it)",
                dir.display()
            ));
            continue;
        };
        let Some(card) = pci.card else {
            warnings.push(format!(
                "GPU {name} skipped: no card* entry under {}/drm",
                dir.display()
            ));
            continue;
        };
        let Some(node) = by_render.get(&render).copied() else {
            warnings.push(format!(
                "GPU {name} skipped: no KFD topology node has drm_render_minor {render} (is the GPU initialised for compute?)"
            ));
            continue;
        };
        match partition_of(node, name.clone(), card, render) {
            Ok(p) => cards.push((pci, vec![p], node)),
            Err(why) => warnings.push(format!("GPU {name} skipped: {why}")),
        }
    }

    // 2. XCP platform devices: more partitions of a card, matched by KFD PCI address.
    let platform = sysfs_root.join(PLATFORM_DEVICES);
    for name in list_dir(&platform).unwrap_or_default() {
        if !name.starts_with("amdgpu_xcp_") {
            continue;
        }
        let (card, render) = match drm_minors(&platform.join(&name)) {
            Ok(minors) => minors,
            Err(e) => {
                warnings.push(format!("partition {name} skipped: {e}"));
                continue;
            }
        };
        let (Some(card), Some(render)) = (card, render) else {
            // Inactive XCPs (SPX mode) have no DRM nodes at all; nothing to report.
            if card.is_some() || render.is_some() {
                warnings.push(format!(
                    "partition {name} skipped: it lacks a card or render node"
                ));
            }
            continue;
        };
        let Some(node) = by_render.get(&render).copied() else {
            // In SPX mode the unused XCPs keep DRM nodes without KFD nodes: not an error,
            // unless its card runs a multi-partition mode (then a partition is missing).
            tracing::debug!(xcp = %name, render, "XCP without KFD node ignored");
            continue;
        };
        let bdf = kfd_bdf(node);
        let Some((pci, parts, _)) = cards.iter_mut().find(|(pci, _, _)| pci.bdf == bdf) else {
            warnings.push(format!(
                "partition {name} skipped: its KFD node {} belongs to {bdf}, which is not a usable amdgpu card",
                node.id
            ));
            continue;
        };
        match partition_of(node, name.clone(), card, render) {
            Ok(p) if parts.iter().any(|q| q.index == p.index) => warnings.push(format!(
                "partition {name} skipped: {} already has a partition {}",
                pci.bdf, p.index
            )),
            Ok(p) => parts.push(p),
            Err(why) => warnings.push(format!("partition {name} skipped: {why}")),
        }
    }

    // 3. Cards with their partitions, identities and XGMI peers.
    let card_of_node: BTreeMap<u32, String> = cards
        .iter()
        .flat_map(|(pci, parts, _)| parts.iter().map(|p| (p.kfd_node, pci.bdf.clone())))
        .collect();
    let mut gpus = Vec::new();
    for (pci, mut parts, first) in cards {
        parts.sort_by_key(|p| p.index);
        let unique_id = first.u64("unique_id").unwrap_or(0);
        if unique_id == 0 {
            warnings.push(format!(
                "GPU {} skipped: KFD node {} has unique_id 0 or none, so ROCr (ROCR_VISIBLE_DEVICES) could not address it",
                pci.bdf, first.id
            ));
            continue;
        }
        let Some(vram_bytes) = pci.vram_bytes.filter(|v| *v > 0) else {
            warnings.push(format!(
                "GPU {} skipped: mem_info_vram_total is missing or 0, so its memory cannot be shared",
                pci.bdf
            ));
            continue;
        };
        if !(MIN_VRAM_BYTES..=MAX_VRAM_BYTES).contains(&vram_bytes) {
            warnings.push(format!(
                "GPU {} skipped: mem_info_vram_total {vram_bytes} bytes is outside {MIN_VRAM_BYTES}..={MAX_VRAM_BYTES} (not a real GPU's memory)",
                pci.bdf
            ));
            continue;
        }
        // A partition's own memory must fit in the card; otherwise use an even share.
        for p in &mut parts {
            if let Some(bytes) = p.mem_bytes
                && (bytes < (16 << 20) || bytes > vram_bytes)
            {
                warnings.push(format!(
                    "GPU {} partition {}: KFD mem_banks report {bytes} bytes, not within the card's {vram_bytes}; using an even share",
                    pci.bdf, p.index
                ));
                p.mem_bytes = None;
            }
        }
        let gfx = match first.u64("gfx_target_version").unwrap_or(0) {
            g if g < 1_000_000 => g as u32,
            g => {
                warnings.push(format!(
                    "GPU {}: gfx_target_version {g} is out of range; treated as unknown",
                    pci.bdf
                ));
                0
            }
        };
        let queues = match first.u64("num_cp_queues").unwrap_or(0) {
            q if q <= 1024 => q as u32,
            q => {
                warnings.push(format!(
                    "GPU {}: num_cp_queues {q} is out of range; reported as 0",
                    pci.bdf
                ));
                0
            }
        };
        if let (Some(mode), n) = (&pci.compute_partition, parts.len())
            && expected_partitions(mode).is_some_and(|want| want != n)
        {
            warnings.push(format!(
                "GPU {} runs {mode} but {n} partition(s) were found; the missing ones are not offered",
                pci.bdf
            ));
        }
        let mut peers: Vec<String> = parts
            .iter()
            .filter_map(|p| nodes.iter().find(|n| n.id == p.kfd_node))
            .flat_map(|n| n.xgmi_targets())
            .filter_map(|to| card_of_node.get(&to))
            .filter(|bdf| **bdf != pci.bdf)
            .cloned()
            .collect();
        peers.sort();
        peers.dedup();
        gpus.push(Gpu {
            market_name: market_name(pci.product_name.as_deref(), pci.device_id),
            bdf: pci.bdf,
            device_id: pci.device_id,
            numa: pci.numa,
            vram_bytes,
            compute_partition: pci.compute_partition,
            memory_partition: pci.memory_partition,
            partitioning_supported: pci.partitioning_supported,
            gfx_target_version: gfx,
            unique_id,
            cu_per_wgp: cu_per_wgp(gfx),
            compute_queues: queues,
            simd_count: u32::try_from(first.u64("simd_count").unwrap_or(0)).unwrap_or(0),
            xgmi_peers: peers,
            driver_version: pci.driver_version,
            partitions: parts,
        });
    }
    gpus.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    Ok(Discovery { gpus, warnings })
}

/// Partitions a compute mode implies on MI300-class parts.
fn expected_partitions(mode: &str) -> Option<usize> {
    match mode.to_ascii_uppercase().as_str() {
        "SPX" => Some(1),
        "DPX" => Some(2),
        "TPX" => Some(3),
        "QPX" => Some(4),
        "CPX" => Some(8),
        _ => None,
    }
}

fn partition_of(
    node: &KfdNode,
    device_key: String,
    card: u32,
    render: u32,
) -> Result<Partition, String> {
    let compute_units = node.compute_units();
    if compute_units > MAX_COMPUTE_UNITS {
        return Err(format!(
            "KFD node {} reports {compute_units} compute units (simd_count {:?} / simd_per_cu {:?}), more than any GPU has ({MAX_COMPUTE_UNITS})",
            node.id,
            node.properties.get("simd_count"),
            node.properties.get("simd_per_cu")
        ));
    }
    if compute_units == 0 {
        return Err(format!(
            "KFD node {} reports 0 compute units (simd_count {:?} / simd_per_cu {:?})",
            node.id,
            node.properties.get("simd_count"),
            node.properties.get("simd_per_cu")
        ));
    }
    Ok(Partition {
        index: partition_index_from_location_id(node.u64("location_id").unwrap_or(0)),
        device_key,
        kfd_node: node.id,
        card,
        render,
        compute_units,
        mem_bytes: node.mem_bytes,
    })
}

fn looks_like_bdf(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            market_name(Some("AMD Instinct MI210"), 0x740f),
            "AMD Instinct MI210"
        );
        assert_eq!(
            market_name(Some("Instinct MI210"), 0x740f),
            "AMD Instinct MI210"
        );
        assert_eq!(market_name(None, 0x740f), "AMD Instinct MI210");
        assert_eq!(market_name(None, 0x1234), "AMD GPU 1234");
        assert_eq!(market_name(Some("AMD X, rev: 2; b"), 1), "AMD X  rev  2  b");
        assert_eq!(
            market_name(Some("AMD Evil\n\u{1b}[31mRed\0\tX"), 1),
            "AMD Evil [31mRed X"
        );
        let long = "AMD ".to_owned() + &"Z".repeat(1 << 20);
        assert_eq!(market_name(Some(&long), 1).len(), MAX_NAME_CHARS);
        assert_eq!(
            market_name(Some("\n\0\u{7f}"), 0x740f),
            "AMD Instinct MI210"
        );
        assert_eq!(cu_per_wgp(90402), 1);
        assert_eq!(cu_per_wgp(110000), 2);
        assert_eq!(cu_per_wgp(120001), 2);
        assert!(looks_like_bdf("0000:05:00.0"));
        assert!(!looks_like_bdf("module"));
    }
}
