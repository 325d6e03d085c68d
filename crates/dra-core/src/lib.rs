//! Pure cores of the AMD DRA driver (issue 20): plain functions over plain data, no async,
//! no I/O. The kubelet plugin (`amdgpu-dra-plugin`) is the shell around them.
//!
//! The `resource.k8s.io/v1` objects are our own serde types (`api`), with upstream's JSON
//! field names, so this crate does not depend on the workspace's k8s-openapi version feature.
//!
//! The model of kube-scheduler's structured allocator and its CEL selector reader are
//! stand-ins, not driver code: they live in `sim/structured-allocation`.

pub mod api;
pub mod cdi_claim;
pub mod claim_identity;
pub mod prepare;
/// DRA capacity quantities (in the protocol crate, which owns every wire format).
pub use hami_protocol::capacity as quantity;
pub mod slice;

/// The driver name (the protocol crate owns it).
pub use hami_protocol::dra::DRIVER;
