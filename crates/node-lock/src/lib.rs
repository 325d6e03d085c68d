//! The node lock `hami.io/mutex.lock` (SPEC §2.4, D-2) as a pure core: what one attempt at
//! taking the lock does ([`lock_attempt`]: the outcome, a busy lock, a question for the API
//! server, or a write), what to do after a failed attempt ([`lock_retry`]: wait, or give up
//! with which error), when to try again ([`backoff`]), and how an operation ends
//! ([`outcome`]). No I/O, no async, no clock: the shells (plugin-core's
//! `node_lock_client`, used by the scheduler's bind and both plugins' release) read and
//! write the Node, sleep, and pass the time and a jitter in.
//!
//! The lock value's codec and the decision over it ([`NodeLock`], [`PodRef`], [`decide`])
//! are `hami_protocol::node_lock`'s, re-exported here: the protocol crate owns every wire
//! format, and its `PodRef` and timestamp codec serve the other annotations too, so moving
//! them here would make the protocol depend on this crate and this crate on the protocol.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod lock_attempt;
pub mod lock_retry;
pub mod outcome;

pub use backoff::{Backoff, RetryPolicy};
pub use hami_protocol::node_lock::{
    DEFAULT_EXPIRY_SECONDS, LockDecision, NodeLock, NodeLockError, PodRef, TakeOverReason, decide,
};
pub use outcome::{LockError, Released, TakeOutcome};
