//! The binding cycle of one DRA pod, asynchronous like kube-scheduler's: the claims'
//! status written (allocation and reservation, conditional on the version placed on), the
//! extended-resource claim created and recorded in the pod, then the binding; a failure
//! undoes what this pod wrote.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::scheduling_cycle::ExtendedClaim;
use super::state::{ClaimWrite, DraState};

fn pod_ref(pod: &Pod) -> Value {
    json!({"resource": "pods", "name": pod.name_any(), "uid": pod.uid().unwrap_or_default()})
}

/// The binding cycle: writes the claims' status, then binds. On failure, undoes this pod's
/// writes and forgets its assumed allocations; the error says what failed.
pub(crate) async fn bind(
    client: &Client,
    state: &DraState,
    pod: &Pod,
    node: &str,
    claims: &[ClaimWrite],
    extended: Option<&ExtendedClaim>,
) -> Result<(), String> {
    let ns = pod.namespace().unwrap_or_else(|| "default".into());
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let mut written: Vec<(String, bool)> = Vec::new();
    let mut failure = None;
    let mut claims = claims.to_vec();
    // KEP-5004: the special claim is created now (PreBind), its allocation moved from the
    // temporary UID to its real one (assumed first, so no cycle sees the capacity free).
    let mut created: Option<String> = None;
    let mut claim_name = extended.and_then(|x| x.name.clone());
    if let Some((body, temp, results)) = extended.and_then(|x| x.create.as_ref()) {
        let made = api.create(&PostParams::default(), body).await;
        match made {
            Ok(c) => {
                state.assume(&c.uid().unwrap_or_default(), node, results);
                state.forget(temp);
                created = Some(c.name_any());
                claim_name = Some(c.name_any());
                claims.push((Arc::new(c), Some(results.clone())));
            }
            Err(e) => {
                state.forget(temp);
                return Err(format!(
                    "cannot create the extended-resource claim of pod {ns}/{}: {e}",
                    pod.name_any()
                ));
            }
        }
    }
    for (c, results) in &claims {
        let name = c.name_any();
        let mut reserved: Vec<Value> = c
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|r| serde_json::to_value(r).ok())
            .collect();
        let me = pod_ref(pod);
        if !reserved.iter().any(|r| r["uid"] == me["uid"]) {
            reserved.push(me);
        }
        let mut status = json!({"reservedFor": reserved});
        if let Some(results) = results {
            status["allocation"] = json!({
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                "allocationTimestamp": now_rfc3339(),
            });
        }
        let patch = json!({
            "metadata": {"resourceVersion": c.resource_version()},
            "status": status,
        });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(done) => {
                if results.is_some() {
                    state.mark_written(&c.uid().unwrap_or_default(), done.resource_version());
                }
                written.push((name, results.is_some()))
            }
            Err(e) => {
                failure = Some(format!("cannot write the status of claim {ns}/{name}: {e}"));
                break;
            }
        }
    }
    if failure.is_none()
        && let (Some(x), Some(name)) = (extended, &claim_name)
    {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let patch = json!({"status": {"extendedResourceClaimStatus": {
            "resourceClaimName": name, "requestMappings": x.mappings}}});
        if let Err(e) = pods
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            failure = Some(format!(
                "cannot record the extended-resource claim in pod {ns}/{}: {e}",
                pod.name_any()
            ));
        }
    }
    if failure.is_none() {
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod.name_any(), "namespace": ns, "uid": pod.uid()},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if let Err(e) = pods
            .create_subresource::<_, Value>(
                "binding",
                &pod.name_any(),
                &PostParams::default(),
                &binding,
            )
            .await
        {
            failure = Some(format!("cannot bind to {node}: {e}"));
        }
    }
    let Some(failure) = failure else {
        return Ok(());
    };
    // Unreserve: take the pod out of what it wrote, and the allocations it made.
    for (name, allocated) in &written {
        if let Err(e) = unreserve(&api, name, &pod.uid().unwrap_or_default(), *allocated).await {
            tracing::warn!(claim = %format!("{ns}/{name}"), "cannot undo the reservation: {e}");
        }
    }
    for (c, results) in &claims {
        if results.is_some() {
            state.forget(&c.uid().unwrap_or_default());
        }
    }
    // The special claim made for this try goes too (upstream's Unreserve deletes it).
    if let Some(name) = created
        && let Err(e) = api.delete(&name, &Default::default()).await
    {
        tracing::warn!(claim = %format!("{ns}/{name}"), "cannot delete the extended-resource claim: {e}");
    }
    Err(failure)
}

/// Removes `pod_uid` from the claim's `reservedFor`, and the allocation when `deallocate`
/// (or when nobody is left and the claim is allocated: the controller's rule).
pub(crate) async fn unreserve(
    api: &Api<ResourceClaim>,
    name: &str,
    pod_uid: &str,
    deallocate: bool,
) -> Result<(), kube::Error> {
    let c = api.get_status(name).await?;
    let reserved: Vec<Value> = c
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.uid != pod_uid)
        .filter_map(|r| serde_json::to_value(r).ok())
        .collect();
    let mut status = json!({"reservedFor": if reserved.is_empty() { Value::Null } else { Value::Array(reserved.clone()) }});
    if deallocate || reserved.is_empty() {
        status["allocation"] = Value::Null;
        status["devices"] = Value::Null;
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"resourceVersion": c.resource_version()}, "status": status}),
        ),
    )
    .await?;
    Ok(())
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}
