//! Measure (no action): per card, per node and for the fleet, what is free, what is
//! stranded, the largest reference slice that still fits, and how fragmented the free
//! capacity is.
//!
//! - *stranded*: free MiB on a card with no free compute or no share left (nothing can use
//!   it), and free compute on a card with no free MiB or no share left.
//! - *largest*: the largest reference [`Shape`] that fits the card by the scheduler's fit
//!   rule ([`shape_fits`]); for a node, the largest over its cards.
//! - *placeable*: the free MiB that reference slices can still take, packed largest first,
//!   each one by the fit rule and charged as the scheduler charges it.
//! - *fragmentation*: `1 − placeable / free` (MiB). "Largest placeable" is read as the
//!   placeable total, not the single largest slice: with the single slice an idle card
//!   (two 1/2 slices) would read as 50 % fragmented. 0 when nothing is free.

use hami_protocol::names::Vendor;
use hami_scheduler_core::snapshot::NodeSnapshot;
use serde::{Deserialize, Serialize};

use crate::shape::{Shape, free, shape_fits};

/// One card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CardMeasure {
    /// Registered device id.
    pub card: String,
    /// Registered type, e.g. `AMD Instinct MI300X`.
    pub device_type: String,
    /// `amd` or `nvidia`.
    pub vendor: String,
    /// Registered healthy (an unhealthy card offers nothing).
    pub healthy: bool,
    /// Device memory in MiB.
    pub total_mib: u64,
    /// AMD CUs, NVIDIA percent.
    pub total_cores: u64,
    /// Free MiB.
    pub free_mib: u64,
    /// Free cores.
    pub free_cores: u64,
    /// Free shares (pods it may still take).
    pub free_shares: u32,
    /// Free MiB nothing can use.
    pub stranded_mib: u64,
    /// Free cores nothing can use.
    pub stranded_cores: u64,
    /// The largest reference slice that fits.
    pub largest: Option<Shape>,
    /// Free MiB reference slices can still take.
    pub placeable_mib: u64,
    /// `1 − placeable / free`.
    pub fragmentation: f64,
}

/// One node: its cards, and their sums.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeMeasure {
    /// The node.
    pub node: String,
    /// Sums over its cards.
    pub totals: Totals,
    /// The largest reference slice that fits one of its cards.
    pub largest: Option<Shape>,
    /// Every card, in registration order.
    pub cards: Vec<CardMeasure>,
}

/// Sums over cards.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Totals {
    /// Cards counted.
    pub cards: usize,
    /// Cards with nothing taken.
    pub idle_cards: usize,
    /// Free MiB.
    pub free_mib: u64,
    /// Free cores (AMD CUs and NVIDIA percent are summed per vendor only in
    /// [`FleetMeasure`]; here they are as the cards report them).
    pub free_cores: u64,
    /// Stranded MiB.
    pub stranded_mib: u64,
    /// Stranded cores.
    pub stranded_cores: u64,
    /// Placeable MiB.
    pub placeable_mib: u64,
    /// `1 − placeable / free`.
    pub fragmentation: f64,
}

impl Totals {
    fn add(&mut self, c: &CardMeasure) {
        self.cards += 1;
        self.idle_cards +=
            usize::from(c.healthy && c.free_mib == c.total_mib && c.free_cores == c.total_cores);
        self.free_mib += c.free_mib;
        self.free_cores += c.free_cores;
        self.stranded_mib += c.stranded_mib;
        self.stranded_cores += c.stranded_cores;
        self.placeable_mib += c.placeable_mib;
        self.fragmentation = fragmentation(self.placeable_mib, self.free_mib);
    }

    fn merge(&mut self, o: &Totals) {
        self.cards += o.cards;
        self.idle_cards += o.idle_cards;
        self.free_mib += o.free_mib;
        self.free_cores += o.free_cores;
        self.stranded_mib += o.stranded_mib;
        self.stranded_cores += o.stranded_cores;
        self.placeable_mib += o.placeable_mib;
        self.fragmentation = fragmentation(self.placeable_mib, self.free_mib);
    }
}

fn fragmentation(placeable: u64, free: u64) -> f64 {
    if free == 0 {
        0.0
    } else {
        (1.0 - placeable as f64 / free as f64).clamp(0.0, 1.0)
    }
}

/// The fleet: per node, and sums per vendor (CUs and NVIDIA percent do not add up).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetMeasure {
    /// Sums over AMD cards.
    pub amd: Totals,
    /// Sums over NVIDIA cards.
    pub nvidia: Totals,
    /// Every node, in the order given.
    pub nodes: Vec<NodeMeasure>,
}

impl FleetMeasure {
    /// The `n` most fragmented nodes with free memory (ties: most free MiB, then name).
    pub fn top_fragmented(&self, n: usize) -> Vec<&NodeMeasure> {
        let mut nodes: Vec<&NodeMeasure> = self
            .nodes
            .iter()
            .filter(|m| m.totals.free_mib > 0)
            .collect();
        nodes.sort_by(|a, b| {
            b.totals
                .fragmentation
                .total_cmp(&a.totals.fragmentation)
                .then(b.totals.free_mib.cmp(&a.totals.free_mib))
                .then(a.node.cmp(&b.node))
        });
        nodes.truncate(n);
        nodes
    }
}

/// Measures every card of `node`.
pub fn measure_node(node: &NodeSnapshot) -> NodeMeasure {
    // One scratch copy for the packing; its usage is put back after each card.
    let mut scratch = node.clone();
    let mut totals = Totals::default();
    let mut cards = Vec::with_capacity(node.devices.gpus.len());
    for (i, gpu) in node.devices.gpus.iter().enumerate() {
        let usage = node.usage[i];
        let (free_mib, free_cores, free_shares) = free(gpu, &usage);
        let no_share = free_shares == 0;
        let largest = Shape::ALL
            .into_iter()
            .find(|s| gpu.info.health && shape_fits(node, i, *s));
        let mut placeable_mib = 0;
        if largest.is_some() {
            for shape in Shape::ALL {
                // Bounded by the card's shares: each slice takes one.
                for _ in 0..=gpu.info.count {
                    if !shape_fits(&scratch, i, shape) {
                        break;
                    }
                    let (mem, cores) = shape.demand(gpu);
                    let u = &mut scratch.usage[i];
                    u.used += 1;
                    u.mem_mib += mem;
                    u.cores += cores;
                    placeable_mib += mem;
                }
            }
            scratch.usage[i] = usage;
        }
        let card = CardMeasure {
            card: gpu.info.id.clone(),
            device_type: gpu.info.device_type.clone(),
            vendor: gpu.vendor.word().to_ascii_lowercase(),
            healthy: gpu.info.health,
            total_mib: gpu.info.devmem,
            total_cores: u64::from(gpu.info.devcore),
            free_mib,
            free_cores,
            free_shares,
            stranded_mib: if free_cores == 0 || no_share {
                free_mib
            } else {
                0
            },
            stranded_cores: if free_mib == 0 || no_share {
                free_cores
            } else {
                0
            },
            largest,
            placeable_mib: placeable_mib.min(free_mib),
            fragmentation: fragmentation(placeable_mib.min(free_mib), free_mib),
        };
        totals.add(&card);
        cards.push(card);
    }
    let largest = cards.iter().filter_map(|c| c.largest).max();
    NodeMeasure {
        node: node.devices.name.clone(),
        totals,
        largest,
        cards,
    }
}

/// Measures every node.
pub fn measure<'a>(nodes: impl IntoIterator<Item = &'a NodeSnapshot>) -> FleetMeasure {
    let mut fleet = FleetMeasure {
        amd: Totals::default(),
        nvidia: Totals::default(),
        nodes: Vec::new(),
    };
    for node in nodes {
        let m = measure_node(node);
        for (card, gpu) in m.cards.iter().zip(&node.devices.gpus) {
            let mut one = Totals::default();
            one.add(card);
            match gpu.vendor {
                Vendor::Amd => fleet.amd.merge(&one),
                Vendor::Nvidia => fleet.nvidia.merge(&one),
            }
        }
        fleet.nodes.push(m);
    }
    fleet
}
