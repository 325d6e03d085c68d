//! Serving kubelet: bind the plugin socket, register with `kubelet.sock`, and start over
//! when kubelet restarts. Shared with the NVIDIA plugin (`hami-plugin-core`); re-exported
//! so `crate::kubelet_session` keeps its paths.

pub use hami_plugin_core::kubelet_session::{SessionConfig, register_once, run_sessions};
