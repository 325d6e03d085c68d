//! The DRA mode's template lifecycle, decided without I/O: which of the webhook's
//! ResourceClaimTemplates the sweeper deletes, and the calls the webhook makes to hand one
//! out. The claims made from a template are owned by their pods and go with them (garbage
//! collector); only the shared, content-addressed templates need this.
//!
//! The race it closes: the sweeper of one replica lists a template nobody uses, another
//! replica's webhook reuses it (409 on create, same spec) and admits a pod naming it, and
//! the sweeper's delete lands before the pod is stored: the resourceclaim controller can
//! never make the pod's claim and the webhook is not called again (Pending for ever). So:
//! - the webhook stamps a reused template ([`hami_protocol::dra::LAST_USED_ANNOTATION`],
//!   a merge patch carrying the resourceVersion it read) before it answers, and creates it
//!   again when the stamp finds it gone ([`Ensure`]);
//! - the sweeper deletes only a template unreferenced for longer than the grace by its own
//!   clock, unchanged since it last looked, and not stamped within the grace
//!   ([`SweepBook::look`]), and deletes at the resourceVersion it listed, so a stamp written
//!   after its list fails the delete (409) instead of losing to it.
//!
//! A stamp rewritten within the second it was written is a no-op (no new version, as
//! upstream skips unchanged writes); it is then fresh to a sweeper whose clock is within
//! the grace of the webhook's, which is assumed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// `(namespace, name)` of a template.
pub type TemplateKey = (String, String);

/// How often the sweeper looks and how long a template may stay unreferenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepTuning {
    /// Between two looks (list templates and pods).
    pub interval: Duration,
    /// Unreferenced (and unstamped) for longer than this: deleted.
    pub grace: Duration,
}

impl Default for SweepTuning {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            grace: Duration::from_secs(600),
        }
    }
}

/// What one list showed of a managed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// `metadata.resourceVersion`: changes with every write, the webhook's stamp included.
    pub resource_version: String,
    /// Unix seconds of its [`hami_protocol::dra::LAST_USED_ANNOTATION`] stamp (absent or
    /// unreadable: `None`, and only the sweeper's own clock counts).
    pub last_used: Option<i64>,
}

/// The stamp's value as unix seconds (`None` when it is not an RFC 3339 time).
pub fn parse_last_used(value: &str) -> Option<i64> {
    hami_protocol::rfc3339::parse(value).ok()
}

/// The stamp's value for unix seconds `now`.
pub fn format_last_used(now: i64) -> String {
    hami_protocol::rfc3339::format_utc(now)
}

#[derive(Debug, Clone)]
struct Seen {
    since: Instant,
    version: String,
}

/// Since when each managed template has been seen unreferenced and unchanged.
#[derive(Debug, Clone, Default)]
pub struct SweepBook {
    unreferenced: BTreeMap<TemplateKey, Seen>,
}

impl SweepBook {
    /// One look: `templates` (the managed ones that exist, as listed), `referenced` (those
    /// some pod names, listed after the templates); `now` by this replica's clock,
    /// `now_unix` by the wall clock (to read stamps). Returns the templates to delete now,
    /// each at the version in `templates`; forgets those that are gone or referenced again.
    pub fn look(
        &mut self,
        templates: &BTreeMap<TemplateKey, Listed>,
        referenced: &BTreeSet<TemplateKey>,
        grace: Duration,
        now: Instant,
        now_unix: i64,
    ) -> Vec<TemplateKey> {
        self.unreferenced
            .retain(|k, _| templates.contains_key(k) && !referenced.contains(k));
        let mut delete = Vec::new();
        for (key, listed) in templates {
            if referenced.contains(key) {
                continue;
            }
            let fresh = || Seen {
                since: now,
                version: listed.resource_version.clone(),
            };
            let seen = self.unreferenced.entry(key.clone()).or_insert_with(fresh);
            if seen.version != listed.resource_version {
                // Written since the last look: stamped by a webhook, or made anew.
                *seen = fresh();
            }
            // A stamp from a replica whose clock is ahead reads as newer: kept longer.
            let stamped_within_grace = listed.last_used.is_some_and(|at| {
                u64::try_from(now_unix - at).map_or(true, |age| Duration::from_secs(age) <= grace)
            });
            if now.saturating_duration_since(seen.since) > grace && !stamped_within_grace {
                delete.push(key.clone());
            }
        }
        delete
    }

    /// A deleted template is forgotten.
    pub fn deleted(&mut self, key: &TemplateKey) {
        self.unreferenced.remove(key);
    }
}

/// How many times [`Ensure`] starts over (the template deleted or written under it) before
/// it gives up.
pub const ENSURE_ROUNDS: u32 = 5;

/// One call the webhook makes while handing out a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnsureCall {
    /// Create it, stamped.
    Create,
    /// Read the one that exists (the create was answered 409 AlreadyExists).
    Get,
    /// Stamp the one read, at the version read (merge patch with `metadata.resourceVersion`).
    Stamp {
        /// The version the GET returned.
        resource_version: String,
    },
}

/// What the API server answered to an [`EnsureCall`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnsureAnswer {
    /// Create: made.
    Created,
    /// Create: 409 AlreadyExists.
    Exists,
    /// Get: the template, whether its spec is ours, and its version.
    Read {
        /// The spec is the one the pod needs ([`crate::dra_claims::same_spec`]).
        same_spec: bool,
        /// Its `metadata.resourceVersion`.
        resource_version: String,
    },
    /// Get or Stamp: 404, deleted meanwhile (swept).
    Gone,
    /// Stamp: 409 Conflict, written since the GET.
    Conflict,
    /// Stamp: written.
    Stamped,
    /// Any other answer (the API error's text).
    Failed(String),
}

/// Why the webhook refuses the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The create failed otherwise than 409.
    CreateFailed(String),
    /// The existing template cannot be read.
    ReadFailed(String),
    /// A template of our name with another spec (never overwritten).
    DifferentSpec,
    /// The stamp failed otherwise than 404 / 409.
    StampFailed(String),
    /// Deleted or written under us [`ENSURE_ROUNDS`] times.
    KeptChanging,
    /// An answer that does not fit the call (a bug in the shell).
    Unexpected(String),
}

/// What the webhook does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnsureNext {
    /// Make this call.
    Call(EnsureCall),
    /// The template exists and is stamped (or new): the pod may name it.
    Done,
    /// Deny the pod.
    Deny(Refusal),
}

/// The webhook's hand-out of one template: [`EnsureCall::Create`] first, then
/// [`Ensure::next`] with each answer until `Done` or `Deny`.
#[derive(Debug, Clone, Default)]
pub struct Ensure {
    rounds: u32,
}

impl Ensure {
    /// The first call.
    pub fn first() -> EnsureCall {
        EnsureCall::Create
    }

    /// After `answer` to `call`.
    pub fn next(&mut self, call: &EnsureCall, answer: EnsureAnswer) -> EnsureNext {
        use EnsureAnswer as A;
        use EnsureCall as C;
        let mut again = |call| {
            self.rounds += 1;
            if self.rounds >= ENSURE_ROUNDS {
                EnsureNext::Deny(Refusal::KeptChanging)
            } else {
                EnsureNext::Call(call)
            }
        };
        match (call, answer) {
            (C::Create, A::Created) | (C::Stamp { .. }, A::Stamped) => EnsureNext::Done,
            (C::Create, A::Exists) => EnsureNext::Call(C::Get),
            (
                C::Get,
                A::Read {
                    same_spec: false, ..
                },
            ) => EnsureNext::Deny(Refusal::DifferentSpec),
            (
                C::Get,
                A::Read {
                    resource_version, ..
                },
            ) => EnsureNext::Call(C::Stamp { resource_version }),
            // Swept between our 409 and here: make it again before answering.
            (C::Get | C::Stamp { .. }, A::Gone) => again(C::Create),
            // Another webhook stamped it first: read it again and stamp that version.
            (C::Stamp { .. }, A::Conflict) => again(C::Get),
            (C::Create, A::Failed(e)) => EnsureNext::Deny(Refusal::CreateFailed(e)),
            (C::Get, A::Failed(e)) => EnsureNext::Deny(Refusal::ReadFailed(e)),
            (C::Stamp { .. }, A::Failed(e)) => EnsureNext::Deny(Refusal::StampFailed(e)),
            (call, answer) => {
                EnsureNext::Deny(Refusal::Unexpected(format!("{answer:?} to {call:?}")))
            }
        }
    }
}

#[cfg(test)]
#[path = "dra_sweep_tests.rs"]
mod tests;
