//! The workload controller of the chaos run and the soak: the ReplicaSet stand-in that keeps
//! the target pod counts (replacing Failed pods, DRA pods from the run's templates), and the
//! run's shared bookkeeping (`Shared`) and timestamped event history (`Log`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use crate::ledger;
use crate::ledger_dra;
use crate::rng::Rng;
use crate::workload::{self, DraTemplate, Kind};

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
    pub(crate) violations: Vec<String>,
    pub(crate) seen: BTreeSet<String>,
    pub(crate) checks: u64,
    pub(crate) created: u64,
    pub(crate) placed: BTreeSet<String>,
    pub(crate) admission_failures: u64,
    pub(crate) usage_checks: u64,
    /// Killed containers' pods (namespace, name) whose memory is not yet seen released.
    pub(crate) killed: BTreeMap<(String, String), Instant>,
    pub(crate) kills: u64,
    pub(crate) kills_holding_memory: u64,
    pub(crate) slowest_release: Option<Duration>,
    pub(crate) memory_readings: u64,
    /// Device memory each pod held at the last usage pass.
    pub(crate) last_memory: BTreeMap<(String, String), u64>,
    pub(crate) dra_checks: u64,
    pub(crate) dra_placed: BTreeSet<String>,
    pub(crate) dra_prepared_max: (u64, u64),
    /// Running-pod findings of the last DRA pass, reported when the next one finds them too
    /// (a pod listed Running between two checkpoint reads that went away meanwhile is no
    /// finding).
    pub(crate) dra_suspects: BTreeSet<String>,
    /// Per hook, the pods (`ns/name`) a monitor checked for it.
    pub(crate) hook_checked: BTreeMap<String, BTreeSet<String>>,
}

pub(crate) fn lock(s: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) async fn chaos_pods(client: &Client) -> Option<Vec<Pod>> {
    Api::<Pod>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels("app=chaos"))
        .await
        .ok()
        .map(|l| l.items)
}

pub(crate) fn kind_of(pod: &Pod) -> Kind {
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
