//! The scheduler's decisions, as plain functions over plain data: no async runtime, no
//! Kubernetes client, no file or network I/O (the compiler keeps it so: this crate's
//! dependencies are the protocol crate, the Kubernetes types and serde; the shell,
//! `hami-scheduler`, does the I/O and re-exports these modules at their old paths).
//!
//! - What the cluster offers and holds: [`snapshot`] (what a node offers and what is used),
//!   [`usage`] (what a pod holds), [`state`] (the cluster as the informers last saw it),
//!   [`heartbeat`] (is a node's device plugin still refreshing its registration).
//! - Decisions: [`fit`] (which node and GPUs), [`extender`] (the extender's wire types and
//!   the filter decision), [`bind_plan`] (what bind does with a pod), [`admission`] (webhook
//!   decisions), [`review_codec`] (one AdmissionReview body in, the answer out),
//!   [`dra_claims`] (the webhook's DRA mode: claim templates from HAMi's AMD requests),
//!   [`dra_sweep`] (which claim templates to delete), [`quota`] (namespace quotas on GPU
//!   slices; [`quota_book`]: what each namespace uses, kept in the state; [`quota_gate`]:
//!   where a quota stops a pod, at admission and in Filter), [`preemption`] (which slices a
//!   higher-priority pod evicts; [`victim_facts`]: what it knows of the pods holding
//!   slices; [`nominated`]: the slices pods nominated after a preemption hold meanwhile;
//!   [`reservations`]: the target slices `hami defrag apply` holds for moved pods' owners).
//! - The shells' timing: [`watch_cycle`] (relist or watch again, and the waits),
//!   [`watch_health`] (is a view live), [`leader_term`] (how long a replica leads),
//!   [`backoff`], [`reload_poll`] (when TLS files reload).

#![forbid(unsafe_code)]

pub mod admission;
pub mod backoff;
pub mod bind_plan;
pub mod dra_claims;
pub mod dra_sweep;
pub mod extender;
pub mod fit;
pub mod heartbeat;
pub mod leader_term;
pub mod nominated;
pub mod preemption;
pub mod quota;
pub mod quota_admission;
pub mod quota_book;
pub mod quota_gate;
pub mod reload_poll;
pub mod reservations;
pub mod review_codec;
pub mod snapshot;
pub mod state;
pub mod usage;
pub mod victim_facts;
pub mod watch_cycle;
pub mod watch_health;
