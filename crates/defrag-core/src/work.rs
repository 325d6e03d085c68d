//! The planner's scratch copy of the cluster: node usage that moves change, where each pod
//! is, and "where would this pod go now?" by the scheduler's fit.

use std::collections::HashMap;

use hami_protocol::requests::ContainerKind;
use hami_protocol::selection::{GpuPolicy, GpuPolicyKind, NodePolicy};
use hami_scheduler_core::fit::quick::QuickFit;
use hami_scheduler_core::fit::{FitRequest, Placement, Selectors, fit_node};
use hami_scheduler_core::snapshot::NodeSnapshot;
use hami_scheduler_core::usage::{DeviceCharge, collapse};

use crate::input::{Cluster, PodRequest};

/// What a pod holds on one card of its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) gpu: usize,
    pub(crate) mem: u64,
    pub(crate) cores: u64,
    pub(crate) slots: u32,
}

/// Where a pod is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct At {
    /// `None`: its node is not in the snapshot (never a candidate).
    pub(crate) node: Option<usize>,
    pub(crate) slots: Vec<Slot>,
}

/// The scratch cluster.
#[derive(Debug, Clone)]
pub(crate) struct Work {
    pub(crate) nodes: Vec<NodeSnapshot>,
    pub(crate) index: HashMap<String, usize>,
    pub(crate) at: Vec<At>,
    /// Pods per node, in pod order.
    by_node: Vec<Vec<usize>>,
}

/// A card: (node index, GPU index).
pub(crate) type CardAt = (usize, usize);

impl Work {
    pub(crate) fn new(cluster: &Cluster) -> Self {
        let nodes = cluster.nodes.clone();
        let index: HashMap<String, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.devices.name.clone(), i))
            .collect();
        let mut by_node = vec![Vec::new(); nodes.len()];
        let at = cluster
            .pods
            .iter()
            .enumerate()
            .map(|(p, pod)| {
                let node = index.get(&pod.node).copied();
                let slots = node.map_or_else(Vec::new, |n| slots_of(&nodes[n], &pod.charges));
                if let Some(n) = node {
                    by_node[n].push(p);
                }
                At { node, slots }
            })
            .collect();
        Self {
            nodes,
            index,
            at,
            by_node,
        }
    }

    /// Pods on `node` holding a slice of card `gpu`.
    pub(crate) fn pods_on_card(&self, (node, gpu): CardAt) -> Vec<usize> {
        self.by_node[node]
            .iter()
            .copied()
            .filter(|p| self.at[*p].slots.iter().any(|s| s.gpu == gpu))
            .collect()
    }

    /// Pods on `node`.
    pub(crate) fn pods_on(&self, node: usize) -> &[usize] {
        &self.by_node[node]
    }

    /// Takes pod `p`'s slices off its node (it is evicted).
    pub(crate) fn uncharge(&mut self, p: usize) {
        let Some(n) = self.at[p].node.take() else {
            return;
        };
        for s in &self.at[p].slots {
            let u = &mut self.nodes[n].usage[s.gpu];
            u.used = u.used.saturating_sub(s.slots);
            u.mem_mib = u.mem_mib.saturating_sub(s.mem);
            u.cores = u.cores.saturating_sub(s.cores);
        }
        self.by_node[n].retain(|q| *q != p);
        self.at[p].slots.clear();
    }

    /// Puts pod `p` on `node` holding `slots` (reserved there).
    pub(crate) fn charge(&mut self, p: usize, node: usize, slots: Vec<Slot>) {
        self.uncharge(p);
        for s in &slots {
            let u = &mut self.nodes[node].usage[s.gpu];
            u.used = u.used.saturating_add(s.slots);
            u.mem_mib = u.mem_mib.saturating_add(s.mem);
            u.cores = u.cores.saturating_add(s.cores);
        }
        let list = &mut self.by_node[node];
        let pos = list.partition_point(|q| *q < p);
        list.insert(pos, p);
        self.at[p] = At {
            node: Some(node),
            slots,
        };
    }

    /// Where `pod` would go now by the scheduler's fit: on the fullest nodes that fit it
    /// first (best fit keeps whole cards free), on the cards the fit picks there under
    /// binpack (the pod's own mutex policy is kept: it changes what fits). Never on a node
    /// of `skip`, nor on a card of `fence` (they are marked held whole for the question,
    /// which the fit refuses). The first of the `tries` best nodes whose placement `accept`
    /// takes is returned.
    pub(crate) fn place(
        &mut self,
        request: &PodRequest,
        skip: &dyn Fn(usize) -> bool,
        fence: &[CardAt],
        accept: &dyn Fn(&Work, usize, &[Slot]) -> bool,
        tries: usize,
    ) -> Option<(usize, Vec<Slot>)> {
        let held: Vec<bool> = fence
            .iter()
            .map(|&(n, g)| std::mem::replace(&mut self.nodes[n].held_whole[g], true))
            .collect();
        let fit = fit_request(request);
        let quick = QuickFit::new(&fit);
        let mut fitting: Vec<(u64, usize)> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(n, node)| !skip(*n) && quick.fits(node))
            .map(|(n, node)| (fullness(node), n))
            .collect();
        // Only the best few are tried: a partial selection, not a sort of every node.
        let order = |a: &(u64, usize), b: &(u64, usize)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
        let tries = tries.max(1);
        if fitting.len() > tries {
            fitting.select_nth_unstable_by(tries - 1, order);
            fitting.truncate(tries);
        }
        fitting.sort_by(order);
        let mut found = None;
        for &(_, n) in &fitting {
            let Ok(placement) = fit_node(&self.nodes[n], &fit) else {
                continue;
            };
            let slots = placement_slots(&self.nodes[n], &request.containers, &placement);
            if accept(self, n, &slots) {
                found = Some((n, slots));
                break;
            }
        }
        for (&(n, g), was) in fence.iter().zip(held) {
            self.nodes[n].held_whole[g] = was;
        }
        found
    }
}

/// The request as the planner fits it: the pod's containers and selectors, binpack on
/// the node's cards unless the pod asks for mutex.
pub(crate) fn fit_request(request: &PodRequest) -> FitRequest<'_> {
    let kind = match request.gpu_policy.kind {
        GpuPolicyKind::Mutex => GpuPolicyKind::Mutex,
        _ => GpuPolicyKind::Binpack,
    };
    FitRequest {
        containers: &request.containers,
        selectors: &request.selectors,
        gpu_policy: GpuPolicy {
            kind,
            numa: request.gpu_policy.numa,
        },
        node_policy: NodePolicy::Binpack,
    }
}

/// Memory used per mille of the node's memory: the best-fit order of target nodes.
fn fullness(node: &NodeSnapshot) -> u64 {
    let (used, total) = node
        .devices
        .gpus
        .iter()
        .zip(&node.usage)
        .fold((0u64, 0u64), |(u, t), (g, us)| {
            (u + us.mem_mib.min(g.info.devmem), t + g.info.devmem)
        });
    used.saturating_mul(1000).checked_div(total).unwrap_or(0)
}

/// What a placement charges on its node, per card (`usage::collapse`, as the informer
/// will charge it).
pub(crate) fn placement_slots(
    node: &NodeSnapshot,
    containers: &[hami_protocol::requests::ContainerRequest],
    placement: &Placement,
) -> Vec<Slot> {
    let kinds: Vec<ContainerKind> = containers.iter().map(|c| c.kind).collect();
    let charges: Vec<DeviceCharge> = placement
        .runs
        .values()
        .flat_map(|runs| collapse(&kinds, runs))
        .collect();
    slots_of(node, &charges)
}

/// Charges as slots of `node` (charges on cards it does not register are dropped, as
/// `NodeSnapshot::charge` drops them).
pub(crate) fn slots_of(node: &NodeSnapshot, charges: &[DeviceCharge]) -> Vec<Slot> {
    let mut slots: Vec<Slot> = charges
        .iter()
        .filter_map(|c| {
            let gpu = node.devices.gpus.iter().position(|g| g.info.id == c.uuid)?;
            Some(Slot {
                gpu,
                mem: c.mem_mib,
                cores: c.cores,
                slots: c.slots,
            })
        })
        .collect();
    slots.sort_by_key(|s| s.gpu);
    slots
}

/// Slots of `node` as charges (card ids).
pub(crate) fn slot_charges(node: &NodeSnapshot, slots: &[Slot]) -> Vec<DeviceCharge> {
    slots
        .iter()
        .map(|s| DeviceCharge {
            uuid: node.devices.gpus[s.gpu].info.id.clone(),
            slots: s.slots,
            mem_mib: s.mem,
            cores: s.cores,
        })
        .collect()
}

/// A request restricted to `cards` of its node: every other card of the node excluded
/// (`nouse-gpuuuid`), for re-checking a planned target.
pub(crate) fn only_cards(request: &PodRequest, node: &NodeSnapshot, cards: &[usize]) -> Selectors {
    let others: Vec<String> = node
        .devices
        .gpus
        .iter()
        .enumerate()
        .filter(|(i, _)| !cards.contains(i))
        .map(|(_, g)| g.info.id.clone())
        .collect();
    let mut selectors = request.selectors.clone();
    selectors.amd.nouse_uuids.extend(others.iter().cloned());
    selectors.nvidia.nouse_uuids.extend(others);
    selectors
}
