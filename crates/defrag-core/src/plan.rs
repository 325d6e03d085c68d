//! The plan: what to reach, the moves that reach it, and what blocks the rest. The plan is
//! data (serde: JSON or YAML) for a shell to show, store, and later execute.

use serde::{Deserialize, Serialize};

use crate::input::{Cluster, PodRequest};
use crate::safety::{Policy, Protection};
use crate::work::{At, Slot, Work};

/// What the plan aims for.
#[derive(Debug, Clone)]
pub enum Target {
    /// A pending pod fits some node.
    FitPod {
        /// `namespace/name`, for the plan's text.
        pod: String,
        /// What it asks for (boxed: the other targets are a few words).
        request: Box<PodRequest>,
    },
    /// At least `count` cards whose type contains `device_type` (case-insensitive, as
    /// `use-gputype` matches) have nothing taken.
    FreeWholeCards {
        /// Part of the registered type, e.g. `MI300X`.
        device_type: String,
        /// Cards wanted idle.
        count: usize,
    },
    /// Every card has at least `percent` % free (memory and compute) or is full (no 1/8
    /// slice fits).
    MinFreeOrFull {
        /// 1..=100.
        percent: u64,
    },
}

impl Target {
    /// The target in words.
    pub fn describe(&self) -> String {
        match self {
            Target::FitPod { pod, .. } => format!("make room for pending pod {pod}"),
            Target::FreeWholeCards { device_type, count } => {
                format!("free {count} whole {device_type} card(s)")
            }
            Target::MinFreeOrFull { percent } => {
                format!("every card at least {percent} % free or full")
            }
        }
    }

    /// What is still missing, in the target's unit: 1 or 0 for a pending pod, cards still
    /// to free, cards neither full nor free enough. 0: reached.
    pub fn shortfall(&self, cluster: &Cluster) -> u64 {
        crate::goals::shortfall(self, &Work::new(cluster))
    }
}

/// One card's part of a move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CardSlice {
    /// Registered device id.
    pub card: String,
    /// MiB held.
    pub mem_mib: u64,
    /// Cores held (AMD CUs, NVIDIA percent).
    pub cores: u64,
    /// Shares held.
    pub slots: u32,
}

/// Where a pod is, or goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    /// The node.
    pub node: String,
    /// What it holds on each card.
    pub cards: Vec<CardSlice>,
}

/// One pod moved: evicted from `from`, its recreated pod placed on `to` (to be reserved
/// for its owner before the eviction).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    /// Moves of one step belong together (one card emptied, or one pod made room for); a
    /// step helps only once all its moves are done.
    pub step: usize,
    /// `namespace/name`.
    pub pod: String,
    /// Its uid (a plan applied later checks it is still the same pod).
    pub uid: String,
    /// Where it is.
    pub from: Place,
    /// Where it goes.
    pub to: Place,
    /// Why it moves.
    pub why: String,
    /// Its PodDisruptionBudget now, e.g. `ns/web allows 2`, or `none (allowed by policy)`.
    pub pdb: String,
    /// What the step gains, on the step's last move; empty on the others.
    pub gain: String,
    /// The target's shortfall once this move's step is done.
    pub shortfall_after: u64,
}

/// What keeps the target from being reached.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Constraint {
    /// A pod that would have to move is protected.
    Protected {
        /// The pod.
        pod: String,
        /// Why it stays.
        protection: Protection,
    },
    /// A pod that would have to move fits nowhere else.
    NoRoomElsewhere {
        /// The pod.
        pod: String,
    },
    /// Freeing the card would take more moves than the policy allows.
    MoveLimit {
        /// The policy's maximum.
        max_moves: usize,
    },
    /// Slices on the card belong to pods the planner was not told about (not scheduled by
    /// this scheduler, or held whole), or are reserved for a moved pod's replacement (a
    /// defrag reservation in force, [`crate::Cluster::count_reservations`]).
    UnknownHolders,
    /// The pod does not fit the node even with every pod gone.
    NeverFits {
        /// The scheduler's reason on the empty node.
        reason: String,
    },
    /// Moving the card's pods does not bring the target closer (they would land on cards
    /// that then miss the target themselves).
    NoImprovement,
    /// Fewer cards of the type exist than asked for.
    NotEnoughCards {
        /// Healthy cards of the type.
        exist: usize,
    },
    /// The search stopped at the policy's budget; a plan may exist beyond it.
    SearchBudget {
        /// The budget.
        budget: usize,
    },
}

/// One blocker: where, and which constraint.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Blocker {
    /// A card (`node/card`), a node, or the fleet.
    pub at: String,
    /// The constraint.
    pub constraint: Constraint,
}

/// The plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The target in words.
    pub target: String,
    /// The shortfall before any move.
    pub shortfall_before: u64,
    /// The shortfall after every move.
    pub shortfall_after: u64,
    /// Whether the target is reached after the moves.
    pub reached: bool,
    /// The moves, in order: each one's target is feasible once the previous ones are done.
    pub moves: Vec<Move>,
    /// For a pending pod: the node it fits after the moves.
    pub pod_fits_on: Option<String>,
    /// Why the target is not reached (empty when it is); at most [`MAX_BLOCKERS`], the
    /// most common constraints first.
    pub blocked: Vec<Blocker>,
    /// Blockers left out of `blocked`.
    pub blockers_left_out: usize,
}

/// Blockers listed in a plan.
pub const MAX_BLOCKERS: usize = 20;

/// A target or policy the planner cannot work with, and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadInput {
    /// The field, e.g. `target.percent`.
    pub field: &'static str,
    /// What is wrong and what to write instead.
    pub problem: String,
}

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

impl std::error::Error for BadInput {}

fn check(target: &Target, policy: &Policy) -> Result<(), BadInput> {
    let bad = |field, problem: &str| {
        Err(BadInput {
            field,
            problem: problem.to_owned(),
        })
    };
    match target {
        Target::FitPod { request, .. } if !request.asks_gpu() => bad(
            "target.pod",
            "the pod asks for no GPU, so no move can make room for it; write a pod that asks for amd.com/gpu or nvidia.com/gpu",
        ),
        Target::FreeWholeCards { device_type, .. } if device_type.trim().is_empty() => bad(
            "target.device_type",
            "empty; write part of the registered card type, e.g. MI300X",
        ),
        Target::FreeWholeCards { count: 0, .. } => {
            bad("target.count", "0 cards is no target; write 1 or more")
        }
        Target::MinFreeOrFull { percent } if !(1..=100).contains(percent) => Err(BadInput {
            field: "target.percent",
            problem: format!("{percent} is not a percentage from 1 to 100; write e.g. 50"),
        }),
        _ if policy.max_moves == 0 => bad(
            "policy.max_moves",
            "0 allows no move; write 1 or more (default 32)",
        ),
        _ if policy.search_budget == 0 => bad(
            "policy.search_budget",
            "0 allows no search; write 1 or more (default 20000)",
        ),
        _ => Ok(()),
    }
}

/// Plans moves towards `target` under `policy`; a target or policy that makes no sense is
/// refused, saying what to write instead.
pub fn plan(cluster: &Cluster, target: &Target, policy: &Policy) -> Result<Plan, BadInput> {
    check(target, policy)?;
    let mut work = Work::new(cluster);
    let mut run = Run {
        cluster,
        policy,
        moves: Vec::new(),
        blocked: Vec::new(),
        budget: policy.search_budget,
        step: 0,
    };
    let before = crate::goals::shortfall(target, &work);
    let pod_fits_on = if before == 0 {
        crate::goals::fits_on(target, &work)
    } else {
        crate::goals::reach(target, &mut work, &mut run)
    };
    let after = crate::goals::shortfall(target, &work);
    if after == 0 {
        run.blocked.clear();
    }
    let (blocked, left_out) = summarize(run.blocked);
    Ok(Plan {
        target: target.describe(),
        shortfall_before: before,
        shortfall_after: after,
        reached: after == 0,
        moves: run.moves,
        pod_fits_on,
        blocked,
        blockers_left_out: left_out,
    })
}

/// Dedupes blockers and keeps the most common constraint kinds first.
fn summarize(mut all: Vec<Blocker>) -> (Vec<Blocker>, usize) {
    all.sort();
    all.dedup();
    let kind = |b: &Blocker| std::mem::discriminant(&b.constraint);
    let count = |b: &Blocker, all: &[Blocker]| all.iter().filter(|o| kind(o) == kind(b)).count();
    let counts: Vec<usize> = all.iter().map(|b| count(b, &all)).collect();
    let mut order: Vec<usize> = (0..all.len()).collect();
    order.sort_by(|a, b| counts[*b].cmp(&counts[*a]).then(a.cmp(b)));
    let left_out = all.len().saturating_sub(MAX_BLOCKERS);
    let kept = order
        .into_iter()
        .take(MAX_BLOCKERS)
        .map(|i| all[i].clone())
        .collect();
    (kept, left_out)
}

/// The state of one planning run.
pub(crate) struct Run<'a> {
    pub(crate) cluster: &'a Cluster,
    pub(crate) policy: &'a Policy,
    pub(crate) moves: Vec<Move>,
    pub(crate) blocked: Vec<Blocker>,
    /// Candidate sets left to try.
    pub(crate) budget: usize,
    pub(crate) step: usize,
}

impl Run<'_> {
    /// Spends one unit of search; false (and a blocker) once none is left.
    pub(crate) fn spend(&mut self) -> bool {
        if self.budget == 0 {
            self.block(
                "fleet".into(),
                Constraint::SearchBudget {
                    budget: self.policy.search_budget,
                },
            );
            return false;
        }
        self.budget -= 1;
        true
    }

    pub(crate) fn block(&mut self, at: String, constraint: Constraint) {
        self.blocked.push(Blocker { at, constraint });
    }

    /// Records a committed step: pod `p` went from `from` to where `work` has it now.
    pub(crate) fn record(&mut self, work: &Work, p: usize, from: &At, why: &str) {
        let pod = &self.cluster.pods[p];
        let place = |at: &At| {
            let node = &work.nodes[at.node.unwrap_or_default()];
            Place {
                node: node.devices.name.clone(),
                cards: at.slots.iter().map(|s| card_slice(node, s)).collect(),
            }
        };
        let pdb = match &pod.safety.pdb {
            Some(b) => {
                // Moves under one budget beyond what it allows at once must wait for the
                // earlier ones' pods to run again (the executor goes step by step).
                let before = self
                    .moves
                    .iter()
                    .filter(|m| m.pdb.split(' ').next() == Some(b.name.as_str()))
                    .count();
                let n = u32::try_from(before).unwrap_or(u32::MAX);
                if n < b.disruptions_allowed {
                    format!("{} allows {}", b.name, b.disruptions_allowed)
                } else {
                    format!(
                        "{} allows {}; move {} under it waits for the earlier ones to run again",
                        b.name,
                        b.disruptions_allowed,
                        before + 1
                    )
                }
            }
            None => "none (allowed by policy)".into(),
        };
        self.moves.push(Move {
            step: self.step,
            pod: pod.shown(),
            uid: pod.uid.clone(),
            from: place(from),
            to: place(&work.at[p]),
            why: why.to_owned(),
            pdb,
            gain: String::new(),
            shortfall_after: 0,
        });
    }

    /// Closes the step: its last move carries the gain, every move of it the shortfall
    /// reached once the whole step is done.
    pub(crate) fn close_step(&mut self, gain: String, shortfall: u64) {
        let step = self.step;
        for m in self.moves.iter_mut().filter(|m| m.step == step) {
            m.shortfall_after = shortfall;
        }
        if let Some(last) = self.moves.last_mut() {
            last.gain = gain;
        }
        self.step += 1;
    }
}

fn card_slice(node: &hami_scheduler_core::snapshot::NodeSnapshot, s: &Slot) -> CardSlice {
    CardSlice {
        card: node.devices.gpus[s.gpu].info.id.clone(),
        mem_mib: s.mem,
        cores: s.cores,
        slots: s.slots,
    }
}
