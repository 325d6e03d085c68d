//! The AMD plugin's decisions, as a crate the compiler keeps pure: plain functions over
//! plain data, no async, no file or network I/O, no unsafe (issue 28). The device plugin
//! (`hami-amd-plugin`) and the DRA driver's cores (`hami-dra-core`) call them; the shells
//! read sysfs, cgroups and the API server and hand the results in.
//!
//! | module | decides |
//! |---|---|
//! | [`allocate_plan`] | pod + node devices + used CUs + kubelet's request → the container's response and annotation updates (D-5, §2.6) |
//! | [`cu_choice`] | which CUs a slice gets (best fit, whole WGPs on RDNA, one common set on several GPUs) |
//! | [`cu_usage`] | the CUs in use on a node, from the live pods the scheduler placed |
//! | [`dmem_plan`] | dmem limits per VRAM region, the pod's peak |
//! | [`dmem_delegation`] | whether pod cgroups can get `dmem.max`, the node annotation and Events saying so |
//! | [`pod_cgroup`] | which directory is a pod's cgroup (QoS class × cgroup driver), how long to wait for it |
//! | [`rocr_visible`] | `ROCR_VISIBLE_DEVICES` for a container, and a model of ROCr's filter |
//! | [`cdi`] | CDI names, the node's CDI spec and its validation, a response's CDI form |
//! | [`health_events`] | Node Events from two registrations (missing, unhealthy, recovered, mode changed) |

#![forbid(unsafe_code)]

pub mod allocate_plan;
pub mod cdi;
pub mod cu_choice;
pub mod cu_usage;
pub mod dmem_delegation;
pub mod dmem_plan;
pub mod health_events;
pub mod pod_cgroup;
pub mod rocr_visible;
