//! The Kubernetes side of Allocate (SPEC §4): find the pod, read the node's CU usage, run
//! the pure planner, write the result in one pod patch (so nothing is half-written), and
//! release the node lock. Failures set `bind-phase=failed` and release the lock.

use hami_protocol::device_list::{decode_pod_devices, first_non_empty_run};
use std::sync::Arc;

use futures::future::BoxFuture;
use hami_protocol::names::{AMD, node as node_keys, pod as pod_keys};
use hami_protocol::node_lock::{BindPhase, NodeLock, PodRef};
use hami_protocol::requests::container_slots;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::sync::{Mutex, watch};

use crate::allocate_plan::{
    ContainerPlan, PlanSettings, PodAnnotations, plan_allocate, plan_whole_cards,
};
use crate::cu_usage::{PodCus, cus_in_use};
use crate::dmem::DmemJob;
use crate::grpc_server::Allocator;
use crate::registration::RegisteredDevice;

/// The pod an Allocate belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodChoice {
    /// HAMi tracks it: the lock owner, or the oldest allocating pod on the node.
    Tracked(PodRef),
    /// No pending HAMi pod: hand the kubelet-chosen devices over as whole cards.
    None,
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn pod_ref(pod: &Pod) -> PodRef {
    PodRef::new(
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Picks the pod among the pods of the node (pure): the lock owner when the lock names
/// one, else the oldest (by `hami.io/bind-time`, then name) pod with
/// `bind-phase=allocating` whose `vgpu-node` is this node and that still has AMD devices
/// to allocate.
pub fn choose_pod(lock: Option<&str>, node: &str, pods: &[Pod]) -> Result<PodChoice, String> {
    if let Some(value) = lock {
        let lock = NodeLock::parse(value).map_err(|e| format!("node {node}: {e}"))?;
        if let Some(owner) = lock.owner {
            return Ok(PodChoice::Tracked(owner));
        }
    }
    let mut candidates: Vec<(&str, PodRef)> = pods
        .iter()
        .filter(|p| annotation(p, pod_keys::BIND_PHASE) == Some(BindPhase::Allocating.as_str()))
        .filter(|p| annotation(p, pod_keys::VGPU_NODE) == Some(node))
        .filter(|p| {
            annotation(p, AMD.devices_to_allocate)
                // A list that does not decode still names this pod: Allocate then
                // fails with the decoding error instead of "no pod".
                .is_some_and(|t| {
                    !decode_pod_devices(t).is_ok_and(|runs| first_non_empty_run(&runs).is_none())
                })
        })
        .map(|p| (annotation(p, pod_keys::BIND_TIME).unwrap_or(""), pod_ref(p)))
        .collect();
    candidates.sort_by(|a, b| {
        let ta: i64 = a.0.parse().unwrap_or(i64::MAX);
        let tb: i64 = b.0.parse().unwrap_or(i64::MAX);
        ta.cmp(&tb).then_with(|| a.1.cmp(&b.1))
    });
    Ok(candidates
        .into_iter()
        .next()
        .map_or(PodChoice::None, |(_, p)| PodChoice::Tracked(p)))
}

/// Allocate against the API server.
pub struct KubeAllocator {
    pub client: kube::Client,
    pub node: String,
    pub devices: watch::Receiver<Vec<RegisteredDevice>>,
    pub settings: PlanSettings,
    /// Receives dmem jobs (the cgroup writer); `None` disables dmem.
    pub dmem: Option<tokio::sync::mpsc::UnboundedSender<DmemJob>>,
    /// Allocations of one node are serialized so CU choices never race.
    pub serial: Mutex<()>,
}

impl KubeAllocator {
    pub fn new(
        client: kube::Client,
        node: String,
        devices: watch::Receiver<Vec<RegisteredDevice>>,
        settings: PlanSettings,
        dmem: Option<tokio::sync::mpsc::UnboundedSender<DmemJob>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            node,
            devices,
            settings,
            dmem,
            serial: Mutex::new(()),
        })
    }

    async fn allocate_inner(&self, ids: Vec<String>) -> Result<ContainerPlan, String> {
        let _serial = self.serial.lock().await;
        let devices = self.devices.borrow().clone();
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes
            .get(&self.node)
            .await
            .map_err(|e| format!("cannot read node {}: {e}", self.node))?;
        let lock = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(node_keys::MUTEX_LOCK))
            .cloned();
        let all: Api<Pod> = Api::all(self.client.clone());
        let pods = all
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.node)))
            .await
            .map_err(|e| format!("cannot list pods of node {}: {e}", self.node))?
            .items;
        let target = match choose_pod(lock.as_deref(), &self.node, &pods)? {
            PodChoice::None => {
                tracing::info!(ids = ?ids, "no pending HAMi pod: handing the devices over as whole cards");
                return plan_whole_cards(&devices, &ids).map_err(|e| e.to_string());
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
            .plan_and_commit(
                &api,
                &pod,
                &target,
                &pods,
                &devices,
                ids.len(),
                lock.as_deref(),
            )
            .await;
        match result {
            Ok(plan) => Ok(plan),
            Err(e) => {
                let message = format!("pod {target}: {e}");
                self.fail(&api, &target).await;
                Err(message)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn plan_and_commit(
        &self,
        api: &Api<Pod>,
        pod: &Pod,
        target: &PodRef,
        pods: &[Pod],
        devices: &[RegisteredDevice],
        requested: usize,
        lock: Option<&str>,
    ) -> Result<ContainerPlan, String> {
        if let Some(value) = lock
            && let Ok(l) = NodeLock::parse(value)
            && l.owner.as_ref().is_some_and(|o| o != target)
        {
            return Err(format!("the node lock is held by another pod ({value})"));
        }
        let refs: Vec<PodRef> = pods.iter().map(pod_ref).collect();
        let usage = cus_in_use(
            pods.iter().zip(&refs).map(|(p, r)| PodCus {
                pod: r,
                phase: p.status.as_ref().and_then(|s| s.phase.as_deref()),
                cu_allocated: annotation(p, pod_keys::AMD_CU_ALLOCATED),
            }),
            Some(target),
        )
        .map_err(|e| e.to_string())?;
        let state = PodAnnotations {
            to_allocate: annotation(pod, AMD.devices_to_allocate).map(str::to_owned),
            cu_allocated: annotation(pod, pod_keys::AMD_CU_ALLOCATED).map(str::to_owned),
            pod_uid: pod.metadata.uid.clone(),
            containers: pod
                .spec
                .as_ref()
                .map(|s| {
                    container_slots(s)
                        .iter()
                        .map(|c| c.container.name.clone())
                        .collect()
                })
                .unwrap_or_default(),
        };
        let plan = plan_allocate(&state, devices, &usage, requested, &self.settings)
            .map_err(|e| e.to_string())?;
        if let Some(dir) = &plan.cache_dir {
            create_cache_dir(dir).map_err(|e| {
                format!("cannot create the container's accounting directory {dir}: {e}")
            })?;
        }
        // One patch: CU bits, the consumed run and (last container) the bind phase.
        let mut annotations = serde_json::Map::new();
        annotations.insert(AMD.devices_to_allocate.into(), json!(plan.to_allocate));
        annotations.insert(pod_keys::AMD_CU_ALLOCATED.into(), json!(plan.cu_allocated));
        if plan.last {
            annotations.insert(
                pod_keys::BIND_PHASE.into(),
                json!(BindPhase::Success.as_str()),
            );
        }
        api.patch(
            &target.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
        )
        .await
        .map_err(|e| format!("cannot record the allocation on the pod: {e}"))?;
        if plan.last {
            release_lock(&self.client, &self.node, target).await;
        }
        if let (Some(tx), Some(uid)) = (&self.dmem, pod.metadata.uid.as_ref())
            && !plan.dmem.is_empty()
        {
            let _ = tx.send(DmemJob {
                pod_uid: uid.clone(),
                limits: plan.dmem.clone(),
                existing: Vec::new(),
            });
        }
        tracing::info!(pod = %target, run = plan.run_index, last = plan.last, mask = ?plan.container.envs.get("HSA_CU_MASK"), "allocated");
        Ok(plan.container)
    }

    async fn fail(&self, api: &Api<Pod>, target: &PodRef) {
        let patch = json!({"metadata": {"annotations": {pod_keys::BIND_PHASE: BindPhase::Failed.as_str()}}});
        if let Err(e) = api
            .patch(&target.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            tracing::warn!(pod = %target, "cannot set bind-phase=failed: {e}");
        }
        release_lock(&self.client, &self.node, target).await;
    }
}

/// The container's accounting directory, writable by any container user (mode 0777, as
/// the reference), since the application inside runs as whoever the image says.
fn create_cache_dir(dir: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
}

/// Removes the node lock if `owner` holds it (a few tries on conflicts).
pub async fn release_lock(client: &kube::Client, node: &str, owner: &PodRef) {
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..5 {
        let Ok(n) = nodes.get(node).await else {
            continue;
        };
        let Some(value) = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(node_keys::MUTEX_LOCK))
        else {
            return;
        };
        if !NodeLock::parse(value).is_ok_and(|l| l.is_owned_by(owner)) {
            return;
        }
        let patch = json!({"metadata": {
            "resourceVersion": n.metadata.resource_version,
            "annotations": {node_keys::MUTEX_LOCK: null},
        }});
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => return,
            Err(e) => tracing::warn!(%node, "releasing the node lock failed, retrying: {e}"),
        }
    }
}

impl Allocator for KubeAllocator {
    fn allocate(&self, kubelet_ids: Vec<String>) -> BoxFuture<'_, Result<ContainerPlan, String>> {
        Box::pin(self.allocate_inner(kubelet_ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ann: &[(&str, &str)]) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "annotations": ann.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>()},
        }))
        .unwrap()
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
            choose_pod(None, "n1", &pods),
            Ok(PodChoice::Tracked(PodRef::new("ns", "early")))
        );
        assert_eq!(
            choose_pod(Some("2026-08-04T10:00:00Z,ns,late"), "n1", &pods),
            Ok(PodChoice::Tracked(PodRef::new("ns", "late")))
        );
        // Legacy lock (no owner): fall back to the search.
        assert_eq!(
            choose_pod(Some("2026-08-04T10:00:00Z"), "n1", &pods),
            Ok(PodChoice::Tracked(PodRef::new("ns", "early")))
        );
        assert_eq!(choose_pod(None, "n2", &pods), Ok(PodChoice::None));
        assert!(
            choose_pod(Some("garbage,x"), "n1", &pods)
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
        assert_eq!(choose_pod(None, "n1", &empty), Ok(PodChoice::None));
    }
}
