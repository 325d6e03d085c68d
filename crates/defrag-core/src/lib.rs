//! Defragmentation of GPU slices, as plain functions over the scheduler's snapshot (issue
//! 32): no async runtime, no Kubernetes client, no I/O. A shell (`hami defrag`, the
//! scheduler's metrics, the web UI) builds a [`Cluster`] from the scheduler's state and
//! the pods' facts, and shows or executes what comes back.
//!
//! - [`measure`]: per card, node and fleet: free MiB and cores, stranded capacity, the
//!   largest reference slice ([`Shape`]: 1/8, 1/4, 1/2 of a card, or all of it) that fits by the
//!   scheduler's fit rule, and the fragmentation ratio.
//! - [`plan`]: the moves that reach a [`Target`] (a pending pod fits; N whole cards of a
//!   type free; every card X % free or full), each with its pod, from and to (node and
//!   cards), why, PDB status and gain, or the constraints that block it.
//!   [`safety`] says which pods are never moved by default; [`pod_safety`] reads those
//!   facts from the Pod and PodDisruptionBudget objects a shell listed. [`apply`] replays a
//!   plan on a snapshot, checking each move; [`table`] prints plans and measurements.
//! - [`score`]: card choice at placement weighing memory against compute (issue 32 item
//!   4), as pure scores for the scheduler's binpack to adopt.
//!
//! The search. Every placement question is the scheduler's own fit (`fit_node` and
//! `QuickFit` of `hami-scheduler-core`) on the snapshot as earlier moves left it, so each
//! move's target is reserved in order. A pending pod: for k = 1, 2, … the candidate nodes
//! (per card, for a pod asking one GPU) are tried with every set of k movable pods, so the
//! first plan found has the fewest moves, each moved pod placed by best fit (bounded by
//! `Policy::search_budget`). Card targets: greedy, card by
//! card, cheapest first; a step (emptying one card) is kept only when the target's
//! shortfall strictly drops; passes repeat until nothing changes, so planning again after
//! applying finds nothing.
//!
//! ```text
//! let cluster = Cluster::from_state(&state, |uid, holding| facts(uid, holding));
//! let plan = plan(&cluster, &Target::FreeWholeCards { device_type: "MI300X".into(), count: 4 }, &Policy::default())?;
//! print!("{}", table::render_plan(&plan));   // or serde_json / YAML of `plan`
//! ```

#![forbid(unsafe_code)]

pub mod apply;
mod fit_pod;
mod goals;
pub mod input;
pub mod measure;
pub mod plan;
pub mod pod_safety;
pub mod safety;
pub mod score;
pub mod shape;
pub mod table;
mod work;

pub use apply::{Skipped, apply};
pub use input::{Cluster, Owner, Pdb, PodFacts, PodRequest, Safety};
pub use measure::{CardMeasure, FleetMeasure, NodeMeasure, Totals, measure, measure_node};
pub use plan::{BadInput, Blocker, CardSlice, Constraint, Move, Place, Plan, Target, plan};
pub use safety::{Policy, Protection, protection};
pub use shape::Shape;
