//! One attempt at taking a node lock, as steps (pure): from the lock value read, either
//! the outcome, a busy lock, a question for the API server (does the owner pod still
//! exist?) or a write. The shell (plugin-core's `NodeLockClient::acquire`) reads the node,
//! asks [`first_step`], asks the API server when told to and then [`after_owner_check`],
//! and writes when told to.
//!
//! The rules (D-2): what the pod may do is `hami_protocol::node_lock::decide`, first as if
//! the owner exists; only a lock that would otherwise stay busy costs a GET of its owner,
//! and never from a cache (a stale "gone" would double-book a GPU); a gone owner's lock is
//! taken over.

use crate::lock_retry::Attempt;
use crate::outcome::TakeOutcome;
use crate::{LockDecision, PodRef, decide};

/// How the attempt ends, once decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to write: the attempt ends with this outcome.
    Done(TakeOutcome),
    /// Another pod holds the lock: the attempt failed this way.
    Failed(Attempt),
    /// Write our lock (conditional on the node's resourceVersion); on success the attempt
    /// ends with this outcome.
    Write(TakeOutcome),
}

/// What the attempt does after reading the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstStep {
    /// Decided without asking.
    Then(Step),
    /// Ask the API server whether this pod exists, then [`after_owner_check`].
    CheckOwner(PodRef),
}

/// The step after reading the lock value `current` at unix second `now`.
pub fn first_step(current: Option<&str>, pod: &PodRef, now: i64, expiry_seconds: i64) -> FirstStep {
    let decision = decide(current, pod, now, expiry_seconds, |_| true);
    if let LockDecision::Busy {
        owner: Some(owner), ..
    } = &decision
    {
        return FirstStep::CheckOwner(owner.clone());
    }
    FirstStep::Then(step_of(decision, current))
}

/// The step once the API server said whether the owner exists (`owner_exists`), for the
/// lock value `current` read at `now`.
pub fn after_owner_check(
    current: Option<&str>,
    pod: &PodRef,
    now: i64,
    expiry_seconds: i64,
    owner_exists: bool,
) -> Step {
    step_of(
        decide(current, pod, now, expiry_seconds, |_| owner_exists),
        current,
    )
}

fn step_of(decision: LockDecision, current: Option<&str>) -> Step {
    match decision {
        LockDecision::AlreadyHeld => Step::Done(TakeOutcome::AlreadyHeld),
        LockDecision::Busy { owner, age_seconds } => Step::Failed(Attempt::Busy {
            owner: owner
                .map(|o| o.to_string())
                .unwrap_or_else(|| "an unnamed owner".into()),
            age_seconds,
        }),
        LockDecision::Take => Step::Write(TakeOutcome::Taken),
        LockDecision::TakeOver { reason } => Step::Write(TakeOutcome::TookOver {
            reason,
            previous: current.map(str::to_owned).unwrap_or_default(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NodeLock, TakeOverReason};
    use proptest::prelude::*;

    const NOW: i64 = 1_780_000_000;

    fn lock(at: i64, owner: &PodRef) -> String {
        NodeLock::new(at, owner.clone()).encode().unwrap()
    }

    #[test]
    fn free_own_and_expired_locks_need_no_question() {
        let me = PodRef::new("ns", "me");
        let other = PodRef::new("ns", "other");
        assert_eq!(
            first_step(None, &me, NOW, 60),
            FirstStep::Then(Step::Write(TakeOutcome::Taken))
        );
        let mine = lock(NOW - 5, &me);
        assert_eq!(
            first_step(Some(&mine), &me, NOW, 60),
            FirstStep::Then(Step::Done(TakeOutcome::AlreadyHeld))
        );
        let old = lock(NOW - 61, &other);
        assert_eq!(
            first_step(Some(&old), &me, NOW, 60),
            FirstStep::Then(Step::Write(TakeOutcome::TookOver {
                reason: TakeOverReason::Expired,
                previous: old.clone()
            }))
        );
        assert_eq!(
            first_step(Some("garbage"), &me, NOW, 60),
            FirstStep::Then(Step::Write(TakeOutcome::TookOver {
                reason: TakeOverReason::Unreadable,
                previous: "garbage".into()
            }))
        );
    }

    #[test]
    fn a_busy_lock_asks_for_its_owner_and_a_gone_owner_is_taken_over() {
        let me = PodRef::new("ns", "me");
        let other = PodRef::new("ns", "other");
        let held = lock(NOW - 5, &other);
        assert_eq!(
            first_step(Some(&held), &me, NOW, 60),
            FirstStep::CheckOwner(other.clone())
        );
        assert_eq!(
            after_owner_check(Some(&held), &me, NOW, 60, true),
            Step::Failed(Attempt::Busy {
                owner: other.to_string(),
                age_seconds: 5
            })
        );
        assert_eq!(
            after_owner_check(Some(&held), &me, NOW, 60, false),
            Step::Write(TakeOutcome::TookOver {
                reason: TakeOverReason::OwnerGone,
                previous: held.clone()
            })
        );
    }

    proptest! {
        /// A lock held by another, unexpired, existing owner is never written over; only
        /// a lock someone else holds costs an owner check.
        #[test]
        fn a_live_owners_fresh_lock_is_never_written(age in -59i64..60, exists in any::<bool>(), same in any::<bool>()) {
            let me = PodRef::new("ns", "me");
            let holder = if same { me.clone() } else { PodRef::new("ns", "other") };
            let value = lock(NOW - age, &holder);
            let first = first_step(Some(&value), &me, NOW, 60);
            if same {
                prop_assert_eq!(first, FirstStep::Then(Step::Done(TakeOutcome::AlreadyHeld)));
                return Ok(());
            }
            prop_assert_eq!(&first, &FirstStep::CheckOwner(holder));
            let then = after_owner_check(Some(&value), &me, NOW, 60, exists);
            prop_assert_eq!(matches!(then, Step::Write(_)), !exists);
        }
    }
}
