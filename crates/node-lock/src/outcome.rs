//! What a node-lock operation ends with: how the lock was obtained, what a release did, and
//! the errors whose messages reach kube-scheduler, kubelet and Events as they are.

use crate::TakeOverReason;

/// How the lock was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeOutcome {
    /// The node was unlocked; now it is ours.
    Taken,
    /// The lock was already this pod's.
    AlreadyHeld,
    /// Replaced `previous` (expired, future-stamped, unreadable, or its owner is gone).
    TookOver {
        /// Why the previous lock could be replaced.
        reason: TakeOverReason,
        /// The previous lock's value.
        previous: String,
    },
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The lock was ours and is gone.
    Released,
    /// Not ours (or no lock): left alone.
    NotHeld,
}

/// Why a lock operation failed; the messages go to kube-scheduler and Events as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    #[error(
        "node {node} is locked by {owner} since {age_seconds}s; gave up waiting after {attempts} tries (the lock expires after {expiry_seconds}s)"
    )]
    /// Another pod held the lock until the deadline.
    Busy {
        /// The node whose lock was wanted.
        node: String,
        /// Who holds the lock, as the lock names it.
        owner: String,
        /// How long it had held it when last read.
        age_seconds: i64,
        /// Age after which a lock may be taken over.
        expiry_seconds: i64,
        /// How many tries were made.
        attempts: u32,
    },
    #[error(
        "{what} on node {node}: the deadline passed after {attempts} tries (last error: {last})"
    )]
    /// Transient errors or conflicts until the deadline.
    Deadline {
        /// The node whose lock was wanted.
        node: String,
        /// What was being done, e.g. `taking the node lock`.
        what: &'static str,
        /// How many tries were made.
        attempts: u32,
        /// The last error seen.
        last: String,
    },
    /// The API server refused in a way retrying cannot fix (403, 404, 422 …).
    #[error("{what} on node {node}: {error}")]
    Refused {
        /// The node whose lock was wanted.
        node: String,
        /// What was being done, e.g. `taking the node lock`.
        what: &'static str,
        /// The API server's error.
        error: String,
    },
}
