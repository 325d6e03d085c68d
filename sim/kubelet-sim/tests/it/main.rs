//! The simulated kubelet's integration tests, one binary: `registration` (the device-plugin
//! Registration service and the Node), `admission_retry` (status reports retried),
//! `cgroups` and `cgroup_order` (pod and container cgroups, and when a DRA driver meets
//! them), `containers` (namespaced containers; needs root and `unshare`), `cri` (pods on a
//! real containerd over CRI; needs root, containerd, runc, buildah), `dra` (the real
//! AMD DRA driver and the simulated kube-scheduler end to end). Each test makes its own
//! API server and its own scratch directory, named per test, so they run side by side.

mod admission_retry;
mod cgroup_order;
mod cgroups;
mod containers;
mod cri;
mod dra;
mod registration;
