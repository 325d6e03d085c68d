//! The chaos run: the stack under a seeded fault schedule while a workload controller keeps
//! pods coming and the ledger checks its invariants every few hundred milliseconds; then
//! the faults stop and every pod must settle within the stated time.
//!
//! The seed fixes the schedule (what, when, which parameter) and the workload (pod sizes,
//! policies); thread timing is the OS's, so a seed replays the same faults, not the same
//! interleaving. A failing run prints the seed and the event history.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::jiff::SignedDuration;
use kube::api::{Api, ListParams, PostParams};

use crate::ledger::{self, Violation};
use crate::rng::Rng;
use crate::schedule::{self, FaultKind};
use crate::stack::Stack;
use crate::workload;

use crate::controller::*;
use crate::injector::*;
use crate::ledger_loop::*;

/// Settings of one chaos run.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// Drives the fault schedule and the workload; rerunning with it reproduces the run.
    pub seed: u64,
    /// How long faults are injected.
    pub fault_duration: Duration,
    /// Mean time between two faults.
    pub mean_gap: Duration,
    /// The stated time: after the faults stop, every pod must be Running with
    /// `bind-phase=success` within this.
    pub settle_limit: Duration,
    /// The `hami-workload` program: with it the pods' containers run as processes under
    /// the hooks (the kill fault and the usage checks need them).
    pub workload: Option<PathBuf>,
    /// Run the DRA node too, with DRA pods in the workload and the DRA faults and checks.
    pub dra: bool,
}

/// A killed container's device memory must be gone from its monitor's readings within
/// this (monitors refresh every 2 s; the hooks reclaim a dead process's slot).
pub const RELEASE_LIMIT: Duration = Duration::from_secs(10);

/// After the pods settled, every claim, driver checkpoint entry and kubelet-sim checkpoint
/// entry of a gone pod must be gone within this (the claim controller and kubelet-sim run
/// every 100 ms).
pub const DRA_RELEASE_LIMIT: Duration = Duration::from_secs(15);

/// What a run did and found.
#[derive(Debug, Default, Clone)]
pub struct ChaosReport {
    /// The seed the run used, to reproduce it.
    pub seed: u64,
    /// Faults injected, per kind.
    pub injected: BTreeMap<FaultKind, u32>,
    /// Faults that caught their target in the act (a pod being allocated when the plugin
    /// stopped, a pod being bound when it was deleted), per kind.
    pub in_the_act: BTreeMap<FaultKind, u32>,
    /// Invariant violations found, each described in one line.
    pub violations: Vec<String>,
    /// Ledger passes made over the cluster state.
    pub ledger_checks: u64,
    /// Ledger passes that also read every monitor (real usage against limits).
    pub usage_checks: u64,
    /// Workload processes killed, and the longest time until their memory was released.
    pub kills: u64,
    /// Of those, kills of a process the monitors had seen holding device memory.
    pub kills_holding_memory: u64,
    /// Longest kill-to-release time seen, if any kill was checked.
    pub slowest_release: Option<Duration>,
    /// Monitor readings of a container holding device memory (a usage check that saw
    /// something to check).
    pub memory_readings: u64,
    /// Pods the harness created.
    pub pods_created: u64,
    /// Distinct pods seen Running.
    pub pods_placed: u64,
    /// Pods kubelet-sim failed at admission (plugin away), replaced by the controller.
    pub admission_failures: u64,
    /// Time from the end of the faults until every pod was settled.
    pub settled_after: Option<Duration>,
    /// DRA ledger passes (claims, slices and both checkpoints read).
    pub dra_checks: u64,
    /// Distinct DRA pods seen Running.
    pub dra_pods_placed: u64,
    /// Most claims the driver's checkpoint held at once, and most on one device.
    pub dra_prepared_max: (u64, u64),
    /// Time from settling until nothing was left of gone DRA pods.
    pub dra_released_after: Option<Duration>,
    /// Distinct pods whose processes a monitor checked for the hook, per hook
    /// (`libvgpu.so`, `libamvgpu.so`).
    pub hook_checked_pods: BTreeMap<String, u64>,
    /// Timestamped log of injected faults and notable events, for diagnosing a failure.
    pub history: Vec<String>,
}

impl ChaosReport {
    /// A human-readable multi-line summary for the test's output.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "seed {}", self.seed);
        for (k, n) in &self.injected {
            let _ = writeln!(
                s,
                "  {k:?}: {n} injected, {} in the act",
                self.in_the_act.get(k).copied().unwrap_or(0)
            );
        }
        let _ = writeln!(
            s,
            "usage checks {} ({} readings of held memory), processes killed {} ({} holding memory), slowest release {:?}",
            self.usage_checks,
            self.memory_readings,
            self.kills,
            self.kills_holding_memory,
            self.slowest_release
        );
        let _ = writeln!(
            s,
            "pods checked for their hook: {:?}",
            self.hook_checked_pods
        );
        let _ = writeln!(
            s,
            "ledger checks {}, violations {}, pods created {}, placed (seen Running) {}, admission failures replaced {}, settled after {:?}",
            self.ledger_checks,
            self.violations.len(),
            self.pods_created,
            self.pods_placed,
            self.admission_failures,
            self.settled_after
        );
        if self.dra_checks > 0 {
            let _ = writeln!(
                s,
                "DRA: ledger checks {}, pods placed {}, most claims prepared at once {} (on one GPU {}), released after {:?}",
                self.dra_checks,
                self.dra_pods_placed,
                self.dra_prepared_max.0,
                self.dra_prepared_max.1,
                self.dra_released_after
            );
        }
        for v in &self.violations {
            let _ = writeln!(s, "  VIOLATION {v}");
        }
        s
    }

    /// The summary and the whole event history: what a failing run prints.
    pub fn render(&self) -> String {
        format!(
            "{}\nevent history (rerun with HAMI_CHAOS_SEED={}):\n{}",
            self.summary(),
            self.seed,
            self.history.join("\n")
        )
    }
}

/// Runs the stack under faults; the report lists every violation found.
pub async fn run(config: ChaosConfig) -> anyhow::Result<ChaosReport> {
    let mut report = ChaosReport {
        seed: config.seed,
        ..Default::default()
    };
    let log = Log {
        started: Instant::now(),
        lines: Arc::default(),
    };
    let mut rng = Rng::new(config.seed);
    let skews = [skew_of(rng.next_u64()), skew_of(rng.next_u64())];
    log.push(format!(
        "seed {}; replica clock skews {} and {}",
        config.seed, skews[0], skews[1]
    ));
    let mut stack = Stack::start(
        &format!("{}", config.seed),
        skews,
        config.workload.as_deref(),
        config.dra,
    )
    .await?;
    // The DRA pods' ResourceClaimTemplates: seeded sizes, created once.
    let templates = if stack.dra.is_some() {
        let templates = workload::dra_templates(&mut Rng::new(config.seed ^ 0xD7A_7E47));
        let api = Api::<ResourceClaimTemplate>::namespaced(stack.client.clone(), "default");
        for t in &templates {
            api.create(&PostParams::default(), &t.object()).await?;
        }
        log.push(format!(
            "DRA templates (MiB, CUs): {:?}",
            templates
                .iter()
                .map(|t| (t.name.as_str(), t.mem_mib, t.cus))
                .collect::<Vec<_>>()
        ));
        templates
    } else {
        Vec::new()
    };
    let dra_files = stack.dra.as_ref().map(|n| n.files());
    log.push(format!(
        "stack up: nodes {:?}, leader replica {:?}",
        stack
            .nodes
            .iter()
            .map(|n| n.name.clone())
            .collect::<Vec<_>>(),
        stack.leader()
    ));
    let shared = Arc::new(Mutex::new(Shared::default()));
    let monitors: Vec<SocketAddr> = if stack.images.is_some() {
        stack
            .nodes
            .iter()
            .map(|n| n.monitor_addr)
            .chain(stack.dra.iter().map(|n| n.monitor_addr))
            .collect()
    } else {
        Vec::new()
    };
    let monitors_final = monitors.clone();
    let tasks = [
        tokio::spawn(controller(
            stack.client.clone(),
            config.seed,
            8,
            templates.clone(),
            shared.clone(),
            log.clone(),
        )),
        tokio::spawn(ledger_loop(
            stack.client.clone(),
            monitors,
            dra_files.clone(),
            shared.clone(),
            log.clone(),
        )),
    ];
    let plan = schedule::plan(config.seed, config.fault_duration, config.mean_gap);
    let started = Instant::now();
    let outcome = {
        let mut injector = Injector {
            stack: &mut stack,
            shared: shared.clone(),
            log: log.clone(),
            report: &mut report,
            restarts: Vec::new(),
        };
        let mut outcome = Ok(());
        for p in &plan {
            if p.kind.needs_dra() && injector.stack.dra.is_none() {
                continue;
            }
            while Instant::now() < started + p.at {
                injector.due_restarts(false)?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if let Err(e) = injector.inject(p.kind, p.param).await {
                injector.log.push(format!("injector failed: {e:#}"));
                outcome = Err(e);
                break;
            }
        }
        while Instant::now() < started + config.fault_duration && outcome.is_ok() {
            injector.due_restarts(false)?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Faults stop: nothing injected any more, every part running again.
        injector.due_restarts(true)?;
        outcome
    };
    if let Some(api) = &stack.api {
        api.faults().clear();
    }
    for i in 0..stack.replicas.len() {
        if stack.replicas[i].is_none() {
            stack.start_replica(i, SignedDuration::ZERO)?;
        }
    }
    if stack.dra.as_ref().is_some_and(|n| n.kubelet.is_none()) {
        stack.start_dra_kubelet().await?;
        log.push("DRA node's kubelet-sim started again");
    }
    if let Some(node) = stack.dra.as_mut()
        && !node.driver_running()
    {
        // Only a failed start leaves it down (a kill is followed by a start).
        let _ = node.kill_driver();
        node.start_driver()?;
        log.push("DRA driver started again");
    }
    log.push("faults stopped");
    let faults_end = Instant::now();
    let deadline = faults_end + config.settle_limit;
    let mut last: Vec<(String, String)> = Vec::new();
    loop {
        if let Some(pods) = chaos_pods(&stack.client).await {
            let dra_pods = if templates.is_empty() {
                0
            } else {
                workload::DRA_PODS
            };
            let full = pods.len() >= workload::AMD_PODS + workload::NVIDIA_PODS + dra_pods;
            last = pods
                .iter()
                .filter_map(|p| {
                    ledger::unsettled(p)
                        .map(|why| (p.metadata.name.clone().unwrap_or_default(), why))
                })
                .collect();
            if full && last.is_empty() {
                report.settled_after = Some(faults_end.elapsed());
                break;
            }
        }
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Killed containers' memory must be released within RELEASE_LIMIT; the ledger loop
    // decides (bounded wait: it reports a violation at the limit).
    let release_deadline = Instant::now() + RELEASE_LIMIT + Duration::from_secs(5);
    while !lock(&shared).killed.is_empty() && Instant::now() < release_deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Nothing may be left of gone DRA pods: claims deleted, both checkpoints without them
    // (bounded wait; what is left at the limit is a violation).
    let dra_left = match &dra_files {
        Some(files) if report.settled_after.is_some() => {
            let released_from = Instant::now();
            let mut left = Vec::new();
            while Instant::now() < released_from + DRA_RELEASE_LIMIT {
                left = dra_leftovers(&stack.client, files).await;
                if left.is_empty() {
                    report.dra_released_after = Some(released_from.elapsed());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            left
        }
        _ => Vec::new(),
    };
    // One last full pass of the ledger over the settled state.
    tokio::time::sleep(Duration::from_millis(400)).await;
    for t in &tasks {
        t.abort();
    }
    if let (Ok(pods), Ok(nodes)) = (
        Api::<Pod>::all(stack.client.clone())
            .list(&ListParams::default())
            .await,
        Api::<Node>::all(stack.client.clone())
            .list(&ListParams::default())
            .await,
    ) {
        let mut found = ledger::check_placement(&pods.items, &nodes.items);
        found.extend(ledger::check_agreement(&pods.items));
        found.extend(dra_left);
        if let Some(files) = &dra_files {
            // Settled: no pod comes or goes, so one pass is the final word on Running pods.
            let before = files.driver_checkpoint();
            match dra_snapshot(&stack.client, files).await {
                Some(snap) => found.extend(dra_findings(
                    &pods.items,
                    &before,
                    &snap,
                    &mut lock(&shared),
                    false,
                )),
                None => log.push("final DRA pass: the API server did not answer"),
            }
        }
        let live = if monitors_final.is_empty() {
            None
        } else {
            read_monitors(&monitors_final).await
        };
        let mut s = lock(&shared);
        if let Some(readings) = &live {
            found.extend(usage_pass(&readings.live, &pods.items, &mut s, &log));
            found.extend(hook_pass(readings, &mut s));
        }
        for (ns, pod) in std::mem::take(&mut s.killed).into_keys() {
            found.push(Violation::NotReleased {
                pod: format!("{ns}/{pod}"),
                used: live
                    .as_ref()
                    .map_or(0, |l| ledger::memory_of(&l.live, &ns, &pod)),
                after_ms: RELEASE_LIMIT.as_millis() as u64,
            });
        }
        for v in found {
            let text = v.to_string();
            if s.seen.insert(text.clone()) {
                log.push(format!("LEDGER (final): {text}"));
                s.violations.push(text);
            }
        }
    }
    if let Some(files) = &dra_files
        && (report.settled_after.is_none() || report.dra_released_after.is_none())
    {
        for line in dra_state_lines(&stack.client, files).await {
            log.push(line);
        }
    }
    // What the monitors told of processes without their hook (the pid, what ld.so did).
    for e in Api::<k8s_openapi::api::core::v1::Event>::namespaced(stack.client.clone(), "default")
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some(hami_monitor::hook_presence::REASON_SLICE_NOT_ENFORCED)
        })
    {
        log.push(format!(
            "SliceNotEnforced on {:?}: {}",
            e.involved_object.name.as_deref(),
            e.message.clone().unwrap_or_default()
        ));
    }
    if report.settled_after.is_none() {
        // What kube-scheduler and the scheduler last said about each stranded pod.
        let events =
            Api::<k8s_openapi::api::events::v1::Event>::namespaced(stack.client.clone(), "default")
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
        for (pod, _) in &last {
            for e in events.iter().filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod.as_str())
            }) {
                log.push(format!(
                    "event of {pod}: {} {} (x{})",
                    e.reason.clone().unwrap_or_default(),
                    e.note.clone().unwrap_or_default(),
                    e.series.as_ref().map_or(1, |s| s.count)
                ));
            }
        }
        log.push(format!(
            "leader replica {:?}; replicas ready {:?}",
            stack.leader(),
            stack
                .replicas
                .iter()
                .map(|r| r.as_ref().map(|r| r.scheduler.view_problem()))
                .collect::<Vec<_>>()
        ));
        let mut s = lock(&shared);
        for (pod, state) in last {
            let v = Violation::Stranded { pod, state }.to_string();
            log.push(format!("LEDGER: {v}"));
            s.violations.push(format!(
                "{v} ({:?} after the faults stopped)",
                config.settle_limit
            ));
        }
    }
    log.push("run over");
    {
        let s = lock(&shared);
        report.violations = s.violations.clone();
        report.ledger_checks = s.checks;
        report.pods_created = s.created;
        report.pods_placed = s.placed.len() as u64;
        report.admission_failures = s.admission_failures;
        report.usage_checks = s.usage_checks;
        report.kills = s.kills;
        report.kills_holding_memory = s.kills_holding_memory;
        report.memory_readings = s.memory_readings;
        report.slowest_release = s.slowest_release;
        report.dra_checks = s.dra_checks;
        report.dra_pods_placed = s.dra_placed.len() as u64;
        report.dra_prepared_max = s.dra_prepared_max;
        report.hook_checked_pods = s
            .hook_checked
            .iter()
            .map(|(hook, pods)| (hook.clone(), pods.len() as u64))
            .collect();
    }
    report.history = log.lines.lock().unwrap_or_else(|p| p.into_inner()).clone();
    stack.shutdown().await;
    outcome.map(|()| report)
}
