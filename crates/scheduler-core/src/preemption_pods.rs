//! A proposed node's pods as the victim search reads them (issue 30): per pod its facts,
//! what decides whether it may be named (priority, protection, whether it holds a slice
//! there) and its charges, laid out flat.
//!
//! The state keeps one per node for the preempt verb (`victim_facts`), its facts shared
//! (`Arc`) with the state, updated in place as holdings and facts change and shared by
//! every call: a call takes one `Arc` per node under the state's lock and copies nothing
//! per pod (copying every slice holder's facts took 0.9–2 s at 1,000 nodes × 512
//! slices). Charges name GPUs by id through a small table, not by index, so a list
//! does not depend on the node's registered devices: each call maps the table onto the
//! snapshot it decides on (a few ids). A caller holding plain facts
//! ([`super::NodeCandidate`]) gets one per call that borrows them.
//!
//! Beside each id, its GPU's slices in the search's eviction order ([`GpuOrder`]), kept
//! sorted as pods come and go: a call reads per GPU the prefix it may take, not every pod
//! of the node.

use std::borrow::Borrow;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use super::order::{GpuOrder, Slice};
use super::{PodFacts, Protection};
use crate::snapshot::NodeDevices;
use crate::usage::DeviceCharge;

/// `(gpu, slots, MiB, cores)`: `gpu` an index of the node's GPUs in the search, of
/// [`NodePods`]'s id table here.
pub(super) type Charge = (u32, u32, u64, u64);

/// One pod of a [`NodePods`].
#[derive(Debug, Clone)]
pub(super) struct Held<F> {
    pub(super) facts: F,
    /// Copied from the facts: the search's eligibility pass reads no pod's facts.
    pub(super) priority: i32,
    pub(super) protection: Option<Protection>,
    /// It holds something on the node (its charges were not empty, even those on GPUs the
    /// node does not list): a proposed victim that holds nothing is kept as proposed.
    pub(super) holds: bool,
    /// Its charges, a range of [`NodePods`]'s (32-bit: a list is kept per slice holder).
    charges: Range<u32>,
}

impl<F> Held<F> {
    fn span(&self) -> Range<usize> {
        self.charges.start as usize..self.charges.end as usize
    }
}

/// A node's pods in the order the search breaks ties by, with their charges.
#[derive(Debug, Clone)]
pub struct NodePods<F = Arc<PodFacts>> {
    /// The GPU ids the charges name.
    ids: Vec<String>,
    /// Per id, its slices that may be evicted, in eviction order.
    orders: Vec<GpuOrder>,
    pods: Vec<Held<F>>,
    /// The pods' charges (ranges of it); entries no pod's range covers any more are
    /// `stale` until the next compaction.
    charges: Vec<Charge>,
    stale: usize,
    /// [`Self::gpu_map`] on the node's registered GPUs as a call last found them: the
    /// same `Arc` is the same GPUs (it is kept alive here, so its address is not reused),
    /// and the map is read, not rebuilt by comparing ids, until the node registers anew
    /// (then each call maps afresh) or the id table grows (then it is forgotten).
    mapped: OnceLock<(Arc<NodeDevices>, Vec<Option<usize>>)>,
}

impl<F> Default for NodePods<F> {
    fn default() -> Self {
        Self {
            ids: Vec::new(),
            orders: Vec::new(),
            pods: Vec::new(),
            charges: Vec::new(),
            stale: 0,
            mapped: OnceLock::new(),
        }
    }
}

impl<F: Borrow<PodFacts>> NodePods<F> {
    /// `pods` in this order, with what each holds (the facts' own `charges` are not read:
    /// the state keeps them apart).
    pub fn new<'c>(pods: impl IntoIterator<Item = (F, &'c [DeviceCharge])>) -> Self {
        let mut out = Self::default();
        for (facts, charges) in pods {
            let held = out.held(facts, charges);
            out.pods.push(held);
            out.add_slices(out.pods.len() - 1, false);
        }
        out.orders.iter_mut().for_each(GpuOrder::sort);
        out
    }

    /// `facts` with `charges` appended to the flat list.
    fn held(&mut self, facts: F, charges: &[DeviceCharge]) -> Held<F> {
        let start = self.charges.len();
        for c in charges {
            let id = match self.ids.iter().position(|id| *id == c.uuid) {
                Some(i) => i,
                None => {
                    self.ids.push(c.uuid.clone());
                    self.orders.push(GpuOrder::default());
                    self.mapped.take();
                    self.ids.len() - 1
                }
            };
            // A node's GPU ids and charges number far below 2^32.
            self.charges.push((id as u32, c.slots, c.mem_mib, c.cores));
        }
        let f = facts.borrow();
        Held {
            priority: f.priority,
            protection: f.protection,
            holds: !charges.is_empty(),
            charges: start as u32..self.charges.len() as u32,
            facts,
        }
    }

    /// Puts the slices of the `i`th pod in their GPUs' orders (where the order puts them
    /// when `sorted`, else at the end); a protected pod has none. Then
    /// [`Self::seal`] (or [`GpuOrder::sort`]) the orders it names.
    fn add_slices(&mut self, i: usize, sorted: bool) {
        let held = &self.pods[i];
        if held.protection.is_some() {
            return;
        }
        for &(id, slots, mem, cores) in &self.charges[held.span()] {
            let slice = Slice {
                priority: held.priority,
                // A node's pods number far below 2^32.
                pod: i as u32,
                slots,
                alone: held.charges.len() == 1,
                mem,
                cores,
            };
            let order = &mut self.orders[id as usize];
            if sorted {
                order.insert(slice);
            } else {
                order.push(slice);
            }
        }
    }

    /// Recomputes the sums of the orders the `i`th pod's charges name.
    fn seal(&mut self, charges: Range<usize>) {
        for &(id, ..) in &self.charges[charges] {
            self.orders[id as usize].seal();
        }
    }

    /// How many pods.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Every pod's facts, in order.
    pub fn facts(&self) -> impl Iterator<Item = &PodFacts> {
        self.pods.iter().map(|p| p.facts.borrow())
    }

    pub(super) fn pods(&self) -> &[Held<F>] {
        &self.pods
    }

    /// The charges of the `i`th pod, their GPUs as indices of the id table.
    pub(super) fn charges_of(&self, i: usize) -> &[Charge] {
        &self.charges[self.pods[i].span()]
    }

    /// The slices of the GPU of id `id` (an index of the id table) that may be evicted,
    /// in eviction order.
    pub(super) fn order(&self, id: usize) -> &GpuOrder {
        &self.orders[id]
    }

    /// For each id of the table, the GPU of `devices` it names: the first of that id, as
    /// `NodeSnapshot::charge` counts it; `None` when the node does not list it (such a
    /// charge is ignored, as the node's usage ignores it).
    #[cfg(test)]
    pub(super) fn gpu_map(&self, devices: &NodeDevices) -> Vec<Option<usize>> {
        let mut out = Vec::new();
        self.map_gpus(devices, &mut out);
        out
    }

    /// [`Self::gpu_map`] into `out` (reused between nodes), read from the map kept for
    /// `devices` where there is one.
    pub(super) fn gpu_map_into(&self, devices: &Arc<NodeDevices>, out: &mut Vec<Option<usize>>) {
        out.clear();
        if let Some((seen, map)) = self.mapped.get()
            && Arc::ptr_eq(seen, devices)
        {
            out.extend_from_slice(map);
            return;
        }
        self.map_gpus(devices, out);
        let _ = self.mapped.set((Arc::clone(devices), out.clone()));
    }

    fn map_gpus(&self, devices: &NodeDevices, out: &mut Vec<Option<usize>>) {
        out.extend(
            self.ids
                .iter()
                .map(|id| devices.gpus.iter().position(|g| same_str(&g.info.id, id))),
        );
    }

    fn position(&self, uid: &str) -> Result<usize, usize> {
        self.pods
            .binary_search_by(|p| p.facts.borrow().uid.as_str().cmp(uid))
    }
}

impl NodePods<Arc<PodFacts>> {
    /// Records that the pod of `facts` holds `charges` here, in UID order (a list kept
    /// this way only, as the state keeps its own).
    pub fn upsert(&mut self, facts: Arc<PodFacts>, charges: &[DeviceCharge]) {
        let held = self.held(facts, charges);
        let i = match self.position(&held.facts.uid) {
            Ok(i) => {
                let old = self.pods[i].span();
                for &(id, ..) in &self.charges[old.clone()] {
                    self.orders[id as usize].remove_pod(i as u32, false);
                }
                self.seal(old.clone());
                self.stale += old.len();
                self.pods[i] = held;
                i
            }
            Err(i) => {
                self.orders.iter_mut().for_each(|o| o.make_room(i as u32));
                self.pods.insert(i, held);
                i
            }
        };
        self.add_slices(i, true);
        self.seal(self.pods[i].span());
        self.compact();
    }

    /// Forgets the pod; false when it was not here.
    pub fn remove(&mut self, uid: &str) -> bool {
        let Ok(i) = self.position(uid) else {
            return false;
        };
        self.orders
            .iter_mut()
            .for_each(|o| o.remove_pod(i as u32, true));
        let gone = self.pods.remove(i).span();
        self.seal(gone.clone());
        self.stale += gone.len();
        self.compact();
        true
    }

    /// Whether the pod is here.
    pub fn contains(&self, uid: &str) -> bool {
        self.position(uid).is_ok()
    }

    /// Drops the charges no pod covers once they are as many as those in use.
    fn compact(&mut self) {
        if self.stale <= self.charges.len() / 2 {
            return;
        }
        let mut charges = Vec::with_capacity(self.charges.len() - self.stale);
        for p in &mut self.pods {
            let start = charges.len();
            charges.extend_from_slice(&self.charges[p.span()]);
            p.charges = start as u32..charges.len() as u32;
        }
        self.charges = charges;
        self.stale = 0;
    }

    /// These pods and then each of `listed` whose UID is not among them, with its own
    /// charges (the shell's listed pods hold no slice: where they stand in the order
    /// changes no choice, which is made among pods holding slices).
    pub fn with_listed(&self, listed: impl IntoIterator<Item = PodFacts>) -> Self {
        let mut out = self.clone();
        for facts in listed {
            if out.pods.iter().any(|p| p.facts.uid == facts.uid) {
                continue;
            }
            let charges = facts.charges.clone();
            let held = out.held(Arc::new(facts), &charges);
            out.pods.push(held);
            let i = out.pods.len() - 1;
            out.add_slices(i, true);
            out.seal(out.pods[i].span());
        }
        out
    }
}

/// `a == b`, rejecting most unequal GPU ids and pod UIDs (which share a long prefix: a
/// node's name, a vendor's UUID form, a workload's name) by their last bytes first.
pub(super) fn same_str(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len()
        && a.iter()
            .rev()
            .zip(b.iter().rev())
            .take(4)
            .all(|(x, y)| x == y)
        && a == b
}
