//! A proposed node's pods as the victim search reads them (issue 30): per pod its facts,
//! what decides whether it may be named (priority, protection, whether it holds a slice
//! there) and its charges, resolved to the node's GPU indices once.
//!
//! The state keeps one per node for the preempt verb (`victim_facts::node_pods`), its
//! facts shared (`Arc`) with the state and the whole shared by every call until the node
//! changes: a call copies nothing per pod under the state's lock (copying every slice
//! holder's facts took 0.9–2 s at 1,000 nodes × 512 slices). A caller holding plain facts
//! ([`super::NodeCandidate`]) gets one per call that borrows them.

use std::borrow::Borrow;
use std::ops::Range;
use std::sync::Arc;

use super::{PodFacts, Protection};
use crate::snapshot::NodeDevices;
use crate::usage::DeviceCharge;

/// `(gpu index, slots, MiB, cores)`.
pub(super) type Charge = (usize, u32, u64, u64);

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
    charges: Range<usize>,
}

/// A node's pods in the order the search breaks ties by, with their charges resolved to
/// the GPUs of `devices` (a charge on a GPU it does not list is ignored, as the node's
/// usage ignores it).
#[derive(Debug, Clone)]
pub struct NodePods<F = Arc<PodFacts>> {
    devices: Arc<NodeDevices>,
    pods: Vec<Held<F>>,
    charges: Vec<Charge>,
}

impl<F: Borrow<PodFacts>> NodePods<F> {
    /// `pods` with what each holds on the GPUs of `devices` (the facts' own `charges` are
    /// not read: the state keeps them apart).
    pub fn new<'c>(
        devices: Arc<NodeDevices>,
        pods: impl IntoIterator<Item = (F, &'c [DeviceCharge])>,
    ) -> Self {
        let pods = pods.into_iter();
        let mut out = Self {
            devices,
            pods: Vec::with_capacity(pods.size_hint().0),
            charges: Vec::with_capacity(pods.size_hint().0),
        };
        for (facts, charges) in pods {
            out.push(facts, charges);
        }
        out
    }

    fn push(&mut self, facts: F, charges: &[DeviceCharge]) {
        let start = self.charges.len();
        for c in charges {
            // The first GPU of that id, as `NodeSnapshot::charge` counts it.
            if let Some(g) = self.devices.gpus.iter().position(|g| g.info.id == c.uuid) {
                self.charges.push((g, c.slots, c.mem_mib, c.cores));
            }
        }
        let f = facts.borrow();
        self.pods.push(Held {
            priority: f.priority,
            protection: f.protection,
            holds: !charges.is_empty(),
            charges: start..self.charges.len(),
            facts,
        });
    }

    /// The GPUs the charges were resolved on.
    pub fn devices(&self) -> &Arc<NodeDevices> {
        &self.devices
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

    /// The charges of the `i`th pod, on this node's GPUs.
    pub(super) fn charges_of(&self, i: usize) -> &[Charge] {
        &self.charges[self.pods[i].charges.clone()]
    }

    /// Where each GPU of [`Self::devices`] is in `devices` (the snapshot decided on):
    /// `None` when they are the same list, the usual case (the state's snapshot and its
    /// nominated copies share it).
    pub(super) fn gpu_map(&self, devices: &Arc<NodeDevices>) -> Option<Vec<Option<usize>>> {
        let same = Arc::ptr_eq(&self.devices, devices)
            || self.devices.gpus.len() == devices.gpus.len()
                && self
                    .devices
                    .gpus
                    .iter()
                    .zip(&devices.gpus)
                    .all(|(a, b)| a.info.id == b.info.id);
        (!same).then(|| {
            self.devices
                .gpus
                .iter()
                .map(|g| devices.gpus.iter().position(|d| d.info.id == g.info.id))
                .collect()
        })
    }
}

impl NodePods<Arc<PodFacts>> {
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
            out.push(Arc::new(facts), &charges);
        }
        out
    }
}
