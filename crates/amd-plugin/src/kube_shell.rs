//! The Kubernetes side of Allocate (SPEC §4): find the pod, read the node's CU usage, run
//! the pure planner, write the result in one pod patch (so nothing is half-written), and
//! release the node lock. Failures set `bind-phase=failed` and release the lock.

use std::collections::BTreeSet;
use std::sync::Arc;

use hami_protocol::cu_allocated::CuAllocation;
use k8s_openapi::api::core::v1::Event;
use kube::api::PostParams;

use futures::future::BoxFuture;
use hami_plugin_core::pod_choice::{annotation, pod_ref};
use hami_plugin_core::pod_commit::record_whole_cards;
use hami_plugin_core::pod_commit::{
    check_lock_owner, commit_allocation, create_cache_dir, mark_failed, write_hook_config,
};
use hami_plugin_core::whole_card_holdings::{
    check_free, check_pod_not_on_held_cards, fallback_target, node_holdings,
};
use hami_protocol::identity::KubeletDeviceId;
use hami_protocol::names::{AMD, DEFAULT_SCHEDULER_NAME as SCHEDULER, Vendor, pod as pod_keys};
use hami_protocol::node_lock::PodRef;
use hami_protocol::requests::{container_kinds, pod_container_slots};
use hami_protocol::whole_cards;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;
use tokio::sync::{Mutex, watch};

// Vendor-neutral pieces (shared with the NVIDIA plugin), kept at their old paths.
pub use hami_plugin_core::pod_choice::PodChoice;
pub use hami_plugin_core::pod_commit::release_lock;

use crate::allocate_plan::{
    ContainerPlan, PlanSettings, PodAnnotations, plan_allocate, plan_whole_cards,
};
use crate::cu_usage::{PodCus, Usage, cus_in_use};
use crate::dmem::{DmemJob, DmemWriter};
use crate::dmem_plan::{DmemLimit, pod_dmem};
use crate::grpc_server::Allocator;
use crate::registration::RegisteredDevice;
use hami_protocol::device_list::decode_pod_devices;

/// Picks the pod among the pods of the node (pure): the lock owner when the lock names
/// one, else the oldest (by `hami.io/bind-time`, then name) pod with
/// `bind-phase=allocating` whose `vgpu-node` is this node and that still has AMD devices
/// to allocate.
pub fn choose_pod(
    lock: Option<&str>,
    node: &str,
    pods: &[Pod],
    requested: usize,
) -> Result<PodChoice, String> {
    hami_plugin_core::pod_choice::choose_pod_for_request(
        lock,
        node,
        pods,
        AMD.devices_to_allocate,
        requested,
    )
}

/// Event reason for a pod whose `hami.io/amd-cu-allocated` cannot be read.
pub const MALFORMED_CU_ALLOCATED: &str = "AMDCuAllocatedMalformed";

/// Devices a whole-card hand-over must not take: those with CUs held by live pods, and
/// those named in a pending run of a pod still being allocated (reserved by the scheduler).
pub fn busy_devices(used: &CuAllocation, pods: &[Pod]) -> BTreeSet<String> {
    let mut busy: BTreeSet<String> = used
        .0
        .iter()
        .filter(|(_, set)| !set.is_empty())
        .map(|(id, _)| id.clone())
        .collect();
    for p in pods {
        if matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ) {
            continue;
        }
        if let Some(runs) =
            annotation(p, AMD.devices_to_allocate).and_then(|t| decode_pod_devices(t).ok())
        {
            busy.extend(runs.into_iter().flatten().map(|d| d.uuid));
        }
    }
    busy
}

/// Records a Warning Event on a pod (core v1, the pod's namespace).
pub async fn record_pod_event(client: &kube::Client, pod: &PodRef, reason: &str, message: &str) {
    let events: Api<Event> = Api::namespaced(client.clone(), &pod.namespace);
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let ev: Result<Event, _> = serde_json::from_value(json!({
        "metadata": {"generateName": format!("{}.", pod.name)},
        "involvedObject": {"kind": "Pod", "name": pod.name, "namespace": pod.namespace, "apiVersion": "v1"},
        "reason": reason,
        "message": message,
        "type": "Warning",
        "source": {"component": "amd-device-plugin"},
        "count": 1,
    }));
    let Ok(mut ev) = ev else { return };
    ev.first_timestamp = Some(now.clone());
    ev.last_timestamp = Some(now);
    if let Err(e) = events.create(&PostParams::default(), &ev).await {
        tracing::warn!("cannot record event {reason} on pod {pod}: {e}");
    }
}

/// Allocate against the API server.
pub struct KubeAllocator {
    /// The API client.
    pub client: kube::Client,
    /// The node this plugin serves.
    pub node: String,
    /// The devices offered now (from the publisher).
    pub devices: watch::Receiver<Vec<RegisteredDevice>>,
    /// How containers are planned.
    pub settings: PlanSettings,
    /// Receives dmem jobs (the cgroup writer); `None` disables dmem.
    pub dmem: Option<DmemWriter>,
    /// Allocations of one node are serialized so CU choices never race.
    pub serial: Mutex<()>,
    /// Unreadable annotations already reported (pod, value), so each gets one Event.
    pub reported: Mutex<BTreeSet<(PodRef, String)>>,
}

impl KubeAllocator {
    /// An allocator for `node`, planning from the current `devices`.
    pub fn new(
        client: kube::Client,
        node: String,
        devices: watch::Receiver<Vec<RegisteredDevice>>,
        settings: PlanSettings,
        dmem: Option<DmemWriter>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            node,
            devices,
            settings,
            dmem,
            serial: Mutex::new(()),
            reported: Mutex::new(BTreeSet::new()),
        })
    }

    async fn allocate_inner(&self, ids: Vec<String>) -> Result<ContainerPlan, String> {
        let mut plan = self.allocate_plan(ids).await?;
        if self.settings.cdi {
            crate::cdi::to_cdi(&mut plan, &self.devices.borrow());
        }
        Ok(plan)
    }

    async fn allocate_plan(&self, ids: Vec<String>) -> Result<ContainerPlan, String> {
        let _serial = self.serial.lock().await;
        let devices = self.devices.borrow().clone();
        let (lock, pods) =
            hami_plugin_core::pod_commit::node_lock_and_pods(&self.client, &self.node).await?;
        let target = match choose_pod(lock.as_deref(), &self.node, &pods, ids.len())? {
            PodChoice::None => {
                tracing::info!(ids = ?ids, "no pending HAMi pod: handing the devices over as whole cards");
                let usage = self
                    .usage(
                        &pods,
                        &devices,
                        None,
                        hami_protocol::names::DEFAULT_SCHEDULER_NAME,
                    )
                    .await?;
                let busy = busy_devices(&usage.used, &pods);
                return self
                    .hand_over_whole_cards(&pods, &devices, &ids, &busy)
                    .await;
            }
            PodChoice::Tracked(p) => p,
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &target.namespace);
        let pod = match pods.iter().find(|p| pod_ref(p) == target) {
            Some(p) => p.clone(),
            None => api
                .get(&target.name)
                .await
                .map_err(|e| format!("pod {target} named by the node lock cannot be read: {e}"))?,
        };
        let result = self
            .plan_and_commit(&pod, &target, &pods, &devices, ids.len(), lock.as_deref())
            .await;
        match result {
            Ok(plan) => Ok(plan),
            Err(e) => {
                let message = format!("pod {target}: {e}");
                self.fail(&target).await;
                Err(message)
            }
        }
    }

    /// A pod HAMi did not place: the cards of kubelet's ids, if no other pod holds them
    /// whole and no slice or pending run uses them (`busy`), recorded on the pod
    /// (`hami.io/amd-whole-cards`) before the answer (issue 26 item 1).
    async fn hand_over_whole_cards(
        &self,
        pods: &[Pod],
        devices: &[RegisteredDevice],
        ids: &[String],
        busy: &BTreeSet<String>,
    ) -> Result<ContainerPlan, String> {
        let target = fallback_target(pods, &self.node, Vendor::Amd, SCHEDULER, ids.len())?;
        let holdings = node_holdings(pods, &self.node, Vendor::Amd, SCHEDULER);
        for (pod, why) in &holdings.problems {
            tracing::warn!(pod = %pod, "whole-card holding not counted: {why}");
        }
        // The card (registered id) each kubelet id is a share of; an id of no offered card
        // is refused by plan_whole_cards below.
        let chosen: Vec<(String, String)> = ids
            .iter()
            .filter_map(|text| {
                let key = KubeletDeviceId::parse(text).ok()?.device_key;
                let dev = devices.iter().find(|d| d.device_key == key)?;
                Some((text.clone(), dev.info.id.clone()))
            })
            .collect();
        check_free(
            &chosen,
            &holdings.held_by_others(Some(&target)),
            &BTreeSet::new(),
            Vendor::Amd,
        )?;
        let plan = plan_whole_cards(devices, ids, busy).map_err(|e| e.to_string())?;
        let cards: Vec<String> = chosen.into_iter().map(|(_, c)| c).collect();
        let existing = pods
            .iter()
            .find(|p| pod_ref(p) == target)
            .and_then(|p| annotation(p, whole_cards::key(Vendor::Amd)));
        record_whole_cards(&self.client, &target, Vendor::Amd, existing, &cards).await?;
        tracing::info!(pod = %target, cards = ?cards, "whole cards handed over and recorded");
        Ok(plan)
    }

    #[allow(clippy::too_many_arguments)]
    async fn plan_and_commit(
        &self,
        pod: &Pod,
        target: &PodRef,
        pods: &[Pod],
        devices: &[RegisteredDevice],
        requested: usize,
        lock: Option<&str>,
    ) -> Result<ContainerPlan, String> {
        // The pod was verified against the request (bound here, allocating, next run of the
        // requested size); a lock held by another pod then means it took over an expired
        // lock: this pod's allocation still stands, and the new owner's lock is not ours.
        if check_lock_owner(lock, target).is_err() {
            tracing::warn!(pod = %target, lock = ?lock, "allocating a pod whose node lock expired and was taken over");
        }
        // A card a pod HAMi did not place took after the scheduler decided: never shared.
        check_pod_not_on_held_cards(pod, pods, &self.node, Vendor::Amd, SCHEDULER)?;
        // D-4: CUs count only on pods our scheduler placed; the pod being allocated was
        // bound by it, so its schedulerName is the scheduler's.
        let scheduler = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref())
            .filter(|n| !n.is_empty())
            .unwrap_or(hami_protocol::names::DEFAULT_SCHEDULER_NAME)
            .to_owned();
        let usage = self
            .usage(pods, devices, Some(target), &scheduler)
            .await?
            .used;
        let state = PodAnnotations {
            to_allocate: annotation(pod, AMD.devices_to_allocate).map(str::to_owned),
            cu_allocated: annotation(pod, pod_keys::AMD_CU_ALLOCATED).map(str::to_owned),
            pod_uid: pod.metadata.uid.clone(),
            containers: pod_container_slots(pod)
                .iter()
                .map(|c| c.container.name.clone())
                .collect(),
            kinds: container_kinds(pod),
            allocated: annotation(pod, AMD.devices_allocated).map(str::to_owned),
            task_priorities: pod_container_slots(pod)
                .iter()
                .map(|c| crate::allocate_plan::task_priority(c.container))
                .collect(),
        };
        let plan = plan_allocate(&state, devices, &usage, requested, &self.settings)
            .map_err(|e| e.to_string())?;
        if let Some(dir) = &plan.cache_dir {
            create_cache_dir(dir).map_err(|e| {
                format!("cannot create the container's accounting directory {dir}: {e}")
            })?;
        }
        if let Some((path, config)) = &plan.hook_config {
            let mut config = config.clone();
            if let Some(dir) = &plan.cache_dir {
                config.shared_cache_inode = Some(prepare_region(dir, &config)?);
            }
            let text = config
                .encode()
                .map_err(|e| format!("the container's hook config is invalid: {e}"))?;
            write_hook_config(path, &text)
                .map_err(|e| format!("cannot write the container's hook config {path}: {e}"))?;
        }
        // One patch: CU bits, the consumed run and (last container) the bind phase.
        let mut annotations = serde_json::Map::new();
        annotations.insert(AMD.devices_to_allocate.into(), json!(plan.to_allocate));
        annotations.insert(pod_keys::AMD_CU_ALLOCATED.into(), json!(plan.cu_allocated));
        commit_allocation(&self.client, &self.node, target, annotations, plan.last).await?;
        if let (Some(writer), Some(uid)) = (&self.dmem, pod.metadata.uid.as_ref()) {
            let limits = pod_limits(pod, devices).unwrap_or_else(|| plan.dmem.clone());
            if !limits.is_empty() {
                writer.submit(DmemJob {
                    pod_uid: uid.clone(),
                    limits,
                });
            }
        }
        tracing::info!(pod = %target, run = plan.run_index, last = plan.last, mask = ?plan.container.envs.get("HSA_CU_MASK"), "allocated");
        Ok(plan.container)
    }

    /// The node's CU usage; pods whose annotation is unreadable are skipped, each named once
    /// in a Warning Event on the pod.
    async fn usage(
        &self,
        pods: &[Pod],
        devices: &[RegisteredDevice],
        exclude: Option<&PodRef>,
        scheduler: &str,
    ) -> Result<Usage, String> {
        let refs: Vec<PodRef> = pods.iter().map(pod_ref).collect();
        let usage = cus_in_use(
            pods.iter()
                .zip(&refs)
                .map(|(p, r)| PodCus::of(p, r, scheduler)),
            exclude,
            |id| {
                devices
                    .iter()
                    .find(|d| d.info.id == id)
                    .map(|d| d.info.devcore)
            },
        )
        .map_err(|e| e.to_string())?;
        for skipped in &usage.skipped {
            let value = pods
                .iter()
                .find(|p| pod_ref(p) == skipped.pod)
                .and_then(|p| annotation(p, pod_keys::AMD_CU_ALLOCATED))
                .unwrap_or_default()
                .to_owned();
            if self
                .reported
                .lock()
                .await
                .insert((skipped.pod.clone(), value))
            {
                tracing::warn!(pod = %skipped.pod, "{}", skipped.reason);
                record_pod_event(
                    &self.client,
                    &skipped.pod,
                    MALFORMED_CU_ALLOCATED,
                    &format!(
                        "{} of pod {} is skipped: {}",
                        pod_keys::AMD_CU_ALLOCATED,
                        skipped.pod,
                        skipped.reason
                    ),
                )
                .await;
            }
        }
        Ok(usage)
    }

    async fn fail(&self, target: &PodRef) {
        mark_failed(&self.client, &self.node, target).await;
    }
}

/// The pod-level dmem limits from the pod's whole decision (`hami.io/amd-devices-allocated`)
/// and its container kinds; `None` when the pod has no readable decision.
pub fn pod_limits(pod: &Pod, devices: &[RegisteredDevice]) -> Option<Vec<DmemLimit>> {
    let runs = decode_pod_devices(annotation(pod, AMD.devices_allocated)?).ok()?;
    let kinds = container_kinds(pod);
    Some(pod_dmem(&runs, &kinds, devices))
}

impl Allocator for KubeAllocator {
    fn allocate(&self, kubelet_ids: Vec<String>) -> BoxFuture<'_, Result<ContainerPlan, String>> {
        Box::pin(self.allocate_inner(kubelet_ids))
    }

    /// Cards holding slices or reserved by a pending run: kubelet's preferred allocation
    /// takes them last, so a pod HAMi did not place gets free whole cards.
    fn avoid_keys(&self) -> BoxFuture<'_, Vec<String>> {
        Box::pin(async move {
            let devices = self.devices.borrow().clone();
            let Ok((_, pods)) =
                hami_plugin_core::pod_commit::node_lock_and_pods(&self.client, &self.node).await
            else {
                return Vec::new();
            };
            let Ok(usage) = self
                .usage(
                    &pods,
                    &devices,
                    None,
                    hami_protocol::names::DEFAULT_SCHEDULER_NAME,
                )
                .await
            else {
                return Vec::new();
            };
            let mut busy = busy_devices(&usage.used, &pods);
            // And cards held whole by pods HAMi did not place (issue 26 item 1).
            busy.extend(
                node_holdings(&pods, &self.node, Vendor::Amd, SCHEDULER)
                    .by_card
                    .into_keys(),
            );
            devices
                .iter()
                .filter(|d| busy.contains(&d.info.id))
                .map(|d| d.device_key.clone())
                .collect()
        })
    }
}

/// Whether `meta` (from `symlink_metadata`) is what a hook can map: a plain file of a
/// region's size. Anything else (cut short, a symlink, a FIFO) it refuses.
pub fn is_region_file(meta: &std::fs::Metadata) -> bool {
    meta.is_file() && meta.len() == hami_region::layout::REGION_SIZE as u64
}

/// What [`check_region_file`] left in a container's or claim's cache directory: the rule
/// both regions share (`hami_kernel_locks::region_file`).
pub use hami_region::plugin_file::RegionFile;

/// Checks the region file in `dir` under the shared rule (`hami_region::plugin_file`),
/// removing one no hook could map and no process has attached; the caller makes the new
/// one.
pub fn check_region_file(dir: &std::path::Path) -> Result<RegionFile, String> {
    hami_region::plugin_file::check(&dir.join(crate::allocate_plan::CACHE_FILE))
        .map_err(|e| e.to_string())
}

/// Creates the container's region file with the plugin's limits (or finds the one an
/// earlier try of this Allocate made) and returns its inode for the hook config: the hook
/// then uses only that file (issue 14 items 7, 8). The DRA driver's prepare does the same
/// per claim, through `hami_region::plugin_file` too.
pub fn prepare_region(
    dir: &str,
    config: &hami_protocol::hook_config::HookConfig,
) -> Result<u64, String> {
    let path = std::path::Path::new(dir).join(crate::allocate_plan::CACHE_FILE);
    let limits = hami_region::plugin_file::limits_of(|d| config.memory_limit(d));
    hami_region::plugin_file::prepare(&path, &limits).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_file_no_hook_could_map_is_replaced_unless_a_process_has_it() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("hami-prepare-region-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.to_str().unwrap();
        let path = dir.join(crate::allocate_plan::CACHE_FILE);
        let config = hami_protocol::hook_config::HookConfig::default();
        // An interrupted earlier try's empty file: replaced, not "remove it".
        std::fs::write(&path, b"").unwrap();
        let inode = prepare_region(d, &config).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(is_region_file(&meta) && meta.ino() == inode);
        // Found again as it is by a retry.
        assert_eq!(prepare_region(d, &config).unwrap(), inode);
        // A planted link: the link goes, its target is untouched.
        let target = dir.join("victim");
        std::fs::write(&target, b"keep").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        prepare_region(d, &config).unwrap();
        assert!(is_region_file(&std::fs::symlink_metadata(&path).unwrap()));
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        // Cut short under a live process (its slot lock held): kept, and refused naming why.
        let holder = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        assert!(
            hami_kernel_locks::file_lock::try_lock_record(
                &holder,
                hami_region::layout::slot_offset(0)
            )
            .unwrap()
        );
        holder.set_len(100).unwrap();
        let kept = std::fs::metadata(&path).unwrap().ino();
        let e = prepare_region(d, &config).unwrap_err();
        assert!(e.contains("still have it attached"), "{e}");
        assert_eq!(check_region_file(&dir).unwrap(), RegionFile::InUse);
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), kept);
        // Once it exits: replaced (a plain open, holding no lock, keeps the inode number
        // from being reused, and does not count as attached).
        let _pin = std::fs::File::open(&path).unwrap();
        drop(holder);
        assert_ne!(prepare_region(d, &config).unwrap(), kept);
        // A directory in its place is not guessed at.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let e = prepare_region(d, &config).unwrap_err();
        assert!(
            e.contains("is a directory, not a region file; remove it"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn pod(name: &str, ann: &[(&str, &str)]) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "annotations": ann.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>()},
            "spec": {"nodeName": "n1", "containers": []},
        }))
        .unwrap()
    }

    #[test]
    fn whole_cards_avoid_slices_and_pending_runs() {
        let mut running = pod("s", &[(pod_keys::AMD_CU_ALLOCATED, r#"{"A":"0-3"}"#)]);
        running.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        let pending = pod(
            "locked",
            &[
                (pod_keys::BIND_PHASE, "allocating"),
                (AMD.devices_to_allocate, ";B,AMD X,10,4:;"),
            ],
        );
        let used = CuAllocation::parse(r#"{"A":"0-3"}"#).unwrap();
        let busy = busy_devices(&used, &[running, pending]);
        assert_eq!(busy.into_iter().collect::<Vec<_>>(), vec!["A", "B"]);
    }

    #[test]
    fn lock_owner_first_else_oldest_allocating() {
        let allocating = |name: &str, t: &str| {
            pod(
                name,
                &[
                    (pod_keys::BIND_PHASE, "allocating"),
                    (pod_keys::VGPU_NODE, "n1"),
                    (pod_keys::BIND_TIME, t),
                    (AMD.devices_to_allocate, "A,AMD X,1,1:;"),
                ],
            )
        };
        let pods = vec![
            allocating("late", "200"),
            allocating("early", "100"),
            pod(
                "done",
                &[
                    (pod_keys::BIND_PHASE, "success"),
                    (pod_keys::VGPU_NODE, "n1"),
                ],
            ),
        ];
        assert_eq!(
            choose_pod(None, "n1", &pods, 1),
            Ok(PodChoice::Tracked(PodRef::new("ns", "early")))
        );
        assert_eq!(
            choose_pod(Some("2026-08-04T10:00:00Z,ns,late"), "n1", &pods, 1),
            Ok(PodChoice::Tracked(PodRef::new("ns", "late")))
        );
        // Legacy lock (no owner): fall back to the search.
        assert_eq!(
            choose_pod(Some("2026-08-04T10:00:00Z"), "n1", &pods, 1),
            Ok(PodChoice::Tracked(PodRef::new("ns", "early")))
        );
        assert_eq!(choose_pod(None, "n2", &pods, 1), Ok(PodChoice::None));
        assert!(
            choose_pod(Some("garbage,x"), "n1", &pods, 1)
                .unwrap_err()
                .contains("node n1")
        );
        // Nothing left to allocate: not a candidate.
        let empty = vec![pod(
            "e",
            &[
                (pod_keys::BIND_PHASE, "allocating"),
                (pod_keys::VGPU_NODE, "n1"),
                (AMD.devices_to_allocate, ";;"),
            ],
        )];
        assert_eq!(choose_pod(None, "n1", &empty, 1), Ok(PodChoice::None));
    }
}
