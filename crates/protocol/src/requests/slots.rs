//! The containers of a pod in device-list order (init and sidecars first, then app
//! containers), and the pod's `namespace/name`.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use serde::Serialize;

use crate::node_lock::PodRef;

/// `namespace/name` of a pod; a pod without a namespace is in `default`, as the API
/// server places it.
pub fn pod_ref(pod: &Pod) -> PodRef {
    PodRef::new(
        pod.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Which list of the pod spec a container comes from, and how it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerKind {
    /// An init container that runs to completion before the app containers.
    Init,
    /// An init container with `restartPolicy: Always` (a native sidecar): it runs beside
    /// the app containers.
    Sidecar,
    /// An app container (`spec.containers`).
    App,
}

impl ContainerKind {
    /// The spelling reports and the JSON output use.
    pub const fn as_str(self) -> &'static str {
        match self {
            ContainerKind::Init => "init",
            ContainerKind::Sidecar => "sidecar",
            ContainerKind::App => "app",
        }
    }
}

/// A container in device-list order, with where it sits in the pod spec.
#[derive(Debug, Clone, Copy)]
pub struct ContainerSlot<'a> {
    /// Init, sidecar or app.
    pub kind: ContainerKind,
    /// Index in `spec.initContainers` or `spec.containers`.
    pub index: usize,
    /// The container itself.
    pub container: &'a Container,
}

impl ContainerSlot<'_> {
    /// The field path of the container, e.g. `spec.initContainers[0]`.
    pub fn field(&self) -> String {
        match self.kind {
            ContainerKind::App => format!("spec.containers[{}]", self.index),
            _ => format!("spec.initContainers[{}]", self.index),
        }
    }
}

/// Init containers (and sidecars) first, then app containers: run `i` of a device list.
pub fn container_slots(spec: &PodSpec) -> Vec<ContainerSlot<'_>> {
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(index, c)| {
            let sidecar = c.restart_policy.as_deref() == Some("Always");
            ContainerSlot {
                kind: if sidecar {
                    ContainerKind::Sidecar
                } else {
                    ContainerKind::Init
                },
                index,
                container: c,
            }
        });
    let app = spec
        .containers
        .iter()
        .enumerate()
        .map(|(index, c)| ContainerSlot {
            kind: ContainerKind::App,
            index,
            container: c,
        });
    init.chain(app).collect()
}

/// [`container_slots`] of a pod; none for a pod without a spec.
pub fn pod_container_slots(pod: &Pod) -> Vec<ContainerSlot<'_>> {
    pod.spec.as_ref().map(container_slots).unwrap_or_default()
}

/// The kind of each of a pod's containers, in [`container_slots`] order.
pub fn container_kinds(pod: &Pod) -> Vec<ContainerKind> {
    pod_container_slots(pod).iter().map(|c| c.kind).collect()
}
