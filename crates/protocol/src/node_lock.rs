//! The node lock `hami.io/mutex.lock` (SPEC §2.4, D-2): `<RFC3339 UTC>,<namespace>,<pod>`.
//!
//! The decisions (may this pod take the lock? is it expired?) are pure functions here; the
//! patches that carry `metadata.resourceVersion` live in the shells.

use core::fmt;

use crate::rfc3339;

/// D-2: locks older than this may be taken over (the reference uses 5 minutes).
pub const DEFAULT_EXPIRY_SECONDS: i64 = 60;

/// A parsed lock value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLock {
    /// Unix seconds when the lock was taken.
    pub taken_at: i64,
    /// The owning pod; `None` for the legacy value, which is the timestamp alone.
    pub owner: Option<PodRef>,
}

/// Namespace and name of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodRef {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
}

impl PodRef {
    /// A reference to pod `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a lock value could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeLockError {
    /// The timestamp part cannot be read.
    #[error("node lock {value:?}: {source}")]
    Timestamp {
        /// The lock value as read.
        value: String,
        /// What is wrong with its time.
        #[source]
        source: rfc3339::TimestampError,
    },
    /// Not `<RFC3339 time>,<namespace>,<pod name>`; the value as read.
    #[error("node lock {0:?} is not <RFC3339 time>,<namespace>,<pod name>")]
    Shape(String),
    /// The owner cannot be written without breaking the format.
    #[error(
        "pod reference {0} cannot be written into a node lock: namespace and name must be non-empty and free of commas"
    )]
    BadOwner(PodRef),
}

impl NodeLock {
    /// A lock taken at unix second `taken_at` by `owner`.
    pub fn new(taken_at: i64, owner: PodRef) -> Self {
        Self {
            taken_at,
            owner: Some(owner),
        }
    }

    /// Reads a lock value.
    pub fn parse(value: &str) -> Result<Self, NodeLockError> {
        let mut parts = value.split(',');
        let time = parts.next().unwrap_or_default();
        let taken_at = rfc3339::parse(time).map_err(|source| NodeLockError::Timestamp {
            value: value.to_owned(),
            source,
        })?;
        let owner = match (parts.next(), parts.next(), parts.next()) {
            (None, _, _) => None,
            (Some(ns), Some(name), None) if !ns.is_empty() && !name.is_empty() => {
                Some(PodRef::new(ns, name))
            }
            _ => return Err(NodeLockError::Shape(value.to_owned())),
        };
        Ok(Self { taken_at, owner })
    }

    /// Writes the lock value (always UTC).
    pub fn encode(&self) -> Result<String, NodeLockError> {
        let time = rfc3339::format_utc(self.taken_at);
        match &self.owner {
            None => Ok(time),
            Some(owner) => {
                let bad = |s: &str| s.is_empty() || s.contains(',');
                if bad(&owner.namespace) || bad(&owner.name) {
                    return Err(NodeLockError::BadOwner(owner.clone()));
                }
                Ok(format!("{time},{},{}", owner.namespace, owner.name))
            }
        }
    }

    /// Whether the lock is older than `expiry_seconds` at `now`.
    pub fn is_expired(&self, now: i64, expiry_seconds: i64) -> bool {
        now.saturating_sub(self.taken_at) > expiry_seconds
    }

    /// Whether the lock is stamped further in the future than the expiry itself: no
    /// plausible clock skew explains that (a writer that far ahead breaks the expiry rule
    /// anyway), and honouring it would block the node until the stamp plus the expiry.
    pub fn is_implausibly_future(&self, now: i64, expiry_seconds: i64) -> bool {
        self.taken_at.saturating_sub(now) > expiry_seconds
    }

    /// Whether `pod` holds this lock (a legacy lock has no owner, so nobody does).
    pub fn is_owned_by(&self, pod: &PodRef) -> bool {
        self.owner.as_ref() == Some(pod)
    }
}

/// What a pod that wants the lock may do, given the current value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockDecision {
    /// No lock: take it.
    Take,
    /// This pod already holds it (re-entrant).
    AlreadyHeld,
    /// Expired, stamped implausibly far in the future, unreadable, or its owner is gone:
    /// replace it.
    TakeOver {
        /// Why it may be replaced.
        reason: TakeOverReason,
    },
    /// Someone else holds it; wait (bounded) and retry.
    Busy {
        /// The holder; `None` for a legacy lock.
        owner: Option<PodRef>,
        /// Seconds since it was taken (negative when stamped ahead of our clock).
        age_seconds: i64,
    },
}

/// Why a lock held by someone else may still be replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeOverReason {
    /// Older than the expiry.
    Expired,
    /// Stamped more than the expiry ahead of our clock (clock skew or a bad writer).
    FutureStamp,
    /// Its owner pod no longer exists (asked of the API server by the shell).
    OwnerGone,
    /// The value cannot be parsed: nobody can release it, so treat it as abandoned.
    Unreadable,
}

/// Decides what `pod` may do with the lock value `current` at `now`.
/// `owner_exists` answers whether the lock's owner pod still exists (the shell asks the
/// informer cache or the API server).
pub fn decide(
    current: Option<&str>,
    pod: &PodRef,
    now: i64,
    expiry_seconds: i64,
    owner_exists: impl FnOnce(&PodRef) -> bool,
) -> LockDecision {
    let Some(value) = current else {
        return LockDecision::Take;
    };
    let Ok(lock) = NodeLock::parse(value) else {
        return LockDecision::TakeOver {
            reason: TakeOverReason::Unreadable,
        };
    };
    if lock.is_owned_by(pod) {
        return LockDecision::AlreadyHeld;
    }
    if lock.is_expired(now, expiry_seconds) {
        return LockDecision::TakeOver {
            reason: TakeOverReason::Expired,
        };
    }
    if lock.is_implausibly_future(now, expiry_seconds) {
        return LockDecision::TakeOver {
            reason: TakeOverReason::FutureStamp,
        };
    }
    if let Some(owner) = &lock.owner
        && !owner_exists(owner)
    {
        return LockDecision::TakeOver {
            reason: TakeOverReason::OwnerGone,
        };
    }
    LockDecision::Busy {
        owner: lock.owner,
        age_seconds: now.saturating_sub(lock.taken_at),
    }
}

/// The bind phase of a pod (`hami.io/bind-phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BindPhase {
    /// Written by the scheduler at bind.
    Allocating,
    /// Written by the plugin when the last container of the pod is allocated.
    Success,
    /// Written by the plugin when Allocate fails.
    Failed,
}

/// A `hami.io/bind-phase` value that is none of the three; the value as read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bind phase {0:?} is not one of allocating, success, failed")]
pub struct BindPhaseError(pub String);

impl BindPhase {
    /// The annotation value.
    pub const fn as_str(self) -> &'static str {
        match self {
            BindPhase::Allocating => "allocating",
            BindPhase::Success => "success",
            BindPhase::Failed => "failed",
        }
    }

    /// Reads an annotation value (exact spelling, lower case).
    pub fn parse(text: &str) -> Result<Self, BindPhaseError> {
        match text {
            "allocating" => Ok(BindPhase::Allocating),
            "success" => Ok(BindPhase::Success),
            "failed" => Ok(BindPhase::Failed),
            other => Err(BindPhaseError(other.to_owned())),
        }
    }
}

impl fmt::Display for BindPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reference_value() {
        let lock = NodeLock::parse("2026-08-21T06:20:39Z,default,job-1").unwrap();
        assert_eq!(lock.owner, Some(PodRef::new("default", "job-1")));
        assert_eq!(lock.encode().unwrap(), "2026-08-21T06:20:39Z,default,job-1");
        // Local time with offset, as the reference writes it, is read and re-written in UTC.
        let local = NodeLock::parse("2026-08-21T14:20:39+08:00,default,job-1").unwrap();
        assert_eq!(local, lock);
        // Legacy: the timestamp alone.
        let legacy = NodeLock::parse("2026-08-21T06:20:39Z").unwrap();
        assert_eq!(legacy.owner, None);
        assert_eq!(legacy.encode().unwrap(), "2026-08-21T06:20:39Z");
    }

    #[test]
    fn bad_values() {
        for bad in [
            "",
            "yesterday,default,p",
            "2026-08-21T06:20:39Z,default",
            "2026-08-21T06:20:39Z,default,p,extra",
            "2026-08-21T06:20:39Z,,p",
            "2026-08-21T06:20:39Z,ns,",
        ] {
            assert!(NodeLock::parse(bad).is_err(), "{bad}");
        }
        let err = NodeLock::new(0, PodRef::new("a,b", "p"))
            .encode()
            .unwrap_err();
        assert!(matches!(err, NodeLockError::BadOwner(_)));
    }

    #[test]
    fn decisions() {
        let me = PodRef::new("default", "me");
        let other = "2026-08-21T06:20:39Z,default,other";
        let t0 = 1_787_293_239;
        let exists = |_: &PodRef| true;
        assert_eq!(decide(None, &me, t0, 60, exists), LockDecision::Take);
        assert_eq!(
            decide(
                Some("2026-08-21T06:20:39Z,default,me"),
                &me,
                t0 + 1000,
                60,
                exists
            ),
            LockDecision::AlreadyHeld
        );
        assert_eq!(
            decide(Some(other), &me, t0 + 10, 60, exists),
            LockDecision::Busy {
                owner: Some(PodRef::new("default", "other")),
                age_seconds: 10
            }
        );
        assert_eq!(
            decide(Some(other), &me, t0 + 61, 60, exists),
            LockDecision::TakeOver {
                reason: TakeOverReason::Expired
            }
        );
        assert_eq!(
            decide(Some(other), &me, t0 + 10, 60, |_| false),
            LockDecision::TakeOver {
                reason: TakeOverReason::OwnerGone
            }
        );
        assert_eq!(
            decide(Some("garbage"), &me, t0, 60, exists),
            LockDecision::TakeOver {
                reason: TakeOverReason::Unreadable
            }
        );
        // Stamped in the future: a little (a peer's clock runs ahead) is a live lock; more
        // than the expiry ahead ("since -576s") is treated as expired, not waited for.
        assert_eq!(
            decide(Some(other), &me, t0 - 5, 60, exists),
            LockDecision::Busy {
                owner: Some(PodRef::new("default", "other")),
                age_seconds: -5
            }
        );
        assert_eq!(
            decide(Some(other), &me, t0 - 60, 60, exists),
            LockDecision::Busy {
                owner: Some(PodRef::new("default", "other")),
                age_seconds: -60
            }
        );
        assert_eq!(
            decide(Some(other), &me, t0 - 576, 60, exists),
            LockDecision::TakeOver {
                reason: TakeOverReason::FutureStamp
            }
        );
        assert!(matches!(
            decide(Some("2026-08-21T06:20:39Z"), &me, t0 - 61, 60, |_| true),
            LockDecision::TakeOver {
                reason: TakeOverReason::FutureStamp
            }
        ));
        // A legacy lock has no owner to look up: only expiry frees it.
        assert!(matches!(
            decide(Some("2026-08-21T06:20:39Z"), &me, t0 + 5, 60, |_| false),
            LockDecision::Busy { owner: None, .. }
        ));
    }

    #[test]
    fn bind_phases() {
        for phase in [BindPhase::Allocating, BindPhase::Success, BindPhase::Failed] {
            assert_eq!(BindPhase::parse(phase.as_str()), Ok(phase));
        }
        assert!(BindPhase::parse("Success").is_err());
        assert!(BindPhase::parse("").is_err());
    }

    proptest! {
        #[test]
        fn round_trip(t in 0i64..253_402_300_799, ns in "[a-z0-9-]{1,20}", name in "[a-z0-9.-]{1,40}") {
            let lock = NodeLock::new(t, PodRef::new(ns, name));
            let text = lock.encode().unwrap();
            let back = NodeLock::parse(&text).unwrap();
            prop_assert_eq!(&back, &lock);
            prop_assert_eq!(back.encode().unwrap(), text);
        }

        /// A lock is live only while its age on our clock is within ±expiry.
        #[test]
        fn live_only_within_expiry(age in -1000i64..1000, expiry in 1i64..300) {
            let t = 1_787_293_239;
            let value = NodeLock::new(t, PodRef::new("ns", "other")).encode().unwrap();
            let d = decide(Some(&value), &PodRef::new("ns", "me"), t + age, expiry, |_| true);
            let live = matches!(d, LockDecision::Busy { .. });
            prop_assert_eq!(live, age.abs() <= expiry, "{:?}", d);
        }

        #[test]
        fn total(text in ".{0,80}") {
            let _ = NodeLock::parse(&text);
            let _ = BindPhase::parse(&text);
        }
    }
}
