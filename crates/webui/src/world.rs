//! What the UI knows about the cluster: nodes, pods and events as the watchers last saw
//! them, and the scheduler's own usage state (`ClusterState`, the core `hami status`
//! uses), kept incrementally: a pod's annotations are decoded once per change, not per
//! page view. Plain data; the watchers (`watch.rs`) feed it.
//!
//! DRA nodes (issue 20) have no registration annotation and their pods no allocation
//! annotation: their devices and shares come from the driver's ResourceSlices and the
//! ResourceClaims, through the same model `hami status` prints
//! (`hami_report::dra_status`), built once per change of either, when a page first asks.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use hami_protocol::dra::{AMD_MODE_DRA, AMD_MODE_LABEL, DRIVER};
use hami_protocol::requests::pod_ref;
use hami_report::dra_status::{self, DraDevice, DraNode, PodShare};
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

/// Events kept in all. Past it, the namespace holding the most Events loses its oldest: the
/// budget is shared fairly, so one namespace's flood erases its own Events, never another
/// namespace's pending reasons (a single cap let it, issue 27).
pub const MAX_EVENTS: usize = 5000;

/// A Kubernetes Event, core/v1 or events.k8s.io/v1, reduced to what the pages show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    /// The same Event read through core/v1 and events.k8s.io/v1 has one uid: kept once.
    pub uid: String,
    /// `core` or `events` (the API group it was read from).
    pub source: &'static str,
    /// Seconds since the epoch (the event's last time, else its first).
    pub at: i64,
    /// Kind of the object it is about (`Pod`, `Node`, …).
    pub kind: String,
    /// Namespace of that object.
    pub namespace: String,
    /// Name of that object.
    pub name: String,
    /// The event's reason, e.g. `FilteringFailed`.
    pub reason: String,
    /// Its message.
    pub note: String,
    /// A `Warning` rather than a `Normal` event.
    pub warning: bool,
}

/// The scheduler's reasons for a pod that waits.
pub fn is_scheduling_failure(reason: &str) -> bool {
    matches!(
        reason,
        "FilteringFailed" | "FailedScheduling" | "BindingFailed"
    )
}

/// A watch's error while it lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The last error's text.
    pub message: String,
    /// When the run of errors began (seconds since the epoch).
    pub since: i64,
}

/// What the watchers have seen, and the scheduler's view computed from it.
#[derive(Debug, Default)]
pub struct World {
    /// By name.
    pub nodes: BTreeMap<String, Node>,
    /// By `namespace/name` (pages address pods by name).
    pub pods: BTreeMap<String, Pod>,
    /// Oldest first, at most [`MAX_EVENTS`] (kept by [`World::upsert_event`]: the fullest
    /// namespace gives way first).
    pub events: Vec<EventRow>,
    /// The scheduler's cluster state, fed the same nodes and pods.
    pub state: ClusterState,
    /// Which resources have completed their first list.
    pub synced: BTreeMap<&'static str, bool>,
    /// The last watch error per resource while it lasts (cleared by the next success).
    pub api_errors: BTreeMap<&'static str, ApiError>,
    /// ResourceSlices by name (all drivers; the view keeps ours).
    pub slices: BTreeMap<String, ResourceSlice>,
    /// ResourceClaims by `namespace/name`.
    pub claims: BTreeMap<String, ResourceClaim>,
    /// The UI runs with `--dra=off` (no ResourceSlice or ResourceClaim watch): a node in
    /// DRA mode then gets a banner saying its devices are not shown.
    pub dra_unwatched: bool,
    /// [`World::dra_nodes`], built on first use after a slice or claim changed.
    dra: OnceLock<Vec<DraNode>>,
}

/// The resources only DRA clusters serve: their watch errors and pending lists are shown
/// only when a node is in DRA mode (a cluster before 1.34, or without the DRA rights,
/// answers 404/403 for ever, and has nothing of them to show).
pub const DRA_RESOURCES: [&str; 2] = ["resourceslices", "resourceclaims"];

/// Whether `node` runs the AMD DRA driver (label `hami.io/amd-mode=dra`).
pub fn is_dra_node(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(AMD_MODE_LABEL))
        .is_some_and(|v| v == AMD_MODE_DRA)
}

/// `namespace/name` of a namespaced object's metadata.
fn namespaced(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// `namespace/name` (`default` when the namespace is unset).
pub fn pod_key(pod: &Pod) -> String {
    pod_ref(pod).to_string()
}

/// Where in `events` (oldest first) the oldest Event of the namespace holding the most is:
/// the one to drop when over budget. Among namespaces holding as many, the one whose
/// oldest Event is oldest gives way.
fn oldest_of_fullest_namespace(events: &[EventRow]) -> Option<usize> {
    let mut per_namespace: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        per_namespace.entry(&e.namespace).or_insert((0, i)).0 += 1;
    }
    per_namespace
        .into_values()
        .max_by_key(|(count, first)| (*count, std::cmp::Reverse(*first)))
        .map(|(_, first)| first)
}

impl World {
    /// Adds or replaces a node.
    pub fn upsert_node(&mut self, node: Node) {
        self.state.upsert_node(&node);
        let name = node.metadata.name.clone().unwrap_or_default();
        self.nodes.insert(name, node);
    }

    /// Forgets a deleted node.
    pub fn remove_node(&mut self, name: &str) {
        self.state.remove_node(name);
        self.nodes.remove(name);
    }

    /// Replaces every node (after a relist).
    pub fn reset_nodes(&mut self, nodes: Vec<Node>) {
        self.state.reset_nodes(nodes.iter());
        self.nodes = nodes
            .into_iter()
            .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
            .collect();
    }

    /// Adds or replaces a pod.
    pub fn upsert_pod(&mut self, pod: Pod) {
        self.state.upsert_pod(&pod);
        self.pods.insert(pod_key(&pod), pod);
    }

    /// Forgets a deleted pod.
    pub fn remove_pod(&mut self, pod: &Pod) {
        if let Some(uid) = &pod.metadata.uid {
            self.state.remove_pod(uid);
        }
        self.pods.remove(&pod_key(pod));
    }

    /// Replaces every pod (after a relist).
    pub fn reset_pods(&mut self, pods: Vec<Pod>) {
        self.state.reset_pods(pods.iter());
        self.pods = pods.into_iter().map(|p| (pod_key(&p), p)).collect();
    }

    /// Adds or replaces a ResourceSlice.
    pub fn upsert_slice(&mut self, slice: ResourceSlice) {
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.slices.insert(name, slice);
        self.dra = OnceLock::new();
    }

    /// Forgets a deleted ResourceSlice.
    pub fn remove_slice(&mut self, name: &str) {
        self.slices.remove(name);
        self.dra = OnceLock::new();
    }

    /// Replaces every ResourceSlice (after a relist).
    pub fn reset_slices(&mut self, slices: Vec<ResourceSlice>) {
        self.slices = slices
            .into_iter()
            .map(|s| (s.metadata.name.clone().unwrap_or_default(), s))
            .collect();
        self.dra = OnceLock::new();
    }

    /// Adds or replaces a ResourceClaim.
    pub fn upsert_claim(&mut self, claim: ResourceClaim) {
        self.claims.insert(namespaced(&claim.metadata), claim);
        self.dra = OnceLock::new();
    }

    /// Forgets a deleted ResourceClaim.
    pub fn remove_claim(&mut self, claim: &ResourceClaim) {
        self.claims.remove(&namespaced(&claim.metadata));
        self.dra = OnceLock::new();
    }

    /// Replaces every ResourceClaim (after a relist).
    pub fn reset_claims(&mut self, claims: Vec<ResourceClaim>) {
        self.claims = claims
            .into_iter()
            .map(|c| (namespaced(&c.metadata), c))
            .collect();
        self.dra = OnceLock::new();
    }

    /// Our DRA driver's nodes with their devices and the shares claims hold (as `hami
    /// status` shows them), sorted by node.
    pub fn dra_nodes(&self) -> &[DraNode] {
        self.dra
            .get_or_init(|| dra_status::build(DRIVER, self.slices.values(), self.claims.values()))
    }

    /// The DRA shares of the pod `namespace/name`.
    pub fn dra_shares_of(&self, pod: &str) -> Vec<PodShare<'_>> {
        dra_status::pod_shares(self.dra_nodes(), pod)
    }

    /// The DRA devices the overview counts, with their node: every device of
    /// [`World::dra_nodes`] but one whose uuid its node also offers through a device plugin,
    /// which is counted there once. (The scheduler's snapshot withdraws the AMD register
    /// entries of a DRA-labelled node, so this only matters for a node running the driver
    /// without the label, which the chart never does.) Each device is one GPU or one hard
    /// partition, as each device-plugin register entry is (a partitioned card registers its partitions, not
    /// itself; the driver publishes one device per such entry): both count alike.
    pub fn dra_devices(&self) -> impl Iterator<Item = (&DraNode, &DraDevice)> {
        self.dra_nodes().iter().flat_map(move |node| {
            let registered = self.state.node(&node.name);
            node.devices
                .iter()
                .filter(move |d| {
                    !registered.is_some_and(|s| s.devices.gpus.iter().any(|g| g.info.id == d.uuid))
                })
                .map(move |d| (node, d))
        })
    }

    /// GPU memory granted in the whole cluster, MiB: what the scheduler charged on the
    /// device plugins' GPUs plus what allocated claims consume of [`World::dra_devices`].
    pub fn memory_granted_mib(&self) -> f64 {
        let plugin: f64 = self
            .state
            .nodes()
            .flat_map(|n| n.usage.iter().map(|u| u.mem_mib as f64))
            .sum();
        let dra: f64 = self
            .dra_devices()
            .map(|(_, d)| d.memory_used_bytes as f64 / 1048576.0)
            .sum();
        plugin + dra
    }

    /// Whether some node is in DRA mode or publishes our driver's devices.
    pub fn has_dra(&self) -> bool {
        self.nodes.values().any(is_dra_node) || !self.dra_nodes().is_empty()
    }

    /// Adds or replaces an event (by uid), keeping them ordered by time.
    pub fn upsert_event(&mut self, event: EventRow) {
        self.events.retain(|e| e.uid != event.uid);
        let at = self.events.partition_point(|e| e.at <= event.at);
        self.events.insert(at, event);
        while self.events.len() > MAX_EVENTS {
            let Some(at) = oldest_of_fullest_namespace(&self.events) else {
                break;
            };
            self.events.remove(at);
        }
    }

    /// Forgets a deleted event.
    pub fn remove_event(&mut self, uid: &str) {
        self.events.retain(|e| e.uid != uid);
    }

    /// Replaces the events read from one source.
    pub fn reset_events(&mut self, source: &str, events: Vec<EventRow>) {
        self.events.retain(|e| e.source != source);
        for e in events {
            self.upsert_event(e);
        }
    }

    /// Events about one object, oldest first.
    pub fn events_of<'a>(
        &'a self,
        kind: &'a str,
        namespace: &'a str,
        name: &'a str,
    ) -> impl Iterator<Item = &'a EventRow> {
        self.events
            .iter()
            .filter(move |e| e.kind == kind && e.name == name && e.namespace == namespace)
    }

    /// The scheduling failures as `hami status` takes them: (namespace, name, note),
    /// oldest first.
    pub fn scheduling_notes(&self) -> Vec<(String, String, String)> {
        self.events
            .iter()
            .filter(|e| e.kind == "Pod" && is_scheduling_failure(&e.reason))
            .map(|e| (e.namespace.clone(), e.name.clone(), e.note.clone()))
            .collect()
    }

    /// The watch of `what` failed at `now` with `message` (a run of errors keeps its start).
    pub fn watch_failed(&mut self, what: &'static str, message: String, now: i64) {
        let since = self.api_errors.get(what).map_or(now, |e| e.since);
        self.api_errors.insert(what, ApiError { message, since });
    }

    /// The watch of `what` works again.
    pub fn watch_ok(&mut self, what: &'static str) {
        self.api_errors.remove(what);
    }

    /// The watch errors the pages show: a DRA resource's only where a node is in DRA mode.
    fn shown_api_errors(&self) -> Vec<(&'static str, &ApiError)> {
        let dra = self.api_errors.keys().any(|w| DRA_RESOURCES.contains(w)) && self.has_dra();
        self.api_errors
            .iter()
            .filter(|(what, _)| dra || !DRA_RESOURCES.contains(what))
            .map(|(what, e)| (*what, e))
            .collect()
    }

    /// Since when the API server cannot be read (the earliest shown watch error), if so.
    pub fn api_down_since(&self) -> Option<i64> {
        self.shown_api_errors().iter().map(|(_, e)| e.since).min()
    }

    /// Problems to show on every page, one per cause: the API server cannot be read (every
    /// failing watch in one banner, since its first error), resources not yet listed, a DRA
    /// node while the DRA resources are not watched.
    pub fn banners(&self) -> Vec<String> {
        let dra = self.has_dra();
        let mut out: Vec<String> = Vec::new();
        if self.dra_unwatched
            && let Some(name) = self
                .nodes
                .values()
                .find(|n| is_dra_node(n))
                .map(|n| n.metadata.name.as_deref().unwrap_or_default())
        {
            out.push(format!(
                "Node {name} is in DRA mode ({AMD_MODE_LABEL}={AMD_MODE_DRA}), but this UI does not watch ResourceSlices and ResourceClaims: DRA devices and claims are not shown (start it with --dra, or without --dra=off; the chart passes --dra with draPlugin.enabled)."
            ));
        }
        let failing = self.shown_api_errors();
        if let Some(since) = failing.iter().map(|(_, e)| e.since).min() {
            let whats: Vec<&str> = failing.iter().map(|(w, _)| *w).collect();
            // The newest error says best what is wrong now.
            let last = failing
                .iter()
                .max_by_key(|(_, e)| e.since)
                .map(|(_, e)| e.message.as_str())
                .unwrap_or_default();
            out.push(format!(
                "The Kubernetes API server cannot be read {} ({}): {last}. Showing what was last seen; the trend stops until it answers.",
                crate::html::since(since),
                whats.join(", ")
            ));
        }
        let listing: Vec<&str> = self
            .synced
            .iter()
            .filter(|(w, synced)| {
                !**synced
                    && (dra || !DRA_RESOURCES.contains(w))
                    && !self.api_errors.contains_key(*w)
            })
            .map(|(w, _)| *w)
            .collect();
        if !listing.is_empty() {
            out.push(format!(
                "Still listing {} from the Kubernetes API server…",
                listing.join(", ")
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(uid: usize, namespace: &str, pod: &str, reason: &str) -> EventRow {
        EventRow {
            uid: format!("{namespace}-{uid}"),
            source: "core",
            at: uid as i64,
            kind: "Pod".into(),
            namespace: namespace.into(),
            name: pod.into(),
            reason: reason.into(),
            note: format!("0/3 nodes are available for {pod}"),
            warning: true,
        }
    }

    #[test]
    fn one_namespace_flood_keeps_the_other_namespaces_pending_reasons() {
        let mut world = World::default();
        for i in 0..50 {
            world.upsert_event(event(i, "team-a", &format!("train-{i}"), "FilteringFailed"));
            world.upsert_event(event(i, "kube-system", &format!("node-{i}"), "Pulled"));
        }
        // A tenant floods its namespace with twice the whole budget, newer than the rest.
        for i in 0..2 * MAX_EVENTS {
            world.upsert_event(event(1000 + i, "flood", "spam", "FailedScheduling"));
        }
        assert_eq!(world.events.len(), MAX_EVENTS);
        let notes = world.scheduling_notes();
        for i in 0..50 {
            let pod = format!("train-{i}");
            assert!(
                notes
                    .iter()
                    .any(|(ns, name, _)| ns == "team-a" && *name == pod),
                "team-a/{pod}'s pending reason survives the flood"
            );
        }
        assert_eq!(
            world
                .events
                .iter()
                .filter(|e| e.namespace == "kube-system")
                .count(),
            50
        );
        // The flood lost its own oldest Events, and the events stay oldest first.
        let flood: Vec<i64> = world
            .events
            .iter()
            .filter(|e| e.namespace == "flood")
            .map(|e| e.at)
            .collect();
        assert_eq!(flood.len(), MAX_EVENTS - 100);
        assert_eq!(*flood.last().unwrap(), 1000 + 2 * MAX_EVENTS as i64 - 1);
        assert!(world.events.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn over_budget_the_fullest_namespace_gives_way() {
        let events: Vec<EventRow> = [("a", 0), ("b", 1), ("b", 2), ("a", 3), ("c", 4)]
            .into_iter()
            .map(|(ns, at)| event(at, ns, "p", "Pulled"))
            .collect();
        // a and b hold two each: b's oldest (index 1) is newer than a's (index 0).
        assert_eq!(oldest_of_fullest_namespace(&events), Some(0));
        assert_eq!(oldest_of_fullest_namespace(&events[1..]), Some(0));
        assert_eq!(oldest_of_fullest_namespace(&[]), None);
    }
}
