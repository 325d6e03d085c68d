//! The monitor's integration tests, one binary: region files read byte for byte
//! (`golden_core_region`), what tenants leave in their cache directories
//! (`hostile_tenants`, `plugin_files`), processes in PID namespaces, AMD partitions, NVIDIA
//! host metrics through the stand-in NVML (in a child process: its settings are in the
//! environment), DRA pods and whole cards against the embedded API server, seed 004's node,
//! the Grafana dashboard's metric names, and GPU processes of sliced containers without the
//! memory hook (`unhooked`, real processes). Shared writers of HAMi-core regions: `common`.

mod common;

mod amd_partitions;
mod dashboard;
mod dra_pods;
mod golden_core_region;
mod hostile_tenants;
mod nvidia_host;
mod pid_namespaces;
mod plugin_files;
mod seed_node;
mod unhooked;
mod whole_cards;
