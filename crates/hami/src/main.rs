//! `hami`: the command-line tool of hami-rs.

mod defrag;
mod defrag_apply;
mod defrag_execute;
mod defrag_facts;
mod input;
mod inspect;
mod status;
mod subprogram;
mod table;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::input::{InputError, parse_object, read_source};

#[derive(Parser)]
#[command(
    name = "hami",
    version,
    about = "GPU sharing for Kubernetes: tools for operators"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
// One value, parsed once at start: boxing the large flag sets would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Show what a pod asked for and got, or what a node registered.
    Inspect {
        #[command(subcommand)]
        what: InspectTarget,
    },
    /// Per node and GPU: who holds which slice, what is free (with the largest reference
    /// slice that still fits and how fragmented the free memory is), and why pending GPU
    /// pods wait. Also works as a kubectl plugin: link this binary as `kubectl-hami` and run
    /// `kubectl hami status`.
    Status(status::StatusArgs),
    /// Defragmentation: plan the fewest pod moves that make room (a dry run; nothing is
    /// evicted), and apply a stored plan (a dry run unless --execute).
    Defrag {
        #[command(subcommand)]
        what: defrag::DefragCommand,
    },
    /// Print the installation manifests (the same objects as the Helm chart), typed and
    /// checked at build time; flags name the chart values they correspond to.
    Manifests(hami_manifests::ManifestsArgs),
    /// What-if planning without processes: place a workload list on a described fleet
    /// (nodes from real captures or inline GPU models) with the scheduler's own engine and
    /// compare GPU and node policies (placed/unplaceable, fragmentation, utilization).
    Plan(hami_planner::PlanArgs),
    /// Serve the web UI (read-only): GPUs by type and node, cards with their slices and
    /// AMD CU maps, per-pod asked vs got with live utilization, and What-if planning.
    Ui(hami_webui::UiArgs),
    /// Run the whole system on simulated nodes (no cluster, no GPU needed): API server,
    /// scheduler, kube-scheduler, device plugins, kubelets and monitors in one process;
    /// submits the examples and prints who got which slice. Runs the `hami-demo` program
    /// (the stand-ins, `sim/demo`), found beside this one or on PATH.
    #[command(disable_help_flag = true)]
    Demo(Forwarded),
    /// Run the embedded Kubernetes API server (kubectl and kube-rs work against it): the
    /// `hami-apiserver` program, found beside this one or on PATH.
    #[command(disable_help_flag = true)]
    Apiserver(Forwarded),
    /// Run a simulated kubelet (device-plugin Registration, Allocate for pods bound to its
    /// node): the `hami-kubelet-sim` program, found beside this one or on PATH.
    #[command(disable_help_flag = true)]
    KubeletSim(Forwarded),
    /// The demo's GPU-busy container process: the `hami-workload` program, found beside
    /// this one or on PATH.
    #[command(disable_help_flag = true)]
    Workload(Forwarded),
}

/// The arguments of a subcommand that another program implements, passed on untouched
/// (`--help` included).
#[derive(clap::Args)]
struct Forwarded {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<std::ffi::OsString>,
}

#[derive(Subcommand)]
enum InspectTarget {
    /// Per container: the GPUs, memory and cores asked for, and what the scheduler's
    /// annotations say it got (device, memory, CUs, CU ranges, bind phase).
    Pod(InspectArgs),
    /// The GPUs a node registered (hami.io/node-*-register), its lock and overrides.
    Node(InspectArgs),
}

#[derive(clap::Args)]
struct InspectArgs {
    /// A Pod or Node as JSON or YAML (e.g. `kubectl get pod NAME -o yaml`); `-` reads stdin.
    file: String,
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// How `hami inspect` prints its report.
#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    /// Aligned text for a terminal.
    Table,
    /// The report as JSON, for scripts.
    Json,
}

fn main() -> ExitCode {
    let output = match Cli::parse().command {
        Command::Demo(f) => return subprogram::run("hami-demo", f.args),
        Command::Apiserver(f) => return subprogram::run("hami-apiserver", f.args),
        Command::KubeletSim(f) => return subprogram::run("hami-kubelet-sim", f.args),
        Command::Workload(f) => return subprogram::run("hami-workload", f.args),
        Command::Plan(args) => return plan(&args),
        Command::Ui(args) => {
            return serve(hami_webui::run(args), hami_webui::LOG_FILTER);
        }
        Command::Inspect { what } => inspect(what),
        Command::Status(args) => return show_status(args),
        Command::Defrag {
            what: defrag::DefragCommand::Plan(args),
        } => return defrag_plan(&args),
        Command::Defrag {
            what: defrag::DefragCommand::Apply(args),
        } => return defrag_apply(&args),
        Command::Manifests(args) => {
            return match hami_manifests::args::run(&args, &mut std::io::stdout().lock()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
    };
    match output {
        Ok(text) => print_out(&text),
        Err(err) => {
            // Input errors may quote the input.
            eprintln!("error: {}", table::shown(&err.to_string()));
            ExitCode::from(2)
        }
    }
}

/// Long-running servers: errors are operational (exit 1), not bad input.
fn serve(
    server: impl std::future::Future<Output = anyhow::Result<()>>,
    default_log_level: &str,
) -> ExitCode {
    hami_plugin_core::entry::serve(server, default_log_level)
}

fn plan(args: &hami_planner::PlanArgs) -> ExitCode {
    match hami_planner::run(args) {
        Ok(text) => print_out(&text),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

fn show_status(args: status::StatusArgs) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let collected = runtime.block_on(async {
        let (report, dra, dra_warning) = status::collect(&args).await?;
        if let Some(w) = dra_warning {
            eprintln!("warning: {w}");
        }
        let (usage, monitor_errors) = status::live_usage(&args.monitors).await;
        anyhow::Ok(status::Status {
            report,
            dra,
            usage,
            monitor_errors,
        })
    });
    match collected {
        Ok(status) => print_out(&match args.output {
            Output::Table => format!(
                "{}{}{}",
                status::render(&status.report, args.all, status.dra.len()),
                status::render_dra(&status.dra, args.all),
                status::render_usage(&status.usage, &status.monitor_errors)
            ),
            Output::Json => to_json(&status),
        }),
        Err(e) => {
            // API errors carry the server's text.
            eprintln!("error: {}", table::shown(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}

fn defrag_plan(args: &defrag::PlanArgs) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(defrag::plan(args)) {
        Ok(planned) => {
            if let Some(w) = &planned.warning {
                eprintln!("warning: {w}");
            }
            print_out(&match args.output {
                defrag::PlanOutput::Table => defrag::render(&planned),
                defrag::PlanOutput::Json => to_json(&planned),
                // Plain data: serialization cannot fail.
                defrag::PlanOutput::Yaml => serde_saphyr::to_string(&planned).unwrap_or_default(),
            })
        }
        Err(defrag::Failure::Input(e)) => {
            eprintln!("error: {}", table::shown(&e.to_string()));
            ExitCode::from(2)
        }
        Err(defrag::Failure::Cluster(e)) => {
            eprintln!("error: {}", table::shown(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}

fn defrag_apply(args: &defrag_apply::ApplyArgs) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(defrag_apply::apply(args)) {
        Ok(summary) => {
            let printed = print_out(&match args.output {
                defrag_apply::ApplyOutput::Table => defrag_apply::render(&summary),
                defrag_apply::ApplyOutput::Json => to_json(&summary),
            });
            // A step blocked, aborted or still waiting is a failure for scripts.
            if summary.clean() {
                printed
            } else {
                ExitCode::from(1)
            }
        }
        Err(defrag::Failure::Input(e)) => {
            eprintln!("error: {}", table::shown(&e.to_string()));
            ExitCode::from(2)
        }
        Err(defrag::Failure::Cluster(e)) => {
            eprintln!("error: {}", table::shown(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}

fn inspect(what: InspectTarget) -> Result<String, InputError> {
    match what {
        InspectTarget::Pod(args) => {
            let pod: Pod = parse_object(&read_source(&args.file)?, "Pod")?;
            let report = inspect::pod_report(&pod)?;
            Ok(match args.output {
                Output::Table => inspect::render_pod(&report),
                Output::Json => to_json(&report),
            })
        }
        InspectTarget::Node(args) => {
            let node: Node = parse_object(&read_source(&args.file)?, "Node")?;
            let report = inspect::node_report(&node)?;
            Ok(match args.output {
                Output::Table => inspect::render_node(&report),
                Output::Json => to_json(&report),
            })
        }
    }
}

/// Writes a command's output. A reader that stopped early (`hami status | head`) closes
/// the pipe: that ends the command quietly with success, as other command-line tools do,
/// instead of `print!`'s panic (Rust ignores SIGPIPE, so the write fails with EPIPE).
fn print_out(text: &str) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write the output: {e}");
            ExitCode::from(1)
        }
    }
}

fn to_json(value: &impl serde::Serialize) -> String {
    // Reports are plain data: serialization cannot fail.
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}
