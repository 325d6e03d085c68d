//! The defrag plan in the What-if page (issue 32 item 2): `hami defrag plan`'s pure core
//! (`hami_defrag_core::plan`) on the live cluster the UI watches, for a pending pod, N whole
//! cards of a type, or every card X % free or full. The UI never executes a plan: it shows
//! the moves and the commands that plan and apply it (`hami defrag plan`, `hami defrag
//! apply`). The server lists the PodDisruptionBudgets for each plan ([`Budgets`]); where
//! the UI may not list them, pods no budget covers may move in its preview, the page says
//! so, and the commands check them. Pure: the server runs [`plan`] on a planning thread
//! (`whatif_run.rs`).

use std::collections::BTreeMap;

use hami_defrag_core::{Plan, Policy, Target};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::defrag_facts;
use crate::whatif::{Limits, Problem};
use crate::whatif_live::{Snapshot, form_fields, shorten};
use crate::whatif_run::Ran;
use crate::world::pod_key;

/// Most cards a "free N whole cards" target asks for.
pub const MAX_CARDS: u64 = 4096;
/// Most moves a plan in the UI may hold (the CLI's default is [`Policy::default`]'s).
pub const MAX_MOVES: u64 = 256;
/// Largest minimum age, seconds (a week).
pub const MAX_MIN_AGE: u64 = 7 * 24 * 3600;

/// What the defrag form asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Goal {
    /// Make room for this pending pod (`namespace/name`).
    Pod(String),
    /// `count` whole cards of `device_type` with nothing taken.
    Cards {
        /// Part of the registered type.
        device_type: String,
        /// How many.
        count: u64,
    },
    /// Every card at least `percent` % free or full.
    Percent(u64),
}

/// The defrag form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefragForm {
    /// The target.
    pub goal: Goal,
    /// Also move the only replica of its owner (`--allow-single-replica`).
    pub allow_single_replica: bool,
    /// Also move pods no PodDisruptionBudget covers (`--allow-without-pdb`).
    pub allow_without_pdb: bool,
    /// At most this many moves (`--max-moves`).
    pub max_moves: u64,
    /// Pods running for less than this stay (`--min-age-seconds`).
    pub min_age_seconds: u64,
}

/// A whole number of `field` from `min` to `max`; past `max` a 413 when the number is a
/// size the UI caps (`capped`), else a 400.
fn whole(
    field: &str,
    text: &str,
    (min, max, capped): (u64, u64, bool),
    what: &str,
) -> Result<u64, Problem> {
    let shown = shorten(text);
    if text.is_empty() {
        return Err(Problem::bad(format!(
            "{field}: write {what}, {min} to {max}"
        )));
    }
    if text.starts_with('-') {
        return Err(Problem::bad(format!(
            "{field}={shown}: cannot be negative; write {what}, {min} to {max}"
        )));
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Problem::bad(format!(
            "{field}={shown:?} is not a whole number: write {what}, {min} to {max}"
        )));
    }
    match text.parse::<u64>().unwrap_or(u64::MAX) {
        n if n < min => Err(Problem::bad(format!(
            "{field}={n}: write {what}, {min} to {max}"
        ))),
        n if n > max => Err(Problem {
            status: if capped { 413 } else { 400 },
            message: format!(
                "{field}={shown}: the UI takes at most {max}; write {what}, {min} to {max}"
            ),
        }),
        n => Ok(n),
    }
}

/// Reads the defrag form: `target` (`pod`, `cards` or `percent`) and its fields (`pod`;
/// `type` and `count`; `percent`), `single`, `nopdb`, `max_moves` and `min_age`.
pub fn form_from_body(body: &[u8]) -> Result<DefragForm, Problem> {
    let fields: BTreeMap<String, String> = form_fields(body)?.into_iter().collect();
    let get = |k: &str| fields.get(k).map_or("", String::as_str);
    let goal = match get("target") {
        "pod" => {
            let pod = get("pod");
            if pod.is_empty() {
                return Err(Problem::bad(
                    "pick the pending pod to make room for (the \"pending pod\" field)",
                ));
            }
            Goal::Pod(pod.to_owned())
        }
        "cards" => {
            let device_type = get("type");
            if device_type.is_empty() || device_type.len() > 64 {
                return Err(Problem::bad(
                    "type: write part of the registered card type (at most 64 characters), e.g. MI300X",
                ));
            }
            Goal::Cards {
                device_type: device_type.to_owned(),
                count: whole(
                    "count",
                    get("count"),
                    (1, MAX_CARDS, true),
                    "how many whole cards to free",
                )?,
            }
        }
        "percent" => Goal::Percent(whole(
            "percent",
            get("percent").trim_end_matches('%'),
            (1, 100, false),
            "the percent every card keeps free (or is full)",
        )?),
        other => {
            return Err(Problem::bad(format!(
                "target={:?}: choose one of pod, cards, percent",
                shorten(other)
            )));
        }
    };
    let max_moves = match get("max_moves") {
        "" => Policy::default().max_moves as u64,
        text => whole(
            "max_moves",
            text,
            (1, MAX_MOVES, true),
            "the most moves a plan may hold",
        )?,
    };
    let min_age_seconds = match get("min_age") {
        "" => Policy::default().min_age_seconds,
        text => whole(
            "min_age",
            text,
            (0, MAX_MIN_AGE, false),
            "the seconds a pod must have run before it may move",
        )?,
    };
    Ok(DefragForm {
        goal,
        allow_single_replica: get("single") == "on",
        allow_without_pdb: get("nopdb") == "on",
        max_moves,
        min_age_seconds,
    })
}

/// The PodDisruptionBudgets a plan is made with.
#[derive(Debug, Clone, PartialEq)]
pub enum Budgets {
    /// Listed for this plan.
    Read(Vec<PodDisruptionBudget>),
    /// Not listed: why (e.g. the UI's role may not list them).
    Unread(String),
}

/// A plan, the pods it keeps in place, and the commands that plan and apply it.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Why the budgets were not read; `None`: each move's PDB status is the budget's.
    pub budgets_unread: Option<String>,
    /// The core's plan.
    pub plan: Plan,
    /// `namespace/name` → why it stays.
    pub protected: BTreeMap<String, String>,
    /// Shell lines: plan to a file, dry-run apply, execute.
    pub commands: Vec<String>,
}

/// A word as a shell reads it back unchanged.
fn sh(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:%".contains(&b))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

fn commands(form: &DefragForm) -> Vec<String> {
    let mut plan = String::from("hami defrag plan ");
    match &form.goal {
        Goal::Pod(p) => plan.push_str(&format!("--pending-pod {}", sh(p))),
        Goal::Cards { device_type, count } => {
            plan.push_str(&format!("--free-cards {count} --type {}", sh(device_type)))
        }
        Goal::Percent(p) => plan.push_str(&format!("--min-free-percent {p}")),
    }
    let mut policy = String::new();
    if form.allow_single_replica {
        policy.push_str(" --allow-single-replica");
    }
    if form.allow_without_pdb {
        policy.push_str(" --allow-without-pdb");
    }
    if form.min_age_seconds != Policy::default().min_age_seconds {
        policy.push_str(&format!(" --min-age-seconds {}", form.min_age_seconds));
    }
    let mut plan_only = String::new();
    if form.max_moves != Policy::default().max_moves as u64 {
        plan_only.push_str(&format!(" --max-moves {}", form.max_moves));
    }
    vec![
        format!("{plan}{plan_only}{policy} -o yaml > defrag-plan.yaml"),
        format!("hami defrag apply defrag-plan.yaml{policy}"),
        format!("hami defrag apply defrag-plan.yaml{policy} --execute"),
    ]
}

/// The pending pod `wanted` of `pods`: it must still exist and still wait.
fn pending<'a>(wanted: &str, snapshot: &'a Snapshot) -> Result<&'a Pod, Problem> {
    let shown = shorten(wanted);
    if wanted
        .split_once('/')
        .is_none_or(|(ns, n)| ns.is_empty() || n.is_empty())
    {
        return Err(Problem::bad(format!(
            "pod={shown:?}: name the pending pod as NAMESPACE/NAME"
        )));
    }
    let pod = snapshot
        .pods
        .iter()
        .find(|p| pod_key(p) == wanted)
        .ok_or_else(|| {
            Problem::bad(format!(
                "pod {shown} is no longer in the cluster (deleted or replaced since the page was shown); pick a pending pod from the list"
            ))
        })?;
    if pod.metadata.deletion_timestamp.is_some() {
        return Err(Problem::bad(format!(
            "pod {shown} is being deleted; pick a pending pod from the list"
        )));
    }
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        return Err(Problem::bad(format!(
            "pod {shown} no longer waits: it runs on node {}; pick a pending pod from the list",
            shorten(node)
        )));
    }
    Ok(pod)
}

/// Plans `form` on `snapshot` with `budgets`. Budgets not read: pods no budget covers may
/// move in this preview (the page says so; the commands shown check them).
pub fn plan(
    snapshot: &Snapshot,
    budgets: &Budgets,
    form: &DefragForm,
    limits: &Limits,
) -> Result<Planned, Problem> {
    if snapshot.nodes.len() as u64 > limits.max_nodes {
        return Err(Problem::too_large(format!(
            "the cluster has {} nodes; the UI plans at most {}: run `hami defrag plan` instead",
            snapshot.nodes.len(),
            limits.max_nodes
        )));
    }
    let mut state = hami_scheduler_core::state::ClusterState::new();
    state.reset_nodes(snapshot.nodes.iter());
    state.reset_pods(snapshot.pods.iter());
    let (target, pending_pod) = match &form.goal {
        Goal::Pod(wanted) => {
            let pod = pending(wanted, snapshot)?;
            if let Some(h) = pod.metadata.uid.as_deref().and_then(|u| state.holding(u)) {
                return Err(Problem::bad(format!(
                    "pod {} no longer waits: it holds GPU slices on node {}; pick a pending pod from the list",
                    shorten(wanted),
                    shorten(&h.node)
                )));
            }
            let request = defrag_facts::request(pod).map_err(|e| {
                Problem::bad(format!(
                    "pod {}: the scheduler cannot read what it asks ({e}); fix the pod's resources",
                    shorten(wanted)
                ))
            })?;
            let target = Target::FitPod {
                pod: wanted.clone(),
                request: Box::new(request),
            };
            (target, Some(pod))
        }
        Goal::Cards { device_type, count } => (
            Target::FreeWholeCards {
                device_type: device_type.clone(),
                count: usize::try_from(*count).unwrap_or(usize::MAX),
            },
            None,
        ),
        Goal::Percent(percent) => (Target::MinFreeOrFull { percent: *percent }, None),
    };
    let (pdbs, unread) = match budgets {
        Budgets::Read(pdbs) => (pdbs.as_slice(), None),
        Budgets::Unread(why) => (&[][..], Some(why.clone())),
    };
    let cluster = defrag_facts::cluster(&state, &snapshot.pods, pdbs, snapshot.now, pending_pod);
    let policy = Policy {
        allow_without_pdb: form.allow_without_pdb || unread.is_some(),
        allow_single_replica: form.allow_single_replica,
        max_moves: usize::try_from(form.max_moves).unwrap_or(usize::MAX),
        min_age_seconds: form.min_age_seconds,
        ..Policy::default()
    };
    let plan = hami_defrag_core::plan(&cluster, &target, &policy).map_err(|e| {
        let field = match e.field {
            "target.pod" => "pod",
            "target.device_type" => "type",
            "target.count" => "count",
            "target.percent" => "percent",
            "policy.max_moves" => "max_moves",
            other => other,
        };
        Problem::bad(format!("{field}: {}", e.problem))
    })?;
    Ok(Planned {
        budgets_unread: unread,
        plan,
        protected: defrag_facts::protected(&cluster, &policy),
        commands: commands(form),
    })
}

/// [`plan`] as a job of the UI's planner (`whatif_run::Runner::run`). The planner is
/// bounded by its search budget ([`Policy::search_budget`]) rather than by `stop`, which is
/// asked once, before it starts.
pub fn job(
    snapshot: &Snapshot,
    budgets: &Budgets,
    form: &DefragForm,
    limits: &Limits,
    stop: &dyn Fn() -> bool,
) -> Result<Ran<Planned>, Problem> {
    if stop() {
        return Ok(Ran::Stopped(format!(
            "the defrag plan did not start within {} s, the UI's limit; retry, or run `hami defrag plan`",
            limits.deadline.as_secs()
        )));
    }
    plan(snapshot, budgets, form, limits).map(Ran::Done)
}
