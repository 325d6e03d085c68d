//! The Kubernetes side of Allocate: find the pod, run the pure planner, write the result in
//! one pod patch and release the node lock (the shared `hami-plugin-core` protocol, as the
//! AMD plugin). Failures set `bind-phase=failed` and release the lock.

use std::sync::Arc;

use futures::future::BoxFuture;
use hami_plugin_core::container_plan::ContainerPlan;
use hami_plugin_core::grpc_server::Allocator;
use hami_plugin_core::pod_choice::{PodChoice, annotation, choose_pod, pod_ref};
use hami_plugin_core::pod_commit::{
    check_lock_owner, commit_allocation, create_cache_dir, mark_failed, record_whole_cards,
};
use hami_plugin_core::whole_card_holdings::{
    check_free, check_pod_not_on_held_cards, fallback_target, node_holdings, slice_cards,
};
use hami_protocol::identity::KubeletDeviceId;
use hami_protocol::names::{DEFAULT_SCHEDULER_NAME as SCHEDULER, NVIDIA, Vendor};
use hami_protocol::node_lock::PodRef;
use hami_protocol::requests::pod_container_slots;
use hami_protocol::whole_cards;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;
use tokio::sync::{Mutex, watch};

use crate::allocate_plan::{
    CUDA_DISABLE_CONTROL, ContainerInfo, PlanSettings, PodState, env_is_true, plan_allocate,
    plan_whole_cards,
};
use crate::registration::RegisteredGpu;

/// What Allocate reads of a pod (device list, uid, containers in device-list order).
pub fn pod_state(pod: &Pod) -> PodState {
    PodState {
        to_allocate: annotation(pod, NVIDIA.devices_to_allocate).map(str::to_owned),
        pod_uid: pod.metadata.uid.clone(),
        containers: pod_container_slots(pod)
            .iter()
            .map(|c| ContainerInfo {
                name: c.container.name.clone(),
                disable_control: c.container.env.iter().flatten().any(|e| {
                    e.name == CUDA_DISABLE_CONTROL && e.value.as_deref().is_some_and(env_is_true)
                }),
                task_priority: crate::allocate_plan::task_priority(c.container),
            })
            .collect(),
    }
}

/// Allocate against the API server.
pub struct KubeAllocator {
    /// The API client.
    pub client: kube::Client,
    /// The node this plugin serves.
    pub node: String,
    /// The GPUs offered now (from the publisher).
    pub devices: watch::Receiver<Vec<RegisteredGpu>>,
    /// How containers are planned.
    pub settings: PlanSettings,
    /// Allocations of one node are serialized (each sees the previous one's patch).
    pub serial: Mutex<()>,
}

impl KubeAllocator {
    /// An allocator for `node`, planning from the current `devices`.
    pub fn new(
        client: kube::Client,
        node: String,
        devices: watch::Receiver<Vec<RegisteredGpu>>,
        settings: PlanSettings,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            node,
            devices,
            settings,
            serial: Mutex::new(()),
        })
    }

    async fn allocate_inner(&self, ids: Vec<String>) -> Result<ContainerPlan, String> {
        let _serial = self.serial.lock().await;
        let devices = self.devices.borrow().clone();
        let (lock, pods) =
            hami_plugin_core::pod_commit::node_lock_and_pods(&self.client, &self.node).await?;
        let target = match choose_pod(
            lock.as_deref(),
            &self.node,
            &pods,
            NVIDIA.devices_to_allocate,
        )? {
            PodChoice::None => {
                tracing::info!(ids = ?ids, "no pending HAMi pod: handing the GPUs over as whole cards");
                return self.hand_over_whole_cards(&pods, &devices, &ids).await;
            }
            PodChoice::Tracked(p) => p,
        };
        let pod = match pods.iter().find(|p| pod_ref(p) == target) {
            Some(p) => p.clone(),
            None => {
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &target.namespace);
                match api.get(&target.name).await {
                    Ok(p) => p,
                    Err(e) => {
                        mark_failed(&self.client, &self.node, &target).await;
                        return Err(format!(
                            "pod {target} named by the node lock cannot be read: {e}"
                        ));
                    }
                }
            }
        };
        match self
            .plan_and_commit(&pod, &target, &pods, &devices, ids.len(), lock.as_deref())
            .await
        {
            Ok(plan) => Ok(plan),
            Err(e) => {
                mark_failed(&self.client, &self.node, &target).await;
                Err(format!("pod {target}: {e}"))
            }
        }
    }

    /// A pod HAMi did not place: the cards of kubelet's ids, if nobody else holds them
    /// and no HAMi slice uses them, recorded on the pod (`hami.io/nvidia-whole-cards`)
    /// before the answer (issue 26 item 1).
    async fn hand_over_whole_cards(
        &self,
        pods: &[Pod],
        devices: &[RegisteredGpu],
        ids: &[String],
    ) -> Result<ContainerPlan, String> {
        let plan = plan_whole_cards(devices, ids).map_err(|e| e.to_string())?;
        let target = fallback_target(pods, &self.node, Vendor::Nvidia, SCHEDULER, ids.len())?;
        let holdings = node_holdings(pods, &self.node, Vendor::Nvidia, SCHEDULER);
        for (pod, why) in &holdings.problems {
            tracing::warn!(pod = %pod, "whole-card holding not counted: {why}");
        }
        // Kubelet ids are `<UUID>#<share>`: the card is the key (plan_whole_cards checked it).
        let chosen: Vec<(String, String)> = ids
            .iter()
            .map(|id| {
                let card = KubeletDeviceId::parse(id).map_or_else(|_| id.clone(), |k| k.device_key);
                (id.clone(), card)
            })
            .collect();
        check_free(
            &chosen,
            &holdings.held_by_others(Some(&target)),
            &slice_cards(pods, &self.node, Vendor::Nvidia, SCHEDULER),
            Vendor::Nvidia,
        )?;
        let cards: Vec<String> = chosen.into_iter().map(|(_, c)| c).collect();
        let existing = pods
            .iter()
            .find(|p| pod_ref(p) == target)
            .and_then(|p| annotation(p, whole_cards::key(Vendor::Nvidia)));
        record_whole_cards(&self.client, &target, Vendor::Nvidia, existing, &cards).await?;
        tracing::info!(pod = %target, cards = ?cards, "whole cards handed over and recorded");
        Ok(plan)
    }

    async fn plan_and_commit(
        &self,
        pod: &Pod,
        target: &PodRef,
        pods: &[Pod],
        devices: &[RegisteredGpu],
        requested: usize,
        lock: Option<&str>,
    ) -> Result<ContainerPlan, String> {
        check_lock_owner(lock, target)?;
        // A card a pod HAMi did not place took after the scheduler decided: never shared.
        check_pod_not_on_held_cards(pod, pods, &self.node, Vendor::Nvidia, SCHEDULER)?;
        let plan = plan_allocate(&pod_state(pod), devices, requested, &self.settings)
            .map_err(|e| e.to_string())?;
        if let Some(dir) = &plan.cache_dir {
            create_cache_dir(dir).map_err(|e| {
                format!("cannot create the container's accounting directory {dir}: {e}")
            })?;
        }
        if let (Some(dir), Some((file, config))) = (&plan.cache_dir, &plan.hook_config) {
            // The region file is made here and named by inode in the config, so a tenant
            // who deletes or replaces it (the directory is the container's) makes the hook
            // fail closed instead of starting a second, empty accounting.
            crate::plugin::prune_configs(
                std::path::Path::new(&self.settings.config_host_root),
                std::path::Path::new(&self.settings.cache_host_root),
            );
            let region = std::path::Path::new(dir).join(crate::allocate_plan::CACHE_FILE);
            // A second link beside the config keeps the inode number from being reused.
            let anchor = std::path::Path::new(file).with_extension("region");
            let inode = anchor
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| hami_cuda_region::prepare_file(&region, &anchor))
                .map_err(|e| {
                    format!(
                        "cannot create the container's region {}: {e}",
                        region.display()
                    )
                })?;
            let mut config = config.clone();
            config.shared_cache_inode = Some(inode);
            let text = config.encode().map_err(|e| e.to_string())?;
            crate::plugin::write_hook_config(std::path::Path::new(file), &text)
                .map_err(|e| format!("cannot write the container's hook config {file}: {e}"))?;
        }
        let mut annotations = serde_json::Map::new();
        annotations.insert(NVIDIA.devices_to_allocate.into(), json!(plan.to_allocate));
        commit_allocation(&self.client, &self.node, target, annotations, plan.last).await?;
        tracing::info!(pod = %target, run = plan.run_index, last = plan.last,
            visible = ?plan.container.envs.get(crate::allocate_plan::NVIDIA_VISIBLE_DEVICES), "allocated");
        Ok(plan.container)
    }
}

impl Allocator for KubeAllocator {
    fn allocate(&self, kubelet_ids: Vec<String>) -> BoxFuture<'_, Result<ContainerPlan, String>> {
        Box::pin(self.allocate_inner(kubelet_ids))
    }

    /// GPUs held whole by pods HAMi did not place, or used by HAMi slices: kubelet's
    /// preferred allocation takes them last, so a plain pod gets a card nobody holds.
    fn avoid_keys(&self) -> BoxFuture<'_, Vec<String>> {
        Box::pin(async move {
            let Ok((_, pods)) =
                hami_plugin_core::pod_commit::node_lock_and_pods(&self.client, &self.node).await
            else {
                return Vec::new();
            };
            let mut busy = slice_cards(&pods, &self.node, Vendor::Nvidia, SCHEDULER);
            busy.extend(
                node_holdings(&pods, &self.node, Vendor::Nvidia, SCHEDULER)
                    .by_card
                    .into_keys(),
            );
            busy.into_iter().collect()
        })
    }
}
