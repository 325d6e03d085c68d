//! The NVIDIA device plugin's integration tests, one binary: the Allocate planner on plain
//! data, the `nvidia-device-plugin` binary end to end (stand-in NVML, embedded API server,
//! simulated kubelet over real unix sockets), the full stack with the real scheduler,
//! whole-card holdings, and XID health.

mod allocate_plan;
mod e2e;
mod full_stack;
mod whole_card_holdings;
mod xid_health;
