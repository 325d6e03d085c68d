//! The `hami` command's integration tests, one binary: each subcommand as a user runs it
//! (the real binary, its files, stdin and exit codes): `inspect`, `plan`, `status` and
//! `defrag plan` and `defrag apply` against the embedded API server, `ui`, and the subprograms `demo`,
//! `apiserver`, `kubelet-sim`, `workload`.

mod defrag;
mod defrag_apply;
mod inspect;
mod plan;
mod status;
mod subprograms;
mod ui;
