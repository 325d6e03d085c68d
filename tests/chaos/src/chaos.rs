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
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use k8s_openapi::jiff::SignedDuration;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use crate::dra_node::DraFiles;
use crate::ledger::{self, Violation};
use crate::ledger_dra;
use crate::rng::Rng;
use crate::schedule::{self, FaultKind};
use crate::stack::Stack;
use crate::workload::{self, DraTemplate, Kind};

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
    dra_checks: u64,
    dra_placed: BTreeSet<String>,
    dra_prepared_max: (u64, u64),
    /// Running-pod findings of the last DRA pass, reported when the next one finds them too
    /// (a pod listed Running between two checkpoint reads that went away meanwhile is no
    /// finding).
    dra_suspects: BTreeSet<String>,
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
    let name = pod.metadata.name.as_deref().unwrap_or("");
    if name.contains("nvidia") {
        Kind::Nvidia
    } else if ledger_dra::is_dra_pod(pod) {
        Kind::Dra
    } else {
        Kind::Amd
    }
}

/// The ReplicaSet stand-in: replaces Failed pods, keeps the target counts (DRA pods from
/// `dra` when it has templates).
pub(crate) async fn controller(
    client: Client,
    seed: u64,
    churn_every_ticks: u64,
    dra: Vec<DraTemplate>,
    shared: Arc<Mutex<Shared>>,
    log: Log,
) {
    let mut rng = Rng::new(seed ^ 0x5EED_C0DE);
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut counter = 0u64;
    let mut tick = 0u64;
    loop {
        if let Some(pods) = chaos_pods(&client).await {
            let mut live = BTreeMap::from([
                (Kind::Amd, 0usize),
                (Kind::Nvidia, 0usize),
                (Kind::Dra, 0usize),
            ]);
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
            let dra_pods = if dra.is_empty() {
                0
            } else {
                workload::DRA_PODS
            };
            for (kind, target) in [
                (Kind::Amd, workload::AMD_PODS),
                (Kind::Nvidia, workload::NVIDIA_PODS),
                (Kind::Dra, dra_pods),
            ] {
                for _ in live[&kind]..target {
                    counter += 1;
                    let word = match kind {
                        Kind::Amd => "amd",
                        Kind::Nvidia => "nvidia",
                        Kind::Dra => "dra",
                    };
                    let name = format!("chaos-{word}-{counter}");
                    let pod = match kind {
                        Kind::Dra => workload::dra_pod(&name, &dra, &mut rng),
                        _ => workload::pod(&name, kind, &mut rng),
                    };
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

/// Deletes one settled chaos pod on `node` (any device-plugin pod if None), so that its
/// replacement is scheduled and allocated while the fault waits for it.
async fn provoke(client: &Client, node: Option<&str>) {
    provoke_one(client, |p| {
        !ledger_dra::is_dra_pod(p) && node.is_none_or(|n| node_of(p) == Some(n))
    })
    .await;
}

/// Deletes one settled chaos pod that `pick` accepts.
async fn provoke_one(client: &Client, pick: impl Fn(&Pod) -> bool) {
    if let Some(p) = chaos_pods(client).await.and_then(|ps| {
        ps.into_iter()
            .find(|p| ledger::unsettled(p).is_none() && pick(p))
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

/// What the DRA checks read after the pods: the claims and slices, the pods again, the
/// driver's checkpoint again (see `ledger_dra::check_cus` for why this order).
struct DraSnapshot {
    claims: Vec<ResourceClaim>,
    slices: Vec<ResourceSlice>,
    pods_after: Vec<Pod>,
    driver_after: hami_amdgpu_dra_plugin::checkpoint::Checkpoint,
}

async fn dra_snapshot(client: &Client, files: &DraFiles) -> Option<DraSnapshot> {
    let claims = Api::<ResourceClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ok()?
        .items;
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ok()?
        .items;
    let pods_after = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ok()?
        .items;
    let driver_after = files.driver_checkpoint().ok()?;
    Some(DraSnapshot {
        claims,
        slices,
        pods_after,
        driver_after,
    })
}

/// One DRA pass over `pods` (listed after `driver_before` was read, before the snapshot):
/// capacity and CUs at once; Running pods' findings only when the last pass had them too
/// (`confirm`), for pods still there.
fn dra_findings(
    pods: &[Pod],
    driver_before: &Result<hami_amdgpu_dra_plugin::checkpoint::Checkpoint, String>,
    snap: &DraSnapshot,
    s: &mut Shared,
    confirm: bool,
) -> Vec<Violation> {
    let driver_before = match driver_before {
        Ok(c) => c,
        Err(e) => {
            return vec![Violation::Undecodable {
                pod: "the DRA driver's checkpoint".into(),
                what: e.clone(),
            }];
        }
    };
    let mut found = ledger_dra::check_capacity(&snap.claims, &snap.slices);
    found.extend(ledger_dra::check_cus(
        &snap.pods_after,
        &snap.claims,
        &snap.slices,
        driver_before,
    ));
    let prepared: BTreeSet<String> = driver_before
        .claims
        .keys()
        .chain(snap.driver_after.claims.keys())
        .cloned()
        .collect();
    let still: BTreeSet<&str> = snap
        .pods_after
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    let mut suspects = BTreeSet::new();
    for (uid, v) in ledger_dra::check_running(pods, &snap.claims, &prepared) {
        if !still.contains(uid.as_str()) {
            continue;
        }
        let text = v.to_string();
        if !confirm || s.dra_suspects.contains(&text) {
            found.push(v);
        }
        suspects.insert(text);
    }
    s.dra_suspects = suspects;
    s.dra_checks += 1;
    let cp = &snap.driver_after;
    let mut per_gpu: BTreeMap<&str, u64> = BTreeMap::new();
    for d in cp.claims.values().flat_map(|c| &c.devices) {
        *per_gpu.entry(d.device_id.as_str()).or_default() += 1;
    }
    s.dra_prepared_max.0 = s.dra_prepared_max.0.max(cp.claims.len() as u64);
    s.dra_prepared_max.1 = s
        .dra_prepared_max
        .1
        .max(per_gpu.values().copied().max().unwrap_or(0));
    for p in pods.iter().filter(|p| {
        ledger_dra::is_dra_pod(p)
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    }) {
        s.dra_placed
            .insert(p.metadata.name.clone().unwrap_or_default());
    }
    found
}

/// The continuous ledger: placement and agreement invariants on every pass, and real usage
/// from the monitors when the pods run processes; the DRA checks with the DRA node.
async fn ledger_loop(
    client: Client,
    monitors: Vec<SocketAddr>,
    dra: Option<DraFiles>,
    shared: Arc<Mutex<Shared>>,
    log: Log,
) {
    loop {
        let live = if monitors.is_empty() {
            None
        } else {
            read_monitors(&monitors).await
        };
        let driver_before = dra.as_ref().map(DraFiles::driver_checkpoint);
        let pods = Api::<Pod>::all(client.clone())
            .list(&ListParams::default())
            .await;
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await;
        let snap = match &dra {
            Some(files) => dra_snapshot(&client, files).await,
            None => None,
        };
        if let (Ok(pods), Ok(nodes)) = (pods, nodes) {
            let mut found = ledger::check_placement(&pods.items, &nodes.items);
            found.extend(ledger::check_agreement(&pods.items));
            let mut s = lock(&shared);
            s.checks += 1;
            if let Some(live) = &live {
                found.extend(usage_pass(live, &pods.items, &mut s, &log));
            }
            if let (Some(before), Some(snap)) = (&driver_before, &snap) {
                found.extend(dra_findings(&pods.items, before, snap, &mut s, true));
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

/// The DRA side as it is now, one line per pod and claim, for a failing run's history.
async fn dra_state_lines(client: &Client, files: &DraFiles) -> Vec<String> {
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let claims = Api::<ResourceClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let driver = files.driver_checkpoint();
    let kubelet = files.kubelet_checkpoint();
    let name_of = |uid: &str| {
        pods.iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
            .and_then(|p| p.metadata.name.clone())
            .unwrap_or_else(|| format!("gone pod {uid}"))
    };
    let mut out = Vec::new();
    for p in pods.iter().filter(|p| ledger_dra::is_dra_pod(p)) {
        let status = p.status.as_ref();
        out.push(format!(
            "DRA pod {} uid {:?}: node {:?}, phase {:?}, claims {:?}, conditions {:?}",
            p.metadata.name.as_deref().unwrap_or(""),
            p.metadata.uid,
            node_of(p),
            status.and_then(|s| s.phase.clone()),
            status
                .and_then(|s| s.resource_claim_statuses.as_ref())
                .map(|c| c
                    .iter()
                    .map(|c| c.resource_claim_name.clone())
                    .collect::<Vec<_>>()),
            status.and_then(|s| s.conditions.as_ref()).map(|c| c
                .iter()
                .map(|c| format!("{}={} {:?}", c.type_, c.status, c.message))
                .collect::<Vec<_>>()),
        ));
    }
    for c in &claims {
        let uid = c.metadata.uid.clone().unwrap_or_default();
        let status = c.status.as_ref();
        out.push(format!(
            "claim {} uid {uid}: owner {:?}, allocation {:?}, reserved for {:?}, devices {:?}, in the driver's checkpoint {:?}, in kubelet-sim's {:?}",
            c.metadata.name.as_deref().unwrap_or(""),
            c.metadata
                .owner_references
                .iter()
                .flatten()
                .map(|o| o.name.clone())
                .collect::<Vec<_>>(),
            status.and_then(|s| s.allocation.as_ref()).map(|a| a
                .devices
                .as_ref()
                .and_then(|d| d.results.as_ref())
                .into_iter()
                .flatten()
                .map(|r| format!("{}/{} {:?}", r.pool, r.device, r.consumed_capacity))
                .collect::<Vec<_>>()),
            status
                .and_then(|s| s.reserved_for.as_ref())
                .map(|r| r.iter().map(|r| name_of(&r.uid)).collect::<Vec<_>>()),
            status
                .and_then(|s| s.devices.as_ref())
                .map(|d| d.iter().map(|d| format!("{} {:?}", d.device, d.data.as_ref().map(|x| x.0.to_string()))).collect::<Vec<_>>()),
            driver.as_ref().map(|d| d.claims.contains_key(&uid)),
            kubelet.as_ref().map(|k| k.claims.get(&uid).map(|e| e.pods.iter().map(|u| name_of(u)).collect::<Vec<_>>())),
        ));
    }
    if let Ok(d) = &driver {
        for (uid, c) in &d.claims {
            if !claims
                .iter()
                .any(|x| x.metadata.uid.as_deref() == Some(uid.as_str()))
            {
                out.push(format!(
                    "driver checkpoint: claim {}/{} uid {uid} (no such claim), CUs {:?}",
                    c.namespace,
                    c.name,
                    c.devices.iter().map(|d| d.cus.clone()).collect::<Vec<_>>()
                ));
            }
        }
    }
    out
}

/// What is left of gone DRA pods now (`ledger_dra::check_released`); a read that fails is
/// reported as such.
async fn dra_leftovers(client: &Client, files: &DraFiles) -> Vec<Violation> {
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await;
    let claims = Api::<ResourceClaim>::all(client.clone())
        .list(&ListParams::default())
        .await;
    let (driver, kubelet) = (files.driver_checkpoint(), files.kubelet_checkpoint());
    match (pods, claims, driver, kubelet) {
        (Ok(p), Ok(c), Ok(d), Ok(k)) => ledger_dra::check_released(&p.items, &c.items, &d, &k),
        (p, c, d, k) => vec![Violation::Undecodable {
            pod: "the DRA node's state".into(),
            what: format!(
                "cannot read it: pods {:?}, claims {:?}, driver checkpoint {:?}, kubelet-sim checkpoint {:?}",
                p.err().map(|e| e.to_string()),
                c.err().map(|e| e.to_string()),
                d.err(),
                k.err()
            ),
        }],
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

fn pending(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|ph| ph == "Pending")
}

/// A DRA pod bound to its node and not Running yet: kubelet-sim is preparing its claim.
fn dra_preparing(p: &Pod) -> bool {
    ledger_dra::is_dra_pod(p) && node_of(p).is_some() && pending(p)
}

/// A DRA pod on its way: its claim created (recorded in its status), allocated or being
/// prepared.
fn dra_in_flight(p: &Pod) -> bool {
    let has_claim = p
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .is_some_and(|c| !c.is_empty());
    ledger_dra::is_dra_pod(p) && pending(p) && (has_claim || node_of(p).is_some())
}

/// A seeded Running DRA pod's name.
async fn running_dra_pod(client: &Client, param: u64) -> Option<String> {
    let running: Vec<Pod> = chaos_pods(client)
        .await?
        .into_iter()
        .filter(|p| ledger_dra::is_dra_pod(p) && ledger::unsettled(p).is_none())
        .collect();
    let n = running.len() as u64;
    (n > 0).then(|| {
        running[(param % n) as usize]
            .metadata
            .name
            .clone()
            .unwrap_or_default()
    })
}

async fn delete_pod(client: &Client, name: &str) -> &'static str {
    match Api::<Pod>::namespaced(client.clone(), "default")
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
    {
        Ok(_) => "deleted",
        Err(_) => "delete failed",
    }
}

/// Host pid of every container's live pid 1, with its pod (namespace, name).
fn live_processes(stack: &Stack) -> Vec<(i32, String, String, String)> {
    stack
        .nodes
        .iter()
        .flat_map(|n| n.containers())
        .chain(stack.dra.iter().flat_map(|n| n.containers()))
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
                let dra = if self.stack.dra.is_some() {
                    // The scheduler's allocation and reservation writes, the claim
                    // controller's unreserve, the driver's status.devices at prepare.
                    f.fail_next(Some("patch"), Some("resourceclaims/status"), n, 409);
                    let creates = 1 + (param >> 24) as u32 % 2;
                    f.fail_next(Some("create"), Some("resourceclaims"), creates, 500);
                    format!(", {n} claim status patches, 500 on {creates} claim creations")
                } else {
                    String::new()
                };
                self.log.push(format!(
                    "FAULT 409 storm: next {n} pod, pod status and node patches, bindings and lease updates{dra}"
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
            FaultKind::DraDriverKill => {
                provoke_one(&client, ledger_dra::is_dra_pod).await;
                let caught = wait_for_pod(&client, Duration::from_secs(3), dra_preparing).await;
                if caught.is_some() {
                    *self.report.in_the_act.entry(kind).or_default() += 1;
                }
                let Some(node) = self.stack.dra.as_mut() else {
                    anyhow::bail!("a DRA fault without the DRA node");
                };
                let was_running = node.kill_driver();
                let down = Duration::from_millis(100 + param % 900);
                self.log.push(format!(
                    "FAULT DRA driver killed (pod waiting for prepare: {:?}; was running: {was_running}; down {down:?})",
                    caught.and_then(|p| p.metadata.name)
                ));
                tokio::time::sleep(down).await;
                node.start_driver()?;
            }
            FaultKind::DraKubeletRestart => {
                provoke_one(&client, ledger_dra::is_dra_pod).await;
                let caught = wait_for_pod(&client, Duration::from_secs(3), dra_preparing).await;
                if caught.is_some() {
                    *self.report.in_the_act.entry(kind).or_default() += 1;
                }
                // The process goes (its containers with it); a Running DRA pod is deleted
                // while it is down: the next kubelet-sim, from its checkpoint, unprepares
                // that pod's claim and keeps the others prepared.
                if !self.stack.stop_dra_kubelet().await {
                    anyhow::bail!("the DRA node's kubelet-sim was not running");
                }
                let victim = running_dra_pod(&client, param).await;
                let deleted = match &victim {
                    Some(name) => delete_pod(&client, name).await,
                    None => "no Running DRA pod",
                };
                let down = Duration::from_millis(100 + param % 500);
                tokio::time::sleep(down).await;
                self.stack.start_dra_kubelet().await?;
                self.log.push(format!(
                    "FAULT DRA node's kubelet-sim restarted from its checkpoint (pod waiting for prepare: {:?}; down {down:?}, meanwhile {victim:?}: {deleted})",
                    caught.and_then(|p| p.metadata.name)
                ));
            }
            FaultKind::DraDeleteMidPrepare => {
                provoke_one(&client, ledger_dra::is_dra_pod).await;
                let caught = wait_for_pod(&client, Duration::from_secs(3), dra_in_flight).await;
                let (victim, state) = match &caught {
                    Some(p) => {
                        *self.report.in_the_act.entry(kind).or_default() += 1;
                        (
                            p.metadata.name.clone(),
                            format!(
                                "node {:?}, claims {:?}",
                                node_of(p),
                                p.status
                                    .as_ref()
                                    .and_then(|s| s.resource_claim_statuses.as_ref())
                                    .map(|c| c
                                        .iter()
                                        .filter_map(|c| c.resource_claim_name.clone())
                                        .collect::<Vec<_>>())
                            ),
                        )
                    }
                    None => (
                        running_dra_pod(&client, param).await,
                        "no DRA pod in flight; a Running one".into(),
                    ),
                };
                if let Some(name) = victim {
                    let r = delete_pod(&client, &name).await;
                    self.log.push(format!(
                        "FAULT delete DRA pod {name} mid-prepare ({state}): {r}"
                    ));
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
    if let Some(files) = &dra_files
        && (report.settled_after.is_none() || report.dra_released_after.is_none())
    {
        for line in dra_state_lines(&stack.client, files).await {
            log.push(line);
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
        report.dra_checks = s.dra_checks;
        report.dra_pods_placed = s.dra_placed.len() as u64;
        report.dra_prepared_max = s.dra_prepared_max;
    }
    report.history = log.lines.lock().unwrap_or_else(|p| p.into_inner()).clone();
    stack.shutdown().await;
    outcome.map(|()| report)
}
