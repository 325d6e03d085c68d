//! What kube-controller-manager's resourceclaim controller does for what we use, run by the
//! simulated scheduler: claims from a pod's ResourceClaimTemplates (`generateName`
//! `<pod>-<claim>-`, owned by the pod as controller, annotated
//! `resource.kubernetes.io/pod-claim-name`, recorded in `pod.status.resourceClaimStatuses`
//! before the pod is placed; an owned claim found from an earlier try, say one whose record
//! was refused, is reused, not duplicated), and the freeing
//! side: pods that are gone or finished are dropped from `reservedFor`, a claim nobody
//! reserves is deallocated (capacity returns), and a generated claim whose pod is gone is
//! deleted (the embedded API server has no garbage collector); what the controller kept of a
//! gone pod to bridge the informers' lag is forgotten then too.
//!
//! Not modelled: templates' own metadata (labels/annotations copied onto the claim),
//! `ownerReferences` of other consumers than pods, the controller's metrics and workqueue
//! rate limits.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::dra::{DraState, unreserve};

/// The annotation naming the pod's claim entry a generated claim is for.
pub const POD_CLAIM_NAME: &str = "resource.kubernetes.io/pod-claim-name";

/// Entries of the pod that use a template and have no claim recorded yet: (entry name,
/// template).
pub fn missing(state: &DraState, pod: &Pod) -> Vec<(String, String)> {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.resource_claim_name.is_none())
        .filter_map(|c| Some((c.name.clone(), c.resource_claim_template_name.clone()?)))
        .filter(|(name, _)| state.pod_claim(pod, name).is_none())
        .collect()
}

fn owned_by(c: &ResourceClaim, pod_uid: &str) -> bool {
    c.owner_references()
        .iter()
        .any(|o| o.uid == pod_uid && o.controller == Some(true))
}

/// Creates the pod's missing claims from their templates (or adopts an owned one made by an
/// earlier try) and records them in the pod's status.
pub async fn ensure_claims(client: &Client, state: &DraState, pod: &Pod) -> Result<(), String> {
    let ns = pod.namespace().unwrap_or_else(|| "default".into());
    let pod_uid = pod.uid().unwrap_or_default();
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let mut statuses: Vec<Value> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|s| serde_json::to_value(s).ok())
        .collect();
    let missing = missing(state, pod);
    // Nothing left to record (an earlier call recorded it after this pod copy was read): a
    // patch from this copy would replace the recorded list with a stale one (chaos, stop 37).
    if missing.is_empty() {
        return Ok(());
    }
    // Entries recorded by earlier calls that this (possibly stale) copy does not show yet: the
    // merge patch replaces the whole list, so keep them.
    for (key, name) in state
        .recorded
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|((uid, _), _)| *uid == pod_uid)
    {
        if !statuses.iter().any(|s| s["name"] == key.1.as_str()) {
            statuses.push(json!({"name": key.1, "resourceClaimName": name}));
        }
    }
    for (entry, template) in &missing {
        let made = state
            .created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(pod_uid.clone(), entry.clone()))
            .cloned();
        let existing = made.or_else(|| {
            state.claims.state().into_iter().find(|c| {
                owned_by(c, &pod_uid)
                    && c.metadata.namespace.as_deref() == Some(ns.as_str())
                    && c.annotations().get(POD_CLAIM_NAME) == Some(entry)
            })
        });
        let claim = match existing {
            Some(c) => c,
            None => {
                let t = state
                    .templates
                    .get(&ObjectRef::new(template).within(&ns))
                    .ok_or_else(|| {
                        format!("resource claim template {ns}/{template} does not exist")
                    })?;
                let body: ResourceClaim = serde_json::from_value(json!({
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {
                        "generateName": generate_name(&pod.name_any(), entry),
                        "namespace": ns,
                        "annotations": {POD_CLAIM_NAME: entry},
                        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                            "name": pod.name_any(), "uid": pod_uid,
                            "controller": true, "blockOwnerDeletion": true}],
                    },
                    "spec": t.spec.spec,
                }))
                .map_err(|e| format!("template {ns}/{template}: {e}"))?;
                Arc::new(
                    api.create(&PostParams::default(), &body)
                        .await
                        .map_err(|e| format!("cannot create a claim from {ns}/{template}: {e}"))?,
                )
            }
        };
        statuses.retain(|s| s["name"] != entry.as_str());
        statuses.push(json!({"name": entry, "resourceClaimName": claim.name_any()}));
        state
            .created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((pod_uid.clone(), entry.clone()), claim);
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"resourceClaimStatuses": statuses}})),
    )
    .await
    .map_err(|e| format!("cannot record the pod's claims: {e}"))?;
    // Recorded: the pod may be placed now, before the pod informer shows the record.
    let created = state.created.lock().unwrap_or_else(|p| p.into_inner());
    let mut recorded = state.recorded.lock().unwrap_or_else(|p| p.into_inner());
    for (entry, _) in missing {
        if let Some(c) = created.get(&(pod_uid.clone(), entry.clone())) {
            recorded.insert((pod_uid.clone(), entry), c.name_any());
        }
    }
    Ok(())
}

/// `<pod>-<claim>-`, each part cut as upstream does so the generated name fits 63 characters.
fn generate_name(pod: &str, claim: &str) -> String {
    let cut = |s: &str, n: usize| s.chars().take(n).collect::<String>();
    format!("{}-{}-", cut(pod, 28), cut(claim, 28))
}

/// One freeing pass (see the module doc); `pods` is the scheduler's pod informer. Returns
/// how many claims it changed (deallocated, unreserved or deleted): capacity may be free.
pub async fn free(client: &Client, state: &DraState, pods: &Store<Pod>) -> usize {
    state.forget_gone_pods(pods);
    let live: HashMap<String, bool> = pods
        .state()
        .iter()
        .map(|p| {
            let done = matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
            (p.uid().unwrap_or_default(), !done)
        })
        .collect();
    let present: HashSet<&String> = live.keys().collect();
    let assumed = state.assumed_nodes();
    let mut changed = 0;
    for c in state.claims.state() {
        let ns = c.namespace().unwrap_or_default();
        let name = c.name_any();
        let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
        let reserved: Vec<String> = c
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .map(|r| r.uid.clone())
            .collect();
        let allocated = c.status.as_ref().is_some_and(|s| s.allocation.is_some());
        let gone: Vec<&String> = reserved
            .iter()
            .filter(|u| !live.get(*u).copied().unwrap_or(false))
            .collect();
        // A claim being written by the binding cycle: keep its allocation.
        let in_flight = assumed.contains_key(&c.uid().unwrap_or_default());
        if let Some(first) = gone.first() {
            // One reservation per pass is enough: the next pass sees the rest.
            match unreserve(&api, &name, first, false).await {
                Ok(()) => changed += 1,
                Err(e) => tracing::debug!(claim = %format!("{ns}/{name}"), "cannot unreserve: {e}"),
            }
            continue;
        }
        if reserved.is_empty() && allocated && !in_flight {
            match unreserve(&api, &name, "", true).await {
                Ok(()) => changed += 1,
                Err(e) => {
                    tracing::debug!(claim = %format!("{ns}/{name}"), "cannot deallocate: {e}")
                }
            }
            continue;
        }
        let owner_gone = c
            .owner_references()
            .iter()
            .any(|o| o.kind == "Pod" && o.controller == Some(true) && !present.contains(&o.uid));
        if owner_gone && reserved.is_empty() && !allocated {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => changed += 1,
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => tracing::debug!(claim = %format!("{ns}/{name}"), "cannot delete: {e}"),
            }
        }
    }
    changed
}
