//! Vendor-neutral parts of the device plugins (AMD `k8s-device-plugin`, NVIDIA
//! `nvidia-device-plugin`). See README.md.
//!
//! Pure cores: [`container_plan`] (what a container gets), [`run_mapping`] (D-5: which run
//! of the scheduler's device list a kubelet request consumes), [`pod_choice`] (which pod an
//! Allocate belongs to). Shells: [`grpc_server`] (kubelet `DevicePlugin` service),
//! [`kubelet_session`] (socket + registration loop), [`pod_commit`] (bind phase, lock
//! release, accounting directory), [`node_lock_client`] (the node-lock client the
//! scheduler's bind uses too).

pub mod container_plan;
pub mod entry;
pub mod grpc_server;
pub mod kubelet_session;
pub mod node_lock_client;
pub mod pod_choice;
pub mod pod_commit;
pub mod run_mapping;
