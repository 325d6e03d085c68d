//! The shell of [`crate::dra_claims`]: fetches the ResourceClaims the node's pods use and
//! this node's devices of the driver's ResourceSlices, with a cache so a steady node costs
//! no API call per refresh.
//!
//! A claim is fetched (`get`) when first named by a pod, and again only while it is not
//! settled for that pod: allocated to our driver on this node but not (yet) reserved for
//! the pod or without our `status.devices` entries (written after Prepare). Claims no pod
//! names any more are forgotten. This node's slices of the driver are listed by field
//! selector (`spec.nodeName=<node>,spec.driver=<driver>`, which the API server, real or
//! embedded, filters: other nodes' slices are never sent here) only when a claim names a
//! device this node's slices, as last read, do not have. An answer holding another node's
//! or driver's slice (a server that ignored the selector) is refused whole, as the
//! driver's slice publisher refuses it, and the slices last read are kept. A pod without
//! DRA claims costs nothing, so a cluster without resource.k8s.io/v1 (or without the RBAC
//! for it) sees no call.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::ListParams;
use kube::{Api, Client};

use crate::dra_claims::{self, DraPod, SliceDevices};

/// Claim cache key: (namespace, name).
type ClaimKey = (String, String);

/// Fetches and caches the DRA objects of one node's pods.
pub struct DraSource {
    client: Client,
    driver: String,
    node: String,
    claims: HashMap<ClaimKey, ResourceClaim>,
    slices: SliceDevices,
}

/// What one refresh learnt.
#[derive(Debug, Default)]
pub struct DraView {
    /// Pod UID → what its claims grant.
    pub pods: HashMap<String, DraPod>,
    /// Failed reads, one line each.
    pub problems: Vec<String>,
}

/// Whether a cached claim is settled for the pod `uid`: nothing more will change that
/// the monitor reports (reserved for it, and our driver's status written), or it is not
/// ours on this node at all.
fn settled(claim: &ResourceClaim, uid: &str, driver: &str, node: &str) -> bool {
    let Some(status) = &claim.status else {
        return false;
    };
    let ours = status
        .allocation
        .as_ref()
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .is_some_and(|r| r.iter().any(|r| r.driver == driver && r.pool == node));
    if status.allocation.is_some() && !ours {
        return true;
    }
    ours && status
        .reserved_for
        .iter()
        .flatten()
        .any(|r| r.resource == "pods" && r.uid == uid)
        && status
            .devices
            .iter()
            .flatten()
            .any(|d| d.driver == driver && d.pool == node)
}

/// The field selector of `node`'s slices of `driver`.
pub fn slice_selector(node: &str, driver: &str) -> String {
    format!("spec.nodeName={node},spec.driver={driver}")
}

/// Why a list answered to [`slice_selector`] cannot be used: it holds a slice of another
/// node or driver (the server ignored the selector), named here; `None` when all are ours.
pub fn foreign_slice(slices: &[ResourceSlice], node: &str, driver: &str) -> Option<String> {
    let other = slices
        .iter()
        .find(|s| s.spec.driver != driver || s.spec.node_name.as_deref() != Some(node))?;
    Some(format!(
        "the API server answered the field selector {:?} with ResourceSlice {} of node {:?}, driver {:?}",
        slice_selector(node, driver),
        other.metadata.name.as_deref().unwrap_or_default(),
        other.spec.node_name.as_deref().unwrap_or_default(),
        other.spec.driver,
    ))
}

impl DraSource {
    /// A source for `driver`'s claims on `node`; nothing read yet.
    pub fn new(client: Client, driver: &str, node: &str) -> DraSource {
        DraSource {
            client,
            driver: driver.to_owned(),
            node: node.to_owned(),
            claims: HashMap::new(),
            slices: SliceDevices::new(),
        }
    }

    /// The DRA view of `pods`, reading what changed since the last call.
    pub async fn view(&mut self, pods: &[Arc<Pod>]) -> DraView {
        let mut view = DraView::default();
        let mut wanted: HashSet<ClaimKey> = HashSet::new();
        for pod in pods {
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            for name in dra_claims::claim_names(pod) {
                let key = (ns.clone(), name);
                wanted.insert(key.clone());
                let fresh = self
                    .claims
                    .get(&key)
                    .is_some_and(|c| settled(c, uid, &self.driver, &self.node));
                if fresh {
                    continue;
                }
                let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &key.0);
                match api.get_opt(&key.1).await {
                    Ok(Some(claim)) => {
                        self.claims.insert(key, claim);
                    }
                    // Not created yet (the pod's template is being instantiated).
                    Ok(None) => {
                        self.claims.remove(&key);
                    }
                    Err(e) => view
                        .problems
                        .push(format!("reading ResourceClaim {}/{}: {e}", key.0, key.1)),
                }
            }
        }
        self.claims.retain(|k, _| wanted.contains(k));
        view.pods = self.build(pods);
        if view.pods.values().any(|p| !p.unknown_devices.is_empty()) {
            let api: Api<ResourceSlice> = Api::all(self.client.clone());
            let selector = slice_selector(&self.node, &self.driver);
            match api.list(&ListParams::default().fields(&selector)).await {
                Ok(list) => match foreign_slice(&list.items, &self.node, &self.driver) {
                    Some(why) => view.problems.push(why),
                    None => {
                        self.slices =
                            dra_claims::slice_devices(&self.driver, &self.node, &list.items);
                        view.pods = self.build(pods);
                    }
                },
                Err(e) => view.problems.push(format!("listing ResourceSlices: {e}")),
            }
        }
        view
    }

    fn build(&self, pods: &[Arc<Pod>]) -> HashMap<String, DraPod> {
        let mut out = HashMap::new();
        for pod in pods {
            let names = dra_claims::claim_names(pod);
            if names.is_empty() {
                continue;
            }
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let claims: HashMap<String, ResourceClaim> = names
                .into_iter()
                .filter_map(|n| {
                    let c = self.claims.get(&(ns.clone(), n.clone()))?.clone();
                    Some((n, c))
                })
                .collect();
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            let dra = dra_claims::dra_pod(pod, &claims, &self.driver, &self.node, &self.slices);
            out.insert(uid, dra);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, node: &str, driver: &str) -> ResourceSlice {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}
        }))
        .unwrap()
    }

    #[test]
    fn an_answer_that_ignored_the_selector_is_refused() {
        let d = "amdgpu.hami-rs.io";
        assert_eq!(
            slice_selector("n1", d),
            "spec.nodeName=n1,spec.driver=amdgpu.hami-rs.io"
        );
        let mine = slice("n1-0", "n1", d);
        assert_eq!(foreign_slice(std::slice::from_ref(&mine), "n1", d), None);
        assert_eq!(foreign_slice(&[], "n1", d), None);
        let node = foreign_slice(&[mine.clone(), slice("n2-0", "n2", d)], "n1", d).unwrap();
        assert!(node.contains("ResourceSlice n2-0 of node \"n2\""), "{node}");
        let driver = foreign_slice(&[slice("x", "n1", "gpu.amd.com"), mine], "n1", d).unwrap();
        assert!(driver.contains("driver \"gpu.amd.com\""), "{driver}");
    }
}
