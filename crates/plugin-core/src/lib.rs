//! Vendor-neutral parts of the device plugins (AMD `k8s-device-plugin`, NVIDIA
//! `nvidia-device-plugin`). See README.md.
//!
//! Pure cores: [`container_plan`] (what a container gets), [`run_mapping`] (D-5: which run
//! of the scheduler's device list a kubelet request consumes), [`pod_choice`] (which pod an
//! Allocate belongs to), and the decisions of the shells' loops: [`session_rules`] (when
//! a kubelet session registers, restarts or stops), [`lock_attempt`] (the steps of one
//! node-lock attempt), [`lock_retry`] (wait or give up after a failed attempt), [`refresh_schedule`] (the plugins' publication and health
//! timers), [`whole_card_holdings`] (whole cards held by pods HAMi did not place: who holds
//! what, which pod a whole-card Allocate is for, refusals). Shells: [`allocate_shell`] (the
//! one Allocate of both vendors; a vendor gives only what differs), [`node_pods`] (the
//! node's pods, watched), [`grpc_server`] (kubelet `DevicePlugin` service),
//! [`kubelet_session`] (socket + registration loop, woken by [`dir_watch`]), [`pod_commit`] (bind phase, lock
//! release, accounting directory), [`mount_sources`] (an answer's mount sources exist), [`node_lock_client`] (the node-lock client the
//! scheduler's bind uses too), [`publisher_loop`] (both plugins' publisher loop),
//! [`node_register`] (the register/heartbeat and node-capacity patches); [`kube_error`] (API
//! errors as one readable line, for the plugins, the DRA driver and the scheduler).

// Pure, vendor-neutral: live in the protocol crate so the vendor cores need no shell crate.
pub use hami_protocol::{container_plan, run_mapping};
pub mod allocate_shell;
pub mod dir_watch;
pub mod entry;
pub mod grpc_server;
pub mod kube_client;
pub mod kube_error;
pub mod kubelet_session;
pub mod mount_sources;
// The node-lock protocol's pure steps live in hami-node-lock; old paths kept.
pub use hami_node_lock::{lock_attempt, lock_retry};
pub mod node_lock_client;
pub mod node_pods;
pub mod node_register;
pub mod pod_choice;
pub mod pod_commit;
pub mod publisher_loop;
pub mod refresh_schedule;
pub mod session_rules;
pub mod whole_card_holdings;
