//! API errors as one readable line, no kube-rs debug dump (it reached kube-scheduler's pod
//! conditions and Events): plugin-core's, shared with the DRA driver.

pub use hami_plugin_core::kube_error::*;
