//! The pods of this node: a pure index built from Pod objects (UID → namespace/name and
//! every container, init and sidecar containers included, with their devices and container
//! ids), and the node-scoped informer that keeps the objects (kube-rs reflector).

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use hami_protocol::cu_allocated::CuAllocation;
use hami_protocol::device_list::{ContainerDevices, decode_pod_devices};
use hami_protocol::names::{AMD, NVIDIA, Vendor, pod as pod_names};
use hami_protocol::placement::placed_by_scheduler;
use hami_protocol::requests::container_slots;
use hami_protocol::whole_cards;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};

use crate::cgroup::container_id_from_status;
use crate::dra_claims::{ClaimRegion, DraPod};
use crate::dra_fetch::DraSource;

/// One container of a pod, in device-list order (init and sidecar containers first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// The container's name.
    pub name: String,
    /// `init`, `sidecar` or `app`.
    pub kind: &'static str,
    /// Runtime id without the `<runtime>://` prefix, once the container started.
    pub container_id: Option<String>,
    /// AMD devices granted (`hami.io/amd-devices-allocated`, else `-to-allocate`).
    pub amd: ContainerDevices,
    /// NVIDIA devices granted (`hami.io/vgpu-devices-allocated`, else `-to-allocate`).
    pub nvidia: ContainerDevices,
}

/// What the monitor knows of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// The pod's UID.
    pub uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// Its containers, in device-list order.
    pub containers: Vec<ContainerInfo>,
    /// `hami.io/amd-cu-allocated`: device id → CU list text (pod-wide).
    pub cu_allocated: Vec<(String, String)>,
    /// Annotation problems, one line each (reported as errors, the pod is kept).
    pub problems: Vec<String>,
}

impl PodInfo {
    /// The container named `name`, if the pod has one.
    pub fn container(&self, name: &str) -> Option<&ContainerInfo> {
        self.containers.iter().find(|c| c.name == name)
    }
}

fn device_runs(pod: &Pod, keys: [&str; 2], problems: &mut Vec<String>) -> Vec<ContainerDevices> {
    let annotations = pod.metadata.annotations.as_ref();
    for key in keys {
        if let Some(text) = annotations.and_then(|a| a.get(key)) {
            match decode_pod_devices(text) {
                Ok(runs) => return runs,
                Err(e) => problems.push(format!("annotation {key}: {e}")),
            }
        }
    }
    Vec::new()
}

/// Builds the monitor's view of a pod. `None` without a UID. Allocation annotations are
/// read only from pods the scheduler named `scheduler_name` placed (D-4): on any other pod
/// they are forged or stale, and the pod is reported with no grants.
pub fn pod_info(pod: &Pod, scheduler_name: &str) -> Option<PodInfo> {
    let uid = pod.metadata.uid.clone()?;
    let mut problems = Vec::new();
    let placed = placed_by_scheduler(pod, scheduler_name);
    let (amd_runs, nvidia_runs) = if placed {
        (
            device_runs(
                pod,
                [AMD.devices_allocated, AMD.devices_to_allocate],
                &mut problems,
            ),
            device_runs(
                pod,
                [NVIDIA.devices_allocated, NVIDIA.devices_to_allocate],
                &mut problems,
            ),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let status = pod.status.as_ref();
    let ids: HashMap<&str, &str> = status
        .into_iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .filter_map(|cs| {
            cs.container_id
                .as_deref()
                .map(|id| (cs.name.as_str(), container_id_from_status(id)))
        })
        .collect();
    let containers = pod
        .spec
        .as_ref()
        .map(|spec| {
            container_slots(spec)
                .iter()
                .enumerate()
                .map(|(run, slot)| ContainerInfo {
                    name: slot.container.name.clone(),
                    kind: slot.kind.as_str(),
                    container_id: ids.get(slot.container.name.as_str()).map(|s| s.to_string()),
                    amd: amd_runs.get(run).cloned().unwrap_or_default(),
                    nvidia: nvidia_runs.get(run).cloned().unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    let mut cu_allocated = Vec::new();
    if let Some(text) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(pod_names::AMD_CU_ALLOCATED))
        .filter(|_| placed)
    {
        match CuAllocation::parse(text) {
            Ok(alloc) => {
                cu_allocated = alloc
                    .0
                    .iter()
                    .map(|(device, set)| (device.clone(), set.to_string()))
                    .collect();
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    Some(PodInfo {
        uid,
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        containers,
        cu_allocated,
        problems,
    })
}

/// A card a pod the scheduler did not place holds whole (issue 26 item 1): the device
/// plugin's record in `hami.io/<vendor>-whole-cards`, as `whole_cards::held_cards` counts
/// it. Pod-wide: the record does not say which container uses the card, and kubelet gives
/// it no region, so the monitor reports the holding, not usage or a per-container grant.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WholeCard {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The card's registered id.
    pub device_uuid: String,
}

/// The cards `pod` holds whole, every vendor's (see [`WholeCard`]); a record that does not
/// decode is a problem line, and holds nothing.
pub fn whole_cards_of(pod: &Pod, scheduler_name: &str) -> (Vec<WholeCard>, Vec<String>) {
    let (mut held, mut problems) = (Vec::new(), Vec::new());
    for vendor in Vendor::ALL {
        match whole_cards::held_cards(pod, vendor, scheduler_name) {
            Ok(Some(h)) => held.extend(h.cards.into_iter().map(|device_uuid| WholeCard {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                pod: pod.metadata.name.clone().unwrap_or_default(),
                device_uuid,
            })),
            Ok(None) => {}
            Err(e) => problems.push(format!("annotation {}: {e}", whole_cards::key(vendor))),
        }
    }
    (held, problems)
}

/// The pods of the node by UID, and containers by runtime id.
#[derive(Debug, Default, Clone)]
pub struct PodIndex {
    /// Pods by UID.
    pub by_uid: HashMap<String, Arc<PodInfo>>,
    /// container id → (pod UID, container name).
    pub by_container_id: HashMap<String, (String, String)>,
    /// DRA claim UID → whose its region (`<HOOK_PATH>/dra/claims/<uid>/`) is.
    pub claims: HashMap<String, ClaimRegion>,
    /// Problems reading DRA claims, one line each.
    pub dra_problems: Vec<String>,
    /// DRA claims whose `consumedCapacity` cannot be read (reported as holding nothing),
    /// one line each.
    pub dra_unreadable: Vec<String>,
    /// Cards held whole by pods the scheduler did not place, sorted.
    pub whole_cards: Vec<WholeCard>,
}

impl PodIndex {
    /// The index of `pods`; `scheduler_name` as in [`pod_info`].
    pub fn from_pods<'a>(
        pods: impl IntoIterator<Item = &'a Pod>,
        scheduler_name: &str,
    ) -> PodIndex {
        PodIndex::from_pods_with_dra(pods, scheduler_name, &HashMap::new())
    }

    /// The index of `pods` with what their DRA claims grant (`dra`: pod UID → view): a
    /// container without annotation devices gets its claims' AMD devices, the pod its
    /// claims' CU ranges, the index the claims' regions.
    pub fn from_pods_with_dra<'a>(
        pods: impl IntoIterator<Item = &'a Pod>,
        scheduler_name: &str,
        dra: &HashMap<String, DraPod>,
    ) -> PodIndex {
        let mut index = PodIndex::default();
        for pod in pods {
            let Some(mut info) = pod_info(pod, scheduler_name) else {
                continue;
            };
            let (held, problems) = whole_cards_of(pod, scheduler_name);
            index.whole_cards.extend(held);
            info.problems.extend(problems);
            if let Some(d) = dra.get(&info.uid) {
                for c in &mut info.containers {
                    if let Some(devices) = d.containers.get(&c.name)
                        && c.amd.is_empty()
                    {
                        c.amd = devices.clone();
                    }
                }
                info.cu_allocated.extend(d.cu_allocated.iter().cloned());
                index.dra_problems.extend(
                    d.problems
                        .iter()
                        .map(|p| format!("{}/{}: {p}", info.namespace, info.name)),
                );
                index.dra_unreadable.extend(
                    d.unreadable
                        .iter()
                        .map(|p| format!("{}/{}: {p}", info.namespace, info.name)),
                );
                for (claim, region) in &d.regions {
                    index.claims.insert(claim.clone(), region.clone());
                }
            }
            for c in &info.containers {
                if let Some(id) = &c.container_id {
                    index
                        .by_container_id
                        .insert(id.clone(), (info.uid.clone(), c.name.clone()));
                }
            }
            index.by_uid.insert(info.uid.clone(), Arc::new(info));
        }
        index.whole_cards.sort();
        index
    }

    /// The pod with this UID, if it is on the node.
    pub fn get(&self, uid: &str) -> Option<&Arc<PodInfo>> {
        self.by_uid.get(uid)
    }
}

/// A node-scoped pod informer (`spec.nodeName=<node>`).
pub struct PodInformer {
    store: Store<Pod>,
    scheduler_name: String,
    dra: DraSource,
    task: tokio::task::JoinHandle<()>,
}

impl PodInformer {
    /// Starts watching the pods of `node_name`, placed by the scheduler `scheduler_name`.
    /// DRA claims of [`crate::dra_claims::DEFAULT_DRIVER`] are read for pods that have
    /// them ([`PodInformer::index_with_dra`]).
    pub fn start(client: Client, node_name: &str, scheduler_name: &str) -> PodInformer {
        let dra = DraSource::new(client.clone(), crate::dra_claims::DEFAULT_DRIVER, node_name);
        let api: Api<Pod> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
        let (store, writer) = reflector::store();
        let stream =
            reflector::reflector(writer, watcher(api, config).default_backoff()).applied_objects();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                if let Err(e) = event {
                    tracing::warn!("pod watch: {e}; retrying with backoff");
                }
            }
        });
        PodInformer {
            store,
            scheduler_name: scheduler_name.to_owned(),
            dra,
            task,
        }
    }

    /// Waits for the first complete list.
    pub async fn wait_ready(&self) -> anyhow::Result<()> {
        self.store
            .wait_until_ready()
            .await
            .map_err(|e| anyhow::anyhow!("pod informer never became ready: {e}"))
    }

    /// A consistent copy of the pods now known.
    pub fn index(&self) -> PodIndex {
        let pods = self.store.state();
        PodIndex::from_pods(pods.iter().map(|p| p.as_ref()), &self.scheduler_name)
    }

    /// [`PodInformer::index`] with the pods' DRA claims, read through the API server where
    /// they changed.
    pub async fn index_with_dra(&mut self) -> PodIndex {
        let pods = self.store.state();
        let view = self.dra.view(&pods).await;
        let mut index = PodIndex::from_pods_with_dra(
            pods.iter().map(|p| p.as_ref()),
            &self.scheduler_name,
            &view.pods,
        );
        index.dra_problems.extend(view.problems);
        index
    }
}

impl Drop for PodInformer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn allocations_only_from_pods_the_scheduler_placed() {
        let annotations = json!({
            "hami.io/amd-devices-allocated": "G,AMD Instinct MI210,1024,10:;",
            "hami.io/amd-cu-allocated": r#"{"G":"0-9"}"#});
        let make = |spec: serde_json::Value| -> Pod {
            serde_json::from_value(
                json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u",
                "annotations": annotations}, "spec": spec}),
            )
            .unwrap()
        };
        let gpu = json!({"limits": {"amd.com/gpu": "1"}});
        let placed = make(
            json!({"schedulerName": "hami-scheduler", "containers": [{"name": "c", "resources": gpu}]}),
        );
        let info = pod_info(&placed, "hami-scheduler").unwrap();
        assert_eq!(info.containers[0].amd.len(), 1);
        assert_eq!(
            info.cu_allocated,
            vec![("G".to_string(), "0-9".to_string())]
        );
        // The forgery of issue 17: a pod without a GPU request carrying allocations.
        let forged =
            make(json!({"schedulerName": "hami-scheduler", "containers": [{"name": "c"}]}));
        let info = pod_info(&forged, "hami-scheduler").unwrap();
        assert!(info.containers[0].amd.is_empty() && info.cu_allocated.is_empty());
        // Still indexed: its cache directories belong to a known pod.
        assert_eq!(info.containers[0].name, "c");
        assert!(pod_info(&placed, "other").unwrap().cu_allocated.is_empty());
    }
}
