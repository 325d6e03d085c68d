//! The hami-rs scheduler: a kube-scheduler extender (filter, bind) and a mutating webhook.
//!
//! This crate is the shell: informers ([`informer`]), the bind path ([`runtime`]), leader
//! election ([`leader`]), the HTTP routes ([`http`]) and listeners ([`listener`]), DRA claim
//! templates ([`dra_templates`]), forwarding to the leader ([`forward`]), metrics (the
//! defragmentation gauges in [`defrag_metrics`]), config.
//! Its decisions live in the pure crate `hami-scheduler-core`, re-exported here at the
//! paths they always had: [`snapshot`], [`usage`], [`fit`], [`state`], [`heartbeat`],
//! [`extender`], [`bind_plan`], [`admission`], [`review_codec`], [`dra_claims`],
//! [`dra_sweep`], [`quota`], [`quota_admission`], [`quota_book`], [`quota_gate`],
//! [`watch_cycle`], [`watch_health`], [`leader_term`], [`backoff`], [`reload_poll`].

pub use hami_scheduler_core::{
    admission, backoff, bind_plan, dra_claims, dra_sweep, extender, fit, heartbeat, leader_term,
    quota, quota_admission, quota_book, quota_gate, reload_poll, review_codec, snapshot, state,
    usage, watch_cycle, watch_health,
};

pub mod cert_pin;
pub mod config;
pub mod defrag_metrics;
pub mod dra_templates;
pub mod dra_wait;
pub mod extender_client;
pub mod forward;
pub mod http;
pub mod informer;
pub mod kube_error;
pub mod leader;
pub mod listener;
pub mod metrics;
pub mod preempt;
pub mod runtime;
pub mod server;
mod watch_errors;
