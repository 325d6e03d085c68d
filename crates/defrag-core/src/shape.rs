//! Reference slice shapes and "does this slice fit that card?" by the scheduler's own fit
//! rule. scheduler-core has no public one-card fit (its per-GPU `check` is private), so the
//! question is asked of `QuickFit` on the card's node with the card as the only allowed
//! uuid (`use-gpuuuid`): the same checks, in the same order, on that one card.

use hami_protocol::names::Vendor;
use hami_protocol::requests::{ContainerKind, ContainerRequest, DeviceRequest, MemoryRequest};
use hami_protocol::selection::{DeviceSelector, GpuPolicy, GpuPolicyKind, NodePolicy};
use hami_scheduler_core::fit::quick::QuickFit;
use hami_scheduler_core::fit::{FitRequest, Selectors, demand};
use hami_scheduler_core::snapshot::{Gpu, GpuUsage, NodeSnapshot};
use serde::{Deserialize, Serialize};

/// A reference slice: a fraction of one card, of its memory and of its compute alike
/// (the 1/8, 1/4 and 1/2, and the whole card).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// 1/8 of a card.
    Eighth,
    /// 1/4 of a card.
    Quarter,
    /// 1/2 of a card.
    Half,
    /// The whole card (a card that takes one pod only, such as a hard partition, packs
    /// nothing smaller twice: without it an idle one would read as half stranded).
    Whole,
}

impl Shape {
    /// Largest first.
    pub const ALL: [Shape; 4] = [Shape::Whole, Shape::Half, Shape::Quarter, Shape::Eighth];

    /// The card is divided by this.
    pub const fn divisor(self) -> u64 {
        match self {
            Shape::Eighth => 8,
            Shape::Quarter => 4,
            Shape::Half => 2,
            Shape::Whole => 1,
        }
    }

    /// `1/8`, `1/4`, `1/2`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Shape::Eighth => "1/8",
            Shape::Quarter => "1/4",
            Shape::Half => "1/2",
            Shape::Whole => "1/1",
        }
    }

    /// The request of one container asking for this slice of `gpu`: `devmem / k` MiB and
    /// `100 / k` % of its compute (rounded down: 1/8 is 12 %; on AMD the scheduler turns
    /// that into CUs, whole WGPs on RDNA).
    pub fn request(self, gpu: &Gpu) -> DeviceRequest {
        DeviceRequest {
            count: 1,
            memory: MemoryRequest::Mib((gpu.info.devmem / self.divisor()).max(1)),
            cores_percent: u32::try_from(100 / self.divisor()).unwrap_or(1),
            priority: None,
            added_limits: Vec::new(),
        }
    }

    /// MiB and cores this slice takes on `gpu`, as the scheduler charges them.
    pub fn demand(self, gpu: &Gpu) -> (u64, u64) {
        demand(gpu, &self.request(gpu))
    }
}

/// Whether `shape` fits card `gpu` of `node` by the scheduler's fit rule, given the node's
/// usage now.
pub fn shape_fits(node: &NodeSnapshot, gpu: usize, shape: Shape) -> bool {
    let card = &node.devices.gpus[gpu];
    let request = shape.request(card);
    let container = ContainerRequest {
        name: "reference".into(),
        kind: ContainerKind::App,
        amd: (card.vendor == Vendor::Amd).then(|| request.clone()),
        nvidia: (card.vendor == Vendor::Nvidia).then_some(request),
    };
    let only = DeviceSelector {
        use_uuids: vec![card.info.id.clone()],
        ..DeviceSelector::default()
    };
    let selectors = match card.vendor {
        Vendor::Amd => Selectors {
            amd: only,
            nvidia: DeviceSelector::default(),
        },
        Vendor::Nvidia => Selectors {
            amd: DeviceSelector::default(),
            nvidia: only,
        },
    };
    let containers = [container];
    let req = FitRequest {
        containers: &containers,
        selectors: &selectors,
        gpu_policy: GpuPolicy {
            kind: GpuPolicyKind::Binpack,
            numa: false,
        },
        node_policy: NodePolicy::Binpack,
    };
    QuickFit::new(&req).fits(node)
}

/// What is free on a card: MiB, cores (AMD CUs, NVIDIA percent) and shares. An unhealthy
/// card offers nothing.
pub fn free(gpu: &Gpu, usage: &GpuUsage) -> (u64, u64, u32) {
    if !gpu.info.health {
        return (0, 0, 0);
    }
    (
        gpu.info.devmem.saturating_sub(usage.mem_mib),
        u64::from(gpu.info.devcore).saturating_sub(usage.cores),
        gpu.info.count.saturating_sub(usage.used),
    )
}

/// The card's free fraction in percent: the smaller of free memory and free compute (a
/// slice needs both), 0 with no share left.
pub fn free_percent(gpu: &Gpu, usage: &GpuUsage) -> u64 {
    let (mem, cores, shares) = free(gpu, usage);
    if shares == 0 || gpu.info.devmem == 0 || gpu.info.devcore == 0 {
        return 0;
    }
    let m = mem * 100 / gpu.info.devmem;
    let c = cores * 100 / u64::from(gpu.info.devcore);
    m.min(c)
}
