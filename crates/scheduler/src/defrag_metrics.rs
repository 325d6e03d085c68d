//! The defragmentation measure (issue 32, D-30) as gauges: `hami_defrag_core::measure` over
//! the node snapshots a scrape copied under the state lock, measured after the lock is
//! released ([`crate::metrics::Metrics::encode`]), never on the Filter path.
//!
//! Per GPU (the labels of the other `hami_gpu_*` families): free and stranded memory in
//! bytes and compute in percent of the GPU (AMD CUs converted, not rounded), the
//! fragmentation ratio, and the largest reference slice that fits as a state set
//! (`shape` = `1/8`, `1/4`, `1/2`, `1/1`; 1 on the largest that fits, 0 on the others, all 0
//! when none fits: a fixed four series per GPU, none appearing or vanishing as it changes).
//! Per node: its fragmentation ratio and largest slice. Per vendor: the fleet's sums.

use hami_defrag_core::{CardMeasure, Shape, Totals, measure};
use hami_protocol::names::Vendor;
use prometheus_client::registry::Registry;

use crate::metrics::{GaugeFamily, Labels, gpu_labels};
use crate::snapshot::{Gpu, NodeSnapshot};

const MIB: f64 = 1_048_576.0;

/// Compute in percent of `gpu` (AMD: CUs x 100 / the GPU's CUs; NVIDIA: already percent).
fn core_percent(gpu: &Gpu, cores: u64) -> f64 {
    match gpu.vendor {
        Vendor::Amd if gpu.info.devcore > 0 => cores as f64 * 100.0 / f64::from(gpu.info.devcore),
        Vendor::Amd => 0.0,
        Vendor::Nvidia => cores as f64,
    }
}

struct Families {
    mem_free: GaugeFamily,
    core_free: GaugeFamily,
    mem_stranded: GaugeFamily,
    core_stranded: GaugeFamily,
    fragmentation: GaugeFamily,
    /// None for the fleet: a slice fits a card, not a vendor.
    largest: Option<GaugeFamily>,
}

impl Families {
    fn new(registry: &mut Registry, scope: &str, whom: &str, largest: bool) -> Self {
        let mut gauge = |name: &str, help: String| {
            let family = GaugeFamily::default();
            registry.register(format!("{scope}_{name}"), help, family.clone());
            family
        };
        Self {
            mem_free: gauge("memory_free_bytes", format!("Device memory free on {whom}, in bytes")),
            core_free: gauge(
                "core_free_ratio",
                format!("Compute free on {whom}, in percent of one GPU, not CUs (AMD: free CUs x 100 / the GPU's CUs, not rounded)"),
            ),
            mem_stranded: gauge(
                "memory_stranded_bytes",
                format!("Device memory free on {whom} that no slice can use (its GPU has no compute or no share left), in bytes"),
            ),
            core_stranded: gauge(
                "core_stranded_ratio",
                format!("Compute free on {whom} that no slice can use (its GPU has no memory or no share left), in percent of one GPU"),
            ),
            fragmentation: gauge(
                "fragmentation_ratio",
                format!("Fragmentation of {whom}: 1 - (free memory reference slices of 1/1, 1/2, 1/4, 1/8 of a card can still take, packed largest first by the scheduler's fit) / free memory; 0 to 1, 0 when nothing is free"),
            ),
            largest: largest.then(|| gauge(
                "largest_slice",
                format!("The largest reference slice (shape: 1/8, 1/4, 1/2, 1/1 of a card's memory and compute) that fits {whom} by the scheduler's fit: 1 on that shape, 0 on the others"),
            )),
        }
    }

    /// Sets every family but `largest` for `labels`; cores are in percent already.
    fn set(&self, labels: &Labels, t: &Totals, core_free: f64, core_stranded: f64) {
        self.mem_free
            .get_or_create(labels)
            .set(t.free_mib as f64 * MIB);
        self.core_free.get_or_create(labels).set(core_free);
        self.mem_stranded
            .get_or_create(labels)
            .set(t.stranded_mib as f64 * MIB);
        self.core_stranded.get_or_create(labels).set(core_stranded);
        self.fragmentation
            .get_or_create(labels)
            .set(t.fragmentation);
    }

    fn set_largest(&self, labels: &Labels, largest: Option<Shape>) {
        let Some(family) = &self.largest else {
            return;
        };
        for shape in Shape::ALL {
            let mut labels = labels.clone();
            labels.push(("shape".into(), shape.as_str().into()));
            family
                .get_or_create(&labels)
                .set(if largest == Some(shape) { 1.0 } else { 0.0 });
        }
    }
}

/// One card's measure as node totals (the per-GPU families share [`Families::set`]).
fn card_totals(c: &CardMeasure) -> Totals {
    Totals {
        cards: 1,
        free_mib: c.free_mib,
        free_cores: c.free_cores,
        stranded_mib: c.stranded_mib,
        stranded_cores: c.stranded_cores,
        placeable_mib: c.placeable_mib,
        fragmentation: c.fragmentation,
        ..Totals::default()
    }
}

/// Registers the defragmentation families on `registry`, measured from `nodes`.
pub fn register(registry: &mut Registry, nodes: &[NodeSnapshot]) {
    let gpus = Families::new(registry, "hami_gpu", "a GPU", true);
    let per_node = Families::new(registry, "hami_node_gpu", "a node's GPUs together", true);
    let fleet = Families::new(
        registry,
        "hami_cluster_gpu",
        "a vendor's GPUs together",
        false,
    );
    let fleet_idle = GaugeFamily::default();
    registry.register(
        "hami_cluster_gpu_idle_cards",
        "GPUs of a vendor with nothing taken",
        fleet_idle.clone(),
    );
    let measured = measure(nodes);
    // Compute per vendor in percent of one GPU: CUs of different GPUs do not add up.
    let mut vendor_cores = [(0.0, 0.0); 2];
    for (node, m) in nodes.iter().zip(&measured.nodes) {
        if m.cards.is_empty() {
            continue;
        }
        let (mut node_free, mut node_stranded) = (0.0, 0.0);
        for (gpu, card) in node.devices.gpus.iter().zip(&m.cards) {
            let labels = gpu_labels(&m.node, gpu);
            let (free, stranded) = (
                core_percent(gpu, card.free_cores),
                core_percent(gpu, card.stranded_cores),
            );
            gpus.set(&labels, &card_totals(card), free, stranded);
            gpus.set_largest(&labels, card.largest);
            node_free += free;
            node_stranded += stranded;
            let v = &mut vendor_cores[usize::from(gpu.vendor == Vendor::Nvidia)];
            v.0 += free;
            v.1 += stranded;
        }
        let labels: Labels = vec![("node".into(), m.node.clone())];
        per_node.set(&labels, &m.totals, node_free, node_stranded);
        per_node.set_largest(&labels, m.largest);
    }
    for (i, (vendor, t)) in [("amd", &measured.amd), ("nvidia", &measured.nvidia)]
        .into_iter()
        .enumerate()
    {
        if t.cards == 0 {
            continue;
        }
        let labels: Labels = vec![("vendor".into(), vendor.into())];
        fleet.set(&labels, t, vendor_cores[i].0, vendor_cores[i].1);
        fleet_idle.get_or_create(&labels).set(t.idle_cards as f64);
    }
}
