//! What one container gets from Allocate, vendor-neutral (plain data).

use std::collections::BTreeMap;

/// A device node for the container (host path = container path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePath {
    /// Path of the device node, on the host and in the container.
    pub path: String,
    /// cgroup device access, e.g. `rw` or `rwm`.
    pub permissions: String,
}

/// A bind mount for the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    /// Where the container sees it.
    pub container_path: String,
    /// What is mounted there.
    pub host_path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// What one container gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerPlan {
    /// Environment variables set in the container.
    pub envs: BTreeMap<String, String>,
    /// Device nodes the container may open.
    pub devices: Vec<DevicePath>,
    /// Bind mounts into the container.
    pub mounts: Vec<MountPlan>,
    /// Fully qualified CDI device names (`vendor/class=name`), for runtimes that inject
    /// devices from CDI specs (kubelet ≥ 1.28 passes them on).
    pub cdi_devices: Vec<String>,
}
