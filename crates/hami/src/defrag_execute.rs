//! One step of `hami defrag apply --execute` (the shell's writes): reserve the targets,
//! evict through the Eviction API (a PodDisruptionBudget's 429 retried until
//! `--pdb-wait-seconds`), an Event per evicted pod, wait until the owners run as many pods
//! as before, mark the replacements, release the reservations.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use hami_defrag_core::Move;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::defrag_apply::{
    ApplyArgs, MOVED_AT, Outcome, POLL, event, evict_once, past, reservation, running_by_owner,
    set_reservation,
};

/// Runs one step; how it ended and what happened, in words.
pub(crate) async fn run_step(
    client: &kube::Client,
    args: &ApplyArgs,
    moves: &[Move],
    by_uid: &HashMap<&str, &Pod>,
) -> (Outcome, String) {
    let nodes = Api::<Node>::all(client.clone());
    let now = crate::defrag_apply::now_secs();
    let mut reserved: Vec<(String, String)> = Vec::new();
    let (outcome, detail) = 'step: {
        // Reservation first: the target slices are held for the owners before any eviction.
        for m in moves {
            let Some(pod) = by_uid.get(m.uid.as_str()) else {
                break 'step (Outcome::Aborted, format!("pod {} is gone", m.pod));
            };
            if let Some(r) = reservation(m, pod, now, args.reservation_ttl_seconds) {
                if let Err(e) = set_reservation(&nodes, &m.to.node, &m.uid, Some(&r)).await {
                    break 'step (
                        Outcome::Aborted,
                        format!("cannot reserve {} on {}: {e}", m.pod, m.to.node),
                    );
                }
                reserved.push((m.to.node.clone(), m.uid.clone()));
            }
        }
        let all = Api::<Pod>::all(client.clone());
        let before = match all.list(&ListParams::default()).await {
            Ok(l) => running_by_owner(&l.items),
            Err(e) => break 'step (Outcome::Aborted, format!("cannot list pods: {e}")),
        };
        let mut evicted: Vec<String> = Vec::new();
        for m in moves {
            let pod = by_uid[m.uid.as_str()];
            let deadline = Instant::now() + Duration::from_secs(args.pdb_wait_seconds);
            loop {
                match evict_once(client, pod).await {
                    Ok(true) => break,
                    Ok(false) if !past(deadline) => tokio::time::sleep(POLL).await,
                    Ok(false) => {
                        break 'step (
                            Outcome::BlockedByPdb,
                            format!(
                                "the PodDisruptionBudget of {} refused its eviction for {}s{}",
                                m.pod,
                                args.pdb_wait_seconds,
                                done(&evicted)
                            ),
                        );
                    }
                    Err(e) => {
                        break 'step (
                            Outcome::Aborted,
                            format!("evicting {}: {e}{}", m.pod, done(&evicted)),
                        );
                    }
                }
            }
            evicted.push(m.pod.clone());
            let from: Vec<&str> = m.from.cards.iter().map(|c| c.card.as_str()).collect();
            let to: Vec<&str> = m.to.cards.iter().map(|c| c.card.as_str()).collect();
            let message = format!(
                "hami defrag apply: plan step {} moves it from {} {} to {} {}",
                m.step,
                m.from.node,
                from.join(","),
                m.to.node,
                to.join(",")
            );
            // The eviction is done; an Event that cannot be written does not undo it.
            let _ = event(client, pod, &message).await;
        }
        // The owners of the evicted pods, and how many pods each ran before.
        let evicted_uids: Vec<&str> = moves.iter().map(|m| m.uid.as_str()).collect();
        // The evicted pods count as running before even where their phase said otherwise:
        // the planner read them as placed.
        let mut wanted: BTreeMap<String, usize> = BTreeMap::new();
        for m in moves {
            let Some(owner) = by_uid[m.uid.as_str()]
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
            else {
                continue;
            };
            let running = before.get(&owner.uid).map_or(&[][..], Vec::as_slice);
            let extra = moves
                .iter()
                .filter(|o| {
                    !running.contains(&o.uid)
                        && by_uid[o.uid.as_str()]
                            .metadata
                            .owner_references
                            .iter()
                            .flatten()
                            .any(|r| r.uid == owner.uid && r.controller == Some(true))
                })
                .count();
            wanted.insert(owner.uid.clone(), running.len() + extra);
        }
        let deadline = Instant::now() + Duration::from_secs(args.ready_wait_seconds);
        let short = loop {
            let now_running = match all.list(&ListParams::default()).await {
                Ok(l) => running_by_owner(&l.items),
                Err(e) => break 'step (Outcome::Aborted, format!("cannot list pods: {e}")),
            };
            let lacking: Vec<String> = wanted
                .iter()
                .filter_map(|(owner, n)| {
                    let have = now_running.get(owner).map_or(0, |p| {
                        p.iter()
                            .filter(|u| !evicted_uids.contains(&u.as_str()))
                            .count()
                    });
                    (have < *n).then(|| format!("owner {owner} runs {have} of {n} pods"))
                })
                .collect();
            if lacking.is_empty() {
                let fresh: Vec<String> = wanted
                    .keys()
                    .flat_map(|o| now_running.get(o).cloned().unwrap_or_default())
                    .filter(|u| !before.values().flatten().any(|b| b == u))
                    .collect();
                let marked = mark(client, &fresh, now).await;
                break 'step (Outcome::Moved, marked);
            }
            if past(deadline) {
                break lacking.join("; ");
            }
            tokio::time::sleep(POLL).await;
        };
        (
            Outcome::Waiting,
            format!(
                "evicted {}, still waiting after {}s: {short}",
                evicted.join(", "),
                args.ready_wait_seconds
            ),
        )
    };
    let mut detail = detail;
    for (node, key) in reserved {
        if let Err(e) = set_reservation(&nodes, &node, &key, None).await {
            detail.push_str(&format!(
                "; cannot release the reservation on {node} (it expires by itself): {e}"
            ));
        }
    }
    (outcome, detail)
}

fn done(evicted: &[String]) -> String {
    if evicted.is_empty() {
        String::new()
    } else {
        format!(" (evicted before it: {})", evicted.join(", "))
    }
}

/// Labels the replacement pods (by uid) `hami.io/defrag-moved-at=<now>`; what could not be
/// marked, in words (empty when all were).
async fn mark(client: &kube::Client, uids: &[String], now: i64) -> String {
    let Ok(list) = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
    else {
        return "cannot list pods to mark the replacements".into();
    };
    let mut failed = Vec::new();
    for p in list
        .items
        .iter()
        .filter(|p| p.metadata.uid.as_ref().is_some_and(|u| uids.contains(u)))
    {
        let ns = p.metadata.namespace.as_deref().unwrap_or("default");
        let name = p.metadata.name.as_deref().unwrap_or_default();
        let patch = json!({"metadata": {"labels": {MOVED_AT: now.to_string()}}});
        if let Err(e) = Api::<Pod>::namespaced(client.clone(), ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            failed.push(format!("{ns}/{name}: {e}"));
        }
    }
    if failed.is_empty() {
        String::new()
    } else {
        format!("cannot mark {}", failed.join(", "))
    }
}
