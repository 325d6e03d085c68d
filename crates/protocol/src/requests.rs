//! What a pod asks for (SPEC §1): one request per container, init containers (sidecars
//! included) first, then app containers — the same order as the device lists of §2.2.
//!
//! Every rule of §1 lives here so that the webhook, the scheduler, the plugins and
//! `hami inspect` agree: the defaults (`gpucores` 100 for AMD, a count of 1 when only
//! memory/cores are given, exclusive NVIDIA cards for count-only requests) and the
//! validation (integers only; `gpucores` 1..100; `gpumem-percentage` 1..100). Each error
//! names the field and says what to write instead.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;

use crate::names::Vendor;
use crate::node_lock::PodRef;
use crate::quantity::{CountProblem, parse_count};

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

/// Most GPUs one container can use: the accounting regions have 64 AMD and 16 NVIDIA
/// device slots.
pub const fn max_gpus_per_container(vendor: Vendor) -> u32 {
    match vendor {
        Vendor::Amd => 64,
        Vendor::Nvidia => 16,
    }
}

/// Scheduler-configurable defaults (HAMi's `defaultMemory`, `defaultCores`, `defaultGPUNum`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestDefaults {
    /// NVIDIA memory in MiB when neither `gpumem` nor a percentage is given; 0 = whole card.
    pub nvidia_default_memory_mib: u64,
    /// NVIDIA cores when `gpucores` is absent but memory is given; 0 = no core reservation.
    pub nvidia_default_cores: u32,
    /// GPU count added when a container gives memory or cores without a count.
    pub default_gpu_count: u32,
}

impl Default for RequestDefaults {
    fn default() -> Self {
        Self {
            nvidia_default_memory_mib: 0,
            nvidia_default_cores: 0,
            default_gpu_count: 1,
        }
    }
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

/// Device memory wanted on each GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "value")]
pub enum MemoryRequest {
    /// All of the GPU's memory.
    Whole,
    /// This many MiB (`gpumem`).
    Mib(u64),
    /// Percent of the GPU's memory, 1..=100.
    Percent(u32),
}

impl MemoryRequest {
    /// MiB to reserve on a GPU with `devmem_mib`: `floor(devmem × pct / 100)` for
    /// percentages.
    pub fn resolve(self, devmem_mib: u64) -> u64 {
        match self {
            MemoryRequest::Whole => devmem_mib,
            MemoryRequest::Mib(mib) => mib,
            MemoryRequest::Percent(pct) => {
                u64::try_from(u128::from(devmem_mib) * u128::from(pct) / 100).unwrap_or(u64::MAX)
            }
        }
    }
}

/// AMD CU count for a percentage of a GPU with `devcore` CUs whose WGP holds `cu_per_wgp`
/// CUs (the register's `cuPerWGP`; 0 or absent read as 1): SPEC §2.2's
/// `floor(pct × devcore / 100)` clamped to `[1, devcore]`, then, where a WGP holds more than
/// one CU (RDNA: 2), rounded **up** to whole WGPs and clamped to the GPU's whole WGPs
/// (`devcore` rounded down). A slice on RDNA is made of whole WGPs (§2.5), so this is
/// exactly what the plugin's CU choice gives: the scheduler charges what the pod gets
/// (5 % of 64 CUs is 4, not the 3 of the floor, of which one WGP = 2 would be given).
/// 0 when the GPU reports no CUs (or fewer than one WGP).
pub fn amd_cu_count(cores_percent: u32, devcore: u32, cu_per_wgp: u32) -> u32 {
    if devcore == 0 {
        return 0;
    }
    let cus = u64::from(cores_percent) * u64::from(devcore) / 100;
    let cus = u32::try_from(cus).unwrap_or(u32::MAX).clamp(1, devcore);
    let w = cu_per_wgp.max(1);
    if w == 1 {
        return cus;
    }
    cus.div_ceil(w).saturating_mul(w).min(devcore / w * w)
}

/// One vendor's request of one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceRequest {
    /// Number of GPUs.
    pub count: u32,
    /// Memory on each GPU.
    pub memory: MemoryRequest,
    /// Percent of each GPU's compute (AMD: CUs, NVIDIA: SMs); 0 = no core reservation
    /// (NVIDIA's configured default only).
    pub cores_percent: u32,
    /// NVIDIA task priority (`nvidia.com/priority`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Resources the webhook adds to the container's limits to make the defaults explicit.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub added_limits: Vec<(&'static str, String)>,
}

/// What one container asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerRequest {
    /// The container's name.
    pub name: String,
    /// Init, sidecar or app.
    pub kind: ContainerKind,
    /// The AMD request, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amd: Option<DeviceRequest>,
    /// The NVIDIA request, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvidia: Option<DeviceRequest>,
}

impl ContainerRequest {
    /// The request for `vendor`, if any.
    pub fn get(&self, vendor: Vendor) -> Option<&DeviceRequest> {
        match vendor {
            Vendor::Amd => self.amd.as_ref(),
            Vendor::Nvidia => self.nvidia.as_ref(),
        }
    }

    /// Whether the container asks for no GPU at all.
    pub fn is_empty(&self) -> bool {
        self.amd.is_none() && self.nvidia.is_none()
    }
}

/// A request the user must fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct RequestError {
    /// Where, e.g. `spec.containers[1].resources.limits[amd.com/gpucores]`.
    pub field: String,
    /// What is wrong with it.
    pub problem: RequestProblem,
}

/// What is wrong with one resource of a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestProblem {
    /// The quantity is not a plain non-negative integer.
    #[error("{value:?} {problem}; {hint}")]
    BadQuantity {
        /// The quantity as written.
        value: String,
        /// Why it is not.
        problem: CountProblem,
        /// What the resource takes.
        hint: &'static str,
    },
    /// The number is outside what the resource takes.
    #[error("{value} is out of range; {hint}")]
    OutOfRange {
        /// The number.
        value: u64,
        /// What the resource takes.
        hint: &'static str,
    },
    /// `gpu: 0` alongside other resources of the vendor.
    #[error("is 0 but {other} is set: ask for at least 1 GPU, or remove {other}")]
    ZeroCountWithOthers {
        /// One of those resources.
        other: &'static str,
    },
    /// Both a memory size and a memory percentage.
    #[error("both {memory} and {percentage} are set: keep one of them")]
    MemoryAndPercentage {
        /// The memory resource's name.
        memory: &'static str,
        /// The percentage resource's name.
        percentage: &'static str,
    },
    /// More GPUs than one container may have.
    #[error("asks for {count} GPUs in one container; at most {max} are supported")]
    TooManyGpus {
        /// GPUs asked for.
        count: u64,
        /// The most allowed.
        max: u32,
    },
}

/// Requests of every container of the pod, in device-list order.
pub fn pod_requests(
    pod: &Pod,
    defaults: &RequestDefaults,
) -> Result<Vec<ContainerRequest>, RequestError> {
    let Some(spec) = &pod.spec else {
        return Ok(Vec::new());
    };
    container_slots(spec)
        .iter()
        .map(|slot| container_request(slot, defaults))
        .collect()
}

/// The request of one container.
pub fn container_request(
    slot: &ContainerSlot<'_>,
    defaults: &RequestDefaults,
) -> Result<ContainerRequest, RequestError> {
    Ok(ContainerRequest {
        name: slot.container.name.clone(),
        kind: slot.kind,
        amd: vendor_request(slot, Vendor::Amd, defaults)?,
        nvidia: vendor_request(slot, Vendor::Nvidia, defaults)?,
    })
}

const COUNT_HINT: &str = "write a whole number of GPUs such as 1";
const MEMORY_HINT: &str =
    "write device memory per GPU in MiB as a plain integer, e.g. 4096 (not 4Gi)";
const CORES_HINT: &str = "write a percentage of the GPU's compute as an integer from 1 to 100";
const PERCENT_HINT: &str = "write a percentage of the GPU's memory as an integer from 1 to 100";
const PRIORITY_HINT: &str = "write 0 (high) or 1 (low)";

struct Resources<'a> {
    slot: &'a ContainerSlot<'a>,
}

impl Resources<'_> {
    /// Limits first, then requests: extended resources must be equal in both when both
    /// are set, and a limit alone is what users usually write.
    fn get(&self, name: &str) -> Option<&Quantity> {
        let resources = self.slot.container.resources.as_ref()?;
        resources
            .limits
            .as_ref()
            .and_then(|l| l.get(name))
            .or_else(|| resources.requests.as_ref().and_then(|r| r.get(name)))
    }

    fn field(&self, name: &str) -> String {
        let resources = self.slot.container.resources.as_ref();
        let in_limits = resources
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| l.contains_key(name));
        let section = if in_limits { "limits" } else { "requests" };
        format!("{}.resources.{section}[{name}]", self.slot.field())
    }

    fn count(&self, name: &'static str, hint: &'static str) -> Result<Option<u64>, RequestError> {
        let Some(quantity) = self.get(name) else {
            return Ok(None);
        };
        parse_count(&quantity.0)
            .map(Some)
            .map_err(|problem| RequestError {
                field: self.field(name),
                problem: RequestProblem::BadQuantity {
                    value: quantity.0.clone(),
                    problem,
                    hint,
                },
            })
    }

    fn ranged(
        &self,
        name: &'static str,
        hint: &'static str,
        range: core::ops::RangeInclusive<u64>,
    ) -> Result<Option<u64>, RequestError> {
        match self.count(name, hint)? {
            Some(value) if !range.contains(&value) => Err(RequestError {
                field: self.field(name),
                problem: RequestProblem::OutOfRange { value, hint },
            }),
            other => Ok(other),
        }
    }
}

fn vendor_request(
    slot: &ContainerSlot<'_>,
    vendor: Vendor,
    defaults: &RequestDefaults,
) -> Result<Option<DeviceRequest>, RequestError> {
    let names = vendor.names();
    let res = Resources { slot };
    let count = res.count(names.resource_count, COUNT_HINT)?;
    let memory = res.ranged(names.resource_memory, MEMORY_HINT, 1..=u64::MAX)?;
    let percentage = res.ranged(names.resource_memory_percentage, PERCENT_HINT, 1..=100)?;
    let cores = res.ranged(names.resource_cores, CORES_HINT, 1..=100)?;
    let priority = match names.resource_priority {
        Some(name) => res.ranged(name, PRIORITY_HINT, 0..=1)?,
        None => None,
    };
    let other = [
        (memory, names.resource_memory),
        (percentage, names.resource_memory_percentage),
        (cores, names.resource_cores),
    ]
    .into_iter()
    .find_map(|(value, name)| value.map(|_| name));

    if count == Some(0) {
        return match other {
            // `gpu: 0` alone is a valid way to say "no GPU".
            None => Ok(None),
            Some(other) => Err(RequestError {
                field: res.field(names.resource_count),
                problem: RequestProblem::ZeroCountWithOthers { other },
            }),
        };
    }
    if count.is_none() && other.is_none() {
        return Ok(None);
    }
    if memory.is_some() && percentage.is_some() {
        return Err(RequestError {
            field: res.field(names.resource_memory),
            problem: RequestProblem::MemoryAndPercentage {
                memory: names.resource_memory,
                percentage: names.resource_memory_percentage,
            },
        });
    }
    let mut added_limits = Vec::new();
    let count = match count {
        Some(count) => count,
        None => {
            let count = u64::from(defaults.default_gpu_count.max(1));
            added_limits.push((names.resource_count, count.to_string()));
            count
        }
    };
    let max = max_gpus_per_container(vendor);
    if count > u64::from(max) {
        return Err(RequestError {
            field: res.field(names.resource_count),
            problem: RequestProblem::TooManyGpus { count, max },
        });
    }
    let memory = match (memory, percentage) {
        (Some(mib), _) => MemoryRequest::Mib(mib),
        (None, Some(pct)) => MemoryRequest::Percent(pct as u32),
        (None, None) if vendor == Vendor::Nvidia && defaults.nvidia_default_memory_mib > 0 => {
            MemoryRequest::Mib(defaults.nvidia_default_memory_mib)
        }
        (None, None) => MemoryRequest::Whole,
    };
    let cores_percent = match (cores, vendor) {
        (Some(cores), _) => cores as u32,
        // AMD: no gpucores reserves every CU (seed 000: one such pod per GPU).
        (None, Vendor::Amd) => 100,
        // NVIDIA: a count alone is an exclusive card, made explicit by the webhook.
        (None, Vendor::Nvidia)
            if memory == MemoryRequest::Whole || memory == MemoryRequest::Percent(100) =>
        {
            added_limits.push((names.resource_cores, "100".to_owned()));
            100
        }
        (None, Vendor::Nvidia) => defaults.nvidia_default_cores.min(100),
    };
    Ok(Some(DeviceRequest {
        count: count as u32,
        memory,
        cores_percent,
        priority: priority.map(|p| p as u32),
        added_limits,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}),
        )
        .unwrap()
    }

    fn limits(pairs: serde_json::Value) -> serde_json::Value {
        json!({"limits": pairs})
    }

    fn one(limits_json: serde_json::Value) -> Result<ContainerRequest, RequestError> {
        let p = pod(json!({"containers": [{"name": "c", "resources": limits(limits_json)}]}));
        pod_requests(&p, &RequestDefaults::default()).map(|mut r| r.remove(0))
    }

    #[test]
    fn a_pods_slots_and_kinds_follow_container_slots() {
        let p = pod(json!({
            "initContainers": [{"name": "i"}, {"name": "s", "restartPolicy": "Always"}],
            "containers": [{"name": "a"}]
        }));
        let names: Vec<_> = pod_container_slots(&p)
            .iter()
            .map(|c| c.container.name.clone())
            .collect();
        assert_eq!(names, ["i", "s", "a"]);
        use ContainerKind::{App, Init, Sidecar};
        assert_eq!(container_kinds(&p), [Init, Sidecar, App]);
        let mut bare = p.clone();
        bare.spec = None;
        assert!(pod_container_slots(&bare).is_empty());
        assert!(container_kinds(&bare).is_empty());
    }

    #[test]
    fn init_containers_first_sidecars_marked() {
        let p = pod(json!({
            "initContainers": [{"name": "setup"}, {"name": "proxy", "restartPolicy": "Always"}],
            "containers": [
                {"name": "a", "resources": limits(json!({"amd.com/gpu": "2", "amd.com/gpumem": "8192", "amd.com/gpucores": "25"}))},
                {"name": "b", "resources": limits(json!({"amd.com/gpu": "2"}))}
            ]
        }));
        let reqs = pod_requests(&p, &RequestDefaults::default()).unwrap();
        let shape: Vec<_> = reqs.iter().map(|r| (r.name.as_str(), r.kind)).collect();
        assert_eq!(
            shape,
            vec![
                ("setup", ContainerKind::Init),
                ("proxy", ContainerKind::Sidecar),
                ("a", ContainerKind::App),
                ("b", ContainerKind::App)
            ]
        );
        assert!(reqs[0].is_empty() && reqs[1].is_empty());
        let a = reqs[2].amd.as_ref().unwrap();
        assert_eq!(
            (a.count, a.memory, a.cores_percent),
            (2, MemoryRequest::Mib(8192), 25)
        );
        let b = reqs[3].amd.as_ref().unwrap();
        assert_eq!(
            (b.count, b.memory, b.cores_percent),
            (2, MemoryRequest::Whole, 100)
        );
        assert!(b.added_limits.is_empty());
    }

    #[test]
    fn pod_refs_default_the_namespace() {
        assert_eq!(
            pod_ref(&pod(json!({"containers": []}))).to_string(),
            "default/p"
        );
        let mut p = pod(json!({"containers": []}));
        p.metadata.namespace = Some("ml".into());
        assert_eq!(pod_ref(&p), PodRef::new("ml", "p"));
    }

    #[test]
    fn amd_defaults() {
        // Only memory: every CU reserved (one such pod per GPU), count defaults to 1.
        let r = one(json!({"amd.com/gpumem": "8192"})).unwrap().amd.unwrap();
        assert_eq!(
            (r.count, r.memory, r.cores_percent),
            (1, MemoryRequest::Mib(8192), 100)
        );
        assert_eq!(r.added_limits, vec![("amd.com/gpu", "1".to_string())]);
        // Only a percentage: the webhook adds amd.com/gpu: 1.
        let r = one(json!({"amd.com/gpumem-percentage": "50"}))
            .unwrap()
            .amd
            .unwrap();
        assert_eq!((r.count, r.memory), (1, MemoryRequest::Percent(50)));
        assert_eq!(r.added_limits, vec![("amd.com/gpu", "1".to_string())]);
        // gpu: 0 alone means no GPU.
        assert!(one(json!({"amd.com/gpu": "0"})).unwrap().is_empty());
        assert!(one(json!({"cpu": "1"})).unwrap().is_empty());
    }

    #[test]
    fn nvidia_defaults() {
        let r = one(json!({"nvidia.com/gpu": "1"})).unwrap().nvidia.unwrap();
        assert_eq!(
            (r.count, r.memory, r.cores_percent),
            (1, MemoryRequest::Whole, 100)
        );
        assert_eq!(
            r.added_limits,
            vec![("nvidia.com/gpucores", "100".to_string())]
        );
        let r = one(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}))
            .unwrap()
            .nvidia
            .unwrap();
        assert_eq!((r.memory, r.cores_percent), (MemoryRequest::Mib(3000), 0));
        assert!(r.added_limits.is_empty());
        let r = one(json!({"nvidia.com/gpumem-percentage": "100"}))
            .unwrap()
            .nvidia
            .unwrap();
        assert_eq!(r.cores_percent, 100);
        assert_eq!(
            r.added_limits,
            vec![
                ("nvidia.com/gpu", "1".to_string()),
                ("nvidia.com/gpucores", "100".to_string())
            ]
        );
        let r = one(json!({"nvidia.com/gpucores": "30", "nvidia.com/priority": "1"}))
            .unwrap()
            .nvidia
            .unwrap();
        assert_eq!((r.count, r.cores_percent, r.priority), (1, 30, Some(1)));
        // Requests are read when limits are absent.
        let p = pod(
            json!({"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "2"}}}]}),
        );
        assert_eq!(
            pod_requests(&p, &RequestDefaults::default()).unwrap()[0]
                .nvidia
                .as_ref()
                .unwrap()
                .count,
            2
        );
        let defaults = RequestDefaults {
            nvidia_default_memory_mib: 1024,
            nvidia_default_cores: 10,
            default_gpu_count: 1,
        };
        let p = pod(
            json!({"containers": [{"name": "c", "resources": limits(json!({"nvidia.com/gpu": "1"}))}]}),
        );
        let r = pod_requests(&p, &defaults)
            .unwrap()
            .remove(0)
            .nvidia
            .unwrap();
        assert_eq!((r.memory, r.cores_percent), (MemoryRequest::Mib(1024), 10));
    }

    #[test]
    fn resolution_and_cu_conversion() {
        assert_eq!(MemoryRequest::Percent(50).resolve(196_288), 98_144);
        assert_eq!(MemoryRequest::Percent(33).resolve(100), 33);
        assert_eq!(MemoryRequest::Whole.resolve(65_520), 65_520);
        assert_eq!(MemoryRequest::Mib(4096).resolve(65_520), 4096);
        assert_eq!(amd_cu_count(25, 304, 1), 76);
        assert_eq!(amd_cu_count(33, 304, 1), 100);
        assert_eq!(amd_cu_count(67, 304, 1), 203);
        assert_eq!(amd_cu_count(100, 304, 1), 304);
        assert_eq!(amd_cu_count(1, 38, 1), 1, "clamped up to one CU");
        assert_eq!(amd_cu_count(50, 0, 1), 0);
        assert_eq!(amd_cu_count(25, 304, 0), 76, "cuPerWGP 0 reads as 1");
    }

    #[test]
    fn rdna_cu_counts_are_whole_wgps_rounded_up() {
        // 5 % of 64 = 3 by the floor: one WGP more, 4 CUs = 2 WGPs.
        assert_eq!(amd_cu_count(5, 64, 2), 4);
        assert_eq!(amd_cu_count(1, 64, 2), 2, "at least one WGP");
        assert_eq!(amd_cu_count(25, 96, 2), 24, "already whole WGPs");
        assert_eq!(amd_cu_count(99, 64, 2), 64);
        assert_eq!(amd_cu_count(100, 64, 2), 64);
        // An odd count: the last CU is in no whole WGP, never given, never charged.
        assert_eq!(amd_cu_count(100, 61, 2), 60);
        assert_eq!(amd_cu_count(99, 61, 2), 60);
        assert_eq!(amd_cu_count(50, 1, 2), 0, "less than one WGP");
        for devcore in 1..=320 {
            for pct in 1..=100 {
                let floor = amd_cu_count(pct, devcore, 1);
                let c = amd_cu_count(pct, devcore, 2);
                assert_eq!(c % 2, 0, "{pct} % of {devcore}");
                assert!(c <= devcore, "{pct} % of {devcore}");
                // Rounded up unless the GPU has no whole WGP more.
                assert!(c >= floor || c == devcore / 2 * 2, "{pct} % of {devcore}");
                assert!(c <= floor + 1, "{pct} % of {devcore}");
            }
        }
    }

    #[test]
    fn bad_requests_name_the_field_and_the_fix() {
        let cases = [
            (
                json!({"amd.com/gpu": "1.5"}),
                "limits[amd.com/gpu]",
                "not a whole number",
            ),
            (
                json!({"amd.com/gpu": "-1"}),
                "limits[amd.com/gpu]",
                "negative",
            ),
            (
                json!({"amd.com/gpu": "1Gi"}),
                "limits[amd.com/gpu]",
                "unit suffix",
            ),
            (
                json!({"amd.com/gpu": "many"}),
                "limits[amd.com/gpu]",
                "not a number",
            ),
            (
                json!({"amd.com/gpu": "65"}),
                "limits[amd.com/gpu]",
                "at most 64",
            ),
            (
                json!({"nvidia.com/gpu": "17"}),
                "limits[nvidia.com/gpu]",
                "at most 16",
            ),
            (
                json!({"amd.com/gpu": "1", "amd.com/gpucores": "0"}),
                "limits[amd.com/gpucores]",
                "from 1 to 100",
            ),
            (
                json!({"amd.com/gpu": "1", "amd.com/gpucores": "101"}),
                "limits[amd.com/gpucores]",
                "from 1 to 100",
            ),
            (
                json!({"amd.com/gpu": "1", "amd.com/gpucores": "12.5"}),
                "limits[amd.com/gpucores]",
                "not a whole number",
            ),
            (
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}),
                "limits[nvidia.com/gpucores]",
                "from 1 to 100",
            ),
            (
                json!({"amd.com/gpu": "1", "amd.com/gpumem-percentage": "101"}),
                "limits[amd.com/gpumem-percentage]",
                "from 1 to 100",
            ),
            (
                json!({"nvidia.com/gpumem-percentage": "0"}),
                "limits[nvidia.com/gpumem-percentage]",
                "from 1 to 100",
            ),
            (
                json!({"amd.com/gpu": "1", "amd.com/gpumem": "4Gi"}),
                "limits[amd.com/gpumem]",
                "4096 (not 4Gi)",
            ),
            (
                json!({"amd.com/gpu": "1", "amd.com/gpumem": "0"}),
                "limits[amd.com/gpumem]",
                "out of range",
            ),
            (
                json!({"amd.com/gpu": "0", "amd.com/gpumem": "10"}),
                "limits[amd.com/gpu]",
                "remove amd.com/gpumem",
            ),
            (
                json!({"amd.com/gpumem": "10", "amd.com/gpumem-percentage": "10"}),
                "limits[amd.com/gpumem]",
                "keep one",
            ),
            (
                json!({"nvidia.com/gpu": "1", "nvidia.com/priority": "5"}),
                "limits[nvidia.com/priority]",
                "0 (high)",
            ),
        ];
        for (limits_json, field, message) in cases {
            let err = one(limits_json.clone()).unwrap_err();
            let text = err.to_string();
            assert!(err.field.ends_with(field), "{limits_json}: {text}");
            assert!(err.field.starts_with("spec.containers[0]"), "{text}");
            assert!(text.contains(message), "{limits_json}: {text}");
        }
        let p = pod(
            json!({"initContainers": [{"name": "i", "resources": limits(json!({"amd.com/gpu": "x"}))}], "containers": [{"name": "c"}]}),
        );
        let err = pod_requests(&p, &RequestDefaults::default()).unwrap_err();
        assert_eq!(
            err.field,
            "spec.initContainers[0].resources.limits[amd.com/gpu]"
        );
    }

    proptest::proptest! {
        #[test]
        fn total_on_arbitrary_values(
            values in proptest::collection::vec(".{0,12}", 9),
            in_requests in proptest::bool::ANY,
        ) {
            let names = ["amd.com/gpu", "amd.com/gpumem", "amd.com/gpumem-percentage", "amd.com/gpucores",
                "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores", "nvidia.com/priority"];
            let map: serde_json::Map<String, serde_json::Value> = names.iter().zip(&values)
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_string(), json!(v))).collect();
            let section = if in_requests { "requests" } else { "limits" };
            let p = pod(json!({"containers": [{"name": "c", "resources": {section: map}}]}));
            if let Ok(reqs) = pod_requests(&p, &RequestDefaults::default()) {
                for vendor in Vendor::ALL {
                    if let Some(r) = reqs[0].get(vendor) {
                        proptest::prop_assert!(r.count >= 1 && r.count <= max_gpus_per_container(vendor));
                        proptest::prop_assert!(r.cores_percent <= 100);
                    }
                }
            }
        }
    }
}
