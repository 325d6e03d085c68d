//! The chaos run: the stack under a seeded fault schedule while a workload controller keeps
//! pods coming and the ledger checks its invariants every few hundred milliseconds; then
//! the faults stop and every pod must settle within the stated time.
//!
//! The seed fixes the schedule (what, when, which parameter) and the workload (pod sizes,
//! policies); thread timing is the OS's, so a seed replays the same faults, not the same
//! interleaving. A failing run prints the seed and the event history.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hami_protocol::names::pod as pod_keys;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::SignedDuration;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use crate::ledger::{self, Violation};
use crate::rng::Rng;
use crate::schedule::{self, FaultKind};
use crate::stack::Stack;
use crate::workload::{self, Kind};

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
}

/// A killed container's device memory must be gone from its monitor's readings within
/// this (monitors refresh every 2 s; the hooks reclaim a dead process's slot).
pub const RELEASE_LIMIT: Duration = Duration::from_secs(10);

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
            "ledger checks {}, violations {}, pods created {}, placed (seen Running) {}, admission failures replaced {}, settled after {:?}",
            self.ledger_checks,
            self.violations.len(),
            self.pods_created,
            self.pods_placed,
            self.admission_failures,
            self.settled_after
        );
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

#[derive(Clone)]
pub(crate) struct Log {
    pub(crate) started: Instant,
    pub(crate) lines: Arc<Mutex<Vec<String>>>,
}

impl Log {
    pub(crate) fn push(&self, line: impl AsRef<str>) {
        let t = self.started.elapsed().as_secs_f64();
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("[{t:7.2}s] {}", line.as_ref()));
    }
}

#[derive(Default)]
pub(crate) struct Shared {
    violations: Vec<String>,
    seen: BTreeSet<String>,
    checks: u64,
    pub(crate) created: u64,
    placed: BTreeSet<String>,
    pub(crate) admission_failures: u64,
    usage_checks: u64,
    /// Killed containers' pods (namespace, name) whose memory is not yet seen released.
    killed: BTreeMap<(String, String), Instant>,
    kills: u64,
    kills_holding_memory: u64,
    slowest_release: Option<Duration>,
    memory_readings: u64,
    /// Device memory each pod held at the last usage pass.
    last_memory: BTreeMap<(String, String), u64>,
}

fn lock(s: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

async fn chaos_pods(client: &Client) -> Option<Vec<Pod>> {
    Api::<Pod>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels("app=chaos"))
        .await
        .ok()
        .map(|l| l.items)
}

fn kind_of(pod: &Pod) -> Kind {
    if pod
        .metadata
        .name
        .as_deref()
        .unwrap_or("")
        .contains("nvidia")
    {
        Kind::Nvidia
    } else {
        Kind::Amd
    }
}

/// The ReplicaSet stand-in: replaces Failed pods, keeps the target counts.
pub(crate) async fn controller(
    client: Client,
    seed: u64,
    churn_every_ticks: u64,
    shared: Arc<Mutex<Shared>>,
    log: Log,
) {
    let mut rng = Rng::new(seed ^ 0x5EED_C0DE);
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut counter = 0u64;
    let mut tick = 0u64;
    loop {
        if let Some(pods) = chaos_pods(&client).await {
            let mut live = BTreeMap::from([(Kind::Amd, 0usize), (Kind::Nvidia, 0usize)]);
            for p in &pods {
                let name = p.metadata.name.clone().unwrap_or_default();
                if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed") {
                    if pods_api
                        .delete(&name, &DeleteParams::default().grace_period(0))
                        .await
                        .is_ok()
                    {
                        lock(&shared).admission_failures += 1;
                        let why = p.status.as_ref().and_then(|s| s.reason.clone());
                        log.push(format!("controller: {name} Failed ({why:?}), replaced"));
                    }
                    continue;
                }
                *live.entry(kind_of(p)).or_default() += 1;
            }
            for (kind, target) in [
                (Kind::Amd, workload::AMD_PODS),
                (Kind::Nvidia, workload::NVIDIA_PODS),
            ] {
                for _ in live[&kind]..target {
                    counter += 1;
                    let word = if kind == Kind::Amd { "amd" } else { "nvidia" };
                    let name = format!("chaos-{word}-{counter}");
                    let pod = workload::pod(&name, kind, &mut rng);
                    match pods_api.create(&PostParams::default(), &pod).await {
                        Ok(_) => lock(&shared).created += 1,
                        Err(e) => {
                            log.push(format!("controller: create {name}: {e}"));
                            break;
                        }
                    }
                }
            }
        }
        // Steady churn: now and then a Running pod completes (is deleted) and is replaced.
        tick += 1;
        if tick.is_multiple_of(churn_every_ticks.max(1))
            && let Some(pods) = chaos_pods(&client).await
        {
            let running: Vec<&Pod> = pods
                .iter()
                .filter(|p| ledger::unsettled(p).is_none())
                .collect();
            if !running.is_empty() {
                let victim = running[rng.below(running.len() as u64) as usize];
                let name = victim.metadata.name.clone().unwrap_or_default();
                if pods_api
                    .delete(&name, &DeleteParams::default().grace_period(0))
                    .await
                    .is_ok()
                {
                    log.push(format!("controller: {name} completed (churn)"));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes one settled chaos pod on `node` (any node if None), so that its replacement is
/// scheduled and allocated while the fault waits for it.
async fn provoke(client: &Client, node: Option<&str>) {
    if let Some(p) = chaos_pods(client).await.and_then(|ps| {
        ps.into_iter()
            .find(|p| ledger::unsettled(p).is_none() && node.is_none_or(|n| node_of(p) == Some(n)))
    }) {
        let _ = Api::<Pod>::namespaced(client.clone(), "default")
            .delete(
                p.metadata.name.as_deref().unwrap_or_default(),
                &DeleteParams::default().grace_period(0),
            )
            .await;
    }
}

/// Every monitor's readings, or None if one did not answer (a partial view would make a
/// killed pod's memory look released).
async fn read_monitors(monitors: &[SocketAddr]) -> Option<hami_demo::Live> {
    let monitors = monitors.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut all = hami_demo::Live::default();
        for m in monitors {
            all.extend(hami_demo::live::fetch(&format!("http://{m}/metrics")).ok()?);
        }
        Some(all)
    })
    .await
    .ok()
    .flatten()
}

/// Real usage within limits, and killed containers' memory released in time.
fn usage_pass(live: &hami_demo::Live, pods: &[Pod], s: &mut Shared, log: &Log) -> Vec<Violation> {
    let mut found = ledger::check_usage(live, pods);
    s.usage_checks += 1;
    s.memory_readings += live.memory.values().filter(|m| **m > 0.0).count() as u64;
    s.last_memory.clear();
    for ((ns, pod, _, _), m) in &live.memory {
        *s.last_memory.entry((ns.clone(), pod.clone())).or_default() += *m as u64;
    }
    let now = Instant::now();
    let killed = std::mem::take(&mut s.killed);
    for ((ns, pod), at) in killed {
        let used = ledger::memory_of(live, &ns, &pod);
        let after = now.duration_since(at);
        if used == 0 {
            log.push(format!(
                "ledger: {ns}/{pod}'s memory released {after:?} after the kill"
            ));
            s.slowest_release = s.slowest_release.max(Some(after));
        } else if after > RELEASE_LIMIT {
            found.push(Violation::NotReleased {
                pod: format!("{ns}/{pod}"),
                used,
                after_ms: after.as_millis() as u64,
            });
        } else {
            s.killed.insert((ns, pod), at);
        }
    }
    found
}

/// The continuous ledger: placement and agreement invariants on every pass, and real usage
/// from the monitors when the pods run processes.
async fn ledger_loop(
    client: Client,
    monitors: Vec<SocketAddr>,
    shared: Arc<Mutex<Shared>>,
    log: Log,
) {
    loop {
        let live = if monitors.is_empty() {
            None
        } else {
            read_monitors(&monitors).await
        };
        let pods = Api::<Pod>::all(client.clone())
            .list(&ListParams::default())
            .await;
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await;
        if let (Ok(pods), Ok(nodes)) = (pods, nodes) {
            let mut found = ledger::check_placement(&pods.items, &nodes.items);
            found.extend(ledger::check_agreement(&pods.items));
            let mut s = lock(&shared);
            s.checks += 1;
            if let Some(live) = &live {
                found.extend(usage_pass(live, &pods.items, &mut s, &log));
            }
            for p in pods
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            {
                s.placed.insert(p.metadata.name.clone().unwrap_or_default());
            }
            for v in found {
                let text = v.to_string();
                if s.seen.insert(text.clone()) {
                    log.push(format!("LEDGER: {text}"));
                    s.violations.push(text);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn skew_of(param: u64) -> SignedDuration {
    // Up to ±5 minutes: far beyond the lease duration, as a broken NTP would be.
    let secs = (param % 601) as i64 - 300;
    SignedDuration::from_secs(secs)
}

/// Polls for a chaos pod matching `pick` for at most `limit`.
async fn wait_for_pod(
    client: &Client,
    limit: Duration,
    pick: impl Fn(&Pod) -> bool,
) -> Option<Pod> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(p) = chaos_pods(client)
            .await
            .and_then(|ps| ps.into_iter().find(&pick))
        {
            return Some(p);
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    None
}

fn bind_phase(p: &Pod) -> Option<&str> {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(pod_keys::BIND_PHASE))
        .map(String::as_str)
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// Host pid of every container's live pid 1, with its pod (namespace, name).
fn live_processes(stack: &Stack) -> Vec<(i32, String, String, String)> {
    stack
        .nodes
        .iter()
        .flat_map(|n| n.containers())
        .filter_map(|r| Some((r.init_pid?, r.namespace, r.pod, r.container_id)))
        .collect()
}

/// SIGKILL of the container process `pid` and of its process group when it has one of its
/// own (never ours: kubelet-sim's children may share this process's group). Its pid 1
/// dying takes the rest of its PID namespace with it.
fn kill_process_group(pid: i32) -> &'static str {
    // SAFETY: getpgid and getpgrp take and return plain integers.
    let (group, ours) = unsafe { (libc::getpgid(pid), libc::getpgrp()) };
    let whole_group = group > 1 && group != ours;
    if whole_group {
        // SAFETY: kill(2) with a negative pid signals that group; no memory is involved.
        unsafe { libc::kill(-group, libc::SIGKILL) };
    }
    // SAFETY: as above, one process.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    if whole_group {
        "process group"
    } else {
        "process"
    }
}

struct Injector<'a> {
    stack: &'a mut Stack,
    shared: Arc<Mutex<Shared>>,
    log: Log,
    report: &'a mut ChaosReport,
    restarts: Vec<(Instant, usize, SignedDuration)>,
}

impl Injector<'_> {
    async fn inject(&mut self, kind: FaultKind, param: u64) -> anyhow::Result<()> {
        *self.report.injected.entry(kind).or_default() += 1;
        let client = self.stack.client.clone();
        match kind {
            FaultKind::ConflictStorm => {
                let n = 2 + (param % 6) as u32;
                let f = self.stack.api().faults();
                f.fail_next(Some("patch"), Some("pods"), n, 409);
                f.fail_next(Some("patch"), Some("nodes"), n, 409);
                // kubelet-sim's status writes (it retries its record and status until taken).
                f.fail_next(Some("patch"), Some("pods/status"), n, 409);
                f.fail_next(
                    Some("create"),
                    Some("pods/binding"),
                    1 + (param >> 8) as u32 % 3,
                    409,
                );
                f.fail_next(
                    Some("update"),
                    Some("leases"),
                    1 + (param >> 16) as u32 % 3,
                    409,
                );
                self.log.push(format!(
                    "FAULT 409 storm: next {n} pod, pod status and node patches, bindings and lease updates"
                ));
            }
            FaultKind::WatchDrop => {
                let f = self.stack.api().faults();
                f.close_all_watches();
                let expire = param & 1 == 1;
                if expire {
                    f.expire_watch_history();
                }
                self.log
                    .push(format!("FAULT watch drop (history expired: {expire})"));
            }
            FaultKind::ApiServerRestart => {
                let down = Duration::from_millis(200 + param % 800);
                self.log
                    .push(format!("FAULT API server restart (down {down:?})"));
                self.stack.restart_api(down).await?;
                self.log
                    .push("API server back on the same address and data dir");
            }
            FaultKind::LeaderKill => {
                let i = self.stack.leader().unwrap_or((param % 2) as usize);
                if let Some(id) = self.stack.kill_replica(i) {
                    let back = Duration::from_millis(1000 + param % 3000);
                    self.restarts
                        .push((Instant::now() + back, i, skew_of(param >> 20)));
                    self.log
                        .push(format!("FAULT leader kill: {id} (back in {back:?})"));
                } else {
                    self.log
                        .push(format!("FAULT leader kill: replica {i} already down"));
                }
            }
            FaultKind::PluginRestartMidAllocate => {
                let i = (param % self.stack.nodes.len() as u64) as usize;
                let node = self.stack.nodes[i].name.clone();
                provoke(&client, Some(&node)).await;
                let caught = wait_for_pod(&client, Duration::from_secs(3), |p| {
                    node_of(p) == Some(node.as_str()) && bind_phase(p) == Some("allocating")
                })
                .await;
                if caught.is_some() {
                    *self.report.in_the_act.entry(kind).or_default() += 1;
                }
                let graceful = self.stack.nodes[i].stop_plugin().await;
                let down = Duration::from_millis(100 + param % 900);
                self.log.push(format!(
                    "FAULT plugin restart on {node} (pod allocating: {:?}; stopped in 5 s: {graceful}; down {down:?})",
                    caught.and_then(|p| p.metadata.name)
                ));
                tokio::time::sleep(down).await;
                self.stack.start_plugin(i);
            }
            FaultKind::KubeletRestart => {
                let i = (param % self.stack.nodes.len() as u64) as usize;
                self.log.push(format!(
                    "FAULT kubelet restart on {}",
                    self.stack.nodes[i].name
                ));
                self.stack.nodes[i].kubelet.restart().await?;
            }
            FaultKind::DeleteMidBind => {
                // Between filter and bind (annotated, unbound) or between bind and the
                // plugin's commit (bound, not yet success).
                provoke(&client, None).await;
                let caught = wait_for_pod(&client, Duration::from_secs(3), |p| {
                    let annotated = p
                        .metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(pod_keys::VGPU_NODE));
                    annotated && bind_phase(p) != Some("success")
                })
                .await;
                let victim = match &caught {
                    Some(p) => {
                        *self.report.in_the_act.entry(kind).or_default() += 1;
                        p.metadata.name.clone()
                    }
                    None => chaos_pods(&client).await.and_then(|ps| {
                        let n = ps.len().max(1) as u64;
                        ps.into_iter()
                            .nth((param % n) as usize)
                            .and_then(|p| p.metadata.name)
                    }),
                };
                if let Some(name) = victim {
                    let state = caught
                        .as_ref()
                        .map(|p| format!("node {:?}, bind-phase {:?}", node_of(p), bind_phase(p)));
                    let r = Api::<Pod>::namespaced(client.clone(), "default")
                        .delete(&name, &DeleteParams::default().grace_period(0))
                        .await;
                    self.log.push(format!(
                        "FAULT delete {name} mid-bind ({}): {}",
                        state.unwrap_or_else(|| "no pod in flight; a random one".into()),
                        if r.is_ok() {
                            "deleted"
                        } else {
                            "delete failed"
                        }
                    ));
                }
            }
            FaultKind::KillWorkload => {
                // Half the time a replacement pod's process is caught while it opens the
                // runtime and allocates; else (or without one in 3 s) a seeded live one,
                // which likely holds memory the hooks must give back.
                let before: BTreeSet<String> = live_processes(self.stack)
                    .into_iter()
                    .map(|(_, _, _, id)| id)
                    .collect();
                let catch = param & 1 == 0;
                if catch {
                    provoke(&client, None).await;
                }
                let deadline = Instant::now() + Duration::from_secs(3);
                let mut fresh = None;
                while catch && fresh.is_none() && Instant::now() < deadline {
                    fresh = live_processes(self.stack)
                        .into_iter()
                        .find(|(_, _, _, id)| !before.contains(id));
                    if fresh.is_none() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                let in_the_act = fresh.is_some();
                let target = fresh.or_else(|| {
                    let all = live_processes(self.stack);
                    let n = all.len() as u64;
                    (n > 0).then(|| all[((param >> 1) % n) as usize].clone())
                });
                match target {
                    Some((pid, ns, pod, _)) => {
                        if in_the_act {
                            *self.report.in_the_act.entry(kind).or_default() += 1;
                        }
                        let what = kill_process_group(pid);
                        let held = {
                            let mut s = lock(&self.shared);
                            s.kills += 1;
                            let key = (ns.clone(), pod.clone());
                            let held = s.last_memory.get(&key).copied().unwrap_or(0);
                            if held > 0 {
                                s.kills_holding_memory += 1;
                            }
                            s.killed.insert(key, Instant::now());
                            held
                        };
                        self.log.push(format!(
                            "FAULT SIGKILL of {ns}/{pod}'s {what} (host pid {pid}; just started: {in_the_act}; last seen holding {held} B)"
                        ));
                    }
                    None => self
                        .log
                        .push("FAULT SIGKILL: no live workload process to kill"),
                }
            }
            FaultKind::ClockSkew => {
                let i = (param % 2) as usize;
                let skew = skew_of(param >> 8);
                self.stack.start_replica(i, skew)?;
                self.log.push(format!(
                    "FAULT clock skew: replica {i} restarted {skew} off"
                ));
            }
        }
        Ok(())
    }

    fn due_restarts(&mut self, all: bool) -> anyhow::Result<()> {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = self
            .restarts
            .drain(..)
            .partition(|(at, _, _)| all || *at <= now);
        self.restarts = later;
        for (_, i, skew) in due {
            if self.stack.replicas[i].is_none() {
                self.stack.start_replica(i, skew)?;
                self.log.push(format!("replica {i} back ({skew} off)"));
            }
        }
        Ok(())
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
    )
    .await?;
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
        stack.nodes.iter().map(|n| n.monitor_addr).collect()
    } else {
        Vec::new()
    };
    let monitors_final = monitors.clone();
    let tasks = [
        tokio::spawn(controller(
            stack.client.clone(),
            config.seed,
            8,
            shared.clone(),
            log.clone(),
        )),
        tokio::spawn(ledger_loop(
            stack.client.clone(),
            monitors,
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
    log.push("faults stopped");
    let faults_end = Instant::now();
    let deadline = faults_end + config.settle_limit;
    let mut last: Vec<(String, String)> = Vec::new();
    loop {
        if let Some(pods) = chaos_pods(&stack.client).await {
            let full = pods.len() >= workload::AMD_PODS + workload::NVIDIA_PODS;
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
        let live = if monitors_final.is_empty() {
            None
        } else {
            read_monitors(&monitors_final).await
        };
        let mut s = lock(&shared);
        if let Some(live) = &live {
            found.extend(usage_pass(live, &pods.items, &mut s, &log));
        }
        for (ns, pod) in std::mem::take(&mut s.killed).into_keys() {
            found.push(Violation::NotReleased {
                pod: format!("{ns}/{pod}"),
                used: live.as_ref().map_or(0, |l| ledger::memory_of(l, &ns, &pod)),
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
    }
    report.history = log.lines.lock().unwrap_or_else(|p| p.into_inner()).clone();
    stack.shutdown().await;
    outcome.map(|()| report)
}
