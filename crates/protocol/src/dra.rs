//! The AMD DRA driver's names on the wire (issue 20), written once: the driver (and
//! DeviceClass) name, the capacity names its ResourceSlices publish and claims consume, the
//! keys of the `status.devices[].data` it writes at prepare, and the node label choosing
//! DRA for a node. The driver, the chart, `hami status` and the monitor all read them here.

/// The driver name (a DNS subdomain): not ROCm's `gpu.amd.com`, not HAMi's NVIDIA driver.
/// Also the name of the DeviceClass selecting its devices.
pub const DRIVER: &str = "amdgpu.hami-rs.io";

/// Capacity name of a device's memory, in bytes.
pub const MEMORY: &str = "memory";
/// Capacity name of a device's compute units.
pub const COMPUTE_UNITS: &str = "computeUnits";
/// Capacity name of a device's shares (claims it may serve at once).
pub const SHARES: &str = "shares";

/// `status.devices[].data` key: the CU ranges chosen at prepare (a CU list, §2.5).
pub const CU_RANGES: &str = "cuRanges";
/// `status.devices[].data` key: the memory limit in bytes.
pub const MEMORY_BYTES: &str = "memoryBytes";

/// Node label choosing the AMD front end of a node: [`AMD_MODE_DRA`] runs the DRA driver
/// there and keeps the device plugin off (never both for `amd.com/gpu` on one node).
pub const AMD_MODE_LABEL: &str = "hami.io/amd-mode";
/// [`AMD_MODE_LABEL`]'s value for DRA nodes.
pub const AMD_MODE_DRA: &str = "dra";

/// Device attribute (in the driver's domain): `amdgpu-slice` or `amdgpu-partition`.
pub const ATTR_TYPE: &str = "type";
/// Device attribute: the registered device id (AMD SMI UUID, §2.1 `id`).
pub const ATTR_UUID: &str = "uuid";
/// Device attribute: the market name (§2.1 `type`), what `amd.com/use-gputype` matches.
pub const ATTR_PRODUCT_NAME: &str = "productName";
/// Device attribute: the lowest PCI address of the card's XGMI hive (absent without peers);
/// `amd.com/link-bind` becomes a `matchAttribute` on it.
pub const ATTR_XGMI_HIVE: &str = "xgmiHive";
/// Upstream's standard attribute of the NUMA node (`amd.com/numa-bind` matches on it).
pub const ATTR_NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
/// Upstream's standard attribute of the PCI bus id.
pub const ATTR_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";

/// Pod annotation choosing the AMD front end for one pod, overriding the webhook's
/// cluster default: [`AMD_MODE_DRA`] turns the pod's `amd.com/*` requests into
/// ResourceClaims, [`AMD_MODE_DEVICE_PLUGIN`] leaves them to the device plugin. Same key as
/// the node label.
pub const AMD_MODE_ANNOTATION: &str = AMD_MODE_LABEL;
/// [`AMD_MODE_LABEL`]'s value (annotation and webhook default) for the device plugin.
pub const AMD_MODE_DEVICE_PLUGIN: &str = "device-plugin";

/// The one request of each claim the webhook writes for a container's `amd.com/*` request
/// (DRA mode). Allocation results name it `gpu`, or `gpu/<sub-request>` when it was written
/// as `firstAvailable`; the driver accepts both.
pub const CLAIM_REQUEST: &str = "gpu";
/// Prefix of the ResourceClaimTemplates the webhook creates (`hami-amd-<16 hex of the
/// spec's hash>`) and of the pod's `spec.resourceClaims` entries it adds
/// (`hami-amd-<container name>`).
pub const CLAIM_PREFIX: &str = "hami-amd-";
/// Label on the webhook's ResourceClaimTemplates (and the claims made from them): the
/// scheduler's sweeper deletes only templates carrying it with [`MANAGED_BY_WEBHOOK`].
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// [`MANAGED_BY_LABEL`]'s value on the webhook's templates.
pub const MANAGED_BY_WEBHOOK: &str = "hami-webhook";
/// Upstream's `allocationMode` of a request for an exact number of devices.
pub const EXACT_COUNT: &str = "ExactCount";
/// Upstream's limit on the sub-requests of one `firstAvailable` request
/// (`FirstAvailableDeviceRequestMaxSize`).
pub const MAX_FIRST_AVAILABLE: usize = 8;
/// Annotation the webhook writes on a managed ResourceClaimTemplate each time it hands the
/// template out (created, or reused after a 409 with the same spec): when, as
/// [`crate::rfc3339::format_utc`] writes it (`YYYY-MM-DDTHH:MM:SSZ`). The scheduler's
/// sweeper spares a template whose stamp is newer than its grace period, and deletes only
/// at the version it listed, so a stamp racing the delete wins.
pub const LAST_USED_ANNOTATION: &str = "hami.io/last-used";
