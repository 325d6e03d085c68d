//! What one container gets from Allocate, vendor-neutral (plain data).

use std::collections::BTreeMap;

/// A device node for the container (host path = container path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePath {
    pub path: String,
    pub permissions: String,
}

/// A bind mount for the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    pub container_path: String,
    pub host_path: String,
    pub read_only: bool,
}

/// What one container gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerPlan {
    pub envs: BTreeMap<String, String>,
    pub devices: Vec<DevicePath>,
    pub mounts: Vec<MountPlan>,
    /// Fully qualified CDI device names (`vendor/class=name`), for runtimes that inject
    /// devices from CDI specs (kubelet ≥ 1.28 passes them on).
    pub cdi_devices: Vec<String>,
}
