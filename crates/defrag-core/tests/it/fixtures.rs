//! Real card shapes (as scheduler-core's fit tests register them) and a fleet builder that
//! places pods with the scheduler's own fit, so every charge is one the scheduler makes.

use std::sync::Arc;

use hami_defrag_core::{Cluster, Owner, Pdb, PodFacts, PodRequest, Safety};
use hami_protocol::names::Vendor;
use hami_protocol::node_register::{CustomInfo, DeviceInfo, DeviceMode};
use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::{DeviceSelector, GpuPolicy, GpuPolicyKind, NodePolicy};
use hami_scheduler_core::fit::{FitRequest, Selectors, fit_node};
use hami_scheduler_core::snapshot::{Gpu, NodeDevices, NodeSnapshot};
use hami_scheduler_core::usage::collapse;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// A card model: vendor, registered type, MiB, cores, shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Model {
    pub(crate) vendor: Vendor,
    pub(crate) device_type: &'static str,
    pub(crate) devmem: u64,
    pub(crate) devcore: u32,
    pub(crate) count: u32,
}

pub(crate) const MI210: Model = Model {
    vendor: Vendor::Amd,
    device_type: "AMD Instinct MI210",
    devmem: 65_536,
    devcore: 104,
    count: 10,
};
pub(crate) const MI300X: Model = Model {
    vendor: Vendor::Amd,
    device_type: "AMD Instinct MI300X",
    devmem: 196_288,
    devcore: 304,
    count: 10,
};
/// One CPX partition of an MI300X: a whole device of count 1 (38 CUs, 1/8 of the memory).
pub(crate) const MI300X_CPX: Model = Model {
    vendor: Vendor::Amd,
    device_type: "AMD Instinct MI300X",
    devmem: 24_536,
    devcore: 38,
    count: 1,
};
pub(crate) const A100: Model = Model {
    vendor: Vendor::Nvidia,
    device_type: "NVIDIA-A100",
    devmem: 40_960,
    devcore: 100,
    count: 10,
};

pub(crate) fn gpu(model: Model, id: &str) -> Gpu {
    Gpu {
        vendor: model.vendor,
        info: DeviceInfo {
            id: id.into(),
            index: 0,
            count: model.count,
            devmem: model.devmem,
            devcore: model.devcore,
            device_type: model.device_type.into(),
            numa: 0,
            mode: DeviceMode::HamiCore,
            health: true,
            device_vendor: model.vendor.word().into(),
            custom_info: CustomInfo::default(),
        },
    }
}

/// A pod movable under the default policy: a 3-replica owner, a PDB allowing 1, an hour old.
pub(crate) fn movable() -> Safety {
    Safety {
        pdb: Some(Pdb {
            name: "ns/pdb".into(),
            disruptions_allowed: 1,
        }),
        owner: Some(Owner {
            kind: "ReplicaSet".into(),
            name: "web".into(),
            replicas: 3,
        }),
        age_seconds: 3600,
        ..Safety::default()
    }
}

/// The request of a one-container pod with these limits.
pub(crate) fn request(limits: serde_json::Value) -> PodRequest {
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}))
    .unwrap();
    PodRequest::from_pod(&pod, &RequestDefaults::default(), GpuPolicy::default()).unwrap()
}

/// One slice of a card: `memory` MiB and `cores` % on `vendor`.
pub(crate) fn slice(vendor: Vendor, memory: u64, cores: u32) -> PodRequest {
    match vendor {
        Vendor::Amd => request(
            json!({"amd.com/gpu": "1", "amd.com/gpumem": memory.to_string(),
            "amd.com/gpucores": cores.to_string()}),
        ),
        Vendor::Nvidia => request(
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": memory.to_string(),
            "nvidia.com/gpucores": cores.to_string()}),
        ),
    }
}

/// A fleet under construction.
#[derive(Debug, Clone)]
pub(crate) struct Fleet {
    pub(crate) cluster: Cluster,
}

impl Fleet {
    pub(crate) fn new() -> Self {
        Self {
            cluster: Cluster {
                nodes: Vec::new(),
                pods: Vec::new(),
            },
        }
    }

    /// Adds a node with cards `<name>-0`, `<name>-1`, ...
    pub(crate) fn node(&mut self, name: &str, models: &[Model]) -> &mut Self {
        let gpus = models
            .iter()
            .enumerate()
            .map(|(i, m)| gpu(*m, &format!("{name}-{i}")))
            .collect();
        self.cluster
            .nodes
            .push(NodeSnapshot::idle(Arc::new(NodeDevices {
                name: name.into(),
                gpus,
                ..NodeDevices::default()
            })));
        self
    }

    /// Places a pod on card `card` of `node` by the scheduler's fit (only that card
    /// allowed), charging what the fit gives; false (nothing placed) if it does not fit.
    pub(crate) fn place(
        &mut self,
        name: &str,
        node: &str,
        card: &str,
        req: PodRequest,
        safety: Safety,
    ) -> bool {
        let Some(n) = self
            .cluster
            .nodes
            .iter()
            .position(|s| s.devices.name == node)
        else {
            return false;
        };
        let only = DeviceSelector {
            use_uuids: vec![card.into()],
            ..req.selectors.amd.clone()
        };
        let selectors = Selectors {
            amd: only.clone(),
            nvidia: DeviceSelector {
                use_uuids: vec![card.into()],
                ..req.selectors.nvidia.clone()
            },
        };
        let fit = FitRequest {
            containers: &req.containers,
            selectors: &selectors,
            gpu_policy: GpuPolicy {
                kind: GpuPolicyKind::Binpack,
                numa: false,
            },
            node_policy: NodePolicy::Binpack,
        };
        let Ok(placement) = fit_node(&self.cluster.nodes[n], &fit) else {
            return false;
        };
        let kinds: Vec<_> = req.containers.iter().map(|c| c.kind).collect();
        let charges: Vec<_> = placement
            .runs
            .values()
            .flat_map(|runs| collapse(&kinds, runs))
            .collect();
        assert!(self.cluster.nodes[n].charge(&charges).is_empty());
        let uid = format!("uid-{name}");
        self.cluster.pods.push(PodFacts {
            uid,
            namespace: "ns".into(),
            name: name.into(),
            node: node.into(),
            charges,
            request: req,
            safety,
        });
        true
    }
}
