//! One step of `hami defrag apply --execute` (the shell's writes): reserve the targets,
//! evict through the Eviction API (a PodDisruptionBudget's 429 retried until
//! `--pdb-wait-seconds`), an Event per evicted pod, wait until the owners run as many pods
//! as before, mark the replacements, release the reservations (an evicted pod's stays
//! until it expires when its step did not finish: its replacement is still to come).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use hami_defrag_core::Move;
use k8s_openapi::api::core::v1::{Event, Node, ObjectReference, Pod};
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::defrag::Failure;
use crate::defrag_apply::{
    ApplyArgs, MOVED_AT, Outcome, POLL, Reservation, past, reservation, running_by_owner,
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
    let mut evicted: Vec<String> = Vec::new();
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
    // A pod evicted in a step that did not finish keeps its reservation until it expires:
    // its replacement is still to be placed there. The others' are released.
    let evicted_uids: Vec<&str> = moves
        .iter()
        .filter(|m| evicted.contains(&m.pod))
        .map(|m| m.uid.as_str())
        .collect();
    for (node, key) in reserved {
        if outcome != Outcome::Moved && evicted_uids.contains(&key.as_str()) {
            continue;
        }
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

/// A client that does not retry 429s itself (kube-rs does by default, up to 15 times with
/// a backoff up to 1000 s): `--pdb-wait-seconds` bounds the wait.
pub(crate) async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, Failure> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let cluster = |e: String| Failure::Cluster(anyhow::anyhow!(e));
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| cluster(format!("cannot read {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| cluster(format!("cannot use {}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| cluster(format!("no Kubernetes configuration: {e}")))?,
    };
    config.default_retry = false;
    kube::Client::try_from(config).map_err(Failure::from)
}

/// Writes (`Some`) or removes (`None`) reservation `key` on `node` (a merge patch: other
/// keys untouched).
pub(crate) async fn set_reservation(
    nodes: &Api<Node>,
    node: &str,
    key: &str,
    value: Option<&Reservation>,
) -> Result<(), kube::Error> {
    let v = value.map(Reservation::encode);
    let key = hami_protocol::defrag_reservation::key(key);
    let patch = json!({"metadata": {"annotations": {key: v}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Records a `DefragEvicted` Event on `pod`.
pub(crate) async fn event(
    client: &kube::Client,
    pod: &Pod,
    message: &str,
) -> Result<(), kube::Error> {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let ev = Event {
        metadata: kube::api::ObjectMeta {
            generate_name: Some(format!("{name}.defrag-")),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name),
            namespace: Some(ns.clone()),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        },
        reason: Some("DefragEvicted".into()),
        message: Some(message.into()),
        type_: Some("Normal".into()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        reporting_component: Some("hami-defrag".into()),
        source: Some(k8s_openapi::api::core::v1::EventSource {
            component: Some("hami-defrag".into()),
            host: None,
        }),
        ..Default::default()
    };
    Api::<Event>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &ev)
        .await
        .map(|_| ())
}

/// Evicts `pod` once (no retry here); `Ok(true)` evicted, `Ok(false)` refused by a budget
/// (429), `Err` anything else.
pub(crate) async fn evict_once(client: &kube::Client, pod: &Pod) -> Result<bool, kube::Error> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    match Api::<Pod>::namespaced(client.clone(), ns)
        .evict(name, &EvictParams::default())
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 429 => Ok(false),
        Err(e) => Err(e),
    }
}
