//! Whole-system reliability tests (issue 18): the chaos harness with an invariant ledger
//! and the soak, both over the real components wired as `hami demo` wires them, in one
//! process so faults can reach inside (see README.md).

pub mod chaos;
mod controller;
pub mod dra_node;
mod injector;
pub mod ledger;
pub mod ledger_dra;
pub mod ledger_hooks;
mod ledger_loop;
pub mod proxy;
pub mod rng;
pub mod schedule;
mod sim_node;
pub mod soak;
pub mod stack;
pub mod workload;
