//! The `resource.k8s.io/v1` objects the driver reads and writes, as our own serde types with
//! upstream's JSON field names (k8s.io/api/resource/v1/types.go). Kept independent of the
//! workspace's k8s-openapi feature (`v1_33` has no resource.k8s.io/v1). Fields we do not
//! model are kept as raw JSON where a round trip needs them; quantities stay strings and are
//! read with [`crate::quantity`]. `tests/it/upstream_json.rs` checks these names against
//! upstream-shaped objects.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `apiVersion` of every object here.
pub const API_VERSION: &str = "resource.k8s.io/v1";

fn is_false(b: &bool) -> bool {
    !*b
}

/// The `metadata` fields the driver reads or writes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `namespace` (claims only; slices are cluster-scoped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `uid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// `resourceVersion`, for updates that must not overwrite a newer object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// `labels`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `ownerReferences` (a slice is owned by its Node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
}

/// `ownerReferences[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    /// The owner's `apiVersion`.
    pub api_version: String,
    /// The owner's `kind`.
    pub kind: String,
    /// The owner's name.
    pub name: String,
    /// The owner's UID.
    pub uid: String,
    /// Whether the owner is the managing controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
    /// Whether the owner's deletion waits for this object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_owner_deletion: Option<bool>,
}

// ---------------------------------------------------------------- ResourceSlice

/// A `ResourceSlice`: devices this driver publishes for one pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSlice {
    /// [`API_VERSION`].
    pub api_version: String,
    /// `ResourceSlice`.
    pub kind: String,
    /// Its metadata.
    pub metadata: ObjectMeta,
    /// Its spec.
    pub spec: ResourceSliceSpec,
}

/// `ResourceSlice.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    /// The DRA driver publishing it.
    pub driver: String,
    /// The pool it belongs to.
    pub pool: ResourcePool,
    /// The node its devices are on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Devices reachable from every node (not used by this driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_nodes: Option<bool>,
    /// The devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Device>,
}

/// `spec.pool`: which pool, and how many slices make it up.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePool {
    /// Pool name (the node's name for this driver).
    pub name: String,
    /// Bumped when the pool's slices are replaced.
    pub generation: i64,
    /// How many slices the pool has at this generation.
    pub resource_slice_count: i64,
}

/// `spec.devices[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Name, unique within the pool.
    pub name: String,
    /// Attributes by qualified name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, DeviceAttribute>,
    /// Capacities by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, DeviceCapacity>,
    /// Several claims may be allocated this device at once (consumable capacity).
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_multiple_allocations: bool,
    /// Taints, e.g. an unhealthy device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<DeviceTaint>,
}

/// Exactly one of the four is set (upstream validation).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceAttribute {
    /// An integer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int: Option<i64>,
    /// A boolean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    /// A string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// A semantic version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl DeviceAttribute {
    /// A string attribute.
    pub fn string(s: impl Into<String>) -> Self {
        Self {
            string: Some(s.into()),
            ..Self::default()
        }
    }
    /// An integer attribute.
    pub fn int(i: i64) -> Self {
        Self {
            int: Some(i),
            ..Self::default()
        }
    }
    /// A boolean attribute.
    pub fn bool(b: bool) -> Self {
        Self {
            bool: Some(b),
            ..Self::default()
        }
    }
    /// A semantic-version attribute.
    pub fn version(v: impl Into<String>) -> Self {
        Self {
            version: Some(v.into()),
            ..Self::default()
        }
    }
}

/// `capacity.<name>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceCapacity {
    /// The total, a quantity.
    pub value: String,
    /// How claims may consume it (multi-allocation devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_policy: Option<CapacityRequestPolicy>,
}

/// `requestPolicy`: what a claim may ask for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityRequestPolicy {
    /// Consumed when a claim asks for nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// The only values a claim may ask for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub valid_values: Vec<String>,
    /// A range a claim's request is rounded into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_range: Option<CapacityRequestPolicyRange>,
}

/// `requestPolicy.validRange`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityRequestPolicyRange {
    /// Smallest request.
    pub min: String,
    /// Largest request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    /// Requests are rounded up to a multiple of this above `min`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// `taints[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTaint {
    /// Taint key.
    pub key: String,
    /// Taint value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `None`, `NoSchedule` or `NoExecute`.
    pub effect: String,
    /// When it was added (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_added: Option<String>,
}

// ---------------------------------------------------------------- ResourceClaim

/// A `ResourceClaim`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaim {
    /// [`API_VERSION`].
    pub api_version: String,
    /// `ResourceClaim`.
    pub kind: String,
    /// Its metadata.
    pub metadata: ObjectMeta,
    /// What it asks for.
    #[serde(default)]
    pub spec: ResourceClaimSpec,
    /// What it was given, once allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ResourceClaimStatus>,
}

/// `ResourceClaim.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaimSpec {
    /// The device requests.
    #[serde(default)]
    pub devices: DeviceClaim,
}

/// `spec.devices`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClaim {
    /// The requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<DeviceRequest>,
    /// Constraints across requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<DeviceConstraint>,
    /// Opaque driver configuration: not used by this driver, kept for round trips.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<Value>,
}

/// `requests[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRequest {
    /// Name, referenced by constraints and results.
    pub name: String,
    /// A request for devices of one class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exactly: Option<ExactDeviceRequest>,
    /// Prioritized alternatives (`firstAvailable`): exactly one is allocated, the first in
    /// this order that fits with the rest of the claim. Results name `<request>/<sub>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_available: Vec<DeviceSubRequest>,
}

/// Upstream's limit on `firstAvailable` entries (`FirstAvailableDeviceRequestMaxSize`).
pub const FIRST_AVAILABLE_MAX: usize = 8;

/// `requests[].firstAvailable[]`: like [`ExactDeviceRequest`] without `adminAccess`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSubRequest {
    /// Name, unique among the request's sub-requests; referenced as `<request>/<name>`.
    pub name: String,
    /// The DeviceClass to take devices from.
    pub device_class_name: String,
    /// Selectors a device must also satisfy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<DeviceSelector>,
    /// `ExactCount` (default) or `All`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_mode: Option<String>,
    /// How many devices (`ExactCount`; default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    /// Tolerated device taints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Value>,
    /// Capacity asked of each device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityRequirements>,
}

impl DeviceSubRequest {
    /// The sub-request as an `exactly` request (the allocator treats both alike).
    pub fn as_exact(&self) -> ExactDeviceRequest {
        ExactDeviceRequest {
            device_class_name: self.device_class_name.clone(),
            selectors: self.selectors.clone(),
            allocation_mode: self.allocation_mode.clone(),
            count: self.count,
            admin_access: None,
            tolerations: self.tolerations.clone(),
            capacity: self.capacity.clone(),
        }
    }
}

/// The top-level request a result's or constraint's request name refers to: `gpu` for both
/// `gpu` and `gpu/<sub>` (upstream splits at the first `/`; request names are DNS labels).
pub fn parent_request(name: &str) -> &str {
    name.split_once('/').map_or(name, |(parent, _)| parent)
}

/// `requests[].exactly`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExactDeviceRequest {
    /// The DeviceClass to take devices from.
    pub device_class_name: String,
    /// Selectors a device must also satisfy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<DeviceSelector>,
    /// `ExactCount` (default) or `All`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_mode: Option<String>,
    /// How many devices (`ExactCount`; default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    /// Admin access (not supported by this driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_access: Option<bool>,
    /// Tolerated device taints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Value>,
    /// Capacity asked of each device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityRequirements>,
}

/// `selectors[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSelector {
    /// A CEL selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cel: Option<CelDeviceSelector>,
}

/// `selectors[].cel`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CelDeviceSelector {
    /// The CEL expression.
    pub expression: String,
}

/// `capacity` of a request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityRequirements {
    /// Capacity name → quantity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
}

/// `constraints[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceConstraint {
    /// The requests it applies to (all when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    /// An attribute all their devices must share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_attribute: Option<String>,
    /// An attribute all their devices must differ in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distinct_attribute: Option<String>,
}

/// `ResourceClaim.status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaimStatus {
    /// The allocation, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationResult>,
    /// The consumers the claim is reserved for (pods).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_for: Vec<ResourceClaimConsumerReference>,
    /// Per-device status a driver writes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<AllocatedDeviceStatus>,
}

/// `status.allocation`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationResult {
    /// The devices allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<DeviceAllocationResult>,
    /// Nodes the allocation is usable on, as raw JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<Value>,
    /// When it was allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_timestamp: Option<String>,
}

/// `allocation.devices`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAllocationResult {
    /// One per allocated device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<DeviceRequestAllocationResult>,
    /// Configuration for the driver, as raw JSON (kept for round trips).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<Value>,
}

/// `allocation.devices.results[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRequestAllocationResult {
    /// The request it satisfies: `<request>`, or `<request>/<sub>` for a `firstAvailable`
    /// sub-request ([`parent_request`] gives the top-level name).
    pub request: String,
    /// The device's driver.
    pub driver: String,
    /// The device's pool.
    pub pool: String,
    /// The device's name.
    pub device: String,
    /// Admin access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_access: Option<bool>,
    /// Tolerated taints, as raw JSON.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Value>,
    /// Which share of a multi-allocation device.
    #[serde(rename = "shareID", default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Capacity consumed, name → quantity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed_capacity: BTreeMap<String, String>,
}

/// `status.reservedFor[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaimConsumerReference {
    /// API group of the consumer (empty for core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// Resource of the consumer, e.g. `pods`.
    pub resource: String,
    /// The consumer's name.
    pub name: String,
    /// The consumer's UID.
    pub uid: String,
}

/// `status.devices[]`: what a driver says about a device it prepared.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedDeviceStatus {
    /// The driver.
    pub driver: String,
    /// The pool.
    pub pool: String,
    /// The device.
    pub device: String,
    /// Which share.
    #[serde(rename = "shareID", default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Conditions, as raw JSON.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Value>,
    /// Driver data (this driver: CU ranges and bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Network data, as raw JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<Value>,
}
