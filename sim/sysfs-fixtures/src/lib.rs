//! Real-shaped sysfs and `/dev` trees of AMD GPU nodes, for tests and the demo.
//!
//! A tree mirrors what the amdgpu and KFD drivers expose on a real node:
//!
//! ```text
//! <sysfs>/class/kfd/kfd/topology/nodes/<n>/{properties,io_links,p2p_links,mem_banks}
//! <sysfs>/devices/pci0000:00/<bdf>/{vendor,device,numa_node,mem_info_vram_total,product_name,
//!        current_compute_partition,current_memory_partition,available_compute_partition,
//!        drm/card<N>,drm/renderD<M>,driver -> bus/pci/drivers/amdgpu}
//! <sysfs>/bus/pci/drivers/amdgpu/<bdf> -> ../../../../devices/pci0000:00/<bdf>
//! <sysfs>/bus/pci/drivers/amdgpu/module -> ../../../../module/amdgpu   (module/amdgpu/version)
//! <sysfs>/class/drm/card<N> -> ../../devices/.../drm/card<N>
//! <sysfs>/devices/platform/amdgpu_xcp_<k>/drm/{card<N>,renderD<M>}
//! <dev>/kfd, <dev>/dri/card<N>, <dev>/dri/renderD<M>      (plain files standing for device nodes)
//! ```
//!
//! The KFD topology comes from real captures (`captures/*.kfd`, packed from
//! `/work/shared/testdata/kfd` with `tools/pack_capture.py`):
//! [`Capture::Mi210Xgmi`] (8 × MI210, two XGMI hives of 4), [`Capture::Mi300xCpx`] (8 × MI300X
//! in CPX mode: 63 partition nodes, the eighth GPU's last partition is absent from the
//! capture), [`Capture::OneGpu`] (a gfx9 node whose node 2 is a copy of node 1). The PCI,
//! DRM and XCP entries around them are synthesized from the KFD data, and
//! [`rdna_node`] synthesizes RDNA gfx11/gfx12 cards (2 SIMDs per CU, WGPs of 2 CUs).
//!
//! ```
//! let tree = hami_sysfs_fixtures::mi300x_cpx().unwrap();
//! assert!(tree.sysfs_root().join("class/kfd/kfd/topology/nodes/2/properties").exists());
//! // Break something the way a real node can be broken:
//! tree.remove("devices/platform/amdgpu_xcp_3/drm/renderD132").unwrap();
//! ```
//!
//! Trees live in a fresh directory under the system temp dir and are deleted on drop
//! (call [`FixtureTree::keep`] to keep one, e.g. for the demo).

pub mod archive;

use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use archive::parse_archive;

/// The real KFD captures shipped with this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// 8 × MI210 (gfx90a, 104 CUs), two XGMI hives of four, 2 CPU nodes.
    Mi210Xgmi,
    /// 8 × MI300X (gfx942) in CPX mode: 38 CUs per partition, 63 partition nodes.
    Mi300xCpx,
    /// One gfx9 GPU (Vega10, 64 CUs) plus a copy of it as node 2.
    OneGpu,
    /// 8 × MI308X (gfx942) in QPX/NPS4: 4 partitions of 20 CUs per card, each with its own
    /// 48 GiB memory bank; 32 partition nodes (upstream `testdata/topology-parsing-mi308`,
    /// packed without the `caches/` directories, which discovery does not read).
    Mi308xQpx,
}

impl Capture {
    /// The packed capture text.
    pub fn archive(self) -> &'static str {
        match self {
            Capture::Mi210Xgmi => include_str!("../captures/mi210-xgmi.kfd"),
            Capture::Mi300xCpx => include_str!("../captures/mi300x-cpx.kfd"),
            Capture::OneGpu => include_str!("../captures/one-gpu.kfd"),
            Capture::Mi308xQpx => include_str!("../captures/mi308x-qpx.kfd"),
        }
    }
}

/// A PCI GPU to synthesize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciGpu {
    /// PCI address, e.g. `0000:05:00.0`.
    pub bdf: String,
    /// PCI device id, e.g. `0x74a1`.
    pub device_id: u16,
    /// `numa_node` (-1 when the platform does not say).
    pub numa_node: i32,
    /// `mem_info_vram_total`, in bytes.
    pub vram_bytes: u64,
    /// `product_name` (absent on consumer cards and older kernels).
    pub product_name: Option<String>,
    /// `current_compute_partition` / `current_memory_partition` (absent when the GPU cannot
    /// be partitioned).
    pub partitions: Option<(String, String)>,
    /// DRM minor of the PCI function's own `card<N>`.
    pub card: u32,
    /// DRM minor of the PCI function's own `renderD<M>`.
    pub render: u32,
}

/// An XCP platform device (`amdgpu_xcp_<index>`) holding one more partition's DRM nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XcpDevice {
    /// `<index>` of `amdgpu_xcp_<index>`, numbered across the whole node (not per card).
    pub index: u32,
    /// DRM minor of the partition's `card<N>`.
    pub card: u32,
    /// DRM minor of the partition's `renderD<M>`.
    pub render: u32,
}

/// A sysfs + /dev tree in a temporary directory.
#[derive(Debug)]
pub struct FixtureTree {
    base: PathBuf,
    keep: bool,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

const KFD_NODES: &str = "class/kfd/kfd/topology/nodes";
const PCI_PARENT: &str = "devices/pci0000:00";
const AMDGPU_DRIVER: &str = "bus/pci/drivers/amdgpu";

impl FixtureTree {
    /// An empty tree (no GPU at all, but the directories a booted node has).
    pub fn empty() -> io::Result<Self> {
        let base = std::env::temp_dir().join(format!(
            "hami-sysfs-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        if base.exists() {
            std::fs::remove_dir_all(&base)?;
        }
        let tree = Self { base, keep: false };
        std::fs::create_dir_all(tree.sysfs_root().join(KFD_NODES))?;
        std::fs::create_dir_all(tree.sysfs_root().join(AMDGPU_DRIVER))?;
        std::fs::create_dir_all(tree.sysfs_root().join("class/drm"))?;
        std::fs::create_dir_all(tree.sysfs_root().join("module/amdgpu"))?;
        std::fs::write(tree.sysfs_root().join("module/amdgpu/version"), "6.12.12\n")?;
        std::os::unix::fs::symlink(
            "../../../../module/amdgpu",
            tree.sysfs_root().join(AMDGPU_DRIVER).join("module"),
        )?;
        std::fs::create_dir_all(tree.dev_root().join("dri"))?;
        std::fs::write(tree.dev_root().join("kfd"), "")?;
        Ok(tree)
    }

    /// The directory standing for `/sys`.
    pub fn sysfs_root(&self) -> PathBuf {
        self.base.join("sys")
    }

    /// The directory standing for `/dev`.
    pub fn dev_root(&self) -> PathBuf {
        self.base.join("dev")
    }

    /// Keeps the tree on disk after drop; returns its base directory.
    pub fn keep(mut self) -> PathBuf {
        self.keep = true;
        self.base.clone()
    }

    /// Writes (creating parents) a file relative to the sysfs root.
    pub fn write(&self, rel: &str, contents: &str) -> io::Result<()> {
        let path = self.sysfs_root().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, contents)
    }

    /// Removes a file, link or directory relative to the sysfs root.
    pub fn remove(&self, rel: &str) -> io::Result<()> {
        let path = self.sysfs_root().join(rel);
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_file(path)
        }
    }

    /// Removes a device node relative to the dev root (e.g. `dri/renderD128`).
    pub fn remove_dev(&self, rel: &str) -> io::Result<()> {
        std::fs::remove_file(self.dev_root().join(rel))
    }

    /// Sets one `name value` line of a KFD node's `properties` (adding it if absent).
    pub fn set_kfd_property(&self, node: u32, name: &str, value: &str) -> io::Result<()> {
        let rel = format!("{KFD_NODES}/{node}/properties");
        let path = self.sysfs_root().join(&rel);
        let text = std::fs::read_to_string(&path)?;
        let mut found = false;
        let mut out = String::new();
        for line in text.lines() {
            if line.split_whitespace().next() == Some(name) {
                found = true;
                let _ = writeln!(out, "{name} {value}");
            } else {
                let _ = writeln!(out, "{line}");
            }
        }
        if !found {
            let _ = writeln!(out, "{name} {value}");
        }
        std::fs::write(path, out)
    }

    /// Unpacks a capture under `class/kfd/kfd/topology/nodes`.
    pub fn add_capture(&self, capture: Capture) -> io::Result<()> {
        let entries = parse_archive(capture.archive())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        for entry in entries {
            self.write(&format!("{KFD_NODES}/{}", entry.path), entry.contents)?;
        }
        Ok(())
    }

    /// Adds a KFD node with the given `properties` text (and a `mem_banks/0` of
    /// `mem_bytes` when given).
    pub fn add_kfd_node(
        &self,
        node: u32,
        properties: &str,
        mem_bytes: Option<u64>,
    ) -> io::Result<()> {
        self.write(&format!("{KFD_NODES}/{node}/properties"), properties)?;
        if let Some(bytes) = mem_bytes {
            self.set_mem_bank(node, bytes)?;
        }
        Ok(())
    }

    /// Writes `mem_banks/0/properties` of a KFD node (captures of partitioned GPUs lack it).
    pub fn set_mem_bank(&self, node: u32, bytes: u64) -> io::Result<()> {
        self.write(
            &format!("{KFD_NODES}/{node}/mem_banks/0/properties"),
            &format!("heap_type 1\nsize_in_bytes {bytes}\nflags 0\nwidth 4096\nmem_clk_max 1300\n"),
        )
    }

    /// Adds a PCI GPU bound to amdgpu, with its DRM nodes and /dev entries.
    pub fn add_pci_gpu(&self, gpu: &PciGpu) -> io::Result<()> {
        let dev_rel = format!("{PCI_PARENT}/{}", gpu.bdf);
        let w = |name: &str, value: String| self.write(&format!("{dev_rel}/{name}"), &value);
        w("vendor", "0x1002\n".into())?;
        w("device", format!("0x{:04x}\n", gpu.device_id))?;
        w("numa_node", format!("{}\n", gpu.numa_node))?;
        w("mem_info_vram_total", format!("{}\n", gpu.vram_bytes))?;
        if let Some(name) = &gpu.product_name {
            w("product_name", format!("{name}\n"))?;
        }
        if let Some((compute, memory)) = &gpu.partitions {
            w("current_compute_partition", format!("{compute}\n"))?;
            w("current_memory_partition", format!("{memory}\n"))?;
            w("available_compute_partition", "SPX, DPX, QPX, CPX\n".into())?;
            w("available_memory_partition", "NPS1, NPS4\n".into())?;
        }
        let sys = self.sysfs_root();
        std::fs::create_dir_all(sys.join(&dev_rel).join(format!("drm/card{}", gpu.card)))?;
        std::fs::create_dir_all(
            sys.join(&dev_rel)
                .join(format!("drm/renderD{}", gpu.render)),
        )?;
        for node in [
            format!("card{}", gpu.card),
            format!("renderD{}", gpu.render),
        ] {
            std::os::unix::fs::symlink(
                "../..",
                sys.join(&dev_rel).join("drm").join(&node).join("device"),
            )?;
        }
        std::os::unix::fs::symlink(
            format!("../../../{AMDGPU_DRIVER}"),
            sys.join(&dev_rel).join("driver"),
        )?;
        std::os::unix::fs::symlink(
            format!("../../../../{dev_rel}"),
            sys.join(AMDGPU_DRIVER).join(&gpu.bdf),
        )?;
        std::os::unix::fs::symlink(
            format!("../../{dev_rel}/drm/card{}", gpu.card),
            sys.join("class/drm").join(format!("card{}", gpu.card)),
        )?;
        self.add_dev_nodes(gpu.card, gpu.render)
    }

    /// Adds an XCP platform device with its DRM nodes and /dev entries.
    pub fn add_xcp(&self, xcp: &XcpDevice) -> io::Result<()> {
        let rel = format!("devices/platform/amdgpu_xcp_{}", xcp.index);
        let sys = self.sysfs_root();
        std::fs::create_dir_all(sys.join(&rel).join(format!("drm/card{}", xcp.card)))?;
        std::fs::create_dir_all(sys.join(&rel).join(format!("drm/renderD{}", xcp.render)))?;
        std::os::unix::fs::symlink(
            format!("../../{rel}/drm/card{}", xcp.card),
            sys.join("class/drm").join(format!("card{}", xcp.card)),
        )?;
        self.add_dev_nodes(xcp.card, xcp.render)
    }

    fn add_dev_nodes(&self, card: u32, render: u32) -> io::Result<()> {
        std::fs::write(self.dev_root().join(format!("dri/card{card}")), "")?;
        std::fs::write(self.dev_root().join(format!("dri/renderD{render}")), "")
    }
}

impl Drop for FixtureTree {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }
}

/// A KFD `properties` file of one node as `(name, value)` pairs, from a capture.
pub fn capture_properties(capture: Capture, node: u32) -> Option<Vec<(String, String)>> {
    let entries = parse_archive(capture.archive()).ok()?;
    let wanted = format!("{node}/properties");
    let entry = entries.into_iter().find(|e| e.path == wanted)?;
    Some(
        entry
            .contents
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_owned(), v.trim().to_owned()))
            })
            .collect(),
    )
}

fn property(props: &[(String, String)], name: &str) -> u64 {
    props
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// PCI address of a KFD node: `domain`, bus `location_id >> 8`, device `(location_id >> 3) & 0x1f`.
pub fn bdf_of(domain: u64, location_id: u64) -> String {
    format!(
        "{domain:04x}:{:02x}:{:02x}.0",
        (location_id >> 8) & 0xff,
        (location_id >> 3) & 0x1f
    )
}

/// The MI210 node: 8 GPUs (KFD nodes 2..=9), hives {2,3,4,5} on NUMA 0 and {6,7,8,9} on
/// NUMA 1, 64 GiB each, cards 1..=8.
pub fn mi210_xgmi() -> io::Result<FixtureTree> {
    let tree = FixtureTree::empty()?;
    tree.add_capture(Capture::Mi210Xgmi)?;
    for node in 2..=9u32 {
        let props = capture_properties(Capture::Mi210Xgmi, node).unwrap_or_default();
        tree.add_pci_gpu(&PciGpu {
            bdf: bdf_of(property(&props, "domain"), property(&props, "location_id")),
            device_id: property(&props, "device_id") as u16,
            numa_node: if node < 6 { 0 } else { 1 },
            vram_bytes: 64 << 30,
            product_name: Some("AMD Instinct MI210".into()),
            partitions: None,
            card: node - 1,
            render: property(&props, "drm_render_minor") as u32,
        })?;
        tree.set_mem_bank(node, 64 << 30)?;
    }
    Ok(tree)
}

/// VRAM of one MI300X in the fixture (196288 MiB, as reported by the validated MI300X VF).
pub const MI300X_VRAM_BYTES: u64 = 196_288 << 20;

/// The MI300X CPX node: 8 GPUs in CPX/NPS1. GPU g (0..8) is PCI card `g*8+1` with the
/// render node of its partition 0; partitions 1..=7 are `amdgpu_xcp_<g*7+p-1>` with
/// `card<g*8+1+p>` and `renderD<128+g*8+p>`. Every partition node gets a synthesized
/// `mem_banks/0` of VRAM/8. GPU 7's partition 7 (renderD191) has no KFD node in the capture.
pub fn mi300x_cpx() -> io::Result<FixtureTree> {
    let tree = FixtureTree::empty()?;
    tree.add_capture(Capture::Mi300xCpx)?;
    for g in 0..8u32 {
        let first = 2 + g * 8;
        let props = capture_properties(Capture::Mi300xCpx, first).unwrap_or_default();
        tree.add_pci_gpu(&PciGpu {
            bdf: bdf_of(property(&props, "domain"), property(&props, "location_id")),
            device_id: property(&props, "device_id") as u16,
            numa_node: if g < 4 { 0 } else { 1 },
            vram_bytes: MI300X_VRAM_BYTES,
            product_name: Some("AMD Instinct MI300X OAM".into()),
            partitions: Some(("CPX".into(), "NPS1".into())),
            card: g * 8 + 1,
            render: 128 + g * 8,
        })?;
        for p in 1..8u32 {
            tree.add_xcp(&XcpDevice {
                index: g * 7 + p - 1,
                card: g * 8 + 1 + p,
                render: 128 + g * 8 + p,
            })?;
        }
        for p in 0..8u32 {
            let node = first + p;
            if capture_properties(Capture::Mi300xCpx, node).is_some() {
                tree.set_mem_bank(node, MI300X_VRAM_BYTES / 8)?;
            }
        }
    }
    Ok(tree)
}

/// VRAM of one MI308X in the fixture (192 GiB).
pub const MI308X_VRAM_BYTES: u64 = 192 << 30;

/// The MI308X QPX/NPS4 node, as the real capture shows it: 8 GPUs (KFD nodes `2+4g..`),
/// 4 partitions each with its own memory bank (from the capture). GPU g is PCI card
/// `g*8+1` holding partition 0 (`renderD<128+8g>`); the kernel creates 7 XCP platform
/// devices per card (`amdgpu_xcp_<g*7+p-1>`, `card<g*8+1+p>`, `renderD<128+8g+p>`), of
/// which only p = 1..=3 have KFD nodes in QPX mode (the render minors of the capture:
/// 128..131, 136..139, …). Domains 0 and 1 are NUMA nodes 0 and 1.
pub fn mi308x_qpx() -> io::Result<FixtureTree> {
    let tree = FixtureTree::empty()?;
    tree.add_capture(Capture::Mi308xQpx)?;
    for g in 0..8u32 {
        let first = 2 + g * 4;
        let props = capture_properties(Capture::Mi308xQpx, first).unwrap_or_default();
        let domain = property(&props, "domain");
        tree.add_pci_gpu(&PciGpu {
            bdf: bdf_of(domain, property(&props, "location_id")),
            device_id: property(&props, "device_id") as u16,
            numa_node: domain as i32,
            vram_bytes: MI308X_VRAM_BYTES,
            product_name: Some("AMD Instinct MI308X".into()),
            partitions: Some(("QPX".into(), "NPS4".into())),
            card: g * 8 + 1,
            render: property(&props, "drm_render_minor") as u32,
        })?;
        for p in 1..8u32 {
            tree.add_xcp(&XcpDevice {
                index: g * 7 + p - 1,
                card: g * 8 + 1 + p,
                render: 128 + g * 8 + p,
            })?;
        }
    }
    Ok(tree)
}

/// The 1-GPU capture: node 1 is `0000:19:00.0` (card1, renderD128); node 2, the capture's
/// copy of it, is given its own PCI function `0000:1a:00.0` (card2, renderD129). No
/// `product_name`, no partition files, NUMA -1 (a desktop board).
pub fn one_gpu() -> io::Result<FixtureTree> {
    let tree = FixtureTree::empty()?;
    tree.add_capture(Capture::OneGpu)?;
    for (node, bdf) in [(1u32, "0000:19:00.0"), (2, "0000:1a:00.0")] {
        tree.add_pci_gpu(&PciGpu {
            bdf: bdf.into(),
            device_id: 0x6860,
            numa_node: -1,
            vram_bytes: 16 << 30,
            product_name: None,
            partitions: None,
            card: node,
            render: 127 + node,
        })?;
    }
    Ok(tree)
}

/// An RDNA generation to synthesize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rdna {
    /// Radeon RX 7900 XTX: gfx1100, 96 CUs, 24 GiB, device 0x744c.
    Gfx11,
    /// Radeon RX 9070 XT: gfx1201, 64 CUs, 16 GiB, device 0x7550.
    Gfx12,
}

impl Rdna {
    /// `(gfx_target_version, device id, CUs, VRAM bytes, market name)`.
    pub fn parameters(self) -> (u32, u16, u32, u64, &'static str) {
        match self {
            Rdna::Gfx11 => (110_000, 0x744c, 96, 24 << 30, "AMD Radeon RX 7900 XTX"),
            Rdna::Gfx12 => (120_001, 0x7550, 64, 16 << 30, "AMD Radeon RX 9070 XT"),
        }
    }
}

/// KFD `properties` of a synthesized RDNA GPU (2 SIMDs per CU).
pub fn rdna_properties(kind: Rdna, location_id: u32, render: u32, unique_id: u64) -> String {
    let (gfx, device_id, cus, vram, _) = kind.parameters();
    format!(
        "cpu_cores_count 0\nsimd_count {}\nmem_banks_count 1\ncaches_count 0\nio_links_count 1\n\
         p2p_links_count 0\ncpu_core_id_base 0\nsimd_id_base 2147487744\nmax_waves_per_simd 16\n\
         lds_size_in_kb 64\ngds_size_in_kb 0\nnum_gws 64\nwave_front_size 32\narray_count 12\n\
         simd_arrays_per_engine 2\ncu_per_simd_array 8\nsimd_per_cu 2\nmax_slots_scratch_cu 32\n\
         gfx_target_version {gfx}\nvendor_id 4098\ndevice_id {device_id}\nlocation_id {location_id}\n\
         domain 0\ndrm_render_minor {render}\nhive_id 0\nnum_sdma_engines 2\nnum_sdma_xgmi_engines 0\n\
         num_sdma_queues_per_engine 6\nnum_cp_queues 8\nmax_engine_clk_fcompute 2500\n\
         local_mem_size {vram}\nfw_version 2390\ncapability 671588992\ndebug_prop 1495\n\
         sdma_fw_version 21\nunique_id {unique_id}\nnum_xcc 1\nmax_engine_clk_ccompute 4000\n",
        cus * 2
    )
}

/// Adds a CPU node 0 (if absent) and the given RDNA cards as KFD nodes 1.., PCI
/// `0000:0<k+3>:00.0`, card k+1, renderD 128+k, NUMA 0, unique ids 0x1000+k.
pub fn rdna_node(cards: &[Rdna]) -> io::Result<FixtureTree> {
    let tree = FixtureTree::empty()?;
    tree.add_kfd_node(
        0,
        "cpu_cores_count 16\nsimd_count 0\nmem_banks_count 1\ngfx_target_version 0\nvendor_id 0\n\
         device_id 0\nlocation_id 0\ndomain 0\ndrm_render_minor 0\nunique_id 0\n",
        Some(64 << 30),
    )?;
    for (k, kind) in cards.iter().enumerate() {
        let k = k as u32;
        let (_, device_id, _, vram, name) = kind.parameters();
        let bus = k + 3;
        let location_id = bus << 8;
        tree.add_kfd_node(
            k + 1,
            &rdna_properties(*kind, location_id, 128 + k, 0x1000 + u64::from(k)),
            Some(vram),
        )?;
        tree.add_pci_gpu(&PciGpu {
            bdf: bdf_of(0, u64::from(location_id)),
            device_id,
            numa_node: 0,
            vram_bytes: vram,
            product_name: Some(name.into()),
            partitions: None,
            card: k + 1,
            render: 128 + k,
        })?;
    }
    Ok(tree)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_unpack_completely() {
        for (capture, files) in [
            (Capture::Mi210Xgmi, 100),
            (Capture::Mi300xCpx, 4099),
            (Capture::OneGpu, 209),
            (Capture::Mi308xQpx, 1290),
        ] {
            assert_eq!(parse_archive(capture.archive()).unwrap().len(), files);
        }
    }

    #[test]
    fn mi300x_tree_has_pci_xcp_and_dev_entries() {
        let tree = mi300x_cpx().unwrap();
        let sys = tree.sysfs_root();
        let pci = sys.join("bus/pci/drivers/amdgpu/0000:05:00.0");
        assert_eq!(
            std::fs::read_to_string(pci.join("vendor")).unwrap(),
            "0x1002\n"
        );
        assert_eq!(
            std::fs::read_to_string(pci.join("device")).unwrap(),
            "0x74a1\n"
        );
        assert!(pci.join("drm/renderD128").is_dir());
        assert!(pci.join("driver/module/version").is_file());
        assert!(
            sys.join("devices/platform/amdgpu_xcp_0/drm/renderD129")
                .is_dir()
        );
        assert!(
            sys.join("class/drm/card2/device").exists() || sys.join("class/drm/card2").exists()
        );
        assert!(tree.dev_root().join("dri/renderD191").is_file());
        assert!(!sys.join("class/kfd/kfd/topology/nodes/65").exists());
        let base = tree.sysfs_root();
        drop(tree);
        assert!(!base.exists(), "dropped trees are removed");
    }

    #[test]
    fn mi308x_tree_follows_the_capture() {
        let tree = mi308x_qpx().unwrap();
        let sys = tree.sysfs_root();
        let nodes = sys.join("class/kfd/kfd/topology/nodes");
        // Render minors of the capture: 4 per card, the card's block of 8 starting at 128.
        let render = |n: u32| {
            capture_properties(Capture::Mi308xQpx, n)
                .map(|p| property(&p, "drm_render_minor"))
                .unwrap()
        };
        assert_eq!((2..6).map(render).collect::<Vec<_>>(), [128, 129, 130, 131]);
        assert_eq!(render(6), 136);
        assert!(nodes.join("33/mem_banks/0/properties").is_file());
        assert!(!nodes.join("34").exists());
        let pci = sys.join("bus/pci/drivers/amdgpu/0000:0a:00.0");
        assert_eq!(
            std::fs::read_to_string(pci.join("current_compute_partition")).unwrap(),
            "QPX\n"
        );
        assert!(pci.join("drm/renderD128").is_dir());
        assert!(sys.join("bus/pci/drivers/amdgpu/0001:c9:00.0").exists());
        assert!(
            sys.join("devices/platform/amdgpu_xcp_2/drm/renderD131")
                .is_dir()
        );
        // XCPs beyond QPX's 4 partitions exist with DRM nodes but no KFD node.
        assert!(
            sys.join("devices/platform/amdgpu_xcp_3/drm/renderD132")
                .is_dir()
        );
    }

    #[test]
    fn property_edits() {
        let tree = rdna_node(&[Rdna::Gfx11, Rdna::Gfx12]).unwrap();
        tree.set_kfd_property(1, "simd_count", "0").unwrap();
        tree.set_kfd_property(1, "new_prop", "7").unwrap();
        let text = std::fs::read_to_string(
            tree.sysfs_root()
                .join("class/kfd/kfd/topology/nodes/1/properties"),
        )
        .unwrap();
        assert!(text.contains("simd_count 0\n") && text.contains("new_prop 7\n"));
        assert!(text.contains("gfx_target_version 110000"));
    }
}
