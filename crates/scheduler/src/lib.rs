//! The hami-rs scheduler: a kube-scheduler extender (filter, bind) and a mutating webhook.
//!
//! Pure cores (no I/O): [`snapshot`] (what a node offers and what is used), [`usage`]
//! (what a pod holds), [`fit`] (which node and GPUs), [`admission`] (webhook decisions).

pub mod admission;
pub mod config;
pub mod extender;
pub mod extender_client;
pub mod fit;
pub mod http;
pub mod leader;
pub mod lock_client;
pub mod metrics;
pub mod runtime;
pub mod server;
pub mod sim_kube_scheduler;
pub mod snapshot;
pub mod state;
pub mod usage;
