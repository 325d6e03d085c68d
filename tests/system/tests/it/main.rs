//! The whole-system tests, one binary: each component under its shipped ServiceAccount and
//! RBAC against the embedded API server with authentication on (`least_privilege*`: AMD,
//! NVIDIA — its body in a child process, the stand-in NVML's settings being environment —,
//! the web UI, the DRA mode), and the web UI in Chromium against the demo's cluster
//! (`browser`), and sliced AMD pods in real containers (`containerd`: containerd + runc,
//! the real hook), and `hami defrag` moving a replica on the demo's cluster (`defrag`), and
//! the web UI's figures set beside `hami status`'s and the monitors' (`console_numbers`).
//! Their shared setup is this package's library (`hami_system_tests`).

mod browser;
mod console_numbers;
mod containerd;
mod defrag;
mod least_privilege;
mod least_privilege_dra;
mod least_privilege_nvidia;
mod least_privilege_webui;
mod whatif_live_browser;

/// The browser test runs the demo's whole cluster and Chromium: it holds this for writing,
/// the least-privilege tests for reading, so it runs alone (each file was its own binary
/// before, and those ran one after another).
static MACHINE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());
