//! The fault injector of the chaos run: each planned fault (`schedule.rs`) turned into its
//! action on the running stack — 409/500 storms, watch drops, API-server restarts, leader
//! kills, plugin, kubelet and DRA driver restarts, clock skew, workload process kills, DRA
//! pods deleted mid-prepare — and the restarts it owes, with the pod-state predicates they
//! share.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hami_protocol::names::pod as pod_keys;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::SignedDuration;
use kube::Client;
use kube::api::{Api, DeleteParams};

use crate::ledger;
use crate::ledger_dra;
use crate::schedule::FaultKind;
use crate::stack::Stack;

use crate::chaos::*;
use crate::controller::*;
use crate::ledger_loop::*;

pub(crate) fn skew_of(param: u64) -> SignedDuration {
    // Up to ±5 minutes: far beyond the lease duration, as a broken NTP would be.
    let secs = (param % 601) as i64 - 300;
    SignedDuration::from_secs(secs)
}

/// Polls for a chaos pod matching `pick` for at most `limit`.
pub(crate) async fn wait_for_pod(
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

pub(crate) fn bind_phase(p: &Pod) -> Option<&str> {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(pod_keys::BIND_PHASE))
        .map(String::as_str)
}

pub(crate) fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

pub(crate) fn pending(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|ph| ph == "Pending")
}

/// A DRA pod bound to its node and not Running yet: kubelet-sim is preparing its claim.
pub(crate) fn dra_preparing(p: &Pod) -> bool {
    ledger_dra::is_dra_pod(p) && node_of(p).is_some() && pending(p)
}

/// A DRA pod on its way: its claim created (recorded in its status), allocated or being
/// prepared.
pub(crate) fn dra_in_flight(p: &Pod) -> bool {
    let has_claim = p
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .is_some_and(|c| !c.is_empty());
    ledger_dra::is_dra_pod(p) && pending(p) && (has_claim || node_of(p).is_some())
}

/// A seeded Running DRA pod's name.
pub(crate) async fn running_dra_pod(client: &Client, param: u64) -> Option<String> {
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

pub(crate) async fn delete_pod(client: &Client, name: &str) -> &'static str {
    match Api::<Pod>::namespaced(client.clone(), "default")
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
    {
        Ok(_) => "deleted",
        Err(_) => "delete failed",
    }
}

/// Host pid of every container's live pid 1, with its pod (namespace, name).
pub(crate) fn live_processes(stack: &Stack) -> Vec<(i32, String, String, String)> {
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
pub(crate) fn kill_process_group(pid: i32) -> &'static str {
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

pub(crate) struct Injector<'a> {
    pub(crate) stack: &'a mut Stack,
    pub(crate) shared: Arc<Mutex<Shared>>,
    pub(crate) log: Log,
    pub(crate) report: &'a mut ChaosReport,
    pub(crate) restarts: Vec<(Instant, usize, SignedDuration)>,
}

impl Injector<'_> {
    pub(crate) async fn inject(&mut self, kind: FaultKind, param: u64) -> anyhow::Result<()> {
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

    pub(crate) fn due_restarts(&mut self, all: bool) -> anyhow::Result<()> {
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
