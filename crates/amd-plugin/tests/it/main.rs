//! The AMD device plugin's integration tests, one binary (issue 28): the Allocate planner on
//! fixture nodes (`allocate_plan`, `common_cu_range`, `hook_config_plan`), discovery and the
//! `discover` command on real captures (`discovery_fixtures`), dmem limits on cgroup trees
//! laid out as kubelet makes them (`dmem_layouts`), health without opening device nodes
//! (`health_pulse`, `health_unprivileged`), and the plugin end to end on the embedded API
//! server with the simulated kubelet over real unix sockets (`e2e`).

mod allocate_plan;
mod common_cu_range;
mod discovery_fixtures;
mod dmem_layouts;
mod e2e;
mod health_pulse;
mod health_unprivileged;
mod hook_config_plan;
