//! The scheduler's view of the cluster, fed by the node and pod informers and by its own
//! filter decisions. Usage is kept incrementally per node (a pod's annotations are decoded
//! once per change, never per filter request), so filter cost depends on the candidate
//! nodes only.
//!
//! A decision made by filter is *pending* until the pod's annotations, as seen by the
//! informer, carry exactly that decision; until then informer updates of the pod do not
//! override it. That closes the window where a second filter could book the same GPU
//! before the first pod's patch comes back through the watch.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::handshake;
use hami_protocol::names::{DEFAULT_SCHEDULER_NAME, Vendor, pod as pod_keys};
use hami_protocol::placement::placed_by_scheduler;
use hami_protocol::requests::{container_kinds, pod_ref};
use hami_protocol::whole_cards;
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::heartbeat::Heartbeats;
use crate::quota_book::QuotaBook;
use crate::snapshot::{NodeDevices, NodeSnapshot, kubelet_count};
use crate::usage::{ContainerGrant, DeviceCharge, collapse, container_grants};

/// What a pod holds, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodHolding {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The node it was placed on (`hami.io/vgpu-node`).
    pub node: String,
    /// What it holds per GPU, summed over its containers as they run.
    pub charges: Vec<DeviceCharge>,
    /// Per container, for the `container_index` of the metrics.
    pub grants: Vec<ContainerGrant>,
}

/// Why a pod's holding could not be read (the pod is then not counted; the caller logs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: annotation {key}: {problem}")]
pub struct HoldingError {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// The annotation that could not be read.
    pub key: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The devices a live pod holds according to its annotations; `None` when it holds none
/// (finished, or not placed by the scheduler named `scheduler_name`: D-4, another pod's
/// allocation annotations are forged or stale and count for nothing).
pub fn pod_holding(pod: &Pod, scheduler_name: &str) -> Result<Option<PodHolding>, HoldingError> {
    if is_terminal(pod) || !placed_by_scheduler(pod, scheduler_name) {
        return Ok(None);
    }
    let annotations = match &pod.metadata.annotations {
        Some(a) => a,
        None => return Ok(None),
    };
    let Some(node) = annotations.get(pod_keys::VGPU_NODE) else {
        return Ok(None);
    };
    let kinds = container_kinds(pod);
    let mut charges = Vec::new();
    let mut grants = Vec::new();
    for vendor in Vendor::ALL {
        let key = vendor.names().devices_allocated;
        let Some(text) = annotations.get(key) else {
            continue;
        };
        let runs = decode_pod_devices(text).map_err(|e| HoldingError {
            pod: pod_name(pod),
            key,
            problem: e.to_string(),
        })?;
        charges.extend(collapse(&kinds, &runs));
        grants.extend(container_grants(&runs));
    }
    let owner = pod_ref(pod);
    Ok(Some(PodHolding {
        namespace: owner.namespace,
        name: owner.name,
        node: node.clone(),
        charges,
        grants,
    }))
}

/// Cards a pod the scheduler did not place holds whole (issue 26 item 1): the device
/// plugin's record of a whole-card hand-over (`hami.io/<vendor>-whole-cards`), counted by
/// `hami_protocol::whole_cards::held_cards`. Each such card is full for the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WholeCardHolding {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The node it is bound to (`spec.nodeName`).
    pub node: String,
    /// The registered ids of the cards, every vendor's.
    pub cards: Vec<String>,
}

/// The whole cards a pod holds, every vendor's; `None` when none counts (see
/// `whole_cards::held_cards`: live, bound, not placed by `scheduler_name`, at most asked).
pub fn whole_card_holding(
    pod: &Pod,
    scheduler_name: &str,
) -> Result<Option<WholeCardHolding>, HoldingError> {
    let mut held: Option<WholeCardHolding> = None;
    for vendor in Vendor::ALL {
        let found =
            whole_cards::held_cards(pod, vendor, scheduler_name).map_err(|e| HoldingError {
                pod: pod_name(pod),
                key: whole_cards::key(vendor),
                problem: e.to_string(),
            })?;
        let Some(found) = found else { continue };
        match &mut held {
            Some(h) => h.cards.extend(found.cards),
            None => {
                let owner = pod_ref(pod);
                held = Some(WholeCardHolding {
                    namespace: owner.namespace,
                    name: owner.name,
                    node: found.node,
                    cards: found.cards,
                });
            }
        }
    }
    Ok(held)
}

/// `namespace/name` of a pod (`default` when the namespace is unset), for logs and errors.
pub fn pod_name(pod: &Pod) -> String {
    pod_ref(pod).to_string()
}

#[derive(Debug, Clone)]
struct PodEntry {
    holding: PodHolding,
    /// For a filter decision not yet seen through the informer: the device-list
    /// annotations it wrote, per vendor.
    pending: Option<BTreeMap<&'static str, String>>,
}

#[derive(Debug, Clone)]
struct NodeEntry {
    /// Raw register annotations, to decode again only when they change.
    raw: Vec<Option<String>>,
    /// What the node offers before the heartbeat rule (`heartbeat`) is applied.
    base: Arc<NodeDevices>,
    /// Vendors withdrawn because their plugin stopped refreshing.
    quiet: Vec<Vendor>,
    snapshot: NodeSnapshot,
}

/// Nodes, their GPUs and usage; pods and what they hold.
#[derive(Debug)]
pub struct ClusterState {
    /// Only pods placed by this scheduler hold devices (`placement::placed_by_scheduler`).
    scheduler_name: String,
    nodes: HashMap<String, NodeEntry>,
    pods: HashMap<String, PodEntry>,
    pods_by_node: HashMap<String, HashSet<String>>,
    /// Whole cards held by pods this scheduler did not place, by pod uid (few: counted on
    /// every recount of their node).
    whole: HashMap<String, WholeCardHolding>,
    /// Problems seen while reading pods (bad annotations), by pod uid.
    pub pod_problems: HashMap<String, String>,
    heartbeats: Heartbeats,
    /// No heartbeat verdict changes by time alone before this moment.
    heartbeat_check_at: Option<Instant>,
    /// Namespace quotas and what the holdings charge them (issue 30): kept here so one
    /// lock covers a decision and its charge, which follows the holding (`quota_book`).
    pub quota: QuotaBook,
    /// What the preempt verb knows of the pods holding slices (`victim_facts`).
    victims: crate::victim_facts::VictimFacts,
    /// Pods nominated to a node and not bound yet: their slices count in Filter
    /// (`nominated`).
    nominated: crate::nominated::Nominations,
    /// Defrag reservations on the nodes and who owns the pods holding slices (issue 32:
    /// `reservations`).
    pub reservations: crate::reservations::Reservations,
}

fn uid(pod: &Pod) -> Option<String> {
    pod.metadata.uid.clone()
}

impl Default for ClusterState {
    fn default() -> Self {
        Self::for_scheduler(DEFAULT_SCHEDULER_NAME)
    }
}

impl ClusterState {
    /// The state of the scheduler with the default name.
    pub fn new() -> Self {
        Self::default()
    }

    /// The state of the scheduler named `scheduler_name` (its pods' `schedulerName`).
    pub fn for_scheduler(scheduler_name: &str) -> Self {
        ClusterState {
            scheduler_name: scheduler_name.to_owned(),
            nodes: HashMap::new(),
            pods: HashMap::new(),
            pods_by_node: HashMap::new(),
            whole: HashMap::new(),
            pod_problems: HashMap::new(),
            heartbeats: Heartbeats::new(),
            heartbeat_check_at: None,
            quota: QuotaBook::new(),
            victims: Default::default(),
            nominated: Default::default(),
            reservations: Default::default(),
        }
    }

    /// Adds or updates a node from the informer.
    pub fn upsert_node(&mut self, node: &Node) {
        self.upsert_node_at(node, Instant::now());
    }

    /// [`Self::upsert_node`] seen at `now` (this scheduler's monotonic clock).
    pub fn upsert_node_at(&mut self, node: &Node, now: Instant) {
        let Some(name) = node.metadata.name.clone() else {
            return;
        };
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        self.reservations.observe_node(&name, &annotations);
        for vendor in Vendor::ALL {
            let value = annotations.get(handshake::key(vendor)).map(String::as_str);
            self.heartbeats.observe(&name, vendor, value, now);
        }
        if let Some(t) = self.heartbeats.node_deadline(&name, now) {
            self.heartbeat_check_at = Some(self.heartbeat_check_at.map_or(t, |c| c.min(t)));
        }
        // What the node's devices are read from: the register annotations and kubelet's
        // count per vendor (a count of 0 withdraws the vendor: `snapshot::withdrawn`).
        let raw: Vec<Option<String>> = Vendor::ALL
            .iter()
            .map(|v| annotations.get(v.names().node_register).cloned())
            .chain(Vendor::ALL.iter().map(|v| kubelet_count(node, *v)))
            .collect();
        let base = match self.nodes.get(&name) {
            Some(e) if e.raw == raw => e.base.clone(),
            _ => Arc::new(NodeDevices::from_node(node)),
        };
        self.set_node_devices(&name, raw, base, now);
    }

    /// Applies the heartbeat rule to `base` and stores the node if anything changed.
    fn set_node_devices(
        &mut self,
        name: &str,
        raw: Vec<Option<String>>,
        base: Arc<NodeDevices>,
        now: Instant,
    ) {
        let verdicts: Vec<(Vendor, (&'static str, String))> = Vendor::ALL
            .iter()
            .filter(|v| base.offers(**v))
            .filter_map(|v| Some((*v, self.heartbeats.verdict(name, *v, now)?)))
            .collect();
        let quiet: Vec<Vendor> = verdicts.iter().map(|(v, _)| *v).collect();
        if let Some(e) = self.nodes.get(name)
            && e.raw == raw
            && e.quiet == quiet
            && Arc::ptr_eq(&e.base, &base)
        {
            return;
        }
        let devices = if verdicts.is_empty() {
            base.clone()
        } else {
            let mut d = (*base).clone();
            for (vendor, (label, why)) in verdicts {
                d.gpus.retain(|g| g.vendor != vendor);
                d.push_register_error(vendor, label, why);
            }
            Arc::new(d)
        };
        self.nodes.insert(
            name.to_owned(),
            NodeEntry {
                raw,
                base,
                quiet,
                snapshot: NodeSnapshot::idle(devices),
            },
        );
        self.recount(name);
        // AMD shares are charged against the registered CUs, which may be new.
        if let (Some(uids), Some(e)) = (self.pods_by_node.get(name), self.nodes.get(name)) {
            self.quota.recharge(uids, &e.base);
        }
    }

    /// Withdraws the vendors whose plugin stopped refreshing by `now` (the heartbeat rule
    /// changes with time alone, so filter calls this before deciding). Cheap when no
    /// verdict can have changed since the last call: before the next deadline, and when
    /// there is none (no plugin announces a heartbeat, as HAMi's do not, or every window
    /// has passed). Each observed change sets its deadline (`upsert_node_at`); a sweep of
    /// every node per filter call cost more than the decision (issue 28).
    pub fn expire_heartbeats(&mut self, now: Instant) {
        if self.heartbeat_check_at.is_none_or(|t| now < t) {
            return;
        }
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in names {
            let Some(e) = self.nodes.get(&name) else {
                continue;
            };
            let (raw, base) = (e.raw.clone(), e.base.clone());
            self.set_node_devices(&name, raw, base, now);
        }
        self.heartbeat_check_at = self.heartbeats.next_deadline(now);
    }

    /// Forgets a deleted node and its heartbeats.
    pub fn remove_node(&mut self, name: &str) {
        self.nodes.remove(name);
        self.heartbeats.forget(name);
        self.reservations.forget_node(name);
    }

    /// Replaces every node (after an informer relist).
    pub fn reset_nodes<'a>(&mut self, nodes: impl IntoIterator<Item = &'a Node>) {
        let mut seen = HashSet::new();
        for node in nodes {
            if let Some(name) = &node.metadata.name {
                seen.insert(name.clone());
            }
            self.upsert_node(node);
        }
        self.nodes.retain(|name, _| seen.contains(name));
        self.heartbeats.retain(|name| seen.contains(name));
        self.reservations.retain_nodes(|name| seen.contains(name));
    }

    /// Adds or updates a pod from the informer.
    pub fn upsert_pod(&mut self, pod: &Pod) {
        let Some(uid) = uid(pod) else { return };
        let holding = match pod_holding(pod, &self.scheduler_name) {
            Ok(h) => {
                self.pod_problems.remove(&uid);
                h
            }
            Err(e) => {
                self.pod_problems.insert(uid.clone(), e.to_string());
                None
            }
        };
        let whole = match whole_card_holding(pod, &self.scheduler_name) {
            Ok(w) => w,
            Err(e) => {
                self.pod_problems.insert(uid.clone(), e.to_string());
                None
            }
        };
        self.set_whole(&uid, whole);
        // DRA mode (D-29): charged from its admission, apart from any holding.
        self.quota.observe_dra_pod(&uid, pod, is_terminal(pod));
        let holds = holding.is_some() || self.pods.contains_key(&uid);
        // A holder's facts changed: so does the preempt verb's list of its node.
        if self.victims.upsert(pod, holds)
            && let Some(e) = self.pods.get(&uid)
        {
            let h = &e.holding;
            self.victims.sync_holder(&h.node, &uid, Some(&h.charges));
        }
        self.nominated.upsert(pod, &self.scheduler_name);
        self.reservations.upsert_pod(pod, holds);
        if let Some(entry) = self.pods.get(&uid)
            && let Some(expected) = &entry.pending
        {
            let annotations = pod.metadata.annotations.clone().unwrap_or_default();
            let caught_up = expected
                .iter()
                .all(|(key, value)| annotations.get(*key) == Some(value));
            if !caught_up && !is_terminal(pod) {
                return;
            }
        }
        match holding {
            Some(holding) => {
                let devices = self.nodes.get(&holding.node).map(|e| &*e.base);
                self.quota.observe_pod(&uid, pod, &holding.node, devices);
                self.set_pod(
                    uid,
                    PodEntry {
                        holding,
                        pending: None,
                    },
                )
            }
            None => self.drop_holding(&uid),
        }
    }

    /// The pod was deleted.
    pub fn remove_pod(&mut self, uid: &str) {
        self.pod_problems.remove(uid);
        self.victims.remove(uid);
        self.nominated.remove(uid);
        self.reservations.remove_pod(uid);
        self.quota.forget_dra_pod(uid);
        self.drop_holding(uid);
        self.set_whole(uid, None);
    }

    /// Records (or, with `None`, forgets) the whole cards a pod holds, recounting the
    /// nodes concerned when that changes.
    fn set_whole(&mut self, uid: &str, whole: Option<WholeCardHolding>) {
        let old = match &whole {
            Some(w) => self.whole.insert(uid.to_owned(), w.clone()),
            None => self.whole.remove(uid),
        };
        if old == whole {
            return;
        }
        let nodes: Vec<String> = old.into_iter().chain(whole).map(|w| w.node).collect();
        for node in nodes {
            self.recount(&node);
        }
    }

    fn drop_holding(&mut self, uid: &str) {
        self.quota.release(uid);
        if let Some(entry) = self.pods.remove(uid) {
            if let Some(set) = self.pods_by_node.get_mut(&entry.holding.node) {
                set.remove(uid);
            }
            self.victims.sync_holder(&entry.holding.node, uid, None);
            self.recount(&entry.holding.node);
        }
    }

    /// Replaces every pod (after an informer relist); pending decisions of pods still
    /// present are kept.
    pub fn reset_pods<'a>(&mut self, pods: impl IntoIterator<Item = &'a Pod>) {
        let mut seen = HashSet::new();
        for pod in pods {
            if let Some(uid) = uid(pod) {
                seen.insert(uid);
            }
            self.upsert_pod(pod);
        }
        let gone: Vec<String> = self
            .kept_pod_uids()
            .into_iter()
            .filter(|u| !seen.contains(u))
            .collect();
        for uid in gone {
            self.remove_pod(&uid);
        }
    }

    /// Every pod UID the state keeps anything of — holdings, problems, whole cards, victim
    /// facts, nominations, defrag reservation owners, DRA quota charges: what a relist must
    /// forget ([`Self::remove_pod`]) of the pods it no longer lists. The one list both
    /// [`Self::reset_pods`] and the scheduler's pod informer use, so a new per-pod record
    /// cannot be left out of one of them.
    pub fn kept_pod_uids(&self) -> HashSet<String> {
        self.pods
            .keys()
            .chain(self.pod_problems.keys())
            .chain(self.whole.keys())
            .chain(self.victims.uids())
            .chain(self.nominated.uids())
            .chain(self.reservations.uids())
            .chain(self.quota.dra_pods())
            .cloned()
            .collect()
    }

    /// Records a filter decision before its patch is sent.
    pub fn reserve(
        &mut self,
        uid: &str,
        holding: PodHolding,
        annotations: BTreeMap<&'static str, String>,
    ) {
        self.set_pod(
            uid.to_owned(),
            PodEntry {
                holding,
                pending: Some(annotations),
            },
        );
    }

    /// Drops whatever the pod holds (a re-filter, or a patch that failed).
    pub fn release(&mut self, uid: &str) {
        self.drop_holding(uid);
    }

    fn set_pod(&mut self, uid: String, entry: PodEntry) {
        let node = entry.holding.node.clone();
        // The preempt verb's lists change where what the pod holds changed.
        match self.pods.get(&uid) {
            Some(old) if old.holding == entry.holding => {}
            old => {
                if let Some(old) = old.filter(|o| o.holding.node != node) {
                    self.victims.sync_holder(&old.holding.node, &uid, None);
                }
                let charges = Some(entry.holding.charges.as_slice());
                self.victims.sync_holder(&node, &uid, charges);
            }
        }
        if let Some(old) = self.pods.insert(uid.clone(), entry)
            && old.holding.node != node
        {
            if let Some(set) = self.pods_by_node.get_mut(&old.holding.node) {
                set.remove(&uid);
            }
            self.recount(&old.holding.node);
        }
        self.pods_by_node
            .entry(node.clone())
            .or_default()
            .insert(uid);
        self.recount(&node);
    }

    /// Recomputes a node's usage from its pods (cheap: a node holds few pods).
    fn recount(&mut self, node: &str) {
        let Some(entry) = self.nodes.get_mut(node) else {
            return;
        };
        let mut snapshot = NodeSnapshot::idle(entry.snapshot.devices.clone());
        if let Some(uids) = self.pods_by_node.get(node) {
            for uid in uids {
                if let Some(pod) = self.pods.get(uid) {
                    snapshot.charge(&pod.holding.charges);
                }
            }
        }
        for w in self.whole.values().filter(|w| w.node == node) {
            snapshot.hold_whole(&w.cards);
        }
        entry.snapshot = snapshot;
    }

    /// The node's GPUs and usage, if the node is known.
    pub fn node(&self, name: &str) -> Option<&NodeSnapshot> {
        self.nodes.get(name).map(|e| &e.snapshot)
    }

    /// Every known node's name.
    pub fn node_names(&self) -> impl Iterator<Item = &String> {
        self.nodes.keys()
    }

    /// Every known node's GPUs and usage.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeSnapshot> {
        self.nodes.values().map(|e| &e.snapshot)
    }

    /// What the pod with this UID holds, if anything.
    pub fn holding(&self, uid: &str) -> Option<&PodHolding> {
        self.pods.get(uid).map(|e| &e.holding)
    }

    /// Whether the pod's filter decision is not yet seen through the informer.
    pub fn is_pending(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|e| e.pending.is_some())
    }

    /// The pods holding GPUs on `node`, with their uids.
    pub fn holdings_on(&self, node: &str) -> impl Iterator<Item = (&String, &PodHolding)> {
        let uids = self.pods_by_node.get(node).into_iter().flatten();
        uids.filter_map(|uid| self.pods.get(uid).map(|e| (uid, &e.holding)))
    }

    /// What the preempt verb knows of the pods holding slices (`victim_facts`).
    pub fn victim_facts(&self) -> &crate::victim_facts::VictimFacts {
        &self.victims
    }

    /// The pods nominated to a node and not bound yet (`nominated`).
    pub fn nominations(&self) -> &crate::nominated::Nominations {
        &self.nominated
    }

    /// Every pod holding GPUs, with its uid.
    pub fn holdings(&self) -> impl Iterator<Item = (&String, &PodHolding)> {
        self.pods.iter().map(|(uid, e)| (uid, &e.holding))
    }

    /// Every pod the scheduler did not place that holds whole cards, with its uid.
    pub fn whole_card_holdings(&self) -> impl Iterator<Item = (&String, &WholeCardHolding)> {
        self.whole.iter()
    }

    /// Pods holding GPUs.
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
