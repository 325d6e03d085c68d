//! Per GPU of a node, the slices the victim search may take there, kept in its eviction
//! order (issue 30): what one `/preempt` call used to sort per GPU per node, here sorted
//! once as the node's holders change, so a call reads a prefix and no pod outside it.
//!
//! A slice is one charge of a pod that is not protected; its order is the search's: lowest
//! priority first, then the largest slice (fewer victims), then the pod's place in its
//! [`super::NodePods`]. Which slices a call may take depends only on the preemptor's
//! priority, so they are a prefix of that order ([`GpuOrder::below`]), and what evicting
//! all of them frees on the GPU is a sum kept per priority ([`GpuOrder::freed_below`]):
//! deciding whether any eviction can help reads no pod. PDB risk (the first key of the
//! search's order) is the call's: a call with a PDB that allows no disruption moves the
//! risky slices of the prefix after the others, keeping their order.

use std::cmp::Reverse;

/// One charge of a pod that may be evicted, as the search reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slice {
    /// The pod's priority.
    pub(super) priority: i32,
    /// The pod's index in its `NodePods`.
    pub(super) pod: u32,
    pub(super) slots: u32,
    /// The pod holds this slice only: evicting it frees this slice and nothing else.
    pub(super) alone: bool,
    pub(super) mem: u64,
    pub(super) cores: u64,
}

impl Slice {
    /// The search's order (PDB risk aside); unique up to equal slices of one pod.
    fn key(&self) -> (i32, Reverse<u64>, Reverse<u64>, u32) {
        (
            self.priority,
            Reverse(self.mem),
            Reverse(self.cores),
            self.pod,
        )
    }
}

/// What evicting some slices of a GPU frees there. Sums saturate: subtracting a sum with
/// `saturating_sub` gives what subtracting each slice in turn gives, as usage is never
/// below 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Freed {
    pub(super) slots: u64,
    pub(super) mem: u64,
    pub(super) cores: u64,
}

impl Freed {
    pub(super) fn add(self, s: &Slice) -> Self {
        Self {
            slots: self.slots.saturating_add(u64::from(s.slots)),
            mem: self.mem.saturating_add(s.mem),
            cores: self.cores.saturating_add(s.cores),
        }
    }
}

/// The slices of one priority in a [`GpuOrder`].
#[derive(Debug, Clone, Copy)]
struct Run {
    priority: i32,
    /// Where its slices end.
    end: u32,
    /// What the slices up to its last free.
    freed: Freed,
}

/// One GPU's slices in eviction order.
#[derive(Debug, Clone, Default)]
pub(super) struct GpuOrder {
    slices: Vec<Slice>,
    /// Per priority present, ascending: a call reads these (a line or two), not the
    /// slices, to know where its candidates end and what they free.
    runs: Vec<Run>,
}

impl GpuOrder {
    /// The slices of pods of priority below `bound`, in order.
    pub(super) fn below(&self, bound: i32) -> &[Slice] {
        let end = self.last_run_below(bound).map_or(0, |r| r.end as usize);
        &self.slices[..end]
    }

    fn last_run_below(&self, bound: i32) -> Option<&Run> {
        let k = self.runs.partition_point(|r| r.priority < bound);
        k.checked_sub(1).map(|i| &self.runs[i])
    }

    /// Whether [`Self::below`]`(bound)` is not empty.
    pub(super) fn any_below(&self, bound: i32) -> bool {
        self.runs.first().is_some_and(|r| r.priority < bound)
    }

    /// What evicting [`Self::below`]`(bound)` frees on the GPU.
    pub(super) fn freed_below(&self, bound: i32) -> Freed {
        self.last_run_below(bound)
            .map_or(Freed::default(), |r| r.freed)
    }

    /// Adds a slice where the order puts it; [`Self::seal`] afterwards.
    pub(super) fn insert(&mut self, slice: Slice) {
        let at = self.slices.partition_point(|s| s.key() < slice.key());
        self.slices.insert(at, slice);
    }

    /// Adds a slice anywhere: [`Self::sort`] afterwards (building many at once).
    pub(super) fn push(&mut self, slice: Slice) {
        self.slices.push(slice);
    }

    /// Puts pushed slices in order, then [`Self::seal`]s.
    pub(super) fn sort(&mut self) {
        self.slices.sort_unstable_by_key(Slice::key);
        self.seal();
    }

    /// Forgets the slices of pod `pod`; then pods above it move down one place when
    /// `shift` (the pod left the list). [`Self::seal`] afterwards.
    pub(super) fn remove_pod(&mut self, pod: u32, shift: bool) {
        self.slices.retain(|s| s.pod != pod);
        if shift {
            for s in &mut self.slices {
                s.pod -= u32::from(s.pod > pod);
            }
        }
    }

    /// Pods from `pod` on move up one place (a pod was inserted there): the order between
    /// them is unchanged.
    pub(super) fn make_room(&mut self, pod: u32) {
        for s in &mut self.slices {
            s.pod += u32::from(s.pod >= pod);
        }
    }

    /// Recomputes the per-priority sums.
    pub(super) fn seal(&mut self) {
        self.runs.clear();
        let mut freed = Freed::default();
        for (i, s) in self.slices.iter().enumerate() {
            freed = freed.add(s);
            // A GPU's slices number far below 2^32.
            let end = i as u32 + 1;
            match self.runs.last_mut() {
                Some(r) if r.priority == s.priority => (r.end, r.freed) = (end, freed),
                _ => self.runs.push(Run {
                    priority: s.priority,
                    end,
                    freed,
                }),
            }
        }
    }
}
