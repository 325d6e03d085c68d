//! What-if from the live cluster (issue 31 item 8): the nodes and pods the UI watches,
//! edited by "+N nodes like X" and "remove node Y", and each pending pod run through the
//! scheduler's own filter decision (`decide_filter`) before and after the edits, in the
//! scheduler's queue order (priority, then age), each placed pod's slices reserved for the
//! next. A pod on a removed node is recreated by its controller: it is planned again after
//! the edits, with the pods that wait. Nothing is written to the cluster. Pure: the
//! server takes the [`Snapshot`] under the world's lock and runs [`run`] on a planning
//! thread (`whatif_run.rs`), which asks `stop` before each pod.
//!
//! Every field of the form is hostile input: counts are bounded ([`MAX_ADDED`],
//! [`MAX_REMOVED`], the What-if limits' node count and planner work), names must be nodes
//! the UI knows, and every refusal is a [`Problem`] saying what to change.

use std::collections::BTreeSet;

use hami_protocol::names::{SCHEDULER_OWNED_ANNOTATIONS, node as node_keys};
use hami_protocol::requests::{RequestDefaults, pod_requests};
use hami_scheduler_core::extender::{FilterConfig, decide_filter};
use hami_scheduler_core::preemption::priority;
use hami_scheduler_core::state::ClusterState;
use hami_scheduler_core::usage::DeviceCharge;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::query::fields;
use crate::whatif::{Limits, Problem};
use crate::whatif_run::Ran;
use crate::world::{World, is_dra_node, pod_key};

/// Most nodes one "+N nodes like X" adds.
pub const MAX_ADDED: u64 = 100;
/// Most nodes one request removes.
pub const MAX_REMOVED: usize = 32;
/// Most waiting pods planned (the oldest of the highest priority first); the rest are
/// counted and left out.
pub const MAX_PENDING: usize = 2000;
/// Largest form body the live What-if and defrag forms take, bytes.
pub const MAX_FORM_BYTES: usize = 16 * 1024;
/// Longest node or pod name taken (Kubernetes allows 253).
const MAX_NAME: usize = 253;

/// The cluster as the UI saw it at one moment: what [`run`] plans from.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Every node the device plugins register on (DRA nodes are left out: the scheduler's
    /// filter does not place their pods).
    pub nodes: Vec<Node>,
    /// Every pod.
    pub pods: Vec<Pod>,
    /// Names of the DRA nodes (refused as a model or removal, saying why).
    pub dra_nodes: BTreeSet<String>,
    /// Unix seconds (the filter stamps it on a placement).
    pub now: i64,
}

impl Snapshot {
    /// The nodes and pods of `world` (clones: the lock is held only while copying).
    pub fn of(world: &World, now: i64) -> Snapshot {
        let (dra, plugin): (Vec<&Node>, Vec<&Node>) =
            world.nodes.values().partition(|n| is_dra_node(n));
        Snapshot {
            nodes: plugin.into_iter().cloned().collect(),
            pods: world.pods.values().cloned().collect(),
            dra_nodes: dra
                .into_iter()
                .filter_map(|n| n.metadata.name.clone())
                .collect(),
            now,
        }
    }

    fn has_node(&self, name: &str) -> bool {
        self.nodes
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some(name))
    }

    /// Why `name` (from the form's `field`) cannot be used, or `None` when it is a node.
    fn unknown_node(&self, field: &str, name: &str) -> Option<Problem> {
        if self.has_node(name) {
            return None;
        }
        let shown = shorten(name);
        Some(if self.dra_nodes.contains(name) {
            Problem::bad(format!(
                "{field}={shown:?} runs the AMD DRA driver; the What-if planner places device-plugin pods only: pick a node whose GPUs the device plugins register"
            ))
        } else {
            Problem::bad(format!(
                "{field}={shown:?}: the cluster has no node of that name (it may have left since the page was shown); pick one of the nodes listed on the form"
            ))
        })
    }
}

/// A name as a message may quote it: at most 64 characters.
pub(crate) fn shorten(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((i, _)) => format!("{}…", &name[..i]),
        None => name.to_owned(),
    }
}

/// The edits of one request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Edits {
    /// "+N nodes like X": N and X.
    pub add: Option<(u64, String)>,
    /// "remove node Y", each Y once, in the order given.
    pub remove: Vec<String>,
}

/// The form's fields decoded (`application/x-www-form-urlencoded`), values trimmed.
pub(crate) fn form_fields(body: &[u8]) -> Result<Vec<(String, String)>, Problem> {
    if body.len() > MAX_FORM_BYTES {
        return Err(Problem::too_large(format!(
            "the form is {} bytes; the UI takes at most {MAX_FORM_BYTES}: post it from the What-if page",
            body.len()
        )));
    }
    let text = std::str::from_utf8(body)
        .map_err(|_| Problem::bad("the form is not UTF-8 text; post it from the What-if page"))?;
    fields(text).map_err(|e| Problem::bad(format!("{e}; post the form from the What-if page")))
}

/// A count of nodes to add from the form's `add` field: 1 to [`MAX_ADDED`].
fn node_count(text: &str) -> Result<u64, Problem> {
    let shown = shorten(text);
    if let Some(rest) = text.strip_prefix('-')
        && !rest.is_empty()
        && rest.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(Problem::bad(format!(
            "add={shown}: a count of nodes to add cannot be negative; to take nodes out, name them under \"remove node\""
        )));
    }
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Problem::bad(format!(
            "add={shown:?} is not a whole number: write how many nodes to add, 1 to {MAX_ADDED}"
        )));
    }
    // All digits: too many of them to parse is a count past the cap too.
    let n = text.parse::<u64>().unwrap_or(u64::MAX);
    match n {
        0 => Err(Problem::bad(format!(
            "add=0 adds no node: write 1 to {MAX_ADDED}, or leave the count empty to add none"
        ))),
        n if n > MAX_ADDED => Err(Problem::too_large(format!(
            "add={shown}: the UI adds at most {MAX_ADDED} nodes at once; write {MAX_ADDED} or fewer, or plan a larger fleet with `hami plan --scenario FILE`"
        ))),
        n => Ok(n),
    }
}

/// Reads `add`, `like` and `remove` (repeatable) from the form and checks them against
/// `snapshot` and `limits`; nothing is planned unless every edit is sound.
pub fn edits_from_form(
    body: &[u8],
    snapshot: &Snapshot,
    limits: &Limits,
) -> Result<Edits, Problem> {
    let (mut add, mut like, mut remove) = (String::new(), String::new(), Vec::<String>::new());
    for (key, value) in form_fields(body)? {
        match key.as_str() {
            "add" => add = value,
            "like" => like = value,
            // Node names hold no comma or space: a list in one field is several nodes.
            "remove" => {
                for name in value.split(|c: char| c == ',' || c.is_whitespace()) {
                    if !name.is_empty() && !remove.iter().any(|r| r == name) {
                        remove.push(name.to_owned());
                    }
                    if remove.len() > MAX_REMOVED {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    let mut edits = Edits::default();
    match (add.is_empty(), like.is_empty()) {
        (true, true) => {}
        (false, true) => {
            return Err(Problem::bad(format!(
                "add={}: say which node the new ones are like (the \"like node\" field)",
                shorten(&add)
            )));
        }
        (true, false) => {
            return Err(Problem::bad(format!(
                "like={:?}: say how many nodes like it to add (the \"add\" field, 1 to {MAX_ADDED})",
                shorten(&like)
            )));
        }
        (false, false) => {
            let n = node_count(&add)?;
            if like.len() > MAX_NAME {
                return Err(Problem::bad(format!(
                    "like=: a node name is at most {MAX_NAME} characters; pick one of the nodes listed"
                )));
            }
            if let Some(p) = snapshot.unknown_node("like", &like) {
                return Err(p);
            }
            edits.add = Some((n, like));
        }
    }
    if remove.len() > MAX_REMOVED {
        return Err(Problem::too_large(format!(
            "more than {MAX_REMOVED} nodes to remove; the UI removes at most {MAX_REMOVED} at once: name fewer, or plan the fleet with `hami plan --scenario FILE`"
        )));
    }
    for name in &remove {
        if name.len() > MAX_NAME {
            return Err(Problem::bad(format!(
                "remove=: a node name is at most {MAX_NAME} characters; pick one of the nodes listed"
            )));
        }
        if let Some(p) = snapshot.unknown_node("remove", name) {
            return Err(p);
        }
    }
    edits.remove = remove;
    let after = snapshot.nodes.len() as u64 + edits.add.as_ref().map_or(0, |(n, _)| *n)
        - edits.remove.len() as u64;
    if after > limits.max_nodes {
        return Err(Problem::too_large(format!(
            "the cluster would have {after} nodes; the UI plans at most {}: add fewer, or plan it with `hami plan --scenario FILE`",
            limits.max_nodes
        )));
    }
    Ok(edits)
}

/// What the scheduler's filter does with one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Placed on `node`, holding `cards`.
    Placed {
        /// The node filter chose.
        node: String,
        /// What it holds per card.
        cards: Vec<DeviceCharge>,
    },
    /// No node takes it: the scheduler's reason.
    Waits {
        /// The FilteringFailed text or the extender's error.
        reason: String,
    },
}

impl Outcome {
    /// Whether it was placed.
    pub fn placed(&self) -> bool {
        matches!(self, Outcome::Placed { .. })
    }
}

/// One pod planned.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `namespace/name`.
    pub pod: String,
    /// The removed node it ran on (its controller's new pod is planned); `None`: it waits
    /// now.
    pub from: Option<String>,
    /// Before the edits (`None` for a pod of a removed node: it runs there now).
    pub before: Option<Outcome>,
    /// After the edits.
    pub after: Outcome,
}

/// The before/after of one request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LiveReport {
    /// Nodes and GPUs the filter places on, before and after.
    pub nodes: (usize, usize),
    /// GPUs, before and after.
    pub gpus: (usize, usize),
    /// Names of the nodes added.
    pub added: Vec<String>,
    /// Names of the nodes removed.
    pub removed: Vec<String>,
    /// Waiting pods (then the removed nodes' GPU pods), in the order planned.
    pub rows: Vec<Row>,
    /// Waiting pods past [`MAX_PENDING`], not planned.
    pub left_out: usize,
    /// Pods of the removed nodes that ask no GPU (kube-scheduler places them; not planned).
    pub displaced_without_gpu: usize,
}

impl LiveReport {
    /// Pods placed before and after the edits (of those waiting before).
    pub fn placed(&self) -> (usize, usize) {
        let before = self
            .rows
            .iter()
            .filter(|r| r.before.as_ref().is_some_and(Outcome::placed))
            .count();
        let after = self.rows.iter().filter(|r| r.after.placed()).count();
        (before, after)
    }
}

/// Finished, or being deleted.
pub(crate) fn is_terminal(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed")
}

/// Asks a GPU (or asks in a way the scheduler refuses: planned, so its reason shows).
pub(crate) fn asks_gpu(pod: &Pod) -> bool {
    pod_requests(pod, &RequestDefaults::default())
        .map(|r| r.iter().any(|c| !c.is_empty()))
        // A request the scheduler refuses is planned, so its reason is shown.
        .unwrap_or(true)
}

/// The pods waiting for GPUs: unbound, not finished, asking a GPU, holding nothing.
fn waiting<'a>(snapshot: &'a Snapshot, state: &ClusterState) -> Vec<&'a Pod> {
    snapshot
        .pods
        .iter()
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none()))
        .filter(|p| !is_terminal(p) && asks_gpu(p))
        .filter(|p| {
            p.metadata
                .uid
                .as_deref()
                .is_none_or(|uid| state.holding(uid).is_none())
        })
        .collect()
}

/// The scheduler's queue order: higher priority first, then a pod of a removed node after
/// those already waiting (its controller creates it now), then older first, then by name.
fn queue_key(pod: &Pod, recreated: bool) -> impl Ord + use<> {
    (
        std::cmp::Reverse(priority(pod)),
        recreated,
        pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        pod_key(pod),
    )
}

/// The pod its controller creates once `pod`'s node is gone: its labels, owner, own
/// annotations and containers, unbound, with none of the scheduler's annotations.
fn recreated(pod: &Pod) -> Pod {
    let meta = &pod.metadata;
    let annotations = meta.annotations.clone().map(|mut a| {
        a.retain(|k, _| !SCHEDULER_OWNED_ANNOTATIONS.contains(&k.as_str()));
        a
    });
    let mut spec = pod.spec.clone();
    if let Some(s) = spec.as_mut() {
        s.node_name = None;
    }
    Pod {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.as_ref().map(|u| format!("{u}-whatif")),
            labels: meta.labels.clone(),
            annotations,
            owner_references: meta.owner_references.clone(),
            creation_timestamp: meta.creation_timestamp.clone(),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// Copies of node `like` named `<like>-whatif-<i>` (skipping names in use), without the
/// defrag reservations written on the original.
fn copies(snapshot: &Snapshot, count: u64, like: &str) -> Vec<Node> {
    let Some(model) = snapshot
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(like))
    else {
        return Vec::new();
    };
    let taken: BTreeSet<&str> = snapshot
        .nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    let stem: String = like.chars().take(MAX_NAME - 20).collect();
    let mut out = Vec::new();
    let mut i = 0u64;
    while (out.len() as u64) < count {
        i += 1;
        let name = format!("{stem}-whatif-{i}");
        if taken.contains(name.as_str()) {
            continue;
        }
        let mut node = model.clone();
        node.metadata.name = Some(name.clone());
        node.metadata.uid = None;
        node.metadata.resource_version = None;
        if let Some(a) = node.metadata.annotations.as_mut() {
            a.retain(|k, _| !k.starts_with(node_keys::DEFRAG_RESERVATION_PREFIX));
        }
        if let Some(l) = node.metadata.labels.as_mut()
            && l.contains_key("kubernetes.io/hostname")
        {
            l.insert("kubernetes.io/hostname".into(), name);
        }
        out.push(node);
    }
    out
}

fn gpus(state: &ClusterState) -> usize {
    state.nodes().map(|n| n.devices.gpus.len()).sum()
}

/// One pod through the scheduler's filter decision over `names`; a placement stays
/// reserved in `state` for the pods after it.
fn place(state: &mut ClusterState, pod: &Pod, names: &[String], now: i64) -> Outcome {
    let decision = decide_filter(state, pod, names, &FilterConfig::default(), now);
    if !decision.result.error.is_empty() {
        return Outcome::Waits {
            reason: decision.result.error,
        };
    }
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    match (&decision.patch, state.holding(uid), decision.event) {
        (Some(_), Some(h), _) => Outcome::Placed {
            node: h.node.clone(),
            cards: h.charges.clone(),
        },
        (_, _, Some(event)) => Outcome::Waits {
            reason: event.message,
        },
        _ => Outcome::Waits {
            reason: "the scheduler's filter made no decision for it".into(),
        },
    }
}

fn state_of<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> (ClusterState, Vec<String>) {
    let nodes: Vec<&Node> = nodes.into_iter().collect();
    let mut state = ClusterState::new();
    state.reset_nodes(nodes.iter().copied());
    state.reset_pods(pods);
    let names = nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    (state, names)
}

/// Plans the waiting pods on the cluster as it is and as `edits` leave it, asking `stop`
/// before each pod: `Ok(None)` once it says stop. Refused (413) when the work — pods ×
/// (nodes + GPUs), twice — passes the limits.
pub fn run(
    snapshot: &Snapshot,
    edits: &Edits,
    limits: &Limits,
    stop: &dyn Fn() -> bool,
) -> Result<Option<LiveReport>, Problem> {
    let removed: BTreeSet<&str> = edits.remove.iter().map(String::as_str).collect();
    let added = match &edits.add {
        Some((n, like)) => copies(snapshot, *n, like),
        None => Vec::new(),
    };
    let (mut before, before_names) = state_of(&snapshot.nodes, &snapshot.pods);
    let mut queue = waiting(snapshot, &before);
    queue.sort_by_key(|p| queue_key(p, false));
    let left_out = queue.len().saturating_sub(MAX_PENDING);
    queue.truncate(MAX_PENDING);

    // Every pod of a removed node leaves it; those asking a GPU are planned again.
    let on_removed = |p: &Pod| {
        let bound = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let held = p
            .metadata
            .uid
            .as_deref()
            .and_then(|u| before.holding(u))
            .map(|h| h.node.as_str());
        !is_terminal(p) && (bound.or(held)).is_some_and(|n| removed.contains(n))
    };
    let leaving: Vec<&Pod> = snapshot.pods.iter().filter(|p| on_removed(p)).collect();
    let mut displaced: Vec<(Pod, String)> = leaving
        .iter()
        .filter(|p| asks_gpu(p))
        .map(|p| {
            let from = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .or_else(|| {
                    let uid = p.metadata.uid.as_deref()?;
                    Some(before.holding(uid)?.node.clone())
                })
                .unwrap_or_default();
            (recreated(p), from)
        })
        .collect();
    displaced.sort_by_key(|(p, _)| queue_key(p, true));
    let displaced_without_gpu = leaving.len() - displaced.len();
    let leaving_keys: BTreeSet<String> = leaving.iter().map(|p| pod_key(p)).collect();

    let kept_nodes = snapshot.nodes.iter().filter(|n| {
        n.metadata
            .name
            .as_deref()
            .is_none_or(|name| !removed.contains(name))
    });
    let (mut after, after_names) = state_of(
        kept_nodes.chain(&added),
        snapshot
            .pods
            .iter()
            .filter(|p| !leaving_keys.contains(&pod_key(p))),
    );
    let steps = (queue.len() as u64)
        .saturating_mul((before_names.len() + gpus(&before)) as u64)
        .saturating_add(
            ((queue.len() + displaced.len()) as u64)
                .saturating_mul((after_names.len() + gpus(&after)) as u64),
        );
    if steps > limits.max_work {
        return Err(Problem::too_large(format!(
            "planning {} waiting pods and {} of the removed nodes before and after takes {steps} steps; the UI plans at most {}: remove fewer nodes, or plan the fleet with `hami plan --scenario FILE`",
            queue.len(),
            displaced.len(),
            limits.max_work
        )));
    }
    let mut report = LiveReport {
        nodes: (before_names.len(), after_names.len()),
        gpus: (gpus(&before), gpus(&after)),
        added: added
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect(),
        removed: edits.remove.clone(),
        rows: Vec::with_capacity(queue.len() + displaced.len()),
        left_out,
        displaced_without_gpu,
    };
    for pod in &queue {
        if stop() {
            return Ok(None);
        }
        let was = place(&mut before, pod, &before_names, snapshot.now);
        report.rows.push(Row {
            pod: pod_key(pod),
            from: None,
            before: Some(was),
            after: Outcome::Waits {
                reason: String::new(),
            },
        });
    }
    // After the edits: the waiting pods and the recreated ones in one queue.
    let mut after_queue: Vec<(&Pod, Option<&str>, usize)> = queue
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, None, i))
        .chain(
            displaced
                .iter()
                .map(|(p, from)| (p, Some(from.as_str()), usize::MAX)),
        )
        .collect();
    after_queue.sort_by_key(|(p, from, _)| queue_key(p, from.is_some()));
    for (pod, from, row) in after_queue {
        if stop() {
            return Ok(None);
        }
        let outcome = place(&mut after, pod, &after_names, snapshot.now);
        match from {
            None => report.rows[row].after = outcome,
            Some(from) => report.rows.push(Row {
                pod: pod_key(pod),
                from: Some(from.to_owned()),
                before: None,
                after: outcome,
            }),
        }
    }
    Ok(Some(report))
}

/// [`run`] as a job of the UI's planner (`whatif_run::Runner::run`): stopped short, it says
/// what to change should the deadline be why.
pub fn job(
    snapshot: &Snapshot,
    edits: &Edits,
    limits: &Limits,
    stop: &dyn Fn() -> bool,
) -> Result<Ran<LiveReport>, Problem> {
    Ok(match run(snapshot, edits, limits, stop)? {
        Some(report) => Ran::Done(report),
        None => Ran::Stopped(format!(
            "planning the live cluster stopped after {} s, the UI's limit: remove fewer nodes, or plan the fleet with `hami plan --scenario FILE`",
            limits.deadline.as_secs()
        )),
    })
}
