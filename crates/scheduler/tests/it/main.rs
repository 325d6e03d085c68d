//! The scheduler's integration tests, one binary: the extender, the webhook (D-4, the DRA
//! mode), bind and the node lock, leader election and forwarding between replicas, watch
//! supervision, node liveness, TLS reloads, the defragmentation gauges, namespace quotas
//! (and install.md's quota section, as written) and the HTTP surface, on the embedded API
//! server with the simulated kube-scheduler in front; `pod_memory` runs the real binary.
//! [`common`] is their shared setup.

mod common;
mod defrag_metrics;
mod dra_webhook;
mod e2e;
mod ha;
mod ha_forwarding;
mod http_api;
mod install_doc_quota;
mod leader_catch_up;
mod leader_handover;
mod lease_skew;
mod node_liveness;
mod node_lock;
mod nominated;
mod pod_memory;
mod preempt;
mod preempt_e2e;
mod quota;
mod reservations;
mod tls_reload;
mod watch_supervision;
mod webhook_d4;
mod webhook_listener;
