//! One Allocate shell for both vendors (SPEC §4; issue 28 item 2): the pod lookup (the
//! node's watched pods, [`crate::node_pods`]), the choice of the pod (`pod_choice`), the
//! whole-card hand-over to a pod HAMi did not place with its busy check and record
//! (`whole_card_holdings`), the container's accounting directory, region file and hook
//! config, the one commit patch and the node-lock release (`pod_commit`), and Events. A
//! vendor gives only what differs ([`VendorAllocate`]): its devices, its planner, its
//! region file. Both plugins then answer the same requests the same way by construction.
//!
//! Busy cards for a whole-card hand-over, one rule for both vendors: the cards HAMi slices
//! use or will use on the node ([`slice_cards`]: device lists of live pods the scheduler
//! placed, including the node lock's owner, which is locked and given its devices before
//! it is bound and so is not yet among the node's pods), cards held whole by other pods,
//! and what the vendor counts besides (the AMD plugin: CUs in use).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use hami_protocol::container_plan::ContainerPlan;
use hami_protocol::hook_config::HookConfig;
use hami_protocol::names::{DEFAULT_SCHEDULER_NAME as SCHEDULER, Vendor};
use hami_protocol::node_lock::{NodeLock, PodRef};
use hami_protocol::whole_cards;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Map, Value};
use tokio::sync::Mutex;

use crate::grpc_server::Allocator;
use crate::mount_sources::check_mount_sources;
use crate::node_pods::NodePods;
use crate::pod_choice::{PodChoice, annotation, choose_pod_for_request, pod_ref};
use crate::pod_commit::{
    check_lock_owner, commit_allocation, create_cache_dir, mark_failed, record_whole_cards,
};
use crate::whole_card_holdings::{
    check_free, check_pod_not_on_held_cards, fallback_target, node_holdings, slice_cards,
};

/// A HAMi pod's container as the vendor's planner decided it.
pub struct TrackedPlan {
    /// What kubelet gets.
    pub container: ContainerPlan,
    /// Which run of the device list the request consumed.
    pub run_index: usize,
    /// The container's accounting directory on the host (made mode 0777 before answering).
    pub cache_dir: Option<String>,
    /// The container's hook config (host path, content); the shell adds the region file's
    /// inode when there is a `cache_dir`.
    pub hook_config: Option<(String, HookConfig)>,
    /// The pod annotations the one commit patch writes.
    pub annotations: Map<String, Value>,
    /// No run is left: `bind-phase=success` and the node lock released.
    pub last: bool,
    /// Run once the commit succeeded (the AMD plugin: dmem limits to its cgroup writer).
    pub after_commit: Option<Box<dyn FnOnce() + Send>>,
}

/// What differs between the vendors' Allocate.
pub trait VendorAllocate: Send + Sync + 'static {
    /// A device as the vendor registers it.
    type Device: Clone + Send + Sync + 'static;

    /// The vendor (annotation keys, resource names).
    fn vendor(&self) -> Vendor;

    /// The devices offered now.
    fn devices(&self) -> Vec<Self::Device>;

    /// The card (registered id) a kubelet id is a share of; `None` for an id of no offered
    /// card (the vendor's whole-card plan refuses it).
    fn card_of(&self, devices: &[Self::Device], kubelet_id: &str) -> Option<String>;

    /// The device keys (kubelet ids are `<key>#<share>`) of `cards`.
    fn keys_of(&self, devices: &[Self::Device], cards: &BTreeSet<String>) -> Vec<String>;

    /// Cards the vendor counts busy besides the shared rule (the AMD plugin: CUs held by
    /// live pods, and every pending run); may record Events.
    fn busy_cards<'a>(
        &'a self,
        _pods: &'a [Pod],
        _devices: &'a [Self::Device],
    ) -> BoxFuture<'a, Result<BTreeSet<String>, String>> {
        Box::pin(async { Ok(BTreeSet::new()) })
    }

    /// The answer for kubelet ids handed over as whole cards, none of them `busy`.
    fn plan_whole_cards(
        &self,
        devices: &[Self::Device],
        kubelet_ids: &[String],
        busy: &BTreeSet<String>,
    ) -> Result<ContainerPlan, String>;

    /// Plans the container of `pod` (the scheduler placed it) for `requested` devices.
    fn plan_tracked<'a>(
        &'a self,
        pod: &'a Pod,
        target: &'a PodRef,
        pods: &'a [Pod],
        devices: &'a [Self::Device],
        requested: usize,
    ) -> BoxFuture<'a, Result<TrackedPlan, String>>;

    /// Makes (or finds) the container's region file in `dir` for the hook config at
    /// `config_path` and returns its inode, through the vendor's region crate (both apply
    /// `hami_kernel_locks::region_file`).
    fn prepare_region(
        &self,
        dir: &str,
        config_path: &str,
        config: &HookConfig,
    ) -> Result<u64, String>;

    /// Writes the container's hook config.
    fn write_hook_config(&self, path: &str, text: &str) -> std::io::Result<()>;

    /// The answer as kubelet gets it (the AMD plugin: CDI names when configured).
    fn finish(&self, plan: ContainerPlan, _devices: &[Self::Device]) -> ContainerPlan {
        plan
    }
}

/// Allocate against the API server, for vendor `V`.
pub struct AllocateShell<V> {
    client: kube::Client,
    node: String,
    vendor: V,
    pods: Arc<NodePods>,
    /// Allocations of one node are serialized, so each sees the previous one's patch.
    serial: Mutex<()>,
}

/// The node as one Allocate reads it.
struct View {
    lock: Option<String>,
    pods: Vec<Pod>,
    /// The lock's owner read from the API server because the watch had not shown it.
    unseen_owner: Option<Pod>,
}

impl<V: VendorAllocate> AllocateShell<V> {
    /// The shell for `node`, watching the node's pods (call inside a tokio runtime).
    pub fn new(client: kube::Client, node: String, vendor: V) -> Arc<Self> {
        let pods = NodePods::start(client.clone(), &node);
        Arc::new(Self {
            client,
            node,
            vendor,
            pods,
            serial: Mutex::new(()),
        })
    }

    /// The vendor part.
    pub fn vendor(&self) -> &V {
        &self.vendor
    }

    /// The API client.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The lock (fresh), the node's pods (watched, or `fresh` from a LIST) and the lock's
    /// owner when the pods do not show it (read by itself; it joins them once bound here).
    async fn view(&self, fresh: bool) -> Result<View, String> {
        let lock = self.pods.lock().await?;
        let mut pods = if fresh {
            self.pods.list().await?
        } else {
            self.pods.pods().await?
        };
        let owner = lock
            .as_deref()
            .and_then(|v| NodeLock::parse(v).ok())
            .and_then(|l| l.owner);
        let mut unseen_owner = None;
        if let Some(owner) = owner
            && !pods.iter().any(|p| pod_ref(p) == owner)
            && let Some(pod) = self.pods.owner(&owner).await.unwrap_or_else(|e| {
                tracing::warn!("the node lock's owner: {e}");
                None
            })
        {
            let bound_here =
                pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&self.node);
            if bound_here {
                pods.push(pod);
            } else {
                unseen_owner = Some(pod);
            }
        }
        Ok(View {
            lock,
            pods,
            unseen_owner,
        })
    }

    /// The cards a whole-card hand-over must not take (see the module's doc).
    async fn busy(&self, view: &View, devices: &[V::Device]) -> Result<BTreeSet<String>, String> {
        let vendor = self.vendor.vendor();
        let mut busy = slice_cards(&view.pods, &self.node, vendor, SCHEDULER);
        if let Some(owner) = &view.unseen_owner {
            busy.extend(slice_cards(
                std::slice::from_ref(owner),
                &self.node,
                vendor,
                SCHEDULER,
            ));
        }
        busy.extend(self.vendor.busy_cards(&view.pods, devices).await?);
        Ok(busy)
    }

    async fn allocate_inner(&self, ids: Vec<String>) -> Result<ContainerPlan, String> {
        let _serial = self.serial.lock().await;
        let devices = self.vendor.devices();
        let key = self.vendor.vendor().names().devices_to_allocate;
        let mut view = self.view(false).await?;
        let mut choice =
            choose_pod_for_request(view.lock.as_deref(), &self.node, &view.pods, key, ids.len())?;
        if choice == PodChoice::None {
            // Only a pod HAMi did not place takes this path: read the node's pods fresh, so
            // a HAMi pod the watch has not shown yet is never handed whole cards.
            view = self.view(true).await?;
            choice = choose_pod_for_request(
                view.lock.as_deref(),
                &self.node,
                &view.pods,
                key,
                ids.len(),
            )?;
        }
        let target = match choice {
            PodChoice::None => {
                tracing::info!(ids = ?ids, "no pending HAMi pod: handing the devices over as whole cards");
                let plan = self.hand_over_whole_cards(&view, &devices, &ids).await?;
                return Ok(self.vendor.finish(plan, &devices));
            }
            PodChoice::Tracked(p) => p,
        };
        let pod = match view.pods.iter().find(|p| pod_ref(p) == target) {
            Some(p) => p.clone(),
            None => match self.pods.get(&target).await {
                Ok(Some(p)) => p,
                Ok(None) => {
                    return Err(format!(
                        "pod {target} named by the node lock cannot be read: it does not exist"
                    ));
                }
                Err(e) => return Err(format!("{e} (named by the node lock)")),
            },
        };
        match self
            .plan_and_commit(&pod, &target, &view, &devices, ids.len())
            .await
        {
            Ok(plan) => Ok(self.vendor.finish(plan, &devices)),
            Err(e) => {
                if let Some(p) = mark_failed(&self.client, &self.node, &target).await {
                    self.pods.wrote(p);
                }
                Err(format!("pod {target}: {e}"))
            }
        }
    }

    /// A pod HAMi did not place: the cards of kubelet's ids, if no other pod holds them
    /// whole and none is busy, recorded on the pod (`hami.io/<vendor>-whole-cards`) before
    /// the answer (issue 26 item 1).
    async fn hand_over_whole_cards(
        &self,
        view: &View,
        devices: &[V::Device],
        ids: &[String],
    ) -> Result<ContainerPlan, String> {
        let vendor = self.vendor.vendor();
        let pods = &view.pods;
        let busy = self.busy(view, devices).await?;
        let target = fallback_target(pods, &self.node, vendor, SCHEDULER, ids.len())?;
        let holdings = node_holdings(pods, &self.node, vendor, SCHEDULER);
        for (pod, why) in &holdings.problems {
            tracing::warn!(pod = %pod, "whole-card holding not counted: {why}");
        }
        // An id of no offered card is refused by the vendor's plan below.
        let chosen: Vec<(String, String)> = ids
            .iter()
            .filter_map(|id| Some((id.clone(), self.vendor.card_of(devices, id)?)))
            .collect();
        check_free(
            &chosen,
            &holdings.held_by_others(Some(&target)),
            &busy,
            vendor,
        )?;
        let plan = self.vendor.plan_whole_cards(devices, ids, &busy)?;
        check_mount_sources(&plan, vendor, Path::exists)?;
        let cards: Vec<String> = chosen.into_iter().map(|(_, c)| c).collect();
        let existing = pods
            .iter()
            .find(|p| pod_ref(p) == target)
            .and_then(|p| annotation(p, whole_cards::key(vendor)));
        let written = record_whole_cards(&self.client, &target, vendor, existing, &cards).await?;
        self.pods.wrote(written);
        tracing::info!(pod = %target, cards = ?cards, "whole cards handed over and recorded");
        Ok(plan)
    }

    async fn plan_and_commit(
        &self,
        pod: &Pod,
        target: &PodRef,
        view: &View,
        devices: &[V::Device],
        requested: usize,
    ) -> Result<ContainerPlan, String> {
        let lock = view.lock.as_deref();
        // The pod was verified against the request (bound here, allocating, next run of the
        // requested size); a lock held by another pod then means it took over an expired
        // lock: this pod's allocation still stands, and the new owner's lock is not ours.
        if check_lock_owner(lock, target).is_err() {
            tracing::warn!(pod = %target, lock = ?lock, "allocating a pod whose node lock expired and was taken over");
        }
        // A card a pod HAMi did not place took after the scheduler decided: never shared.
        check_pod_not_on_held_cards(pod, &view.pods, &self.node, self.vendor.vendor(), SCHEDULER)?;
        let plan = self
            .vendor
            .plan_tracked(pod, target, &view.pods, devices, requested)
            .await?;
        let new_cache_dir = plan
            .cache_dir
            .as_deref()
            .filter(|dir| !Path::new(dir).exists());
        if let Some(dir) = &plan.cache_dir {
            create_cache_dir(dir).map_err(|e| {
                format!("cannot create the container's accounting directory {dir}: {e}")
            })?;
        }
        if let Some((path, config)) = &plan.hook_config {
            let mut config = config.clone();
            if let Some(dir) = &plan.cache_dir {
                // Named by inode in the config, so a tenant who deletes or replaces it (the
                // directory is the container's) makes the hook fail closed instead of
                // starting a second, empty accounting.
                config.shared_cache_inode = Some(self.vendor.prepare_region(dir, path, &config)?);
            }
            let text = config
                .encode()
                .map_err(|e| format!("the container's hook config is invalid: {e}"))?;
            self.vendor
                .write_hook_config(path, &text)
                .map_err(|e| format!("cannot write the container's hook config {path}: {e}"))?;
        }
        // After the files this Allocate makes, so only what it cannot make is missing; on
        // refusal they go again (the monitor would read an accounting directory as a
        // container).
        if let Err(e) = check_mount_sources(&plan.container, self.vendor.vendor(), Path::exists) {
            if let Some((path, _)) = &plan.hook_config {
                let _ = std::fs::remove_file(path);
            }
            if let Some(dir) = new_cache_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            return Err(e);
        }
        let written = commit_allocation(
            &self.client,
            &self.node,
            target,
            plan.annotations,
            plan.last,
        )
        .await?;
        self.pods.wrote(written);
        if let Some(after) = plan.after_commit {
            after();
        }
        tracing::info!(pod = %target, run = plan.run_index, last = plan.last, "allocated");
        Ok(plan.container)
    }

    /// Cards held whole by pods HAMi did not place, or busy (see the module's doc):
    /// kubelet's preferred allocation takes them last, so a plain pod gets a free card.
    async fn avoid_keys_inner(&self) -> Vec<String> {
        let devices = self.vendor.devices();
        let Ok(view) = self.view(false).await else {
            return Vec::new();
        };
        let Ok(mut busy) = self.busy(&view, &devices).await else {
            return Vec::new();
        };
        busy.extend(
            node_holdings(&view.pods, &self.node, self.vendor.vendor(), SCHEDULER)
                .by_card
                .into_keys(),
        );
        self.vendor.keys_of(&devices, &busy)
    }
}

impl<V: VendorAllocate> Allocator for AllocateShell<V> {
    fn allocate(&self, kubelet_ids: Vec<String>) -> BoxFuture<'_, Result<ContainerPlan, String>> {
        Box::pin(self.allocate_inner(kubelet_ids))
    }

    fn avoid_keys(&self) -> BoxFuture<'_, Vec<String>> {
        Box::pin(self.avoid_keys_inner())
    }
}
