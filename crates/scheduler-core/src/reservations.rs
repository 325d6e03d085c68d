//! Defrag reservations in Filter (issue 32 item 3). Before it evicts, `hami defrag apply`
//! writes `reservation.defrag.hami.io/<evicted pod uid>` on the move's target node
//! (`hami_protocol::defrag_reservation`): the target cards are held for the moved pod's
//! owner, so the replacement its controller creates lands there and not on the capacity
//! the eviction frees, and no other pod takes the target meanwhile.
//!
//! While a reservation is in force — not past `expires_at` (Filter's `now`, unix seconds)
//! and not used up: no pod of the owner created at or after `reserved_at` holds all its
//! cards — Filter charges each of its cards one share, its MiB and its cores for every pod
//! but the owner's (controller uid `owner_uid`, and the `pod-template-hash` label
//! `template_hash` when that is set), and steers the owner's pod to the reserved cards
//! first, anywhere else when it does not fit there. A malformed value is ignored (the node
//! stays usable) and reported once per node, key and value through [`Reservations::take_problems`].
//!
//! Cost: nothing is parsed per Filter call (values are decoded when the node changes), and
//! with no reservation on any node [`for_filter`] returns at once without allocating.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use hami_protocol::defrag_reservation::{DefragReservation, pod_uid_of};
use hami_protocol::names::Vendor;
use hami_protocol::names::node::DEFRAG_RESERVATION_PREFIX;
use k8s_openapi::api::core::v1::Pod;

use crate::fit::{FilterOutcome, FitRequest, Selectors, filter};
use crate::snapshot::NodeSnapshot;
use crate::state::ClusterState;
use crate::usage::DeviceCharge;

pub use hami_protocol::names::pod::TEMPLATE_HASH_LABEL;

/// One reservation annotation of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The evicted pod's uid (the key's suffix).
    pub key: String,
    /// The value as written, to decode again only when it changes.
    raw: String,
    /// The decoded value; `None` when it did not decode (ignored, reported once).
    pub reservation: Option<DefragReservation>,
}

/// Who a pod belongs to, for matching it with a reservation's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerFacts {
    /// Its controller ownerReference's uid.
    pub owner_uid: String,
    /// Its `pod-template-hash` label.
    pub template_hash: Option<String>,
    /// `metadata.creationTimestamp`, unix seconds.
    pub created: Option<i64>,
}

impl OwnerFacts {
    /// The facts of `pod`; `None` when no controller owns it (it is nobody's replacement).
    pub fn of(pod: &Pod) -> Option<Self> {
        let owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))?;
        Some(Self {
            owner_uid: owner.uid.clone(),
            template_hash: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(TEMPLATE_HASH_LABEL))
                .cloned(),
            created: pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second()),
        })
    }
}

/// Whether a pod with these facts is the owner `r` holds its cards for.
pub fn is_for(r: &DefragReservation, owner: Option<&OwnerFacts>) -> bool {
    owner.is_some_and(|o| {
        o.owner_uid == r.owner_uid
            && r.template_hash
                .as_ref()
                .is_none_or(|h| o.template_hash.as_ref() == Some(h))
    })
}

/// Whether `r` still holds its cards at `now`: not expired, and no pod of the owner
/// created at or after `reserved_at` holds every one of its cards (`holders`: the pods
/// holding slices on its node, with their owner facts when known).
pub fn in_force<'a>(
    r: &DefragReservation,
    now: i64,
    holders: impl IntoIterator<Item = (Option<&'a OwnerFacts>, &'a [DeviceCharge])>,
) -> bool {
    if r.expired(now) {
        return false;
    }
    !holders.into_iter().any(|(facts, charges)| {
        is_for(r, facts)
            && facts
                .and_then(|f| f.created)
                .is_some_and(|c| c >= r.reserved_at)
            && r.cards
                .iter()
                .all(|card| charges.iter().any(|ch| ch.uuid == card.uuid))
    })
}

/// The reservations of every node, and who owns the pods holding slices (to tell when a
/// reservation is used up). Kept in [`ClusterState`].
#[derive(Debug, Clone, Default)]
pub struct Reservations {
    by_node: HashMap<String, Vec<Entry>>,
    /// Pods holding slices (or with a Filter decision pending) that a controller owns, by uid.
    owners: HashMap<String, OwnerFacts>,
    /// Malformed values not yet reported.
    problems: Vec<String>,
}

/// The reservation annotations among `annotations`, in key order (a range of the sorted
/// map: nothing is allocated for a node without any).
fn reservation_annotations(
    annotations: &BTreeMap<String, String>,
) -> impl Iterator<Item = (&String, &String)> {
    annotations
        .range::<str, _>((Bound::Included(DEFRAG_RESERVATION_PREFIX), Bound::Unbounded))
        .take_while(|(k, _)| k.starts_with(DEFRAG_RESERVATION_PREFIX))
}

impl Reservations {
    /// Reads node `name`'s reservation annotations; a value is decoded only when it changed.
    pub fn observe_node(&mut self, name: &str, annotations: &BTreeMap<String, String>) {
        let old = self.by_node.get(name);
        let mut found = reservation_annotations(annotations).peekable();
        if old.is_none() && found.peek().is_none() {
            return;
        }
        let unchanged = old.is_some_and(|old| {
            old.len() == reservation_annotations(annotations).count()
                && old
                    .iter()
                    .zip(reservation_annotations(annotations))
                    .all(|(e, (k, v))| pod_uid_of(k) == Some(e.key.as_str()) && e.raw == *v)
        });
        if unchanged {
            return;
        }
        let mut entries = Vec::new();
        for (key, value) in found {
            let Some(uid) = pod_uid_of(key) else {
                continue;
            };
            let kept = old.and_then(|o| o.iter().find(|e| e.key == uid && e.raw == *value));
            let entry = match kept {
                Some(e) => e.clone(),
                None => {
                    let reservation = match DefragReservation::decode(value) {
                        Ok(r) => Some(r),
                        Err(e) => {
                            self.problems.push(format!(
                                "node {name}: annotation {key}: {e}; the reservation is ignored (remove or rewrite the annotation)"
                            ));
                            None
                        }
                    };
                    Entry {
                        key: uid.to_owned(),
                        raw: value.clone(),
                        reservation,
                    }
                }
            };
            entries.push(entry);
        }
        if entries.is_empty() {
            self.by_node.remove(name);
        } else {
            self.by_node.insert(name.to_owned(), entries);
        }
    }

    /// Forgets a deleted node's reservations.
    pub fn forget_node(&mut self, name: &str) {
        self.by_node.remove(name);
    }

    /// Keeps the nodes `keep` says to (after a relist).
    pub fn retain_nodes(&mut self, keep: impl Fn(&str) -> bool) {
        self.by_node.retain(|name, _| keep(name));
    }

    /// The reservation annotations of `node` (malformed ones included, undecoded).
    pub fn on(&self, node: &str) -> &[Entry] {
        self.by_node.get(node).map_or(&[], Vec::as_slice)
    }

    /// Whether no node carries a reservation.
    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }

    /// Records who owns `pod` when it holds slices (`holds`), forgets it otherwise.
    pub fn upsert_pod(&mut self, pod: &Pod, holds: bool) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        match OwnerFacts::of(pod).filter(|_| holds) {
            Some(facts) => {
                if self.owners.get(uid) != Some(&facts) {
                    self.owners.insert(uid.to_owned(), facts);
                }
            }
            None => {
                self.owners.remove(uid);
            }
        }
    }

    /// Records who owns `pod`, just placed by Filter (its holding is pending: the informer
    /// has not shown it yet), so its placement uses up its owner's reservation at once.
    /// Nothing is kept while no node carries a reservation.
    pub fn note_placed(&mut self, pod: &Pod) {
        if !self.is_empty() {
            self.upsert_pod(pod, true);
        }
    }

    /// Forgets a deleted pod.
    pub fn remove_pod(&mut self, uid: &str) {
        self.owners.remove(uid);
    }

    /// The uids of the pods whose owner is kept.
    pub fn uids(&self) -> impl Iterator<Item = &String> {
        self.owners.keys()
    }

    /// Who owns the pod with this uid, if it holds slices and a controller owns it.
    pub fn owner(&self, uid: &str) -> Option<&OwnerFacts> {
        self.owners.get(uid)
    }

    /// The malformed values seen since the last call, in words (each once per node, key
    /// and value), for the shell to log.
    pub fn take_problems(&mut self) -> Vec<String> {
        std::mem::take(&mut self.problems)
    }
}

/// What the reservations do to one Filter call.
#[derive(Debug, Default)]
pub struct ForFilter {
    /// Copies of the nodes whose in-force reservations belong to someone else, with those
    /// cards charged.
    pub charged: HashMap<String, NodeSnapshot>,
    /// The cards reserved for this pod's owner, per node (in `names` order).
    pub steer: Vec<(String, Vec<String>)>,
    /// Per node of `charged`, what the reservations of others hold there.
    pub held: HashMap<String, Vec<DeviceCharge>>,
}

/// The reservations in force at `now` on `names`, for `pod`: charged on copies of the
/// nodes (`base` gives each node as Filter would see it otherwise) unless they are the
/// pod's owner's, which are returned to steer it. No reservation anywhere: returns at
/// once, allocating nothing.
pub fn for_filter<'a>(
    state: &'a ClusterState,
    pod: &Pod,
    names: &[String],
    base: impl Fn(&str) -> Option<&'a NodeSnapshot>,
    now: i64,
) -> ForFilter {
    let mut out = ForFilter::default();
    let book = &state.reservations;
    if book.is_empty() {
        return out;
    }
    let mine = OwnerFacts::of(pod);
    for name in names {
        let entries = book.on(name);
        if entries.is_empty() {
            continue;
        }
        let mut charges: Vec<DeviceCharge> = Vec::new();
        let mut steer: Vec<String> = Vec::new();
        for r in entries.iter().filter_map(|e| e.reservation.as_ref()) {
            let holders = state
                .holdings_on(name)
                .map(|(uid, h)| (book.owner(uid), h.charges.as_slice()));
            if !in_force(r, now, holders) {
                continue;
            }
            if is_for(r, mine.as_ref()) {
                steer.extend(r.cards.iter().map(|c| c.uuid.clone()));
            } else {
                charges.extend(r.cards.iter().map(|c| DeviceCharge {
                    uuid: c.uuid.clone(),
                    slots: 1,
                    mem_mib: c.mem_mib,
                    cores: c.cores,
                }));
            }
        }
        if !charges.is_empty()
            && let Some(current) = base(name)
        {
            let mut copy = current.clone();
            // A card the node no longer registers holds nothing here.
            copy.charge(&charges);
            out.charged.insert(name.clone(), copy);
            out.held.insert(name.clone(), charges);
        }
        if !steer.is_empty() {
            out.steer.push((name.clone(), steer));
        }
    }
    out
}

/// The nodes among `failed` (refused by Filter, and found curable by an eviction) where no
/// eviction can help because others' reservations stay: the pod does not fit even with
/// every slice the scheduler placed gone and those reservations kept. Fit's own check
/// (`cured_by_eviction`) starts from an idle node, which frees the reserved capacity too:
/// kube-scheduler would offer such a node to preemption (`FailedNodes`) and the preempt
/// verb evict pods for room the pod may not take. Only nodes carrying such reservations
/// are fitted again.
pub fn uncured<'a>(
    reserved: &ForFilter,
    failed: impl IntoIterator<Item = &'a String>,
    req: &FitRequest<'_>,
) -> Vec<String> {
    if reserved.held.is_empty() {
        return Vec::new();
    }
    failed
        .into_iter()
        .filter(|name| {
            let (Some(held), Some(node)) = (reserved.held.get(*name), reserved.charged.get(*name))
            else {
                return false;
            };
            let mut empty = NodeSnapshot::idle(node.devices.clone());
            empty.held_whole = node.held_whole.clone();
            empty.charge(held);
            crate::fit::fit_node(&empty, req).is_err()
        })
        .cloned()
        .collect()
}

/// Filter restricted to the cards reserved for the pod's owner (`steer`), on those of
/// `snapshots` that carry them; `Some` only when the pod fits there. The pod's own
/// `use-gpuuuid`/`nouse-gpuuuid` still apply: a reserved card they exclude is not offered.
pub fn steered(
    steer: &[(String, Vec<String>)],
    snapshots: &[&NodeSnapshot],
    req: &FitRequest<'_>,
) -> Option<FilterOutcome> {
    if steer.is_empty() {
        return None;
    }
    let reserved: Vec<&String> = steer.iter().flat_map(|(_, cards)| cards).collect();
    let restrict = |vendor: Vendor| {
        let mut s = req.selectors.get(vendor).clone();
        s.use_uuids = reserved
            .iter()
            .filter(|u| req.selectors.get(vendor).uuid_allowed(u))
            .map(|u| (*u).clone())
            .collect();
        s
    };
    let selectors = Selectors {
        amd: restrict(Vendor::Amd),
        nvidia: restrict(Vendor::Nvidia),
    };
    // An empty list would allow every card: no steering for a vendor left without one.
    if req
        .vendors()
        .iter()
        .any(|v| selectors.get(*v).use_uuids.is_empty())
    {
        return None;
    }
    let nodes = snapshots
        .iter()
        .copied()
        .filter(|s| steer.iter().any(|(n, _)| *n == s.devices.name));
    let outcome = filter(
        nodes,
        &FitRequest {
            selectors: &selectors,
            ..req.clone()
        },
    );
    outcome.chosen.is_some().then_some(outcome)
}

#[cfg(test)]
#[path = "reservations_tests.rs"]
mod tests;
