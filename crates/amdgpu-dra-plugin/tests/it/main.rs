//! The DRA driver's integration tests, one binary: the binary's own subcommands, claim
//! status and ResourceSlice publishing against the embedded API server, and kubelet's
//! calls over real unix sockets (registration, prepare/unprepare, checkpoint files, claims
//! at once, dmem limits).

mod binary;
mod checkpoint_files;
mod claim_concurrency;
mod claim_status;
mod dmem_limits;
mod kubelet_calls;
mod kubelet_support;
mod slice_publishing;
