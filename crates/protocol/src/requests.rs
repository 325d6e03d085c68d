//! What a pod asks for (SPEC §1): one request per container, init containers (sidecars
//! included) first, then app containers — the same order as the device lists of §2.2.
//!
//! Every rule of §1 lives here so that the webhook, the scheduler, the plugins and
//! `hami inspect` agree: the defaults (`gpucores` 100 for AMD, a count of 1 when only
//! memory/cores are given, exclusive NVIDIA cards for count-only requests) and the
//! validation (integers only; `gpucores` 1..100; `gpumem-percentage` 1..100). Each error
//! names the field and says what to write instead.
//!
//! | module | concern |
//! |---|---|
//! | `slots` | a pod's containers in device-list order, `namespace/name` |
//! | `amounts` | the request types, the defaults, per-vendor limits, AMD CU counts |
//! | `validate` | reading a container's resources into a request, with the errors |

mod amounts;
mod slots;
mod validate;

pub use amounts::{
    ContainerRequest, DeviceRequest, MemoryRequest, RequestDefaults, amd_cu_count,
    max_gpus_per_container,
};
pub use slots::{
    ContainerKind, ContainerSlot, container_kinds, container_slots, pod_container_slots, pod_ref,
};
pub use validate::{RequestError, RequestProblem, container_request, pod_requests};

#[cfg(test)]
mod tests;
