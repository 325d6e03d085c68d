//! libvgpu.so in real processes against the stand-in driver and NVML: the C probes
//! (`tests/c`) under `LD_PRELOAD`, the pod configuration, internal errors behind the fault
//! switch, PID namespaces, the monitor reading the region the hook writes, the seed plan's
//! duty shares, the stand-ins themselves, and the glibc baseline. The helpers (built
//! libraries, compiled probes, scratch directories) are in `common`; every compiled program
//! has its own name in the one driver directory, built once per process.

mod common;
mod glibc_baseline;
mod internal_errors;
mod monitor_reads_the_hook;
mod pid_namespace;
mod pod_config;
mod processes;
mod seed_plan;
mod stand_ins;
