//! The Kubernetes side of Allocate (SPEC §4): find the pod, read the node's CU usage, run
//! the pure planner, write the result in one pod patch (so nothing is half-written), and
//! release the node lock. Failures set `bind-phase=failed` and release the lock.

use std::sync::Arc;

use futures::future::BoxFuture;
use hami_plugin_core::pod_choice::{annotation, pod_ref};
use hami_plugin_core::pod_commit::{
    check_lock_owner, commit_allocation, create_cache_dir, mark_failed,
};
use hami_protocol::names::{AMD, pod as pod_keys};
use hami_protocol::node_lock::PodRef;
use hami_protocol::requests::container_slots;
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
use crate::cu_usage::{PodCus, cus_in_use};
use crate::dmem::DmemJob;
use crate::grpc_server::Allocator;
use crate::registration::RegisteredDevice;

/// Picks the pod among the pods of the node (pure): the lock owner when the lock names
/// one, else the oldest (by `hami.io/bind-time`, then name) pod with
/// `bind-phase=allocating` whose `vgpu-node` is this node and that still has AMD devices
/// to allocate.
pub fn choose_pod(lock: Option<&str>, node: &str, pods: &[Pod]) -> Result<PodChoice, String> {
    hami_plugin_core::pod_choice::choose_pod(lock, node, pods, AMD.devices_to_allocate)
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
        let (lock, pods) =
            hami_plugin_core::pod_commit::node_lock_and_pods(&self.client, &self.node).await?;
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
        check_lock_owner(lock, target)?;
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
        commit_allocation(&self.client, &self.node, target, annotations, plan.last).await?;
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

    async fn fail(&self, target: &PodRef) {
        mark_failed(&self.client, &self.node, target).await;
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
