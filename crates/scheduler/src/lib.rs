//! The hami-rs scheduler: a kube-scheduler extender (filter, bind) and a mutating webhook.
//!
//! Pure cores (no I/O): [`snapshot`] (what a node offers and what is used), [`usage`]
//! (what a pod holds), [`fit`] (which node and GPUs), [`admission`] (webhook decisions),
//! [`dra_claims`] (the webhook's DRA mode: claim templates from HAMi's AMD requests);
//! the shells' decisions: [`watch_cycle`] (relist or watch again, and the waits),
//! [`watch_health`] (is a view live), [`leader_term`] (how long a replica leads), [`backoff`],
//! [`bind_plan`] (what bind does with a pod), [`reload_poll`] (when TLS files reload),
//! [`dra_sweep`] (which claim templates to delete).

pub mod admission;
pub mod backoff;
pub mod bind_plan;
pub mod cert_pin;
pub mod config;
pub mod dra_claims;
pub mod dra_sweep;
pub mod dra_templates;
pub mod extender;
pub mod extender_client;
pub mod fit;
pub mod forward;
pub mod heartbeat;
pub mod http;
pub mod informer;
pub mod kube_error;
pub mod leader;
pub mod leader_term;
pub mod metrics;
pub mod reload_poll;
pub mod runtime;
pub mod server;
pub mod snapshot;
pub mod state;
pub mod usage;
pub mod watch_cycle;
pub mod watch_health;
