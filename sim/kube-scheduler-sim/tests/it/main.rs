//! The simulated kube-scheduler's integration tests, one binary: each module runs the
//! stand-in against the embedded API server (`sim/apiserver`). `claim_bookkeeping`: what the
//! claim controller keeps per pod lasts as long as the pod; `claim_record`: the pod's claim
//! record comes before placement and survives conflicts; `extended_resources`: KEP-5004
//! (a pod asking for `amd.com/gpu` placed through DRA); `common`: shared fixtures.

mod claim_bookkeeping;
mod claim_record;
mod common;
mod extended_resources;
