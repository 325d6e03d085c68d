//! Every wire format of hami-rs, as pure functions over plain data (no I/O, no async).
//!
//! We speak HAMi's protocol byte for byte (SPEC §2) so operators can mix our components
//! with the reference's. No other crate parses an annotation or env value by hand.
//!
//! | module | format |
//! |---|---|
//! | [`names`] | resource names, annotation keys, env names (§1, §2) |
//! | [`node_register`] | `hami.io/node-{amd,nvidia}-register` JSON (§2.1) — feature `json` |
//! | [`device_list`] | `*-devices-to-allocate` / `*-devices-allocated` (§2.2) |
//! | [`cu_allocated`] | `hami.io/amd-cu-allocated` (§2.3) — feature `json` |
//! | [`defrag_reservation`] | `reservation.defrag.hami.io/<pod uid>`: a target slice `hami defrag apply` holds for a moved pod's owner (issue 32) — feature `json` |
//! | [`handshake`] | `hami.io/node-handshake-{amd,nvidia}`: the plugins' register heartbeat |
//! | [`node_lock`] | `hami.io/mutex.lock`, lock decisions, bind phases (§2.3, §2.4) |
//! | [`cu_list`] | CU id lists and `HSA_CU_MASK` (§2.5) |
//! | [`dns_name`] | Kubernetes object names (RFC 1123 labels and subdomains), checked before a foreign name goes into an API URL |
//! | [`exposition`] | `/metrics` bodies: `Accept` negotiation, OpenMetrics → Prometheus text 0.0.4 |
//! | [`scrape`] | reading samples of a `/metrics` or `/federate` body (the web UI) |
//! | [`hook_config`] | the per-container read-only hook configuration (issue 14) |
//! | [`capacity`] | DRA capacity quantities (`64Gi`, `104`): ResourceSlices, `consumedCapacity` |
//! | [`dra`] | the AMD DRA driver's names: driver, capacities, status data keys, node mode label |
//! | [`memory_limit`] | `HIP_DEVICE_MEMORY_LIMIT_<i>` and friends (§2.7) |
//! | [`identity`] | AMD SMI UUID, ROCr id, partition ids, kubelet device ids (§2.8) |
//! | [`placement`] | which pods the scheduler placed, whose allocation annotations count (D-4) — feature `k8s` |
//! | [`requests`] | what a pod asks for, defaults and validation (§1) — feature `k8s` |
//! | [`selection`] | type/uuid filters, NUMA/XGMI binding, policies (§1) |
//! | [`run_mapping`] | D-5: which run of a `*-devices-to-allocate` list one kubelet Allocate consumes (moved from plugin-core, so the vendor cores need no shell crate) |
//! | [`container_plan`] | what one container gets from Allocate (env, device nodes, mounts, CDI names), plain data shared by both plugins' cores |
//! | [`whole_cards`] | whole-card fallback holdings of pods HAMi did not place (`hami.io/<vendor>-whole-cards`), and the rule that counts them (issue 26) |
//!
//! Without default features the crate needs only `thiserror`, so the hooks can link it.

pub mod capacity;
pub mod container_plan;
pub mod cu_list;
pub mod device_list;
pub mod dns_name;
pub mod dra;
pub mod exposition;
pub mod handshake;
pub mod hook_config;
pub mod identity;
pub mod memory_limit;
pub mod names;
pub mod node_lock;
pub mod quantity;
pub mod rfc3339;
pub mod run_mapping;
pub mod scrape;
pub mod selection;
pub mod whole_cards;

#[cfg(feature = "json")]
pub mod cu_allocated;
#[cfg(feature = "json")]
pub mod defrag_reservation;
#[cfg(feature = "json")]
pub mod node_register;
#[cfg(feature = "k8s")]
pub mod placement;
#[cfg(feature = "k8s")]
pub mod requests;
