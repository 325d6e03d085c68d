//! Whole-system tests of hami-rs (no library code): the shipped manifests' ServiceAccounts,
//! RBAC and settings driving every component, each under its own account, against the
//! embedded API server with authentication and RBAC on and the simulated kubelets
//! (`tests/least_privilege*.rs`). Kept out of the product crates so that what ships
//! (`crates/`) never depends on the stand-ins (`sim/`).
