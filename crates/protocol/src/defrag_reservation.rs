//! `reservation.defrag.hami.io/<evicted pod uid>` (issue 32): the node annotation
//! `hami defrag apply` writes on a move's target node before it evicts, and the scheduler's
//! Filter reads. JSON:
//!
//! ```json
//! {"owner_uid":"…","owner":"ReplicaSet/web-5d8f","template_hash":"5d8f",
//!  "cards":[["GPU-1",8192,50]],"reserved_at":1700000000,"expires_at":1700000600,
//!  "plan_step":0}
//! ```
//!
//! `cards` lists `[uuid, MiB, cores]` per card (cores: CUs for AMD, percent for NVIDIA).
//! While it is in force (not past `expires_at`, not used up by a pod of the owner created
//! after `reserved_at` that holds the cards), Filter counts each card's MiB, cores and one
//! share as taken for every pod but the owner's (controller uid `owner_uid`, and the
//! `pod-template-hash` label `template_hash` when set), and steers the owner's pod there.
//! Unknown fields are ignored, so a newer writer's additions do not void a reservation.

use serde::{Deserialize, Serialize};

use crate::names::node::DEFRAG_RESERVATION_PREFIX;

/// One reserved card: `[uuid, MiB, cores]` on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(String, u64, u64)", into = "(String, u64, u64)")]
pub struct ReservedCard {
    /// The registered device id.
    pub uuid: String,
    /// MiB held for the owner.
    pub mem_mib: u64,
    /// CUs (AMD) or percent (NVIDIA) held for the owner.
    pub cores: u64,
}

impl From<(String, u64, u64)> for ReservedCard {
    fn from((uuid, mem_mib, cores): (String, u64, u64)) -> Self {
        Self {
            uuid,
            mem_mib,
            cores,
        }
    }
}

impl From<ReservedCard> for (String, u64, u64) {
    fn from(c: ReservedCard) -> Self {
        (c.uuid, c.mem_mib, c.cores)
    }
}

/// A target slice held for the owner of a moved pod until it expires or is used up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefragReservation {
    /// The moved pod's controller uid (its ReplicaSet, StatefulSet, …).
    pub owner_uid: String,
    /// `Kind/name` of that controller, for people reading the node.
    pub owner: String,
    /// The moved pod's `pod-template-hash` label, when it had one: only a pod of the same
    /// template is the replacement.
    #[serde(default)]
    pub template_hash: Option<String>,
    /// The cards held, with what is held on each.
    pub cards: Vec<ReservedCard>,
    /// When it was written, seconds since the epoch.
    pub reserved_at: i64,
    /// When it stops counting, seconds since the epoch.
    pub expires_at: i64,
    /// The plan step that wrote it.
    #[serde(default)]
    pub plan_step: usize,
}

/// Why a reservation value was refused; each says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReservationError {
    /// Not the JSON object above; the parser's message.
    #[error(
        "not a defrag reservation (JSON object with owner_uid, owner, cards [[uuid, MiB, cores]], reserved_at, expires_at): {0}"
    )]
    Json(String),
    /// `owner_uid` is empty: no pod could ever be its owner.
    #[error("owner_uid is empty: name the moved pod's controller uid")]
    NoOwner,
    /// `cards` is empty: nothing is reserved.
    #[error("cards is empty: list [uuid, MiB, cores] per reserved card")]
    NoCards,
    /// A card's uuid is empty.
    #[error("card {index} has an empty uuid")]
    EmptyUuid {
        /// Its position in `cards`.
        index: usize,
    },
    /// A card is listed twice.
    #[error("card {uuid:?} is listed twice")]
    Duplicate {
        /// The card.
        uuid: String,
    },
    /// It expires before it was written.
    #[error("expires_at {expires_at} is before reserved_at {reserved_at}")]
    ExpiresBeforeReserved {
        /// When it was written.
        reserved_at: i64,
        /// When it expires.
        expires_at: i64,
    },
}

impl DefragReservation {
    /// The annotation value.
    pub fn encode(&self) -> String {
        // Plain strings and numbers only: serialization cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an annotation value; unknown fields are ignored.
    pub fn decode(text: &str) -> Result<Self, ReservationError> {
        let r: Self =
            serde_json::from_str(text).map_err(|e| ReservationError::Json(e.to_string()))?;
        if r.owner_uid.is_empty() {
            return Err(ReservationError::NoOwner);
        }
        if r.cards.is_empty() {
            return Err(ReservationError::NoCards);
        }
        for (index, card) in r.cards.iter().enumerate() {
            if card.uuid.is_empty() {
                return Err(ReservationError::EmptyUuid { index });
            }
            if r.cards[..index].iter().any(|c| c.uuid == card.uuid) {
                return Err(ReservationError::Duplicate {
                    uuid: card.uuid.clone(),
                });
            }
        }
        if r.expires_at < r.reserved_at {
            return Err(ReservationError::ExpiresBeforeReserved {
                reserved_at: r.reserved_at,
                expires_at: r.expires_at,
            });
        }
        Ok(r)
    }

    /// Whether it no longer counts by time alone at `now` (seconds since the epoch).
    pub fn expired(&self, now: i64) -> bool {
        now >= self.expires_at
    }
}

/// The annotation key of the reservation for the evicted pod `pod_uid`.
pub fn key(pod_uid: &str) -> String {
    format!("{DEFRAG_RESERVATION_PREFIX}{pod_uid}")
}

/// The evicted pod's uid of a reservation annotation key; `None` for any other key.
pub fn pod_uid_of(key: &str) -> Option<&str> {
    key.strip_prefix(DEFRAG_RESERVATION_PREFIX)
        .filter(|u| !u.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DefragReservation {
        DefragReservation {
            owner_uid: "rs-1".into(),
            owner: "ReplicaSet/web-5d8f".into(),
            template_hash: Some("5d8f".into()),
            cards: vec![ReservedCard {
                uuid: "GPU-1".into(),
                mem_mib: 8192,
                cores: 50,
            }],
            reserved_at: 1000,
            expires_at: 1600,
            plan_step: 2,
        }
    }

    #[test]
    fn round_trips_as_the_documented_json() {
        let r = sample();
        let text = r.encode();
        assert_eq!(
            text,
            r#"{"owner_uid":"rs-1","owner":"ReplicaSet/web-5d8f","template_hash":"5d8f","cards":[["GPU-1",8192,50]],"reserved_at":1000,"expires_at":1600,"plan_step":2}"#
        );
        assert_eq!(DefragReservation::decode(&text), Ok(r));
    }

    #[test]
    fn unknown_fields_are_ignored_and_optional_ones_default() {
        let text = r#"{"owner_uid":"o","owner":"ReplicaSet/x","cards":[["G",1,2]],"reserved_at":5,"expires_at":5,"future":{"a":1}}"#;
        let r = DefragReservation::decode(text).unwrap();
        assert_eq!((r.template_hash.as_deref(), r.plan_step), (None, 0));
        assert!(r.expired(5) && !r.expired(4));
    }

    #[test]
    fn bad_values_say_what_to_change() {
        let cases = [
            ("nope", "not a defrag reservation"),
            (r#"{"owner_uid":"o"}"#, "missing field"),
            (
                r#"{"owner_uid":"","owner":"","cards":[["G",1,2]],"reserved_at":1,"expires_at":2}"#,
                "owner_uid is empty",
            ),
            (
                r#"{"owner_uid":"o","owner":"","cards":[],"reserved_at":1,"expires_at":2}"#,
                "cards is empty",
            ),
            (
                r#"{"owner_uid":"o","owner":"","cards":[["",1,2]],"reserved_at":1,"expires_at":2}"#,
                "card 0 has an empty uuid",
            ),
            (
                r#"{"owner_uid":"o","owner":"","cards":[["G",1,2],["G",1,2]],"reserved_at":1,"expires_at":2}"#,
                "listed twice",
            ),
            (
                r#"{"owner_uid":"o","owner":"","cards":[["G",-1,2]],"reserved_at":1,"expires_at":2}"#,
                "not a defrag reservation",
            ),
            (
                r#"{"owner_uid":"o","owner":"","cards":[["G",1,2]],"reserved_at":3,"expires_at":2}"#,
                "before reserved_at",
            ),
        ];
        for (text, want) in cases {
            let err = DefragReservation::decode(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn keys_carry_the_evicted_pods_uid() {
        assert_eq!(key("u-1"), "reservation.defrag.hami.io/u-1");
        assert_eq!(pod_uid_of(&key("u-1")), Some("u-1"));
        assert_eq!(pod_uid_of("reservation.defrag.hami.io/"), None);
        assert_eq!(pod_uid_of("hami.io/node-amd-register"), None);
    }
}
