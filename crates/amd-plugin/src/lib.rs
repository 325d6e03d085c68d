//! `k8s-device-plugin`: the AMD GPU device plugin of hami-rs (SPEC §4). See README.md.
//!
//! Pure cores, from `hami-amd-discovery` and `hami-amd-core` (re-exported): [`discovery`]
//! (sysfs → GPUs), [`registration`] (GPUs → register entries and kubelet ids),
//! [`cu_choice`] (which CUs a slice gets), [`allocate_plan`] (pod + request → container
//! response and annotation updates), [`pod_cgroup`] (which cgroup is the pod's, how long to
//! wait for it). Shells: [`grpc_server`] (kubelet gRPC),
//! [`kube_shell`] (API server), [`dmem`] (cgroup limits), [`plugin`] (wiring).

// Discovery and registration live in their own crate (shared with the monitor, the
// labeller and the planner); re-exported so `crate::discovery` etc. keep their paths.
pub use hami_amd_discovery::{discovery, kfd_topology, registration, sysfs};

// The pure decisions live in `hami-amd-core` (issue 28); re-exported under their old
// names so `hami_amd_plugin::cu_choice` etc. keep their paths.
pub use hami_amd_core::{
    allocate_plan, cu_choice, cu_usage, dmem_plan, health_events, pod_cgroup, rocr_visible,
};

pub mod cdi;
pub mod cli;
pub mod discover_report;
pub mod dmem;
pub mod dmem_delegation;
pub mod dmem_watch;
pub mod exporter;
pub mod grpc_server;
pub mod health;
pub mod kube_shell;
pub mod kubelet_session;
pub mod node_publisher;
pub mod plugin;
