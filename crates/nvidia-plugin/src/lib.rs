//! `nvidia-device-plugin`: the NVIDIA GPU device plugin of hami-rs (issue 8). See README.md.
//!
//! Pure cores: [`registration`] (NVML GPUs → register entries and kubelet ids),
//! [`allocate_plan`] (pod + request → container response and the consumed run). Shells:
//! [`nvml`] (dlopen FFI), [`node_publisher`] (API server), [`kube_shell`] (Allocate against
//! the API server), [`plugin`] (wiring). Vendor-neutral parts come from `hami-plugin-core`.

pub mod allocate_plan;
pub mod cli;
pub mod discover_report;
pub mod kube_shell;
pub mod node_publisher;
pub mod nvml;
pub mod plugin;
pub mod registration;
pub mod xid_health;
pub mod xid_watch;
