//! `k8s-vgpu-monitor`: per-container GPU memory and utilization as Prometheus metrics
//! (SPEC §6, §7, Appendix A; seed 004). See README.md.
//!
//! Pure cores: [`hami_core_region`], [`hip_region`] (region readers over [`region_bytes`]),
//! [`fdinfo`], [`cgroup`], [`utilization`], [`cache_dirs`], [`scan_plan`], [`cache_budget`]
//! (decisions),
//! [`hook_presence`] (is the memory hook in the sliced containers' GPU processes),
//! [`hooked_processes`] (the processes found hooked, remembered between passes),
//! [`pods`] (index), [`dra_claims`] (DRA pods' devices and claim regions), [`metrics`]
//! (exposition). Shells: [`procfs`], [`host_gpus`], [`dra_fetch`] (claims and slices), [`hook_check`] (its /proc reads and Events),
//! [`node_monitor`] (state and passes), [`server`] (HTTP and wiring).

pub mod cache_budget;
pub mod cache_dirs;
pub mod cgroup;
pub mod dra_claims;
pub mod dra_fetch;
pub mod dra_slices;
pub mod environ_memory;
pub mod errors;
pub mod fdinfo;
pub mod hami_core_region;
pub mod hip_region;
pub mod hook_check;
pub mod hook_presence;
pub mod hooked_processes;
pub mod host_gpus;
pub mod host_pids;
pub mod metrics;
pub mod node_monitor;
pub mod pods;
pub mod procfs;
pub mod region_bytes;
pub mod region_file;
mod region_reading;
pub mod scan_plan;
pub mod scrape;
pub mod server;
pub mod utilization;
