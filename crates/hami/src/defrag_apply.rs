//! `hami defrag apply PLAN_FILE` (issue 32 item 3): a stored plan replayed against the
//! live cluster, a dry run unless `--execute`. Moves that no longer match (pod gone,
//! moved, other cards, target full) are skipped by `hami_defrag_core::apply` with the
//! reason; moves of pods the policy refuses (the same flags as `plan`) or that a fresh
//! `hami.io/defrag-moved-at` marker protects are skipped too, and so is the rest of any
//! step that lost a move (a step helps only whole). Executed, each step (one source
//! node) writes a reservation on its target nodes, evicts through the Eviction API only
//! (a 429 from a PodDisruptionBudget is retried until `--pdb-wait-seconds`, then the step
//! stops; any other error aborts it), records a `DefragEvicted` Event on each pod, waits
//! until the owners run as many pods as before, marks the replacements and releases the
//! reservation; the next step starts only then.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hami_defrag_core::{Cluster, Move, Plan, Policy};
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::defrag::Failure;
use crate::defrag_facts;
use crate::input::InputError;
use crate::table::shown;

/// The label put on a moved workload's replacement pods: seconds since the epoch.
pub(crate) const MOVED_AT: &str = hami_protocol::names::pod::DEFRAG_MOVED_AT_LABEL;
/// How long the marker keeps a pod from being moved again, by default (a day).
pub(crate) const MARKER_TTL_SECONDS: u64 = 86_400;

#[derive(clap::Args)]
pub(crate) struct ApplyArgs {
    /// The plan, as `hami defrag plan -o json` or `-o yaml` wrote it.
    #[arg(value_name = "PLAN_FILE")]
    pub plan_file: PathBuf,
    /// kubeconfig file; default: $KUBECONFIG, ~/.kube/config, then in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Evict. Without it nothing is written: the steps that would run are printed.
    #[arg(long)]
    pub execute: bool,
    /// Also move pods no PodDisruptionBudget covers.
    #[arg(long)]
    pub allow_without_pdb: bool,
    /// Also move the only replica of its owner.
    #[arg(long)]
    pub allow_single_replica: bool,
    /// Never move pods running for less than this.
    #[arg(long, value_name = "SECONDS", default_value_t = Policy::default().min_age_seconds)]
    pub min_age_seconds: u64,
    /// A pod whose hami.io/defrag-moved-at label is younger than this is not moved again.
    #[arg(long, value_name = "SECONDS", default_value_t = MARKER_TTL_SECONDS)]
    pub marker_ttl_seconds: u64,
    /// How long an eviction refused by a PodDisruptionBudget (429) is retried before its
    /// step stops.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub pdb_wait_seconds: u64,
    /// How long a step waits for the evicted pods' owners to run as many pods as before.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub ready_wait_seconds: u64,
    /// How long a target slice stays reserved for the moved pod's owner.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub reservation_ttl_seconds: u64,
    #[arg(long, short, value_enum, default_value_t = ApplyOutput::Table)]
    pub output: ApplyOutput,
}

/// How `hami defrag apply` prints its summary.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum ApplyOutput {
    /// Aligned text.
    Table,
    /// The summary as JSON.
    Json,
}

/// How a step ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// Dry run: it would run.
    WouldRun,
    /// Evicted and every owner runs as many pods as before.
    Moved,
    /// A PodDisruptionBudget refused an eviction past --pdb-wait-seconds.
    BlockedByPdb,
    /// An eviction failed otherwise.
    Aborted,
    /// Evicted, but the owners did not run as many pods again in time.
    Waiting,
    /// Not run: an earlier step did not finish.
    NotRun,
}

/// One step: the moves from one source node.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StepReport {
    pub step: usize,
    pub from_node: String,
    /// `namespace/name` → its target `node card,card`.
    pub moves: Vec<(String, String)>,
    pub outcome: Outcome,
    /// What happened, in words (empty for a dry run or a clean move).
    pub detail: String,
}

/// A move left out, and why.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SkippedMove {
    pub step: usize,
    pub pod: String,
    pub reason: String,
}

/// What `apply` did.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Summary {
    pub executed: bool,
    pub steps: Vec<StepReport>,
    pub skipped: Vec<SkippedMove>,
}

impl Summary {
    /// Whether every step that ran finished (a dry run always does).
    pub(crate) fn clean(&self) -> bool {
        self.steps
            .iter()
            .all(|s| matches!(s.outcome, Outcome::WouldRun | Outcome::Moved))
    }
}

/// The reservation a step writes on a target node before it evicts, under
/// `reservation.defrag.hami.io/<evicted pod uid>`: the protocol crate owns its format and
/// says what the scheduler's Filter does with it.
pub(crate) use hami_protocol::defrag_reservation::DefragReservation as Reservation;
use hami_protocol::defrag_reservation::ReservedCard;

pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Reads a plan file (JSON or YAML); a problem is exit 2 naming the file.
pub(crate) fn read_plan(path: &Path) -> Result<Plan, InputError> {
    let shown_path = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| InputError(format!("cannot read plan {shown_path}: {e}")))?;
    let plan: Plan = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text)
            .map_err(|e| InputError(format!("plan {shown_path} is not a plan (JSON): {e}")))?
    } else {
        serde_saphyr::from_str(&text)
            .map_err(|e| InputError(format!("plan {shown_path} is not a plan (YAML): {e}")))?
    };
    for (i, m) in plan.moves.iter().enumerate() {
        if m.uid.is_empty()
            || !m.pod.contains('/')
            || m.from.node.is_empty()
            || m.to.node.is_empty()
        {
            return Err(InputError(format!(
                "plan {shown_path}: move {i} ({}) needs a namespace/name pod, its uid and from/to nodes",
                m.pod
            )));
        }
    }
    Ok(plan)
}

/// Which moves of `plan` run on `cluster` (pure): `hami_defrag_core::apply` skips the
/// stale ones, `refuse` the ones the policy or a marker keeps; a step that lost a move
/// loses the rest, and the remainder is applied again until nothing more drops (a later
/// move may have counted on a dropped one).
pub(crate) fn select(
    cluster: &Cluster,
    plan: &Plan,
    refuse: impl Fn(&Move) -> Option<String>,
) -> (Vec<Move>, Vec<SkippedMove>) {
    let mut skipped: Vec<SkippedMove> = Vec::new();
    let mut kept: Vec<Move> = Vec::new();
    for m in &plan.moves {
        match refuse(m) {
            Some(reason) => skipped.push(SkippedMove {
                step: m.step,
                pod: m.pod.clone(),
                reason,
            }),
            None => kept.push(m.clone()),
        }
    }
    loop {
        let trial = Plan {
            moves: kept.clone(),
            ..plan.clone()
        };
        let (_, stale) = hami_defrag_core::apply(cluster, &trial);
        let stale_at: HashSet<usize> = stale.iter().map(|s| s.index).collect();
        for s in &stale {
            skipped.push(SkippedMove {
                step: kept[s.index].step,
                pod: s.pod.clone(),
                reason: s.reason.clone(),
            });
        }
        let broken: HashSet<usize> = skipped.iter().map(|s| s.step).collect();
        let before = kept.len();
        let mut next = Vec::new();
        for (i, m) in kept.into_iter().enumerate() {
            if stale_at.contains(&i) {
                continue;
            }
            if broken.contains(&m.step) {
                skipped.push(SkippedMove {
                    step: m.step,
                    pod: m.pod.clone(),
                    reason: format!(
                        "step {} lost another move (a step helps only whole)",
                        m.step
                    ),
                });
                continue;
            }
            next.push(m);
        }
        kept = next;
        if kept.len() == before {
            return (kept, skipped);
        }
    }
}

/// Why `pod` is not moved again: a `hami.io/defrag-moved-at` marker younger than `ttl`.
pub(crate) fn fresh_marker(pod: &Pod, now: i64, ttl: u64) -> Option<String> {
    let at: i64 = pod.metadata.labels.as_ref()?.get(MOVED_AT)?.parse().ok()?;
    let age = now.saturating_sub(at);
    (age < i64::try_from(ttl).unwrap_or(i64::MAX))
        .then(|| format!("moved by defrag {age}s ago ({MOVED_AT}; not again within {ttl}s)"))
}

/// The steps to run: kept moves grouped by (plan step, source node), in plan order.
fn steps(kept: &[Move]) -> Vec<(usize, String, Vec<Move>)> {
    let mut out: Vec<(usize, String, Vec<Move>)> = Vec::new();
    for m in kept {
        match out
            .iter_mut()
            .find(|(s, n, _)| *s == m.step && *n == m.from.node)
        {
            Some((_, _, ms)) => ms.push(m.clone()),
            None => out.push((m.step, m.from.node.clone(), vec![m.clone()])),
        }
    }
    out
}

fn place(m: &Move) -> String {
    let cards: Vec<&str> = m.to.cards.iter().map(|c| c.card.as_str()).collect();
    format!("{} {}", m.to.node, cards.join(","))
}

/// Replays the plan file; executes it with `--execute`.
pub(crate) async fn apply(args: &ApplyArgs) -> Result<Summary, Failure> {
    let plan = read_plan(&args.plan_file)?;
    let client = crate::defrag_execute::client(args.kubeconfig.as_deref()).await?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let pdbs = Api::<PodDisruptionBudget>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let mut state = ClusterState::new();
    state.reset_nodes(nodes.iter());
    state.reset_pods(pods.iter());
    let now = now_secs();
    let gpu_policy = hami_protocol::selection::GpuPolicy::default();
    // Reserved capacity counts as taken: a stored plan's move onto it is stale.
    let cluster = defrag_facts::cluster(&state, &pods, &pdbs, gpu_policy, now, None);
    let policy = Policy {
        min_age_seconds: args.min_age_seconds,
        allow_without_pdb: args.allow_without_pdb,
        allow_single_replica: args.allow_single_replica,
        ..Policy::default()
    };
    let by_uid: HashMap<&str, &Pod> = pods
        .iter()
        .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
        .collect();
    let refuse = |m: &Move| {
        let pod = by_uid.get(m.uid.as_str())?;
        if let Some(why) = fresh_marker(pod, now, args.marker_ttl_seconds) {
            return Some(why);
        }
        let facts = cluster.pods.iter().find(|p| p.uid == m.uid)?;
        hami_defrag_core::safety::protection(&facts.safety, &policy)
            .map(|p| format!("refused by policy: {p}"))
    };
    let (kept, skipped) = select(&cluster, &plan, refuse);
    let mut reports = Vec::new();
    let mut stopped = false;
    for (step, from_node, moves) in steps(&kept) {
        let mut report = StepReport {
            step,
            from_node,
            moves: moves.iter().map(|m| (m.pod.clone(), place(m))).collect(),
            outcome: Outcome::WouldRun,
            detail: String::new(),
        };
        if args.execute {
            if stopped {
                report.outcome = Outcome::NotRun;
                report.detail = "an earlier step did not finish".into();
            } else {
                let (outcome, detail) =
                    crate::defrag_execute::run_step(&client, args, &moves, &by_uid).await;
                stopped = outcome != Outcome::Moved;
                report.outcome = outcome;
                report.detail = detail;
            }
        }
        reports.push(report);
    }
    Ok(Summary {
        executed: args.execute,
        steps: reports,
        skipped,
    })
}

/// The summary as text; every name through [`shown`].
pub(crate) fn render(summary: &Summary) -> String {
    let mut out = String::new();
    let what = if summary.executed {
        "Steps"
    } else {
        "Dry run (add --execute to evict): steps"
    };
    out.push_str(&format!("{what}: {}\n", summary.steps.len()));
    for s in &summary.steps {
        let outcome = serde_json::to_value(&s.outcome)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        out.push_str(&format!(
            "  step {} from {}: {}{}\n",
            s.step,
            shown(&s.from_node),
            outcome.replace('_', " "),
            if s.detail.is_empty() {
                String::new()
            } else {
                format!(": {}", shown(&s.detail))
            }
        ));
        for (pod, to) in &s.moves {
            out.push_str(&format!("    {} -> {}\n", shown(pod), shown(to)));
        }
    }
    let count = |o: Outcome| summary.steps.iter().filter(|s| s.outcome == o).count();
    let moved: usize = summary
        .steps
        .iter()
        .filter(|s| s.outcome == Outcome::Moved)
        .map(|s| s.moves.len())
        .sum();
    out.push_str(&format!(
        "Summary: {moved} pod(s) moved, {} skipped, {} step(s) blocked by a PodDisruptionBudget, {} aborted, {} waiting, {} not run\n",
        summary.skipped.len(),
        count(Outcome::BlockedByPdb),
        count(Outcome::Aborted),
        count(Outcome::Waiting),
        count(Outcome::NotRun),
    ));
    for s in &summary.skipped {
        out.push_str(&format!(
            "  skipped (step {}) {}: {}\n",
            s.step,
            shown(&s.pod),
            shown(&s.reason)
        ));
    }
    out
}

/// The reservation for move `m` of pod `pod`, valid `ttl` seconds from `now` (pure).
pub(crate) fn reservation(m: &Move, pod: &Pod, now: i64, ttl: u64) -> Option<Reservation> {
    // The scheduler's own rule for whose pod this is (a controller, its template hash):
    // what is written here is what Filter matches the replacement against.
    let facts = hami_scheduler_core::reservations::OwnerFacts::of(pod)?;
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.uid == facts.owner_uid)?;
    Some(Reservation {
        owner_uid: facts.owner_uid,
        owner: format!("{}/{}", owner.kind, owner.name),
        template_hash: facts.template_hash,
        cards: m
            .to
            .cards
            .iter()
            .map(|c| ReservedCard {
                uuid: c.card.clone(),
                mem_mib: c.mem_mib,
                cores: c.cores,
            })
            .collect(),
        reserved_at: now,
        expires_at: now.saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX)),
        plan_step: m.step,
    })
}

/// Running pods per controller uid (not being deleted).
pub(crate) fn running_by_owner(pods: &[Pod]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in pods {
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if !running || p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Some(o) = p
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
        {
            out.entry(o.uid.clone())
                .or_default()
                .push(p.metadata.uid.clone().unwrap_or_default());
        }
    }
    out
}

/// The wait between polls of a step (a 429's retry, the owners' pods).
pub(crate) const POLL: Duration = Duration::from_millis(200);

/// Whether `deadline` has passed.
pub(crate) fn past(deadline: Instant) -> bool {
    Instant::now() >= deadline
}

#[cfg(test)]
#[path = "defrag_apply_tests.rs"]
mod tests;
