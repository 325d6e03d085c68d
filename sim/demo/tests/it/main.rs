//! The demo's integration tests, one binary: its programs as a user runs them
//! (`hami-demo --once`, `hami-apiserver` under SIGTERM, `hami-kubelet-sim` with a cgroup
//! tree), and the demo's cluster in-process: the whole pipeline, forged allocations, `--dra`,
//! GPU-busy workloads, seed 004's AMD plan, every `/metrics` endpoint and every Grafana
//! panel. Their shared setup (scratch directories, `--once` arguments, `ONE_CLUSTER`: the
//! tests that start a whole cluster take turns): `common`.

mod common;

mod apiserver_sigterm;
mod dashboard_panels;
mod demo_cli;
mod demo_containerd;
mod dra;
mod forged_allocations;
mod kubelet_sim_cgroups;
mod kubelet_sim_containerd;
mod metrics;
mod pipeline;
mod seed_plan_amd;
mod workloads;
