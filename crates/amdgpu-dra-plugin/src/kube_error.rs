//! API errors as one readable line (kubelet copies a failed prepare's error into the pod's
//! Events): plugin-core's, shared with the scheduler.

pub use hami_plugin_core::kube_error::*;
