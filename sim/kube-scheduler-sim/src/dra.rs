//! The shell of kube-scheduler's `DynamicResources` plugin for pods with
//! `spec.resourceClaims`: informers of ResourceSlices, DeviceClasses, ResourceClaims and
//! ResourceClaimTemplates; an assume cache of allocations being written (so the next pod
//! counts them before the informer shows them); per pod, placement by the pure
//! [`crate::dra_placement`], then — asynchronously, like kube-scheduler's binding cycle —
//! each new allocation written to the claim's `status` (`allocation` with the node's
//! `nodeSelector`, `reservedFor` the pod) with the claim's resourceVersion as precondition,
//! the pod added to `reservedFor` of claims allocated before, and the pod bound. A failed
//! write undoes what this pod wrote and the pod goes back to the queue.
//!
//! Extended resources a DeviceClass maps (KEP-5004, pure part in
//! [`crate::extended_resources`]): on nodes that offer none of them as allocatable, the
//! special claim is placed with the pod's other claims (assumed under a temporary UID until
//! it exists); the binding cycle creates it, writes its allocation and reservation, records
//! `pod.status.extendedResourceClaimStatus`, then binds; a failure deletes it again. A claim
//! of an earlier try (the pod still pending) is placed as it is. The claim controller frees
//! and deletes it when the pod goes (it is owned by the pod).
//!
//! Not modelled: the extender is not called for DRA pods (a pod with claims and extender
//! resources gets no extender filter), nor are the other filter plugins (NodeResourcesFit,
//! affinity, taints of Nodes): a node offering a mapped extended resource as allocatable is
//! refused with that reason instead of being fitted by NodeResourcesFit, and extended
//! resources no class maps are not checked; in a scheduler with an extender, a pod without
//! claims goes to the extender even when a class maps its resources (kube-scheduler would
//! run both, and the extender refuses DRA nodes); claims shared by several pods are reserved
//! for each but placed by the first; binding conditions (KEP-5007) are not waited for.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use hami_dra_core::api::{self as model, DeviceRequestAllocationResult};
use hami_structured_allocation::allocator::DeviceClass as ClassModel;
use k8s_openapi::api::core::v1::{ContainerExtendedResourceRequest, Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::dra_placement::{NodeOrder, NodeView, PodClaim, Unschedulable, place, utilization};
use crate::extended_resources as ext;

/// How the simulated scheduler places DRA pods.
#[derive(Debug, Clone, Copy, Default)]
pub struct DraOptions {
    /// The order nodes are tried in (`MostAllocated` = binpack).
    pub node_order: NodeOrder,
}

/// Whether a pod has ResourceClaims (and so takes the DRA path).
pub fn has_claims(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty())
}

/// The pod's requests of extended resources a DeviceClass in `state` maps (KEP-5004: such a
/// pod takes the DRA path even without claims).
pub fn mapped_extended(state: &DraState, pod: &Pod) -> BTreeMap<String, u64> {
    let requests = ext::pod_requests(pod);
    if requests.is_empty() {
        return requests;
    }
    let classes = state.classes.state();
    ext::mapped(
        &requests,
        &ext::class_mapping(classes.iter().map(|c| c.as_ref())),
    )
}

/// An allocation this scheduler decided and is writing (or wrote, before the informer shows it).
#[derive(Debug, Clone)]
struct Assumed {
    node: String,
    results: Vec<DeviceRequestAllocationResult>,
    /// Set once the binding cycle's status write succeeded (the version it returned).
    written: Option<String>,
}

/// The informers and caches the DRA path reads.
pub struct DraState {
    pub(crate) options: DraOptions,
    pub(crate) slices: Store<ResourceSlice>,
    pub(crate) classes: Store<DeviceClass>,
    pub(crate) claims: Store<ResourceClaim>,
    pub(crate) templates: Store<ResourceClaimTemplate>,
    /// Claim UID → allocation being written.
    assumed: Arc<Mutex<HashMap<String, Assumed>>>,
    /// Claims whose assumed allocation changed since the last view.
    assumed_dirty: Arc<Mutex<HashSet<String>>>,
    /// Claims the claim controller created that the informer may not show yet:
    /// (pod UID, pod claim name) → claim. Kept while the pod exists (see
    /// [`DraState::forget_gone_pods`]).
    pub(crate) created: Mutex<HashMap<(String, String), Arc<ResourceClaim>>>,
    /// Entries the claim controller recorded in the pod's status, which the pod informer may
    /// not show yet: (pod UID, pod claim name) → claim name. Kept while the pod exists.
    pub(crate) recorded: Mutex<HashMap<(String, String), String>>,
    /// Bumped on every slice or class event (the view's slice side is rebuilt when it moved).
    slice_generation: Arc<AtomicU64>,
    /// Bumped on every claim event and assume cache change.
    claim_generation: Arc<AtomicU64>,
    cache: Mutex<ViewCache>,
}

/// A claim's allocation results, shared.
type Results = Arc<Vec<DeviceRequestAllocationResult>>;
/// A claim to write: the object and its new results (`None`: allocated before).
pub(crate) type ClaimWrite = (
    Arc<ResourceClaim>,
    Option<Vec<DeviceRequestAllocationResult>>,
);

/// What allocations hold of one node, kept up to date claim by claim.
#[derive(Default)]
struct NodeHeld {
    by_claim: HashMap<String, Results>,
    flat: Arc<Vec<DeviceRequestAllocationResult>>,
    utilization: f64,
}

/// Whether an informer copy of the claim (its resourceVersion, allocated or not) reflects
/// this assumed allocation's write: it is allocated (our write or a later one), or our write
/// succeeded and the copy is that version or a newer one (the embedded server's versions
/// are integers; an unreadable one keeps the entry, the conservative side).
fn shows_write(a: &Assumed, rv: Option<&str>, allocated: bool) -> bool {
    if allocated {
        return true;
    }
    let (Some(w), Some(rv)) = (a.written.as_deref(), rv) else {
        return false;
    };
    rv == w || matches!((rv.parse::<u64>(), w.parse::<u64>()), (Ok(r), Ok(w)) if r > w)
}

/// Converted objects, keyed by resourceVersion so an unchanged object is not converted
/// again, and per-node holdings updated only for claims that changed (a cycle costs what
/// changed since the last one, not the size of the cluster).
#[derive(Default)]
struct ViewCache {
    generations: (u64, u64),
    slices: HashMap<String, (String, Arc<model::ResourceSlice>)>,
    classes: Vec<ClassModel>,
    node_slices: BTreeMap<String, Arc<Vec<model::ResourceSlice>>>,
    pool_node: HashMap<(String, String), String>,
    /// Claim UID → (resourceVersion, its allocation's results, if allocated).
    claims: HashMap<String, (String, Option<Results>)>,
    /// Claim UID → the node and results it holds now (informer's, else assumed).
    effective: HashMap<String, (String, Results)>,
    held: HashMap<String, NodeHeld>,
    view: Arc<ClusterView>,
}

/// One node in a [`ClusterView`].
pub(crate) struct NodeEntry {
    pub(crate) name: String,
    pub(crate) slices: Arc<Vec<model::ResourceSlice>>,
    pub(crate) allocated: Arc<Vec<DeviceRequestAllocationResult>>,
    pub(crate) utilization: f64,
}

/// The cluster as placement sees it: per node, its slices and what allocations hold.
#[derive(Default)]
pub(crate) struct ClusterView {
    pub(crate) nodes: Vec<NodeEntry>,
    pub(crate) classes: Vec<ClassModel>,
}

fn convert<T: serde::Serialize, U: serde::de::DeserializeOwned>(v: &T) -> Result<U, String> {
    serde_json::to_value(v)
        .and_then(serde_json::from_value)
        .map_err(|e| e.to_string())
}

/// Watches a kind into a store, bumping `generation` and ringing `wake` on every event.
fn informer<K>(
    client: &Client,
    generation: Option<Arc<AtomicU64>>,
    wake: Arc<tokio::sync::Notify>,
    on_event: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let api: Api<K> = Api::all(client.clone());
    tokio::spawn(
        reflector::reflector(
            writer,
            watcher(api, watcher::Config::default()).default_backoff(),
        )
        .for_each(move |event| {
            if let Ok(e) = &event {
                on_event(e);
            }
            if let Some(g) = &generation {
                g.fetch_add(1, Ordering::Relaxed);
            }
            wake.notify_one();
            async {}
        }),
    );
    store
}

impl DraState {
    /// Starts the informers and waits for their first lists.
    pub async fn start(client: &Client, options: DraOptions) -> Self {
        Self::start_waking(client, options, Arc::default()).await
    }

    /// [`DraState::start`], ringing `wake` on every event of its informers (the scheduling
    /// loop sleeps until one).
    pub async fn start_waking(
        client: &Client,
        options: DraOptions,
        wake: Arc<tokio::sync::Notify>,
    ) -> Self {
        let slice_generation = Arc::new(AtomicU64::new(1));
        let claim_generation = Arc::new(AtomicU64::new(1));
        let assumed: Arc<Mutex<HashMap<String, Assumed>>> = Arc::default();
        let assumed_dirty: Arc<Mutex<HashSet<String>>> = Arc::default();
        // The assume cache follows the claim informer, as kube-scheduler's does: an entry
        // goes when the informer shows the claim changed from the version it was decided
        // on (that is our write: it is conditional on that version, and a failed write
        // forgets the entry) or deleted, whether or not a scheduling cycle ran in between.
        let (a, dirty) = (assumed.clone(), assumed_dirty.clone());
        let on_claim = move |e: &watcher::Event<ResourceClaim>| {
            // Not `InitApply`: during a relist the store keeps its old content until
            // `InitDone`, so dropping an entry then would let a cycle see the capacity free
            // (the view's own check covers what a relist changed, once the store has it).
            let (c, deleted) = match e {
                watcher::Event::Apply(c) => (c, false),
                watcher::Event::Delete(c) => (c, true),
                _ => return,
            };
            let Some(uid) = c.metadata.uid.as_deref() else {
                return;
            };
            let mut a = a.lock().unwrap_or_else(|p| p.into_inner());
            let allocated = c.status.as_ref().is_some_and(|s| s.allocation.is_some());
            if a.get(uid).is_some_and(|x| {
                deleted && x.written.is_some()
                    || shows_write(x, c.metadata.resource_version.as_deref(), allocated)
            }) {
                a.remove(uid);
                dirty
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(uid.to_owned());
            }
        };
        let state = Self {
            options,
            slices: informer(client, Some(slice_generation.clone()), wake.clone(), |_| {}),
            classes: informer(client, Some(slice_generation.clone()), wake.clone(), |_| {}),
            claims: informer(
                client,
                Some(claim_generation.clone()),
                wake.clone(),
                on_claim,
            ),
            templates: informer(client, None, wake, |_| {}),
            assumed,
            assumed_dirty,
            created: Mutex::default(),
            recorded: Mutex::default(),
            slice_generation,
            claim_generation,
            cache: Mutex::default(),
        };
        let _ = state.slices.wait_until_ready().await;
        let _ = state.classes.wait_until_ready().await;
        let _ = state.claims.wait_until_ready().await;
        let _ = state.templates.wait_until_ready().await;
        state
    }

    /// The current view: the slice side rebuilt (reusing converted objects) only when slices
    /// or classes moved; on the allocation side only claims whose resourceVersion or assumed
    /// allocation changed are recounted, and only their nodes' totals.
    pub(crate) fn view(&self) -> Arc<ClusterView> {
        let slice_gen = self.slice_generation.load(Ordering::Relaxed);
        let claim_gen = self.claim_generation.load(Ordering::Relaxed);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.generations == (slice_gen, claim_gen) && slice_gen != 0 {
            return cache.view.clone();
        }
        // Held across the store snapshot: the claim informer drops an entry only after its
        // store shows the write, and only under this lock, so the snapshot below never
        // misses both the entry and the write.
        let mut assumed = self.assumed.lock().unwrap_or_else(|p| p.into_inner());
        let mut changed: HashSet<String> =
            std::mem::take(&mut *self.assumed_dirty.lock().unwrap_or_else(|p| p.into_inner()));
        if cache.generations.0 != slice_gen {
            self.rebuild_slices(&mut cache);
            // Pools may map to other nodes now: recount everything.
            cache.claims.clear();
            cache.effective.clear();
            cache.held.clear();
            changed.extend(assumed.keys().cloned());
        }
        // Borrowed strings: this runs once per scheduling cycle over every claim.
        let all = self.claims.state();
        let mut seen: HashSet<&str> = HashSet::with_capacity(all.len());
        for c in &all {
            let uid = c.metadata.uid.as_deref().unwrap_or_default();
            let rv = c.metadata.resource_version.as_deref().unwrap_or_default();
            if cache.claims.get(uid).is_none_or(|(old, _)| old != rv) {
                let results = allocation_results(c).map(Arc::new);
                cache
                    .claims
                    .insert(uid.to_owned(), (rv.to_owned(), results));
                changed.insert(uid.to_owned());
            }
            seen.insert(uid);
        }
        let gone: Vec<String> = cache
            .claims
            .keys()
            .filter(|u| !seen.contains(u.as_str()))
            .cloned()
            .collect();
        for u in gone {
            cache.claims.remove(&u);
            changed.insert(u);
        }
        // Once the informer shows our write (see `shows_write`), its word counts, even when
        // the claim was deallocated again before this view ran.
        assumed.retain(|uid, a| {
            cache
                .claims
                .get(uid)
                .is_none_or(|(rv, r)| !shows_write(a, Some(rv), r.is_some()))
        });
        let mut dirty: HashSet<String> = HashSet::new();
        for uid in changed {
            let informer = cache.claims.get(&uid).and_then(|(_, r)| r.clone());
            let now: Option<(String, Results)> = match informer {
                Some(r) => r
                    .first()
                    .and_then(|f| cache.pool_node.get(&(f.driver.clone(), f.pool.clone())))
                    .map(|n| (n.clone(), r.clone())),
                None => assumed
                    .get(&uid)
                    .map(|a| (a.node.clone(), Arc::new(a.results.clone()))),
            };
            if let Some((node, _)) = cache.effective.remove(&uid) {
                if let Some(h) = cache.held.get_mut(&node) {
                    h.by_claim.remove(&uid);
                }
                dirty.insert(node);
            }
            if let Some((node, r)) = now {
                cache
                    .held
                    .entry(node.clone())
                    .or_default()
                    .by_claim
                    .insert(uid.clone(), r.clone());
                cache.effective.insert(uid, (node.clone(), r));
                dirty.insert(node);
            }
        }
        drop(assumed);
        for node in dirty {
            let slices = cache.node_slices.get(&node).cloned().unwrap_or_default();
            let Some(h) = cache.held.get_mut(&node) else {
                continue;
            };
            h.flat = Arc::new(
                h.by_claim
                    .values()
                    .flat_map(|r| r.iter().cloned())
                    .collect(),
            );
            h.utilization = utilization(&slices, &h.flat);
        }
        let view = Arc::new(ClusterView {
            nodes: cache
                .node_slices
                .iter()
                .map(|(n, s)| {
                    let h = cache.held.get(n);
                    NodeEntry {
                        name: n.clone(),
                        slices: s.clone(),
                        allocated: h.map(|h| h.flat.clone()).unwrap_or_default(),
                        utilization: h.map_or(0.0, |h| h.utilization),
                    }
                })
                .collect(),
            classes: cache.classes.clone(),
        });
        cache.view = view.clone();
        cache.generations = (slice_gen, claim_gen);
        view
    }

    fn rebuild_slices(&self, cache: &mut ViewCache) {
        let mut slices = HashMap::new();
        for s in self.slices.state() {
            let name = s.name_any();
            let rv = s.resource_version().unwrap_or_default();
            let converted = match cache.slices.remove(&name) {
                Some((old_rv, c)) if old_rv == rv => c,
                _ => match convert::<_, model::ResourceSlice>(s.as_ref()) {
                    Ok(c) => Arc::new(c),
                    Err(e) => {
                        tracing::warn!(slice = %name, "cannot read ResourceSlice: {e}");
                        continue;
                    }
                },
            };
            slices.insert(name, (rv, converted));
        }
        cache.slices = slices;
        cache.classes = self
            .classes
            .state()
            .iter()
            .map(|c| ClassModel {
                name: c.name_any(),
                selectors: c
                    .spec
                    .selectors
                    .iter()
                    .flatten()
                    .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
                    .collect(),
            })
            .collect();
        let mut nodes: BTreeMap<String, Vec<model::ResourceSlice>> = BTreeMap::new();
        cache.pool_node.clear();
        for (_, s) in cache.slices.values() {
            let Some(node) = s.spec.node_name.clone() else {
                continue;
            };
            cache.pool_node.insert(
                (s.spec.driver.clone(), s.spec.pool.name.clone()),
                node.clone(),
            );
            nodes.entry(node).or_default().push(s.as_ref().clone());
        }
        cache.node_slices = nodes.into_iter().map(|(n, s)| (n, Arc::new(s))).collect();
    }

    fn assume(&self, claim_uid: &str, node: &str, results: &[DeviceRequestAllocationResult]) {
        self.assumed_dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(claim_uid.to_owned());
        self.assumed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                claim_uid.to_owned(),
                Assumed {
                    node: node.to_owned(),
                    results: results.to_vec(),
                    written: None,
                },
            );
        self.claim_generation.fetch_add(1, Ordering::Relaxed);
    }

    fn mark_written(&self, claim_uid: &str, version: Option<String>) {
        if let Some(a) = self
            .assumed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(claim_uid)
        {
            a.written = Some(version.unwrap_or_default());
        }
        self.assumed_dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(claim_uid.to_owned());
        self.claim_generation.fetch_add(1, Ordering::Relaxed);
    }

    fn forget(&self, claim_uid: &str) {
        self.assumed_dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(claim_uid.to_owned());
        self.assumed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(claim_uid);
        self.claim_generation.fetch_add(1, Ordering::Relaxed);
    }

    /// How many entries the claim controller keeps over the informers' lag: (claims it
    /// created, records it wrote), for tests and logs.
    pub fn claim_controller_entries(&self) -> (usize, usize) {
        let created = self.created.lock().unwrap_or_else(|p| p.into_inner()).len();
        let recorded = self
            .recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len();
        (created, recorded)
    }

    /// Forgets what the claim controller created and recorded for pods that `pods` (the pod
    /// informer) no longer holds: a pod's UID never comes back, so those entries can no
    /// longer be read, and without this a long run keeps one per pod it ever saw.
    pub(crate) fn forget_gone_pods(&self, pods: &Store<Pod>) {
        // Locked before the snapshot: the controller adds entries only for pods it took from
        // this store, so every entry present now is of a pod the snapshot shows unless it is
        // gone (a snapshot taken first could predate a pod whose entries are added after).
        let mut created = self.created.lock().unwrap_or_else(|p| p.into_inner());
        let mut recorded = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
        let live: HashSet<String> = pods.state().iter().filter_map(|p| p.uid()).collect();
        created.retain(|(pod, _), _| live.contains(pod));
        recorded.retain(|(pod, _), _| live.contains(pod));
    }

    /// Nodes of allocations being written, by claim UID (for tests and logs).
    pub fn assumed_nodes(&self) -> BTreeMap<String, String> {
        self.assumed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.node.clone()))
            .collect()
    }

    /// The claim the pod's entry `name` refers to: by `resourceClaimName`, or the claim made
    /// from its template as the pod's status records it (or the claim controller just
    /// recorded it), from the informer (else what the controller created, until the informer
    /// shows it). `None` while it does not exist or is not recorded yet: as kube-scheduler
    /// finds a template's claim only through the pod's status, a claim created but not
    /// recorded (that status write failed) is not placed; the controller records it first.
    pub(crate) fn pod_claim(&self, pod: &Pod, name: &str) -> Option<Arc<ResourceClaim>> {
        let ns = pod.namespace().unwrap_or_default();
        let entry = pod
            .spec
            .as_ref()?
            .resource_claims
            .iter()
            .flatten()
            .find(|c| c.name == name)?;
        let key = (pod.uid().unwrap_or_default(), name.to_owned());
        let claim_name = match &entry.resource_claim_name {
            Some(n) => n.clone(),
            None => pod
                .status
                .as_ref()
                .and_then(|s| s.resource_claim_statuses.as_ref())
                .and_then(|v| v.iter().find(|s| s.name == name))
                .and_then(|s| s.resource_claim_name.clone())
                .or_else(|| {
                    self.recorded
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&key)
                        .cloned()
                })?,
        };
        if let Some(c) = self
            .claims
            .get(&reflector::ObjectRef::new(&claim_name).within(&ns))
        {
            return Some(c);
        }
        let created = self.created.lock().unwrap_or_else(|p| p.into_inner());
        created
            .get(&key)
            .filter(|c| c.name_any() == claim_name)
            .cloned()
    }
}

/// The results of a claim's allocation, if it is allocated.
fn allocation_results(c: &ResourceClaim) -> Option<Vec<DeviceRequestAllocationResult>> {
    let allocation = c.status.as_ref()?.allocation.as_ref()?;
    let results = allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .cloned()
        .unwrap_or_default();
    match convert(&results) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(claim = %c.name_any(), "cannot read the claim's allocation: {e}");
            Some(Vec::new())
        }
    }
}

/// The node an allocation's `nodeSelector` names (`metadata.name In [node]`), as this
/// scheduler writes it.
pub fn allocation_node(c: &ResourceClaim) -> Option<String> {
    let sel = c
        .status
        .as_ref()?
        .allocation
        .as_ref()?
        .node_selector
        .as_ref()?;
    sel.node_selector_terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|f| f.key == "metadata.name" && f.operator == "In")
        .and_then(|f| f.values.as_ref()?.first().cloned())
}

/// What one DRA pod's scheduling cycle decided.
pub(crate) enum Decision {
    /// A claim does not exist yet (the claim controller is making it): try again soon.
    Waiting,
    /// No node fits.
    Unschedulable(String),
    /// Place it: the node, and per claim (name, object, new results or `None`).
    Place {
        node: String,
        claims: Vec<ClaimWrite>,
        /// The extended-resource claim's part (KEP-5004), when the pod has one.
        extended: Option<Box<ExtendedClaim>>,
    },
}

/// The pod's extended-resource claim in a [`Decision::Place`].
pub(crate) struct ExtendedClaim {
    /// A new claim: the object to create, the temporary UID its allocation is assumed under,
    /// and its allocation. `None`: it exists from an earlier try (among `claims`).
    create: Option<(ResourceClaim, String, Vec<DeviceRequestAllocationResult>)>,
    /// The existing claim's name (when `create` is `None`).
    name: Option<String>,
    /// `pod.status.extendedResourceClaimStatus.requestMappings`.
    mappings: Vec<ContainerExtendedResourceRequest>,
}

/// The node's allocatable of `resource`, as a count.
fn allocatable(nodes: &Store<Node>, node: &str, resource: &str) -> Option<u64> {
    let n = nodes.get(&reflector::ObjectRef::new(node))?;
    let q = n.status.as_ref()?.allocatable.as_ref()?.get(resource)?;
    hami_dra_core::quantity::parse(&q.0).ok()
}

/// The nodes a scheduling cycle sees: the schedulable ones' names, and the Node objects
/// (their allocatable, for KEP-5004).
pub(crate) struct Nodes<'a> {
    pub(crate) schedulable: &'a HashSet<String>,
    pub(crate) objects: &'a Store<Node>,
}

/// The scheduling cycle of one DRA pod over `view` (which it updates with what it assumes).
pub(crate) fn decide(state: &DraState, pod: &Pod, cycle_nodes: &Nodes) -> Decision {
    let (nodes, node_objects) = (cycle_nodes.schedulable, cycle_nodes.objects);
    let names: Vec<String> = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect();
    let mut objects = Vec::new();
    for n in &names {
        match state.pod_claim(pod, n) {
            Some(c) => objects.push(c),
            None => return Decision::Waiting,
        }
    }
    // KEP-5004: the pod's extended-resource claim, found from an earlier try or made here.
    let extended = mapped_extended(state, pod);
    let mut new_extended: Option<(ResourceClaim, model::DeviceClaim)> = None;
    let mut mappings = Vec::new();
    let mut existing_extended = None;
    if !extended.is_empty() {
        let classes = state.classes.state();
        let mapping = ext::class_mapping(classes.iter().map(|c| c.as_ref()));
        let (requests, m) = ext::requests_and_mappings(pod, &extended, &mapping);
        mappings = m;
        match state
            .claims
            .state()
            .into_iter()
            .find(|c| ext::is_claim_of(c, pod))
        {
            Some(c) => {
                existing_extended = Some(c.name_any());
                objects.push(c);
            }
            None => {
                let body = match ext::claim_body(pod, &requests) {
                    Ok(b) => b,
                    Err(e) => return Decision::Unschedulable(e),
                };
                match convert::<_, model::DeviceClaim>(&body.spec.devices) {
                    Ok(spec) => new_extended = Some((body, spec)),
                    Err(e) => {
                        return Decision::Unschedulable(format!(
                            "the extended-resource claim cannot be read: {e}"
                        ));
                    }
                }
            }
        }
    }
    let mut specs = Vec::new();
    for c in &objects {
        match convert::<_, model::DeviceClaim>(&c.spec.devices) {
            Ok(s) => specs.push(s),
            Err(e) => {
                return Decision::Unschedulable(format!(
                    "claim {:?} cannot be read: {e}",
                    c.name_any()
                ));
            }
        }
    }
    let uids: Vec<String> = objects
        .iter()
        .map(|c| c.uid().unwrap_or_default())
        .collect();
    let assumed = state.assumed_nodes();
    let on: Vec<Option<String>> = objects
        .iter()
        .zip(&uids)
        .map(|(c, uid)| allocation_node(c).or_else(|| assumed.get(uid).cloned()))
        .collect();
    let claim_names: Vec<String> = objects.iter().map(|c| c.name_any()).collect();
    let mut pod_claims: Vec<PodClaim> = (0..objects.len())
        .map(|i| PodClaim {
            name: &claim_names[i],
            uid: &uids[i],
            spec: &specs[i],
            allocated_on: on[i].as_deref(),
        })
        .collect();
    let temp_uid = format!("<extended-resources>/{}", pod.uid().unwrap_or_default());
    let extended_label = format!(
        "<extended-resources: {}>",
        extended.keys().cloned().collect::<Vec<_>>().join(",")
    );
    if let Some((_, spec)) = &new_extended {
        pod_claims.push(PodClaim {
            name: &extended_label,
            uid: &temp_uid,
            spec,
            allocated_on: None,
        });
    }
    // A node offering a mapped resource as allocatable serves it through a device plugin.
    let mut refused: BTreeMap<String, String> = BTreeMap::new();
    let view = state.view();
    let node_views: Vec<NodeView> = view
        .nodes
        .iter()
        .filter(|n| nodes.contains(&n.name))
        .filter(|n| {
            let Some(r) =
                ext::device_plugin_served(&extended, |r| allocatable(node_objects, &n.name, r))
            else {
                return true;
            };
            refused.insert(
                n.name.clone(),
                format!("node(s) serve {r} through a device plugin, not DRA"),
            );
            false
        })
        .map(|n| NodeView {
            name: &n.name,
            slices: &n.slices,
            allocated: &n.allocated,
            utilization: n.utilization,
        })
        .collect();
    match place(
        &pod_claims,
        &view.classes,
        &node_views,
        state.options.node_order,
    ) {
        Ok(mut p) => {
            let new_results = new_extended
                .as_ref()
                .and_then(|_| p.results.pop().flatten());
            for (i, r) in p.results.iter().enumerate() {
                if let Some(r) = r {
                    state.assume(&uids[i], &p.node, r);
                }
            }
            let extended = if extended.is_empty() {
                None
            } else {
                let create = match (new_extended, new_results) {
                    (Some((body, _)), Some(results)) => {
                        state.assume(&temp_uid, &p.node, &results);
                        Some((body, temp_uid, results))
                    }
                    _ => None,
                };
                Some(Box::new(ExtendedClaim {
                    create,
                    name: existing_extended,
                    mappings,
                }))
            };
            Decision::Place {
                node: p.node,
                claims: objects.into_iter().zip(p.results).collect(),
                extended,
            }
        }
        Err(Unschedulable { mut reasons, .. }) => {
            reasons.append(&mut refused);
            Decision::Unschedulable(
                Unschedulable {
                    // Nodes without slices count too: kube-scheduler reports every node.
                    nodes: nodes.len(),
                    reasons,
                }
                .to_string(),
            )
        }
    }
}

fn pod_ref(pod: &Pod) -> Value {
    json!({"resource": "pods", "name": pod.name_any(), "uid": pod.uid().unwrap_or_default()})
}

/// The binding cycle: writes the claims' status, then binds. On failure, undoes this pod's
/// writes and forgets its assumed allocations; the error says what failed.
pub(crate) async fn bind(
    client: &Client,
    state: &DraState,
    pod: &Pod,
    node: &str,
    claims: &[ClaimWrite],
    extended: Option<&ExtendedClaim>,
) -> Result<(), String> {
    let ns = pod.namespace().unwrap_or_else(|| "default".into());
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let mut written: Vec<(String, bool)> = Vec::new();
    let mut failure = None;
    let mut claims = claims.to_vec();
    // KEP-5004: the special claim is created now (PreBind), its allocation moved from the
    // temporary UID to its real one (assumed first, so no cycle sees the capacity free).
    let mut created: Option<String> = None;
    let mut claim_name = extended.and_then(|x| x.name.clone());
    if let Some((body, temp, results)) = extended.and_then(|x| x.create.as_ref()) {
        let made = api.create(&PostParams::default(), body).await;
        match made {
            Ok(c) => {
                state.assume(&c.uid().unwrap_or_default(), node, results);
                state.forget(temp);
                created = Some(c.name_any());
                claim_name = Some(c.name_any());
                claims.push((Arc::new(c), Some(results.clone())));
            }
            Err(e) => {
                state.forget(temp);
                return Err(format!(
                    "cannot create the extended-resource claim of pod {ns}/{}: {e}",
                    pod.name_any()
                ));
            }
        }
    }
    for (c, results) in &claims {
        let name = c.name_any();
        let mut reserved: Vec<Value> = c
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|r| serde_json::to_value(r).ok())
            .collect();
        let me = pod_ref(pod);
        if !reserved.iter().any(|r| r["uid"] == me["uid"]) {
            reserved.push(me);
        }
        let mut status = json!({"reservedFor": reserved});
        if let Some(results) = results {
            status["allocation"] = json!({
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                "allocationTimestamp": now_rfc3339(),
            });
        }
        let patch = json!({
            "metadata": {"resourceVersion": c.resource_version()},
            "status": status,
        });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(done) => {
                if results.is_some() {
                    state.mark_written(&c.uid().unwrap_or_default(), done.resource_version());
                }
                written.push((name, results.is_some()))
            }
            Err(e) => {
                failure = Some(format!("cannot write the status of claim {ns}/{name}: {e}"));
                break;
            }
        }
    }
    if failure.is_none()
        && let (Some(x), Some(name)) = (extended, &claim_name)
    {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let patch = json!({"status": {"extendedResourceClaimStatus": {
            "resourceClaimName": name, "requestMappings": x.mappings}}});
        if let Err(e) = pods
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            failure = Some(format!(
                "cannot record the extended-resource claim in pod {ns}/{}: {e}",
                pod.name_any()
            ));
        }
    }
    if failure.is_none() {
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod.name_any(), "namespace": ns, "uid": pod.uid()},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if let Err(e) = pods
            .create_subresource::<_, Value>(
                "binding",
                &pod.name_any(),
                &PostParams::default(),
                &binding,
            )
            .await
        {
            failure = Some(format!("cannot bind to {node}: {e}"));
        }
    }
    let Some(failure) = failure else {
        return Ok(());
    };
    // Unreserve: take the pod out of what it wrote, and the allocations it made.
    for (name, allocated) in &written {
        if let Err(e) = unreserve(&api, name, &pod.uid().unwrap_or_default(), *allocated).await {
            tracing::warn!(claim = %format!("{ns}/{name}"), "cannot undo the reservation: {e}");
        }
    }
    for (c, results) in &claims {
        if results.is_some() {
            state.forget(&c.uid().unwrap_or_default());
        }
    }
    // The special claim made for this try goes too (upstream's Unreserve deletes it).
    if let Some(name) = created
        && let Err(e) = api.delete(&name, &Default::default()).await
    {
        tracing::warn!(claim = %format!("{ns}/{name}"), "cannot delete the extended-resource claim: {e}");
    }
    Err(failure)
}

/// Removes `pod_uid` from the claim's `reservedFor`, and the allocation when `deallocate`
/// (or when nobody is left and the claim is allocated: the controller's rule).
pub(crate) async fn unreserve(
    api: &Api<ResourceClaim>,
    name: &str,
    pod_uid: &str,
    deallocate: bool,
) -> Result<(), kube::Error> {
    let c = api.get_status(name).await?;
    let reserved: Vec<Value> = c
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.uid != pod_uid)
        .filter_map(|r| serde_json::to_value(r).ok())
        .collect();
    let mut status = json!({"reservedFor": if reserved.is_empty() { Value::Null } else { Value::Array(reserved.clone()) }});
    if deallocate || reserved.is_empty() {
        status["allocation"] = Value::Null;
        status["devices"] = Value::Null;
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"resourceVersion": c.resource_version()}, "status": status}),
        ),
    )
    .await?;
    Ok(())
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}
