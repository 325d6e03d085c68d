//! Reading a container's resources into a [`ContainerRequest`]: the defaults of §1 and
//! the validation, each error naming the field and the fix.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{
    ContainerRequest, ContainerSlot, DeviceRequest, MemoryRequest, RequestDefaults,
    container_slots, max_gpus_per_container,
};
use crate::names::Vendor;
use crate::quantity::{CountProblem, parse_count};

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
