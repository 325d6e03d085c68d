//! What-if planner (`hami plan`, `hami demo --scenario FILE`): the live scheduler's
//! fitting engine, without processes, over a described fleet and workload list, once per
//! GPU × node policy pair.
//!
//! - [`scenario`]: the scenario file (fleet, workloads, policies), strictly validated.
//! - [`fleet`]: node groups → Node objects with register annotations (captures go through
//!   the AMD plugin's discovery and registration; the only I/O).
//! - [`engine`]: pure; every pod through `hami_scheduler_core::extender::decide_filter` in order.
//! - [`preempt`]: pure; which lower-priority pods a pod that fits nowhere evicts, and where
//!   (the preempt verb's decision, kube-scheduler's choice of node).
//! - [`report`]: placed/unplaceable pods, utilization, fragmentation; table and JSON.

pub mod engine;
pub mod error;
pub mod fleet;
pub mod preempt;
pub mod report;
pub mod scenario;

use std::path::PathBuf;

pub use error::PlanError;

use crate::engine::{expand_workloads, run_policy_until};
use crate::report::{PlanReport, policy_report, render_json, render_table, workload_slices};
use crate::scenario::{Scenario, gpu_policies, node_policies, parse_scenario};

/// How the plan is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// One table per policy pair, for people.
    #[default]
    Table,
    /// One JSON document (the [`report::PlanReport`]), for tools.
    Json,
}

/// `hami plan` (and `hami demo --scenario FILE`).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct PlanArgs {
    /// Scenario file (YAML): fleet, workloads and policies; see examples/scenarios/small.yaml.
    #[arg(long, value_name = "FILE")]
    pub scenario: PathBuf,
    /// table or json (json includes every placement).
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Compare only these GPU policies (repeatable; binpack, spread, mutex, with ",numa").
    #[arg(long = "gpu-policy", value_name = "POLICY")]
    pub gpu_policy: Vec<String>,
    /// Compare only these node policies (repeatable; binpack, spread).
    #[arg(long = "node-policy", value_name = "POLICY")]
    pub node_policy: Vec<String>,
    /// List every pod's node and GPUs in the table.
    #[arg(long)]
    pub placements: bool,
}

impl PlanArgs {
    /// The defaults for a scenario file (what `hami demo --scenario FILE` uses).
    pub fn for_scenario(scenario: impl Into<PathBuf>) -> Self {
        Self {
            scenario: scenario.into(),
            output: OutputFormat::Table,
            gpu_policy: Vec::new(),
            node_policy: Vec::new(),
            placements: false,
        }
    }
}

/// Reads the scenario file, plans and renders. Errors are for the user to fix (exit
/// [`PlanError::exit_code`]).
pub fn run(args: &PlanArgs) -> Result<String, PlanError> {
    let shown = args.scenario.display().to_string();
    let text = std::fs::read_to_string(&args.scenario).map_err(|e| PlanError::Read {
        path: shown.clone(),
        problem: e.to_string(),
    })?;
    let mut scenario = parse_scenario(&text, &shown)?;
    restrict_policies(&mut scenario, args)?;
    let report = plan(&scenario)?;
    Ok(match args.output {
        OutputFormat::Table => render_table(&report, args.placements),
        OutputFormat::Json => render_json(&report) + "\n",
    })
}

/// Replaces the scenario's policies by the flags' when given.
pub fn restrict_policies(scenario: &mut Scenario, args: &PlanArgs) -> Result<(), PlanError> {
    if !args.gpu_policy.is_empty() {
        scenario.gpu_policies =
            gpu_policies(&args.gpu_policy).map_err(|(_, problem)| PlanError::Flag {
                flag: "--gpu-policy",
                problem,
            })?;
    }
    if !args.node_policy.is_empty() {
        scenario.node_policies =
            node_policies(&args.node_policy).map_err(|(_, problem)| PlanError::Flag {
                flag: "--node-policy",
                problem,
            })?;
    }
    Ok(())
}

/// Builds the fleet and runs every policy pair.
pub fn plan(scenario: &Scenario) -> Result<PlanReport, PlanError> {
    let specs = fleet::resolve_groups(&scenario.fleet)?;
    plan_until(scenario, &specs, &|| false)
        .map(|r| r.unwrap_or_else(|| unreachable!("a plan never asked to stop stopped")))
}

/// [`plan`] over the groups' devices already resolved (`fleet::resolve_groups`, which the
/// web UI bounds before planning), asking `stop` before each pod of each policy pair:
/// `Ok(None)` once it says stop.
pub fn plan_until(
    scenario: &Scenario,
    specs: &[fleet::NodeDevicesSpec],
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<Option<PlanReport>, PlanError> {
    let nodes = fleet::build_nodes(&scenario.fleet, specs)?;
    let gpus = scenario
        .fleet
        .iter()
        .zip(specs)
        .map(|(g, s)| g.count as usize * (s.amd.len() + s.nvidia.len()))
        .sum();
    let pods = expand_workloads(&scenario.workloads);
    let slices = workload_slices(&scenario.workloads);
    let pairs: Vec<_> = scenario
        .gpu_policies
        .iter()
        .flat_map(|gpu| scenario.node_policies.iter().map(move |node| (gpu, *node)))
        .collect();
    // Policy pairs are independent plans: one thread each, so the scheduler's serial
    // per-pod work of one overlaps the others' (filter itself already splits the nodes).
    let policies = std::thread::scope(|scope| {
        let handles: Vec<_> = pairs
            .iter()
            .map(|(gpu, node)| {
                let (nodes, pods, slices) = (&nodes, &pods, &slices);
                scope.spawn(move || {
                    let run = run_policy_until(nodes, pods, gpu.policy, *node, stop)?;
                    Some(policy_report(
                        &run,
                        &gpu.name,
                        pods,
                        &scenario.workloads,
                        slices,
                    ))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect::<Option<Vec<_>>>()
    });
    Ok(policies.map(|policies| PlanReport {
        scenario: scenario.name.clone(),
        nodes: nodes.len(),
        gpus,
        pods: pods.len(),
        policies,
    }))
}
