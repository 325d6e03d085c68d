//! What the simulated kubelet knows about device plugins: per resource, the plugin's
//! endpoint, options and latest ListAndWatch device list, and which ids each pod holds.
//! Plain data; the gRPC tasks and the admission worker share it behind a mutex.

use std::collections::{BTreeMap, BTreeSet};

use hami_deviceplugin_api::HEALTHY;
use hami_deviceplugin_api::v1beta1::Device;

/// One registered resource.
#[derive(Debug, Clone, Default)]
pub struct ResourceState {
    /// Socket file name inside the device-plugin directory.
    pub endpoint: String,
    /// The plugin registered with `GetPreferredAllocationAvailable`: Allocate asks it first.
    pub preferred_allocation: bool,
    /// Latest ListAndWatch list.
    pub devices: Vec<Device>,
    /// ListAndWatch responses received (health pulses included).
    pub updates: u64,
    /// Bumped by every registration; a stream of an older registration stops updating.
    pub generation: u64,
    /// True while the plugin's ListAndWatch stream is open.
    pub connected: bool,
}

impl ResourceState {
    /// Healthy device ids.
    pub fn healthy(&self) -> impl Iterator<Item = &str> {
        self.devices
            .iter()
            .filter(|d| d.health == HEALTHY)
            .map(|d| d.id.as_str())
    }
}

/// Everything shared.
#[derive(Debug, Default)]
pub struct DeviceState {
    /// Registered resources by resource name (`amd.com/gpu`).
    pub resources: BTreeMap<String, ResourceState>,
    /// Registrations accepted so far (re-registrations included).
    pub registrations: u64,
    /// pod uid → resource → ids held (the kubelet checkpoint; survives a kubelet restart).
    pub assigned: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl DeviceState {
    /// Allocatable count of a resource (healthy ids).
    pub fn allocatable(&self, resource: &str) -> usize {
        self.resources
            .get(resource)
            .map_or(0, |r| r.healthy().count())
    }

    /// Healthy ids of `resource` that no pod other than `pod_uid` holds.
    pub fn free_ids(&self, resource: &str, pod_uid: &str) -> Vec<String> {
        let held: BTreeSet<&str> = self
            .assigned
            .iter()
            .filter(|(uid, _)| uid.as_str() != pod_uid)
            .flat_map(|(_, per)| per.get(resource).into_iter().flatten())
            .map(String::as_str)
            .collect();
        self.resources
            .get(resource)
            .map(|r| {
                r.healthy()
                    .filter(|id| !held.contains(id))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ids_exclude_other_pods_and_unhealthy() {
        let mut s = DeviceState::default();
        s.resources.insert(
            "amd.com/gpu".into(),
            ResourceState {
                devices: vec![
                    Device {
                        id: "a#0".into(),
                        health: HEALTHY.into(),
                        topology: None,
                    },
                    Device {
                        id: "a#1".into(),
                        health: "Unhealthy".into(),
                        topology: None,
                    },
                    Device {
                        id: "a#2".into(),
                        health: HEALTHY.into(),
                        topology: None,
                    },
                ],
                ..Default::default()
            },
        );
        s.assigned
            .entry("p1".into())
            .or_default()
            .entry("amd.com/gpu".into())
            .or_default()
            .insert("a#0".into());
        assert_eq!(s.allocatable("amd.com/gpu"), 2);
        assert_eq!(s.free_ids("amd.com/gpu", "p2"), vec!["a#2"]);
        assert_eq!(s.free_ids("amd.com/gpu", "p1"), vec!["a#0", "a#2"]);
    }
}
