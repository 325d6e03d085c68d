//! Which pods the planner refuses to move, and the knobs that relax it. The defaults
//! refuse everything a move could hurt: a move is an eviction and a restart, never a live
//! migration.

use serde::{Deserialize, Serialize};

use crate::input::Safety;

/// How the planner may move pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Policy {
    /// Pods younger than this are not moved (they may still be loading).
    pub min_age_seconds: u64,
    /// Move pods no PodDisruptionBudget covers (off: nothing says their owner tolerates it).
    pub allow_without_pdb: bool,
    /// Move the only replica of its owner (off: that is an outage, not a move).
    pub allow_single_replica: bool,
    /// At most this many moves in one plan.
    pub max_moves: usize,
    /// At most this many candidate sets tried (pod sets for a pending pod, cards for the
    /// other targets); beyond it the plan says the search was cut short.
    pub search_budget: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            min_age_seconds: 600,
            allow_without_pdb: false,
            allow_single_replica: false,
            max_moves: 32,
            search_budget: 20_000,
        }
    }
}

/// Why a pod is not moved.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Protection {
    /// A static pod: kubelet owns it.
    Static,
    /// A DaemonSet's pod: it would come back on the same node.
    DaemonSet,
    /// A critical pod.
    Critical,
    /// A gang member.
    GangMember,
    /// No controller recreates it.
    NoController,
    /// The only replica of its owner.
    SingleReplica {
        /// `Kind/name` of the owner.
        owner: String,
    },
    /// No PodDisruptionBudget covers it.
    NoPdb,
    /// Its PodDisruptionBudget allows no disruption now.
    PdbBlocks {
        /// The budget.
        pdb: String,
    },
    /// Younger than the policy's minimum age.
    TooYoung {
        /// Its age.
        age_seconds: u64,
        /// The minimum.
        min_age_seconds: u64,
    },
}

impl std::fmt::Display for Protection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Protection::Static => write!(f, "static pod (kubelet owns it)"),
            Protection::DaemonSet => write!(f, "DaemonSet pod (it would return to the same node)"),
            Protection::Critical => write!(f, "critical pod"),
            Protection::GangMember => write!(f, "gang member (moving it stalls its group)"),
            Protection::NoController => write!(f, "no controller recreates it"),
            Protection::SingleReplica { owner } => write!(
                f,
                "only replica of {owner} (allow_single_replica to move it anyway)"
            ),
            Protection::NoPdb => write!(
                f,
                "no PodDisruptionBudget covers it (allow_without_pdb to move it anyway)"
            ),
            Protection::PdbBlocks { pdb } => {
                write!(f, "PodDisruptionBudget {pdb} allows no disruption now")
            }
            Protection::TooYoung {
                age_seconds,
                min_age_seconds,
            } => write!(
                f,
                "running {age_seconds}s, younger than the minimum age {min_age_seconds}s"
            ),
        }
    }
}

/// Why `safety` keeps its pod in place under `policy`, if anything does; the hardest
/// reason first (no policy knob lifts the first five).
pub fn protection(safety: &Safety, policy: &Policy) -> Option<Protection> {
    if safety.static_pod {
        return Some(Protection::Static);
    }
    if safety.owner.as_ref().is_some_and(|o| o.kind == "DaemonSet") {
        return Some(Protection::DaemonSet);
    }
    if safety.critical {
        return Some(Protection::Critical);
    }
    if safety.gang_member {
        return Some(Protection::GangMember);
    }
    let Some(owner) = &safety.owner else {
        return Some(Protection::NoController);
    };
    if owner.replicas <= 1 && !policy.allow_single_replica {
        return Some(Protection::SingleReplica {
            owner: format!("{}/{}", owner.kind, owner.name),
        });
    }
    match &safety.pdb {
        None if !policy.allow_without_pdb => return Some(Protection::NoPdb),
        Some(pdb) if pdb.disruptions_allowed == 0 => {
            return Some(Protection::PdbBlocks {
                pdb: pdb.name.clone(),
            });
        }
        _ => {}
    }
    (safety.age_seconds < policy.min_age_seconds).then_some(Protection::TooYoung {
        age_seconds: safety.age_seconds,
        min_age_seconds: policy.min_age_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{Owner, Pdb};

    fn movable() -> Safety {
        Safety {
            pdb: Some(Pdb {
                name: "ns/web".into(),
                disruptions_allowed: 1,
            }),
            owner: Some(Owner {
                kind: "ReplicaSet".into(),
                name: "web-1".into(),
                replicas: 3,
            }),
            age_seconds: 3600,
            ..Safety::default()
        }
    }

    #[test]
    fn each_fact_protects_and_the_knobs_lift_only_their_own() {
        let p = Policy::default();
        assert_eq!(protection(&movable(), &p), None);
        type Change = Box<dyn Fn(&mut Safety)>;
        let cases: Vec<(Change, Protection)> = vec![
            (Box::new(|s| s.static_pod = true), Protection::Static),
            (
                Box::new(|s| s.owner.as_mut().unwrap().kind = "DaemonSet".into()),
                Protection::DaemonSet,
            ),
            (Box::new(|s| s.critical = true), Protection::Critical),
            (Box::new(|s| s.gang_member = true), Protection::GangMember),
            (Box::new(|s| s.owner = None), Protection::NoController),
            (
                Box::new(|s| s.owner.as_mut().unwrap().replicas = 1),
                Protection::SingleReplica {
                    owner: "ReplicaSet/web-1".into(),
                },
            ),
            (Box::new(|s| s.pdb = None), Protection::NoPdb),
            (
                Box::new(|s| s.pdb.as_mut().unwrap().disruptions_allowed = 0),
                Protection::PdbBlocks {
                    pdb: "ns/web".into(),
                },
            ),
            (
                Box::new(|s| s.age_seconds = 5),
                Protection::TooYoung {
                    age_seconds: 5,
                    min_age_seconds: 600,
                },
            ),
        ];
        let relaxed = Policy {
            allow_single_replica: true,
            allow_without_pdb: true,
            min_age_seconds: 0,
            ..Policy::default()
        };
        for (change, want) in cases {
            let mut s = movable();
            change(&mut s);
            assert_eq!(protection(&s, &p), Some(want.clone()));
            let lifted = matches!(
                want,
                Protection::SingleReplica { .. } | Protection::NoPdb | Protection::TooYoung { .. }
            );
            assert_eq!(protection(&s, &relaxed).is_none(), lifted, "{want}");
        }
    }
}
