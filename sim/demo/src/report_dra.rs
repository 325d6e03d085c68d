//! The DRA node's table (`--dra`): who holds which share of each device, from the driver's
//! ResourceSlices and the allocated ResourceClaims (`hami_report::dra_status`, as `hami
//! status` shows them) — no annotation or node lock in DRA mode — plus the monitor's live
//! memory used and utilization per container.

use hami_report::dra_status::{DraNode, build};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::live::Live;

/// Every DRA node's devices and holders, read once per rendering.
#[derive(Default)]
pub(crate) struct DraView {
    nodes: Vec<DraNode>,
}

impl DraView {
    /// Lists the slices and claims and builds the view.
    pub(crate) async fn read(client: &Client) -> anyhow::Result<Self> {
        let slices = Api::<ResourceSlice>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let claims = Api::<ResourceClaim>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        Ok(Self {
            nodes: build(hami_dra_core::DRIVER, &slices, &claims),
        })
    }
}

/// The containers of `pod` (`namespace/name`) that use claim `claim` (`namespace/claim`,
/// then `:request` as `dra_status` names a holder): the pod's entry for that claim (a
/// template's claim through `status.resourceClaimStatuses`, a named one through the spec),
/// then the containers listing that entry. The webhook's DRA mode gives every container a
/// claim of its own, so one pod's claims are not its containers' in common. Before the
/// pod's status names a template's claim: every container that uses a claim.
fn claim_containers(pods: &[Pod], pod: &str, claim: &str) -> Vec<String> {
    let Some(p) = pods
        .iter()
        .find(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()) == pod)
    else {
        return Vec::new();
    };
    let claim_name = claim
        .split_once('/')
        .map_or(claim, |(_, rest)| rest)
        .split(':')
        .next()
        .unwrap_or_default();
    let by_status = p
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .find(|s| s.resource_claim_name.as_deref() == Some(claim_name))
        .map(|s| s.name.clone());
    let by_spec = || {
        p.spec
            .iter()
            .flat_map(|s| s.resource_claims.iter().flatten())
            .find(|c| c.resource_claim_name.as_deref() == Some(claim_name))
            .map(|c| c.name.clone())
    };
    let entry = by_status.or_else(by_spec);
    p.spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter(|c| {
            let claims = c.resources.as_ref().and_then(|r| r.claims.as_ref());
            match &entry {
                Some(entry) => claims.is_some_and(|cs| cs.iter().any(|c| &c.name == entry)),
                None => claims.is_some_and(|cs| !cs.is_empty()),
            }
        })
        .map(|c| c.name.clone())
        .collect()
}

/// The table of DRA node `name` (same columns as the device-plugin nodes').
pub(crate) fn node_table(
    view: &DraView,
    name: &str,
    description: &str,
    pods: &[Pod],
    live: &Live,
) -> String {
    let node = view.nodes.iter().find(|n| n.name == name);
    let devices = node.map_or(&[][..], |n| n.devices.as_slice());
    let busy = devices.iter().filter(|d| !d.holders.is_empty()).count();
    let model = devices
        .first()
        .map(|d| d.product.clone())
        .unwrap_or_default();
    let mut text = format!(
        "\nNode {name} — {description} ({} GPUs/partitions published as DRA devices of {}, {model:?}, {busy} in use)\n",
        devices.len(),
        hami_dra_core::DRIVER,
    );
    let mut table = vec![
        [
            "GPU",
            "POD/CONTAINER",
            "CLAIM",
            "MEMORY",
            "CUS",
            "CU RANGE",
            "USED",
            "UTIL",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for d in devices {
        for h in &d.holders {
            let mut who: Vec<(String, String, String)> = Vec::new();
            for pod in &h.pods {
                let (ns, pod_name) = pod.split_once('/').unwrap_or(("", pod));
                for c in claim_containers(pods, pod, &h.claim) {
                    who.push((ns.into(), pod_name.into(), c));
                }
            }
            if who.is_empty() {
                who.push((String::new(), "(not reserved yet)".into(), String::new()));
            }
            for (ns, pod, container) in who {
                let key = (ns.clone(), pod.clone(), container.clone(), "0".to_string());
                table.push(vec![
                    d.uuid.clone(),
                    if ns.is_empty() {
                        pod.clone()
                    } else {
                        format!("{ns}/{pod}/{container}")
                    },
                    h.claim.clone(),
                    format!("{} MiB", h.memory_bytes >> 20),
                    format!("{}/{}", h.compute_units, d.compute_units),
                    if h.cu_ranges.is_empty() {
                        "(pending prepare)".into()
                    } else {
                        h.cu_ranges.clone()
                    },
                    live.memory
                        .get(&key)
                        .map(|b| format!("{} MiB", (*b as u64) >> 20))
                        .unwrap_or_else(|| "-".into()),
                    live.util
                        .get(&key)
                        .map(|u| format!("{u:.0}%"))
                        .unwrap_or_else(|| "-".into()),
                ]);
            }
        }
    }
    if table.len() == 1 {
        text.push_str("  no slices on this node\n");
    } else {
        text.push_str(&crate::report::align(&table));
    }
    for p in node.iter().flat_map(|n| &n.problems) {
        text.push_str(&format!("  problem: {p}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod as the webhook's DRA mode leaves it: two containers, a claim each from a
    /// template, the claims' names in its status once made; a third container uses a
    /// claim by name.
    fn pod(with_status: bool) -> Pod {
        let status = if with_status {
            serde_json::json!({"resourceClaimStatuses": [
                {"name": "hami-amd-a", "resourceClaimName": "p-hami-amd-a-x1"},
                {"name": "hami-amd-b", "resourceClaimName": "p-hami-amd-b-x2"}]})
        } else {
            serde_json::json!({})
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "resourceClaims": [
                    {"name": "hami-amd-a", "resourceClaimTemplateName": "hami-amd-1"},
                    {"name": "hami-amd-b", "resourceClaimTemplateName": "hami-amd-2"},
                    {"name": "shared", "resourceClaimName": "shared-claim"}],
                "containers": [
                    {"name": "a", "resources": {"claims": [{"name": "hami-amd-a"}]}},
                    {"name": "b", "resources": {"claims": [{"name": "hami-amd-b"}]}},
                    {"name": "c", "resources": {"claims": [{"name": "shared"}]}},
                    {"name": "plain"}]},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn each_claim_names_only_the_containers_that_use_it() {
        let pods = [pod(true)];
        assert_eq!(
            claim_containers(&pods, "ns/p", "ns/p-hami-amd-a-x1:gpu"),
            ["a"]
        );
        assert_eq!(
            claim_containers(&pods, "ns/p", "ns/p-hami-amd-b-x2:gpu/shape-0"),
            ["b"]
        );
        assert_eq!(
            claim_containers(&pods, "ns/p", "ns/shared-claim:gpu"),
            ["c"]
        );
        assert!(claim_containers(&pods, "ns/other", "ns/shared-claim:gpu").is_empty());
    }

    #[test]
    fn before_the_status_names_the_claim_every_claim_user_is_shown() {
        let pods = [pod(false)];
        assert_eq!(
            claim_containers(&pods, "ns/p", "ns/p-hami-amd-a-x1:gpu"),
            ["a", "b", "c"]
        );
    }
}
