//! Test data shaped like the demo's (`hami demo`, plain and `--dra`): nodes registered from
//! the real sysfs captures, a DRA node publishing the same capture's devices (so the same
//! uuids as a device-plugin node), plugin pods as the scheduler annotates them, DRA claims
//! as the API server allocates them, and monitor bodies as the monitors serve them.

use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::dra::DRIVER;
use hami_protocol::names::{Vendor, pod as pod_keys};
use hami_protocol::node_register::{DeviceInfo, decode_node_devices, encode_node_devices};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

/// The real captures' register entries (KFD trees from hami-sysfs-fixtures, discovered
/// and registered as the AMD plugin does): a node of 8 × MI210 (named `mi210-0`), and an
/// MI300X in CPX mode (63 hard partitions of 38 CUs).
pub(crate) fn captures() -> (Node, Vec<DeviceInfo>) {
    let scenario = hami_planner::scenario::parse_scenario(
        "fleet:\n- {name: mi210, count: 1, capture: mi210-xgmi}\n- {name: cpx, count: 1, capture: mi300x-cpx, mode: partition}\nworkloads: []\n",
        "test.yaml",
    )
    .unwrap();
    let specs = hami_planner::fleet::resolve_groups(&scenario.fleet).unwrap();
    let nodes = hami_planner::fleet::build_nodes(&scenario.fleet[..1], &specs[..1]).unwrap();
    (nodes[0].clone(), specs[1].amd.clone())
}

/// The demo's NVIDIA node: one 16 GiB card from the stand-in driver.
pub(crate) fn nvidia_card() -> DeviceInfo {
    let (node, _) = captures();
    let mut card = amd_entries(&node)[0].clone();
    card.id = "GPU-00000000-0000-4000-8000-000000000001".into();
    card.device_type = "NVIDIA-Stand-in GPU".into();
    card.device_vendor = Vendor::Nvidia.word().into();
    card.devmem = 16384;
    card.devcore = 100;
    card
}

/// The register entries of a node's AMD annotation.
pub(crate) fn amd_entries(node: &Node) -> Vec<DeviceInfo> {
    decode_node_devices(
        &node.metadata.annotations.as_ref().unwrap()[Vendor::Amd.names().node_register],
    )
    .unwrap()
}

/// The slice device the driver publishes for a register entry (dra-core's
/// `slice::device`: shared when it has more than one share, else exclusive).
pub(crate) fn slice_device(name: &str, info: &DeviceInfo) -> Value {
    json!({"name": name, "allowMultipleAllocations": info.count > 1,
        "attributes": {"uuid": {"string": info.id}, "productName": {"string": info.device_type}},
        "capacity": {"memory": {"value": format!("{}Mi", info.devmem)},
            "computeUnits": {"value": info.devcore.to_string()},
            "shares": {"value": info.count.to_string()}}})
}

/// The driver's ResourceSlice of node `node` publishing `devices` as `gpu-<i>`.
pub(crate) fn dra_slice(
    node: &str,
    devices: &[DeviceInfo],
) -> k8s_openapi::api::resource::v1::ResourceSlice {
    let devices: Vec<Value> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| slice_device(&format!("gpu-{i}"), d))
        .collect();
    serde_json::from_value(
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-amdgpu-0")},
        "spec": {"driver": DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices}}),
    )
    .unwrap()
}

/// A node labelled for DRA mode (it registers nothing by annotation).
pub(crate) fn dra_node(name: &str) -> Node {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"hami.io/amd-mode": "dra"}}}))
    .unwrap()
}

/// A node registering `devices` for `vendor`.
pub(crate) fn plugin_node(name: &str, vendor: Vendor, devices: &[DeviceInfo]) -> Node {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {
            vendor.names().node_register: encode_node_devices(devices).unwrap()}}}))
    .unwrap()
}

/// A running pod the scheduler placed on `node` with one container granted `mem_mib` and
/// `cores` of the card `uuid`.
pub(crate) fn plugin_pod(
    ns: &str,
    name: &str,
    node: &str,
    vendor: Vendor,
    (uuid, device_type): (&str, &str),
    (mem_mib, cores): (u64, u32),
) -> Pod {
    let runs = vec![vec![ContainerDevice {
        uuid: uuid.into(),
        device_type: device_type.into(),
        mem_mib,
        cores,
    }]];
    let names = vendor.names();
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"),
            "annotations": {
                pod_keys::VGPU_NODE: node,
                names.devices_allocated: encode_pod_devices(&runs).unwrap(),
                pod_keys::BIND_PHASE: "success"}},
        "spec": {"nodeName": node, "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "app",
                "resources": {"limits": {names.resource_count: "1",
                    names.resource_memory: mem_mib.to_string()}}}]},
        "status": {"phase": "Running"}}))
    .unwrap()
}

/// A DRA pod on `node` and its allocated claim: `gib` GiB and `cus` CUs of `device`.
pub(crate) fn dra_pod(
    ns: &str,
    name: &str,
    node: &str,
    device: &str,
    (gib, cus): (u64, u64),
) -> (Pod, k8s_openapi::api::resource::v1::ResourceClaim) {
    let claim_name = format!("{name}-gpu");
    let uid = format!("uid-{ns}-{name}");
    let claim = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": claim_name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER,
                "pool": node, "device": device, "shareID": format!("s-{name}"),
                "consumedCapacity": {"memory": format!("{gib}Gi"), "computeUnits": cus.to_string(), "shares": "1"}}]}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": uid}],
            "devices": [{"driver": DRIVER, "pool": node, "device": device, "shareID": format!("s-{name}"),
                "data": {"cuRanges": format!("0-{}", cus - 1), "memoryBytes": gib << 30}}]}}))
    .unwrap();
    let pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"nodeName": node,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "slice"}],
            "containers": [{"name": "main", "image": "rocm",
                "resources": {"claims": [{"name": "gpu"}]}}]},
        "status": {"phase": "Running",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim_name}]}}))
    .unwrap();
    (pod, claim)
}

/// A monitor's container series: `hami_container_device_memory_bytes` (`mib`) and
/// `hami_container_device_utilization_ratio` (`util`) of container `main`.
pub(crate) fn container_samples(ns: &str, pod: &str, uuid: &str, mib: u64, util: f64) -> String {
    let labels = format!(
        "namespace=\"{ns}\",pod=\"{pod}\",container=\"main\",vdevice_index=\"0\",device_uuid=\"{uuid}\""
    );
    format!(
        "hami_container_device_memory_bytes{{{labels}}} {}\nhami_container_device_utilization_ratio{{{labels}}} {util}\n",
        mib << 20
    )
}

/// A monitor's host series of one card on `node`.
pub(crate) fn host_samples(
    node: &str,
    uuid: &str,
    device_type: &str,
    mib: u64,
    util: f64,
) -> String {
    let labels = format!(
        "node=\"{node}\",device_index=\"0\",device_uuid=\"{uuid}\",device_type=\"{device_type}\""
    );
    format!(
        "hami_host_gpu_memory_used_bytes{{{labels}}} {}\nhami_host_gpu_utilization_ratio{{{labels}}} {util}\n",
        mib << 20
    )
}
