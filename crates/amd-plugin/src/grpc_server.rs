//! The kubelet-facing gRPC service (`deviceplugin/v1beta1` `DevicePlugin`). The service
//! itself is vendor-neutral (`hami-plugin-core`); this file says how AMD devices are
//! listed to kubelet.

use hami_deviceplugin_api::v1beta1::{NumaNode, TopologyInfo};
use hami_deviceplugin_api::{HEALTHY, UNHEALTHY};

pub use hami_plugin_core::grpc_server::{Allocator, container_response, preferred_ids};

use crate::registration::RegisteredDevice;

/// The `DevicePlugin` service over the AMD device list.
pub type PluginService = hami_plugin_core::grpc_server::PluginService<Vec<RegisteredDevice>>;

/// The kubelet device list: `count` ids per device, health, NUMA (none when unknown).
pub fn kubelet_devices(
    devices: &[RegisteredDevice],
) -> Vec<hami_deviceplugin_api::v1beta1::Device> {
    devices
        .iter()
        .flat_map(|d| {
            let topology = (d.info.numa >= 0).then(|| TopologyInfo {
                nodes: vec![NumaNode {
                    id: i64::from(d.info.numa),
                }],
            });
            let health = if d.info.health { HEALTHY } else { UNHEALTHY };
            d.kubelet_ids()
                .map(move |id| hami_deviceplugin_api::v1beta1::Device {
                    id: id.to_string(),
                    health: health.to_owned(),
                    topology: topology.clone(),
                })
        })
        .collect()
}
