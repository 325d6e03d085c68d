//! The ledger's side of the chaos run: every few hundred milliseconds read the cluster (pods,
//! nodes, kubelet-sim's records, the monitors' live readings, the DRA node's slices, claims
//! and both checkpoints) and run the pure ledgers (`ledger.rs`, `ledger_dra.rs`) over it,
//! recording violations; after the run, what is left of gone DRA pods.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};

use crate::dra_node::DraFiles;
use crate::ledger::{self, Violation};
use crate::ledger_dra;
use crate::ledger_hooks::{self, HookCount, HookKey};

use crate::chaos::*;
use crate::controller::*;
use crate::injector::*;

/// Deletes one settled chaos pod on `node` (any device-plugin pod if None), so that its
/// replacement is scheduled and allocated while the fault waits for it.
pub(crate) async fn provoke(client: &Client, node: Option<&str>) {
    provoke_one(client, |p| {
        !ledger_dra::is_dra_pod(p) && node.is_none_or(|n| node_of(p) == Some(n))
    })
    .await;
}

/// Deletes one settled chaos pod that `pick` accepts.
pub(crate) async fn provoke_one(client: &Client, pick: impl Fn(&Pod) -> bool) {
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

/// What the monitors publish that the ledger checks: usage per container and device, and
/// the hook check's counts.
#[derive(Default)]
pub(crate) struct MonitorReadings {
    pub(crate) live: hami_demo::Live,
    pub(crate) hooks: BTreeMap<HookKey, HookCount>,
}

/// Every monitor's readings, or None if one did not answer (a partial view would make a
/// killed pod's memory look released).
pub(crate) async fn read_monitors(monitors: &[SocketAddr]) -> Option<MonitorReadings> {
    let monitors = monitors.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut all = MonitorReadings::default();
        for m in monitors {
            let (status, body, _) = crate::soak::get_answer(m, "/metrics")?;
            if !status.starts_with("HTTP/1.1 200") {
                return None;
            }
            all.live.extend(hami_demo::Live::from_body(&body));
            ledger_hooks::read_hook_series(&body, &mut all.hooks);
        }
        Some(all)
    })
    .await
    .ok()
    .flatten()
}

/// The hook check: no workload process unhooked; which pods each hook was checked in.
pub(crate) fn hook_pass(readings: &MonitorReadings, s: &mut Shared) -> Vec<Violation> {
    ledger_hooks::note_checked(&readings.hooks, &mut s.hook_checked);
    ledger_hooks::check_hooks(&readings.hooks)
}

/// Real usage within limits, and killed containers' memory released in time.
pub(crate) fn usage_pass(
    live: &hami_demo::Live,
    pods: &[Pod],
    s: &mut Shared,
    log: &Log,
) -> Vec<Violation> {
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
pub(crate) struct DraSnapshot {
    claims: Vec<ResourceClaim>,
    slices: Vec<ResourceSlice>,
    pods_after: Vec<Pod>,
    driver_after: hami_amdgpu_dra_plugin::checkpoint::Checkpoint,
}

pub(crate) async fn dra_snapshot(client: &Client, files: &DraFiles) -> Option<DraSnapshot> {
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
pub(crate) fn dra_findings(
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
pub(crate) async fn ledger_loop(
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
            if let Some(readings) = &live {
                found.extend(usage_pass(&readings.live, &pods.items, &mut s, &log));
                found.extend(hook_pass(readings, &mut s));
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
pub(crate) async fn dra_state_lines(client: &Client, files: &DraFiles) -> Vec<String> {
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
pub(crate) async fn dra_leftovers(client: &Client, files: &DraFiles) -> Vec<Violation> {
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
