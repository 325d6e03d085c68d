//! `hami defrag plan` (issue 32 item 2): the fewest pod moves that make a pending pod fit
//! or reach a card target, planned by `hami_defrag_core` on the live cluster or on a
//! what-if scenario (`--scenario`, as `hami plan` reads it). A dry run: nothing is evicted. The pods that stay and why are listed with the plan.

use std::path::PathBuf;

use hami_defrag_core::{Plan, Policy, Target};
use hami_protocol::selection::GpuPolicy;
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::defrag_facts;
use crate::input::InputError;
use crate::table::shown;

#[derive(clap::Subcommand)]
pub(crate) enum DefragCommand {
    /// Plan (dry run, nothing is evicted) the fewest pod moves that make a pending pod fit,
    /// free whole cards of a type, or leave every card at least X % free or full. Pods it
    /// never moves: static, DaemonSet, critical and gang pods, bare pods, and by default
    /// single replicas, pods no PodDisruptionBudget covers or whose budget allows no
    /// disruption now, and pods younger than --min-age-seconds.
    Plan(PlanArgs),
    /// Replay a plan file (`plan -o json|yaml`) against the live cluster: a dry run unless
    /// --execute. Stale moves are skipped with the reason; pods the policy refuses (the
    /// same flags as plan) or moved within --marker-ttl-seconds are never evicted. Executed:
    /// one source node per step, the Eviction API only (PodDisruptionBudgets honoured),
    /// the next step once the evicted pods' owners run as many pods again.
    Apply(crate::defrag_apply::ApplyArgs),
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).multiple(false)
    .args(["pending_pod", "free_cards", "min_free_percent"])))]
pub(crate) struct PlanArgs {
    /// kubeconfig file; default: $KUBECONFIG, ~/.kube/config, then in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Plan on a what-if scenario (the `hami plan` file) instead of the live cluster: its
    /// pods placed in file order under its first GPU and node policies; each workload's
    /// pods are one owner's replicas. A scenario has no PodDisruptionBudgets: add
    /// --allow-without-pdb to let the planner move its pods.
    #[arg(long, value_name = "FILE", conflicts_with = "kubeconfig")]
    pub scenario: Option<PathBuf>,
    /// Target: make room for this pending pod.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub pending_pod: Option<String>,
    /// Target: this many whole cards of --type with nothing taken.
    #[arg(long, value_name = "N", requires = "device_type")]
    pub free_cards: Option<usize>,
    /// The card type for --free-cards: part of the registered type, e.g. MI300X.
    #[arg(long = "type", value_name = "TYPE", requires = "free_cards")]
    pub device_type: Option<String>,
    /// Target: every card at least this percent free (memory and compute) or full.
    #[arg(long, value_name = "PERCENT", value_parser = percent)]
    pub min_free_percent: Option<u64>,
    #[arg(long, short, value_enum, default_value_t = PlanOutput::Table)]
    pub output: PlanOutput,
    /// Also move pods no PodDisruptionBudget covers.
    #[arg(long)]
    pub allow_without_pdb: bool,
    /// Also move the only replica of its owner.
    #[arg(long)]
    pub allow_single_replica: bool,
    /// Never move pods running for less than this.
    #[arg(long, value_name = "SECONDS", default_value_t = Policy::default().min_age_seconds)]
    pub min_age_seconds: u64,
    /// At most this many moves.
    #[arg(long, value_name = "N", default_value_t = Policy::default().max_moves)]
    pub max_moves: usize,
    /// A pod whose hami.io/defrag-moved-at label (set by `apply` on the replacements) is
    /// younger than this is not moved again.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::defrag_apply::MARKER_TTL_SECONDS)]
    pub marker_ttl_seconds: u64,
}

/// How `hami defrag plan` prints the plan.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum PlanOutput {
    /// Aligned text.
    Table,
    /// The plan as JSON (`hami_defrag_core::Plan`, plus `protected`).
    Json,
    /// The same as YAML.
    Yaml,
}

/// `--min-free-percent`: 1 to 100, a trailing `%` allowed.
fn percent(text: &str) -> Result<u64, String> {
    let digits = text.trim().trim_end_matches('%');
    match digits.parse::<u64>() {
        Ok(p @ 1..=100) => Ok(p),
        _ => Err(format!(
            "{text:?} is not a percentage: write a whole number from 1 to 100, e.g. 50"
        )),
    }
}

/// The plan and the pods holding slices that the policy keeps in place.
#[derive(Serialize)]
pub(crate) struct Planned {
    #[serde(flatten)]
    pub plan: Plan,
    /// `namespace/name` → why it stays (these are never part of a move).
    pub protected: std::collections::BTreeMap<String, String>,
    /// What could not be read, for stderr (not part of the plan's data).
    #[serde(skip)]
    pub warning: Option<String>,
}

/// Why the command failed: the user's input (exit 2) or the cluster (exit 1).
pub(crate) enum Failure {
    Input(InputError),
    Cluster(anyhow::Error),
}

impl From<InputError> for Failure {
    fn from(e: InputError) -> Self {
        Failure::Input(e)
    }
}

impl From<kube::Error> for Failure {
    fn from(e: kube::Error) -> Self {
        Failure::Cluster(e.into())
    }
}

impl PlanArgs {
    fn policy(&self) -> Policy {
        Policy {
            min_age_seconds: self.min_age_seconds,
            allow_without_pdb: self.allow_without_pdb,
            allow_single_replica: self.allow_single_replica,
            max_moves: self.max_moves,
            ..Policy::default()
        }
    }
}

/// What the planner starts from: the scheduler's state, every pod (placed or not), the
/// PodDisruptionBudgets, and the GPU policy a pod without its own annotation gets.
struct Source {
    state: ClusterState,
    pods: Vec<Pod>,
    pdbs: Vec<PodDisruptionBudget>,
    gpu_policy: GpuPolicy,
    /// What the plan could not read (for stderr).
    warning: Option<String>,
}

/// The live cluster, its state built the way `hami status` builds it.
async fn live(args: &PlanArgs) -> Result<Source, Failure> {
    let client = hami_plugin_core::kube_client::client(args.kubeconfig.as_deref())
        .await
        .map_err(|e| Failure::Cluster(e.into()))?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    // A user who may not list budgets still gets a plan: every pod reads as uncovered,
    // which the default policy never moves.
    let (pdbs, warning) = match Api::<PodDisruptionBudget>::all(client)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => (list.items, None),
        Err(kube::Error::Api(e)) if e.code == 403 => (
            Vec::new(),
            Some(format!(
                "listing PodDisruptionBudgets was refused ({}): every pod is taken as covered by none, so only --allow-without-pdb moves any; the plan needs list on poddisruptionbudgets (API group policy)",
                shown(&e.message)
            )),
        ),
        Err(e) => return Err(e.into()),
    };
    let mut state = ClusterState::new();
    state.reset_nodes(nodes.iter());
    state.reset_pods(pods.iter());
    Ok(Source {
        state,
        pods,
        pdbs,
        gpu_policy: GpuPolicy::default(),
        warning,
    })
}

/// A scenario file placed as `hami plan` places it, under its first policy pair.
fn scenario(path: &std::path::Path) -> Result<Source, Failure> {
    use hami_planner::engine::{expand_workloads, run_policy};
    use hami_planner::fleet::{build_nodes, resolve_groups};
    let planner = |e: hami_planner::PlanError| match e.exit_code() {
        2 => Failure::Input(InputError(e.to_string())),
        _ => Failure::Cluster(e.into()),
    };
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| InputError(format!("cannot read scenario {shown}: {e}")))?;
    let scenario = hami_planner::scenario::parse_scenario(&text, &shown).map_err(planner)?;
    let specs = resolve_groups(&scenario.fleet).map_err(planner)?;
    let nodes = build_nodes(&scenario.fleet, &specs).map_err(planner)?;
    let gpu_policy = scenario
        .gpu_policies
        .first()
        .map_or_else(GpuPolicy::default, |p| p.policy);
    let node_policy = scenario.node_policies.first().copied().unwrap_or_default();
    let planned = expand_workloads(&scenario.workloads);
    let run = run_policy(&nodes, &planned, gpu_policy, node_policy);
    let pods = planned
        .into_iter()
        .map(|p| {
            defrag_facts::owned_by_workload(p.pod, &scenario.workloads[p.workload], p.workload)
        })
        .collect();
    Ok(Source {
        state: run.state,
        pods,
        pdbs: Vec::new(),
        gpu_policy,
        warning: None,
    })
}

/// Reads the cluster or the scenario and plans.
pub(crate) async fn plan(args: &PlanArgs) -> Result<Planned, Failure> {
    let Source {
        state,
        pods,
        pdbs,
        gpu_policy,
        warning,
    } = match &args.scenario {
        Some(path) => scenario(path)?,
        None => live(args).await?,
    };
    // The pending pod, whose owner's defrag reservations stay free for it.
    let mut pending = None;
    let target = match (&args.pending_pod, args.free_cards, args.min_free_percent) {
        (Some(wanted), _, _) => {
            let (pod, request) = defrag_facts::pending_pod(wanted, &pods, &state, gpu_policy)?;
            pending = Some(pod);
            Target::FitPod {
                pod: wanted.clone(),
                request: Box::new(request),
            }
        }
        (_, Some(count), _) => Target::FreeWholeCards {
            device_type: args.device_type.clone().unwrap_or_default(),
            count,
        },
        (_, _, Some(percent)) => Target::MinFreeOrFull { percent },
        // clap's group requires one.
        (None, None, None) => return Err(InputError("name a target".into()).into()),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let mut cluster = defrag_facts::cluster(&state, &pods, &pdbs, gpu_policy, now, pending);
    // A pod moved recently is no candidate (defrag-core's Safety has no field for it: the
    // shell keeps it out, its slices stay counted) and is listed with the reason.
    let marked: std::collections::BTreeMap<String, String> = pods
        .iter()
        .filter_map(|p| {
            let why = crate::defrag_apply::fresh_marker(p, now, args.marker_ttl_seconds)?;
            Some((p.metadata.uid.clone()?, why))
        })
        .collect();
    let mut kept_marked = std::collections::BTreeMap::new();
    cluster.pods.retain(|p| match marked.get(&p.uid) {
        Some(why) => {
            kept_marked.insert(format!("{}/{}", p.namespace, p.name), why.clone());
            false
        }
        None => true,
    });
    let policy = args.policy();
    let plan = hami_defrag_core::plan(&cluster, &target, &policy).map_err(|e| {
        // The core names its fields; the user wrote flags.
        let flag = match e.field {
            "target.pod" => "--pending-pod",
            "target.device_type" => "--type",
            "target.count" => "--free-cards",
            "target.percent" => "--min-free-percent",
            "policy.max_moves" => "--max-moves",
            other => other,
        };
        InputError(format!("{flag}: {}", e.problem))
    })?;
    Ok(Planned {
        plan,
        protected: {
            let mut all = defrag_facts::protected(&cluster, &policy);
            all.extend(kept_marked);
            all
        },
        warning,
    })
}

/// Every string of `value` through [`shown`]: names, card ids and reasons come from the
/// cluster, and a line feed in one would forge a table row.
fn shown_strings(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(s) => {
            if let std::borrow::Cow::Owned(clean) = shown(s) {
                *s = clean;
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(shown_strings),
        serde_json::Value::Object(map) => map.values_mut().for_each(shown_strings),
        _ => {}
    }
}

/// Pods listed as protected in the table; JSON and YAML list them all.
const PROTECTED_SHOWN: usize = 20;

/// The plan as the table shows it: the core's table, then the pods that stay.
pub(crate) fn render(planned: &Planned) -> String {
    let mut value = serde_json::to_value(&planned.plan).unwrap_or_default();
    shown_strings(&mut value);
    let mut out = match serde_json::from_value::<Plan>(value) {
        Ok(plan) => hami_defrag_core::table::render_plan(&plan),
        Err(e) => format!("cannot show the plan: {e}\n"),
    };
    if !planned.protected.is_empty() {
        out.push_str(&format!(
            "Not moved ({} pod(s) the policy keeps in place):\n",
            planned.protected.len()
        ));
        for (pod, why) in planned.protected.iter().take(PROTECTED_SHOWN) {
            out.push_str(&format!("  {}: {}\n", shown(pod), shown(why)));
        }
        if planned.protected.len() > PROTECTED_SHOWN {
            out.push_str(&format!(
                "  ... and {} more (-o json lists them all)\n",
                planned.protected.len() - PROTECTED_SHOWN
            ));
        }
    }
    out
}
