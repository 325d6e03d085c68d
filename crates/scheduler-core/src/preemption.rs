//! The extender's preempt verb (issue 30 item 2): which slices a higher-priority pod
//! evicts on each node kube-scheduler proposes, decided with Filter's own fit
//! ([`crate::fit::fit_node`]) over the node's GPUs with the victims' charges taken away.
//!
//! kube-scheduler's dry run runs only in-tree filters, which cannot see which GPU a slice is
//! on; from Kubernetes 1.38 it also sends candidates with no victims. Per node:
//! - a proposed victim we may never evict (priority ≥ the preemptor's, critical, DaemonSet,
//!   static, `hami.io/preemptible: "false"`, already terminating) drops the node: in-tree
//!   may need it gone, and we must not name it;
//! - proposed victims holding no slice on the node are kept (in-tree needed them for CPU,
//!   memory or ports, which we cannot judge); proposed slices the pod does not need are not
//!   evicted (in-tree proposes them blind to cards);
//! - GPU victims are chosen from scratch among the eligible pods holding slices on the GPUs
//!   the pod will take: first one GPU at a time, else across GPUs; the set with the fewest
//!   PDB risks, the lowest highest priority, then the fewest victims wins (kube-scheduler's
//!   own order of preference between nodes), made minimal by a reprieve pass (highest
//!   priority first, as kube-scheduler reprieves);
//! - the node is kept only when the pod then fits by Filter's rule and the list is not
//!   empty (an empty answer would empty kube-scheduler's list, or preempt for nothing).
//!
//! Unknown nodes and pods are dropped without error; PDB violations are counted as
//! kube-scheduler counts them, over the final list.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use hami_protocol::names::Vendor;
use hami_protocol::requests::{ContainerRequest, RequestDefaults, pod_ref, pod_requests};
use hami_protocol::selection::{DeviceSelector, GpuPolicy, NodePolicy, PodPolicies};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use crate::extender::{
    ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaPod, MetaVictims, from_json_any_case,
};
use crate::fit::{FitRequest, Selectors, fit_node};
use crate::snapshot::NodeSnapshot;
use crate::usage::DeviceCharge;

/// The largest preempt request body read; a larger one is answered 413 (the HTTP shell's
/// limit, shared with `/filter`).
pub const PREEMPT_BODY_LIMIT: usize = 1 << 20;

/// Pods labelled `hami.io/preemptible: "false"` are never evicted for another pod (the
/// label's name is the protocol crate's).
pub use hami_protocol::names::pod::PREEMPTIBLE_LABEL;

/// Priority from which a pod is critical (`scheduling.SystemCriticalPriority`).
pub const CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The priority classes of critical pods.
pub const CRITICAL_CLASSES: [&str; 2] = ["system-node-critical", "system-cluster-critical"];

/// Why a preempt request body is not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Over [`PREEMPT_BODY_LIMIT`].
    #[error("preempt request body is {size} bytes; at most {limit} are read")]
    TooLarge {
        /// The body's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Not an `ExtenderPreemptionArgs`.
    #[error("{0}")]
    Invalid(String),
}

impl DecodeError {
    /// The HTTP status the shell answers: 413 or 400.
    pub const fn http_status(&self) -> u16 {
        match self {
            DecodeError::TooLarge { .. } => 413,
            DecodeError::Invalid(_) => 400,
        }
    }
}

fn lower_keys(value: &mut Value) {
    if let Value::Object(map) = value {
        let taken = std::mem::take(map);
        *map = taken
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect();
    }
}

/// Reads `ExtenderPreemptionArgs` as Go writes it (PascalCase) or in any other case:
/// the top-level keys, each victims object's and each meta pod's (a pod object itself is
/// read as the API spells it).
pub fn decode_args(body: &[u8]) -> Result<ExtenderPreemptionArgs, DecodeError> {
    if body.len() > PREEMPT_BODY_LIMIT {
        return Err(DecodeError::TooLarge {
            size: body.len(),
            limit: PREEMPT_BODY_LIMIT,
        });
    }
    let mut top: serde_json::Map<String, Value> =
        from_json_any_case(body).map_err(DecodeError::Invalid)?;
    for (key, meta) in [
        ("nodenametovictims", false),
        ("nodenametometavictims", true),
    ] {
        let Some(Value::Object(nodes)) = top.get_mut(key) else {
            continue;
        };
        for victims in nodes.values_mut() {
            lower_keys(victims);
            if meta && let Some(Value::Array(pods)) = victims.get_mut("pods") {
                pods.iter_mut().for_each(lower_keys);
            }
        }
    }
    serde_json::from_value(Value::Object(top)).map_err(|e| {
        DecodeError::Invalid(format!(
            "request body does not match ExtenderPreemptionArgs: {e}"
        ))
    })
}

/// Node → the UIDs kube-scheduler proposes to evict there (possibly none), from either
/// form of the request; pods without a UID are skipped.
pub fn proposals(args: &ExtenderPreemptionArgs) -> BTreeMap<String, Vec<String>> {
    // From a sorted map: built in one pass, not a search per node.
    let mut out: BTreeMap<String, Vec<String>> = args
        .node_name_to_meta_victims
        .iter()
        .flatten()
        .map(|(node, victims)| {
            let uids = victims
                .iter()
                .flat_map(|v| v.pods.iter().flatten())
                .map(|p| p.uid.clone())
                .collect();
            (node.clone(), uids)
        })
        .collect();
    for (node, victims) in args.node_name_to_victims.iter().flatten() {
        let uids = victims
            .iter()
            .flat_map(|v| v.pods.iter().flatten())
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        out.entry(node.clone()).or_insert(uids);
    }
    out
}

/// Why a pod may never be a victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protection {
    /// Priority ≥ the preemptor's.
    HigherPriority,
    /// `system-node-critical`, `system-cluster-critical` or priority ≥ 2 000 000 000.
    Critical,
    /// Owned by a DaemonSet (it would come back on the same node).
    DaemonSet,
    /// A static pod's mirror (deleting the mirror does not stop the pod).
    Static,
    /// Labelled `hami.io/preemptible: "false"`.
    NotPreemptible,
    /// Already being deleted: its slice frees when its containers are gone.
    Terminating,
}

impl Protection {
    /// For messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Protection::HigherPriority => "priority not below the preemptor's",
            Protection::Critical => "critical",
            Protection::DaemonSet => "DaemonSet pod",
            Protection::Static => "static pod",
            Protection::NotPreemptible => "labelled hami.io/preemptible=false",
            Protection::Terminating => "already terminating",
        }
    }
}

/// A pod's priority (`spec.priority`, 0 when unset).
pub fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// Why `pod` may never be evicted for anyone, if it may not.
pub fn protection(pod: &Pod) -> Option<Protection> {
    let meta = &pod.metadata;
    let class = pod
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_deref());
    if priority(pod) >= CRITICAL_PRIORITY || class.is_some_and(|c| CRITICAL_CLASSES.contains(&c)) {
        return Some(Protection::Critical);
    }
    let owners = meta.owner_references.iter().flatten();
    if owners.clone().any(|o| o.kind == "DaemonSet") {
        return Some(Protection::DaemonSet);
    }
    let mirror = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    if mirror || owners.clone().any(|o| o.kind == "Node") {
        return Some(Protection::Static);
    }
    if meta
        .labels
        .as_ref()
        .and_then(|l| l.get(PREEMPTIBLE_LABEL))
        .is_some_and(|v| v == "false")
    {
        return Some(Protection::NotPreemptible);
    }
    if meta.deletion_timestamp.is_some() {
        return Some(Protection::Terminating);
    }
    None
}

/// What the decision knows of a pod on a candidate node.
#[derive(Debug, Clone, PartialEq)]
pub struct PodFacts {
    /// Its UID.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name (PDBs' `disruptedPods` name pods).
    pub name: String,
    /// Its priority.
    pub priority: i32,
    /// Why it may never be evicted, whatever the preemptor's priority.
    pub protection: Option<Protection>,
    /// Its labels (PDB selectors).
    pub labels: BTreeMap<String, String>,
    /// What it holds on the node's GPUs (`state::PodHolding::charges`); empty: no slice.
    pub charges: Vec<DeviceCharge>,
}

impl PodFacts {
    /// The facts of `pod`, holding `charges` on its node.
    pub fn from_pod(pod: &Pod, charges: Vec<DeviceCharge>) -> Self {
        let owner = pod_ref(pod);
        Self {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            namespace: owner.namespace,
            name: owner.name,
            priority: priority(pod),
            protection: protection(pod),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            charges,
        }
    }
}

/// A PodDisruptionBudget as kube-scheduler's preemption reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct PdbFacts {
    /// Its namespace.
    pub namespace: String,
    /// `spec.selector`; none or empty matches no pod (as kube-scheduler reads it).
    pub selector: Option<LabelSelector>,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i32,
    /// `status.disruptedPods` names: already counted, never violated again.
    pub disrupted: BTreeSet<String>,
}

impl PdbFacts {
    /// The facts of a PodDisruptionBudget object.
    pub fn from_object(pdb: &PodDisruptionBudget) -> Self {
        let status = pdb.status.as_ref();
        Self {
            namespace: pdb
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            selector: pdb.spec.as_ref().and_then(|s| s.selector.clone()),
            disruptions_allowed: status.and_then(|s| s.disruptions_allowed).unwrap_or(0),
            disrupted: status
                .and_then(|s| s.disrupted_pods.as_ref())
                .map(|d| d.keys().cloned().collect())
                .unwrap_or_default(),
        }
    }

    fn covers(&self, pod: &PodFacts) -> bool {
        pod.namespace == self.namespace
            && !self.disrupted.contains(&pod.name)
            && self
                .selector
                .as_ref()
                .is_some_and(|s| selector_matches(s, &pod.labels))
    }
}

/// `metav1.LabelSelectorAsSelector(s).Matches(labels)`, where an empty selector and one
/// with an unknown operator match nothing (kube-scheduler skips both).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let exprs = selector.match_expressions.iter().flatten();
    let plain = selector.match_labels.iter().flatten();
    if plain.clone().next().is_none() && exprs.clone().next().is_none() {
        return false;
    }
    plain.clone().all(|(k, v)| labels.get(k) == Some(v))
        && exprs.clone().all(|e| {
            let values = e.values.iter().flatten();
            let value = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.clone().any(|x| x == v)),
                "NotIn" => value.is_none_or(|v| !values.clone().any(|x| x == v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// How many of `victims` (in order) violate a PDB: each covering PDB's allowance is spent
/// victim by victim, and a victim that takes one below 0 violates (kube-scheduler's
/// `filterPodsWithPDBViolation`).
pub fn pdb_violations<'a>(
    victims: impl IntoIterator<Item = &'a PodFacts>,
    pdbs: &[PdbFacts],
) -> i64 {
    let mut allowed: Vec<i64> = pdbs
        .iter()
        .map(|p| i64::from(p.disruptions_allowed))
        .collect();
    let mut violations = 0;
    for victim in victims {
        let mut violated = false;
        for (i, pdb) in pdbs.iter().enumerate() {
            if pdb.covers(victim) {
                allowed[i] -= 1;
                violated |= allowed[i] < 0;
            }
        }
        violations += i64::from(violated);
    }
    violations
}

/// The preemptor as Filter reads it.
#[derive(Debug, Clone)]
pub struct Preemptor {
    /// Its priority.
    pub priority: i32,
    /// Its requests in device-list order.
    pub containers: Vec<ContainerRequest>,
    /// Its GPU include/exclude rules.
    pub selectors: Selectors,
    /// How its GPUs are chosen.
    pub gpu_policy: GpuPolicy,
    /// How nodes are ranked (unused here; kept so the fit request is Filter's).
    pub node_policy: NodePolicy,
}

impl Preemptor {
    /// Reads the pod as `extender::decide_filter` does, with the scheduler's defaults.
    pub fn from_pod(
        pod: &Pod,
        defaults: &RequestDefaults,
        gpu_policy: GpuPolicy,
        node_policy: NodePolicy,
    ) -> Result<Self, String> {
        let who = pod_ref(pod);
        let containers = pod_requests(pod, defaults).map_err(|e| format!("pod {who}: {e}"))?;
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let amd = DeviceSelector::from_annotations(Vendor::Amd, &annotations);
        let nvidia = DeviceSelector::from_annotations(Vendor::Nvidia, &annotations);
        let policies = PodPolicies::from_annotations(&annotations);
        let (amd, nvidia, policies) = match (amd, nvidia, policies) {
            (Ok(a), Ok(n), Ok(p)) => (a, n, p),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                return Err(format!("pod {who}: {e}"));
            }
        };
        Ok(Self {
            priority: priority(pod),
            containers,
            selectors: Selectors { amd, nvidia },
            gpu_policy: policies.gpu.unwrap_or(gpu_policy),
            node_policy: policies.node.unwrap_or(node_policy),
        })
    }

    /// Filter's view of the pod.
    pub fn fit_request(&self) -> FitRequest<'_> {
        FitRequest {
            containers: &self.containers,
            selectors: &self.selectors,
            gpu_policy: self.gpu_policy,
            node_policy: self.node_policy,
        }
    }

    /// Whether it asks for any GPU (the extender is called only for such pods).
    pub fn asks_for_gpus(&self) -> bool {
        self.containers.iter().any(|c| !c.is_empty())
    }
}

/// A node kube-scheduler proposes, as the scheduler knows it.
#[derive(Debug, Clone, Copy)]
pub struct NodeCandidate<'a> {
    /// Its GPUs and their usage now, every pod's charges included.
    pub snapshot: &'a NodeSnapshot,
    /// The pods on it that the decision may name (those holding slices, and the proposed
    /// victims the shell could read); a proposed UID not here is unknown and dropped.
    pub pods: &'a [PodFacts],
}

/// A proposed node as the state keeps it for the preempt verb: its pods' facts shared,
/// their charges laid out flat ([`NodePods`], `victim_facts::node_pods`).
#[derive(Debug, Clone, Copy)]
pub struct HeldCandidate<'a> {
    /// Its GPUs and their usage now, every pod's charges included.
    pub snapshot: &'a NodeSnapshot,
    /// The pods on it that the decision may name (as [`NodeCandidate::pods`]).
    pub pods: &'a NodePods,
}

/// A proposed node in either form.
enum Candidate<'a> {
    Facts(NodeCandidate<'a>),
    Held(HeldCandidate<'a>),
}

impl<'a> From<NodeCandidate<'a>> for Candidate<'a> {
    fn from(c: NodeCandidate<'a>) -> Self {
        Candidate::Facts(c)
    }
}

impl<'a> From<HeldCandidate<'a>> for Candidate<'a> {
    fn from(c: HeldCandidate<'a>) -> Self {
        Candidate::Held(c)
    }
}

/// Why a node was dropped from the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Veto {
    /// The scheduler does not know the node.
    UnknownNode,
    /// Even with every eligible pod evicted the pod does not fit; Filter's reason.
    NoEvictionFits(String),
    /// kube-scheduler proposed a pod we may never evict.
    Protected {
        /// `namespace/name` of the pod.
        pod: String,
        /// Why.
        why: Protection,
    },
    /// The pod fits without evicting anything (its reason for failing Filter is gone).
    NothingToEvict,
}

impl std::fmt::Display for Veto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Veto::UnknownNode => write!(f, "node unknown to the scheduler"),
            Veto::NoEvictionFits(why) => {
                write!(
                    f,
                    "does not fit even with every lower-priority slice evicted: {why}"
                )
            }
            Veto::Protected { pod, why } => {
                write!(
                    f,
                    "proposed victim {pod} may not be evicted ({})",
                    why.as_str()
                )
            }
            Veto::NothingToEvict => write!(f, "fits without evicting anything"),
        }
    }
}

/// The preempt verb's answer and what the shell reports.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PreemptionDecision {
    /// What kube-scheduler is answered.
    pub result: ExtenderPreemptionResult,
    /// Nodes dropped, with why.
    pub vetoed: BTreeMap<String, Veto>,
    /// Proposed pods the scheduler does not know, dropped: `(node, uid)`.
    pub unknown_pods: Vec<(String, String)>,
}

impl PreemptionDecision {
    /// The Warning Event text for the preemptor when every proposed node was vetoed.
    pub fn all_vetoed_message(&self) -> Option<String> {
        if !self.result.node_name_to_meta_victims.is_empty() || self.vetoed.is_empty() {
            return None;
        }
        let mut by_why: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for (node, veto) in &self.vetoed {
            by_why.entry(veto.to_string()).or_default().push(node);
        }
        let parts: Vec<String> = by_why
            .into_iter()
            .map(|(why, nodes)| {
                let shown: Vec<&str> = nodes.iter().take(5).copied().collect();
                let more = nodes.len().saturating_sub(5);
                let more = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                format!("{why} (on {}{more})", shown.join(","))
            })
            .collect();
        Some(format!(
            "preemption: 0/{} nodes can make room for the pod's GPUs: {}",
            self.vetoed.len(),
            parts.join("; ")
        ))
    }

    /// Victims named over every node kept.
    pub fn victim_count(&self) -> usize {
        self.result
            .node_name_to_meta_victims
            .values()
            .map(|v| v.pods.as_ref().map_or(0, Vec::len))
            .sum()
    }
}

/// Below this many nodes one thread is faster than splitting the work.
const PARALLEL_FROM: usize = 32;

/// Decides the preempt verb: `proposals` from [`proposals`], `node` the scheduler's view of
/// a proposed node (`None`: unknown), `pdbs` every PodDisruptionBudget that may cover a
/// victim. A preemptor without GPUs passes the proposals through unchanged.
pub fn decide_preemption<'a>(
    preemptor: &Preemptor,
    proposals: &BTreeMap<String, Vec<String>>,
    node: impl Fn(&str) -> Option<NodeCandidate<'a>> + Sync,
    pdbs: &[PdbFacts],
) -> PreemptionDecision {
    // Prepared once per call: every node's search shares it.
    let how = Search::Fast(search::Fast::new(preemptor, pdbs));
    decide_with(preemptor, proposals, node, pdbs, &how)
}

/// [`decide_preemption`] on nodes as the state keeps them for the verb ([`HeldCandidate`]):
/// the same decisions as on the same pods given as [`NodeCandidate`]s.
pub fn decide_preemption_held<'a>(
    preemptor: &Preemptor,
    proposals: &BTreeMap<String, Vec<String>>,
    node: impl Fn(&str) -> Option<HeldCandidate<'a>> + Sync,
    pdbs: &[PdbFacts],
) -> PreemptionDecision {
    let how = Search::Fast(search::Fast::new(preemptor, pdbs));
    decide_with(preemptor, proposals, node, pdbs, &how)
}

/// How each node's victims are searched: the same decisions either way.
enum Search<'p> {
    /// The verb's (`preemption_search.rs`): each GPU's order kept sorted by the node's
    /// list, trials judged by [`crate::fit::quick::QuickFit`] on one scratch copy of the node per thread.
    Fast(search::Fast<'p>),
    /// The search as first written (`preemption_reference.rs`, Filter's `fit_node` on a
    /// fresh copy per trial): the reference the tests compare the verb's decisions with.
    #[cfg(test)]
    Reference,
}

/// [`decide_preemption`] with its victims found as `how` says.
fn decide_with<'a, C: Into<Candidate<'a>>>(
    preemptor: &Preemptor,
    proposals: &BTreeMap<String, Vec<String>>,
    node: impl Fn(&str) -> Option<C> + Sync,
    pdbs: &[PdbFacts],
    how: &Search<'_>,
) -> PreemptionDecision {
    let mut decision = PreemptionDecision::default();
    if !preemptor.asks_for_gpus() {
        for (name, uids) in proposals {
            let pods = uids
                .iter()
                .map(|uid| MetaPod { uid: uid.clone() })
                .collect();
            decision.result.node_name_to_meta_victims.insert(
                name.clone(),
                MetaVictims {
                    pods: Some(pods),
                    num_pdb_violations: 0,
                },
            );
        }
        return decision;
    }
    let work: Vec<(&String, &Vec<String>)> = proposals.iter().collect();
    let one =
        |(name, uids): &(&String, &Vec<String>), scratch: &mut search::Scratch| -> NodeOutcome {
            match node(name) {
                None => NodeOutcome {
                    result: Err(Veto::UnknownNode),
                    unknown: Vec::new(),
                },
                Some(candidate) => match candidate.into() {
                    Candidate::Held(c) => {
                        refine(preemptor, how, c.snapshot, c.pods, uids, pdbs, scratch)
                    }
                    Candidate::Facts(c) => {
                        // Borrowed, laid out for this call only.
                        let pods = NodePods::new(c.pods.iter().map(|p| (p, p.charges.as_slice())));
                        refine(preemptor, how, c.snapshot, &pods, uids, pdbs, scratch)
                    }
                },
            }
        };
    // One scratch per thread, reused from node to node.
    let some = |chunk: &[(&String, &Vec<String>)]| -> Vec<NodeOutcome> {
        let mut scratch = search::Scratch::default();
        chunk.iter().map(|w| one(w, &mut scratch)).collect()
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let outcomes: Vec<NodeOutcome> = if work.len() >= PARALLEL_FROM && threads > 1 {
        let size = work.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = work
                .chunks(size)
                .map(|chunk| scope.spawn(|| some(chunk)))
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    } else {
        some(&work)
    };
    // In name order (the proposals' own): the maps are built from sorted runs, not a
    // search per node.
    let (mut kept, mut vetoed) = (Vec::new(), Vec::new());
    for ((name, _), outcome) in work.iter().zip(outcomes) {
        decision.unknown_pods.extend(
            outcome
                .unknown
                .into_iter()
                .map(|uid| ((*name).clone(), uid)),
        );
        match outcome.result {
            Ok(victims) => kept.push(((*name).clone(), victims)),
            Err(veto) => vetoed.push(((*name).clone(), veto)),
        }
    }
    decision.result.node_name_to_meta_victims = kept.into_iter().collect();
    decision.vetoed = vetoed.into_iter().collect();
    decision
}

struct NodeOutcome {
    result: Result<MetaVictims, Veto>,
    unknown: Vec<String>,
}

/// One node's victims: see the module's rules.
fn refine<F: Borrow<PodFacts>>(
    preemptor: &Preemptor,
    how: &Search<'_>,
    snapshot: &NodeSnapshot,
    pods: &NodePods<F>,
    proposed: &[String],
    pdbs: &[PdbFacts],
    scratch: &mut search::Scratch,
) -> NodeOutcome {
    // Only proposed pods are looked up (none from Kubernetes ≥ 1.38 on most nodes).
    let by_uid: HashMap<&str, usize> = if proposed.is_empty() {
        HashMap::new()
    } else {
        pods.facts()
            .enumerate()
            .map(|(i, p)| (p.uid.as_str(), i))
            .collect()
    };
    let mut unknown = Vec::new();
    let mut kept: Vec<&PodFacts> = Vec::new();
    let finish = |result, unknown| NodeOutcome { result, unknown };
    for uid in proposed {
        let Some(&i) = by_uid.get(uid.as_str()) else {
            unknown.push(uid.clone());
            continue;
        };
        let held = &pods.pods()[i];
        let pod: &PodFacts = held.facts.borrow();
        if let Some(why) = barred(preemptor, pod) {
            let veto = Veto::Protected {
                pod: format!("{}/{}", pod.namespace, pod.name),
                why,
            };
            return finish(Err(veto), unknown);
        }
        if !held.holds {
            kept.push(pod);
        }
    }
    let chosen = match how {
        Search::Fast(fast) => search::choose(preemptor, fast, snapshot, pods, pdbs, scratch),
        #[cfg(test)]
        Search::Reference => reference::choose(preemptor, snapshot, pods, pdbs),
    };
    let gpu_victims = match chosen {
        Ok(v) => v,
        Err(veto) => return finish(Err(veto), unknown),
    };
    let mut victims: Vec<&PodFacts> = kept;
    victims.reserve(gpu_victims.len());
    for v in gpu_victims {
        if !victims.iter().any(|k| pods::same_str(&k.uid, &v.uid)) {
            victims.push(v);
        }
    }
    if victims.is_empty() {
        return finish(Err(Veto::NothingToEvict), unknown);
    }
    let num_pdb_violations = pdb_violations(victims.iter().copied(), pdbs);
    let pods = victims
        .iter()
        .map(|v| MetaPod { uid: v.uid.clone() })
        .collect();
    finish(
        Ok(MetaVictims {
            pods: Some(pods),
            num_pdb_violations,
        }),
        unknown,
    )
}

/// Why `pod` may not be evicted for `preemptor`.
pub fn barred(preemptor: &Preemptor, pod: &PodFacts) -> Option<Protection> {
    pod.protection
        .or_else(|| (pod.priority >= preemptor.priority).then_some(Protection::HigherPriority))
}

/// Whether `preemptor` fits `snapshot` by Filter's rule.
pub fn fits(preemptor: &Preemptor, snapshot: &NodeSnapshot) -> Result<(), String> {
    fit_node(snapshot, &preemptor.fit_request()).map(|_| ())
}

#[path = "preemption_search.rs"]
mod search;

#[path = "preemption_pods.rs"]
mod pods;
pub use pods::NodePods;

#[path = "preemption_gpu_order.rs"]
mod order;

#[cfg(test)]
#[path = "preemption_reference.rs"]
mod reference;

#[cfg(test)]
#[path = "preemption_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "preemption_order_tests.rs"]
mod order_tests;
