//! The DRA path's informers (ResourceSlices, DeviceClasses, ResourceClaims,
//! ResourceClaimTemplates), the assume cache of allocations being written, the claim
//! controller's bridge over the informers' lag, and the cluster view placement reads,
//! rebuilt only where something changed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use hami_dra_core::api::{self as model, DeviceRequestAllocationResult};
use hami_structured_allocation::allocator::DeviceClass as ClassModel;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use super::DraOptions;
use crate::dra_placement::utilization;

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

pub(super) fn convert<T: serde::Serialize, U: serde::de::DeserializeOwned>(
    v: &T,
) -> Result<U, String> {
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

    pub(super) fn assume(
        &self,
        claim_uid: &str,
        node: &str,
        results: &[DeviceRequestAllocationResult],
    ) {
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

    pub(super) fn mark_written(&self, claim_uid: &str, version: Option<String>) {
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

    pub(super) fn forget(&self, claim_uid: &str) {
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
