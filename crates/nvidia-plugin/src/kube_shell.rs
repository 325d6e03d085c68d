//! The NVIDIA part of Allocate: what the vendor-generic shell (`hami_plugin_core::
//! allocate_shell`: pod lookup, whole-card hand-over with its busy check, region file,
//! commit, node-lock release) asks of each vendor — the GPUs, the planner, the region file
//! (`hami-cuda-region`, with its anchor beside the hook config) and the hook config's mode.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::future::BoxFuture;
use hami_plugin_core::allocate_shell::{AllocateShell, TrackedPlan, VendorAllocate};
use hami_plugin_core::container_plan::ContainerPlan;
use hami_plugin_core::pod_choice::annotation;
use hami_protocol::hook_config::HookConfig;
use hami_protocol::identity::KubeletDeviceId;
use hami_protocol::names::{NVIDIA, Vendor};
use hami_protocol::node_lock::PodRef;
use hami_protocol::requests::pod_container_slots;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tokio::sync::watch;

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

/// The NVIDIA part of Allocate against the API server.
pub struct KubeAllocator {
    /// The GPUs offered now (from the publisher).
    pub devices: watch::Receiver<Vec<RegisteredGpu>>,
    /// How containers are planned.
    pub settings: PlanSettings,
}

impl KubeAllocator {
    /// Allocate for `node`, planning from the current `devices` (inside a tokio runtime:
    /// the shell watches the node's pods).
    pub fn new(
        client: kube::Client,
        node: String,
        devices: watch::Receiver<Vec<RegisteredGpu>>,
        settings: PlanSettings,
    ) -> Arc<AllocateShell<Self>> {
        AllocateShell::new(client, node, Self { devices, settings })
    }
}

impl VendorAllocate for KubeAllocator {
    type Device = RegisteredGpu;

    fn vendor(&self) -> Vendor {
        Vendor::Nvidia
    }

    fn devices(&self) -> Vec<RegisteredGpu> {
        self.devices.borrow().clone()
    }

    /// Kubelet ids are `<UUID>#<share>`: the card is the key.
    fn card_of(&self, devices: &[RegisteredGpu], kubelet_id: &str) -> Option<String> {
        let key = KubeletDeviceId::parse(kubelet_id).ok()?.device_key;
        devices.iter().any(|d| d.info.id == key).then_some(key)
    }

    fn keys_of(&self, devices: &[RegisteredGpu], cards: &BTreeSet<String>) -> Vec<String> {
        devices
            .iter()
            .filter(|d| cards.contains(&d.info.id))
            .map(|d| d.info.id.clone())
            .collect()
    }

    fn plan_whole_cards(
        &self,
        devices: &[RegisteredGpu],
        kubelet_ids: &[String],
        _busy: &BTreeSet<String>,
    ) -> Result<ContainerPlan, String> {
        plan_whole_cards(devices, kubelet_ids).map_err(|e| e.to_string())
    }

    fn plan_tracked<'a>(
        &'a self,
        pod: &'a Pod,
        _target: &'a PodRef,
        _pods: &'a [Pod],
        devices: &'a [RegisteredGpu],
        requested: usize,
    ) -> BoxFuture<'a, Result<TrackedPlan, String>> {
        Box::pin(async move {
            let plan = plan_allocate(&pod_state(pod), devices, requested, &self.settings)
                .map_err(|e| e.to_string())?;
            tracing::info!(run = plan.run_index,
                visible = ?plan.container.envs.get(crate::allocate_plan::NVIDIA_VISIBLE_DEVICES), "planned");
            let mut annotations = serde_json::Map::new();
            annotations.insert(NVIDIA.devices_to_allocate.into(), json!(plan.to_allocate));
            Ok(TrackedPlan {
                container: plan.container,
                run_index: plan.run_index,
                cache_dir: plan.cache_dir,
                hook_config: plan.hook_config,
                annotations,
                last: plan.last,
                after_commit: None,
            })
        })
    }

    /// The region file, with a second link beside the config (`<config>.region`) that keeps
    /// its inode number from being reused; configs and anchors of gone containers are
    /// pruned first.
    fn prepare_region(
        &self,
        dir: &str,
        config_path: &str,
        _config: &HookConfig,
    ) -> Result<u64, String> {
        crate::plugin::prune_configs(
            std::path::Path::new(&self.settings.config_host_root),
            std::path::Path::new(&self.settings.cache_host_root),
        );
        let region = std::path::Path::new(dir).join(crate::allocate_plan::CACHE_FILE);
        let anchor = std::path::Path::new(config_path).with_extension("region");
        anchor
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| hami_cuda_region::prepare_file(&region, &anchor))
            .map_err(|e| {
                format!(
                    "cannot create the container's region {}: {e}",
                    region.display()
                )
            })
    }

    fn write_hook_config(&self, path: &str, text: &str) -> std::io::Result<()> {
        crate::plugin::write_hook_config(std::path::Path::new(path), text)
    }
}
