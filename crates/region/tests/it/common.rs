//! What the region's tests share: the lock that keeps a spawned child from holding a
//! dropped session's record locks.
//!
//! Between fork and exec a child holds a copy of every open file description of this
//! process, and with them the record locks (open-file-description locks) of every session
//! open at that moment: a session a test has just dropped or abandoned still looks alive
//! until the child execs. The tests that spawn processes take [`spawning`]; the tests that
//! expect a dropped session's locks to be gone share [`no_spawns`].

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

static SPAWNS: RwLock<()> = RwLock::new(());

/// Held by a test that spawns processes, for its whole run.
pub(crate) fn spawning() -> RwLockWriteGuard<'static, ()> {
    SPAWNS.write().unwrap_or_else(PoisonError::into_inner)
}

/// Held by a test whose sessions' locks must go when they are dropped.
pub(crate) fn no_spawns() -> RwLockReadGuard<'static, ()> {
    SPAWNS.read().unwrap_or_else(PoisonError::into_inner)
}
