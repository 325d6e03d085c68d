//! The AMD part of Allocate (SPEC §4): what the vendor-generic shell
//! (`hami_plugin_core::allocate_shell`: pod lookup, whole-card hand-over with its busy
//! check, region file, one commit patch, node-lock release, `bind-phase=failed` on
//! failure) asks of each vendor — the devices, the node's CU usage (with an Event per
//! unreadable annotation), the planner, the region file (`hami_region::plugin_file`), dmem
//! limits after the commit and CDI names.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::future::BoxFuture;
use hami_plugin_core::allocate_shell::{AllocateShell, TrackedPlan, VendorAllocate};
use hami_plugin_core::pod_choice::{annotation, pod_ref};
use hami_protocol::cu_allocated::CuAllocation;
use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::hook_config::HookConfig;
use hami_protocol::identity::KubeletDeviceId;
use hami_protocol::names::{AMD, DEFAULT_SCHEDULER_NAME as SCHEDULER, Vendor, pod as pod_keys};
use hami_protocol::node_lock::PodRef;
use hami_protocol::requests::{container_kinds, pod_container_slots};
use k8s_openapi::api::core::v1::Pod;
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
use crate::registration::RegisteredDevice;

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

/// The AMD part of Allocate against the API server; the rest is the vendor-generic shell
/// (`hami_plugin_core::allocate_shell`).
pub struct KubeAllocator {
    /// The API client (Events).
    pub client: kube::Client,
    /// The devices offered now (from the publisher).
    pub devices: watch::Receiver<Vec<RegisteredDevice>>,
    /// How containers are planned.
    pub settings: PlanSettings,
    /// Receives dmem jobs (the cgroup writer); `None` disables dmem.
    pub dmem: Option<DmemWriter>,
    /// Unreadable annotations already reported (pod, value), so each gets one Event.
    pub reported: Mutex<BTreeSet<(PodRef, String)>>,
}

impl KubeAllocator {
    /// Allocate for `node`, planning from the current `devices` (inside a tokio runtime:
    /// the shell watches the node's pods).
    pub fn new(
        client: kube::Client,
        node: String,
        devices: watch::Receiver<Vec<RegisteredDevice>>,
        settings: PlanSettings,
        dmem: Option<DmemWriter>,
    ) -> Arc<AllocateShell<Self>> {
        AllocateShell::new(
            client.clone(),
            node,
            Self {
                client,
                devices,
                settings,
                dmem,
                reported: Mutex::new(BTreeSet::new()),
            },
        )
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

    async fn plan_pod(
        &self,
        pod: &Pod,
        target: &PodRef,
        pods: &[Pod],
        devices: &[RegisteredDevice],
        requested: usize,
    ) -> Result<TrackedPlan, String> {
        // D-4: CUs count only on pods our scheduler placed; the pod being allocated was
        // bound by it, so its schedulerName is the scheduler's.
        let scheduler = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref())
            .filter(|n| !n.is_empty())
            .unwrap_or(SCHEDULER)
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
        tracing::info!(pod = %target, run = plan.run_index, mask = ?plan.container.envs.get("HSA_CU_MASK"), "planned");
        // One patch: CU bits, the consumed run and (last container) the bind phase.
        let mut annotations = serde_json::Map::new();
        annotations.insert(AMD.devices_to_allocate.into(), json!(plan.to_allocate));
        annotations.insert(pod_keys::AMD_CU_ALLOCATED.into(), json!(plan.cu_allocated));
        let dmem_job = match (&self.dmem, pod.metadata.uid.as_ref()) {
            (Some(writer), Some(uid)) => {
                let limits = pod_limits(pod, devices).unwrap_or_else(|| plan.dmem.clone());
                // The QoS class names the pod cgroup's one path (kubelet's naming).
                let qos = crate::dmem::Qos::of_pod(pod);
                (!limits.is_empty()).then(|| {
                    (
                        writer.clone(),
                        DmemJob {
                            pod_uid: uid.clone(),
                            limits,
                        },
                        qos,
                    )
                })
            }
            _ => None,
        };
        Ok(TrackedPlan {
            container: plan.container,
            run_index: plan.run_index,
            cache_dir: plan.cache_dir,
            hook_config: plan.hook_config,
            annotations,
            last: plan.last,
            after_commit: dmem_job.map(|(writer, job, qos)| {
                Box::new(move || {
                    writer.submit_with_qos(job, Some(qos));
                }) as Box<dyn FnOnce() + Send>
            }),
        })
    }
}

/// Records a Warning Event on a pod (core v1, the pod's namespace).
pub async fn record_pod_event(client: &kube::Client, pod: &PodRef, reason: &str, message: &str) {
    hami_plugin_core::pod_commit::record_pod_event(
        client,
        pod,
        "amd-device-plugin",
        reason,
        message,
    )
    .await;
}

impl VendorAllocate for KubeAllocator {
    type Device = RegisteredDevice;

    fn vendor(&self) -> Vendor {
        Vendor::Amd
    }

    fn devices(&self) -> Vec<RegisteredDevice> {
        self.devices.borrow().clone()
    }

    fn card_of(&self, devices: &[RegisteredDevice], kubelet_id: &str) -> Option<String> {
        let key = KubeletDeviceId::parse(kubelet_id).ok()?.device_key;
        let dev = devices.iter().find(|d| d.device_key == key)?;
        Some(dev.info.id.clone())
    }

    fn keys_of(&self, devices: &[RegisteredDevice], cards: &BTreeSet<String>) -> Vec<String> {
        devices
            .iter()
            .filter(|d| cards.contains(&d.info.id))
            .map(|d| d.device_key.clone())
            .collect()
    }

    /// Cards with CUs held by live pods, and those named in a pending run of any pod.
    fn busy_cards<'a>(
        &'a self,
        pods: &'a [Pod],
        devices: &'a [RegisteredDevice],
    ) -> BoxFuture<'a, Result<BTreeSet<String>, String>> {
        Box::pin(async move {
            let usage = self.usage(pods, devices, None, SCHEDULER).await?;
            Ok(busy_devices(&usage.used, pods))
        })
    }

    fn plan_whole_cards(
        &self,
        devices: &[RegisteredDevice],
        kubelet_ids: &[String],
        busy: &BTreeSet<String>,
    ) -> Result<ContainerPlan, String> {
        plan_whole_cards(devices, kubelet_ids, busy).map_err(|e| e.to_string())
    }

    fn plan_tracked<'a>(
        &'a self,
        pod: &'a Pod,
        target: &'a PodRef,
        pods: &'a [Pod],
        devices: &'a [RegisteredDevice],
        requested: usize,
    ) -> BoxFuture<'a, Result<TrackedPlan, String>> {
        Box::pin(self.plan_pod(pod, target, pods, devices, requested))
    }

    fn prepare_region(
        &self,
        dir: &str,
        _config_path: &str,
        config: &HookConfig,
    ) -> Result<u64, String> {
        prepare_region(dir, config)
    }

    fn write_hook_config(&self, path: &str, text: &str) -> std::io::Result<()> {
        hami_plugin_core::pod_commit::write_hook_config(path, text)
    }

    fn finish(&self, mut plan: ContainerPlan, devices: &[RegisteredDevice]) -> ContainerPlan {
        if self.settings.cdi {
            crate::cdi::to_cdi(&mut plan, devices);
        }
        plan
    }
}

/// The pod-level dmem limits from the pod's whole decision (`hami.io/amd-devices-allocated`)
/// and its container kinds; `None` when the pod has no readable decision.
pub fn pod_limits(pod: &Pod, devices: &[RegisteredDevice]) -> Option<Vec<DmemLimit>> {
    let runs = decode_pod_devices(annotation(pod, AMD.devices_allocated)?).ok()?;
    let kinds = container_kinds(pod);
    Some(pod_dmem(&runs, &kinds, devices))
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
