//! The quotas in force and what each namespace uses, kept inside [`ClusterState`] so that
//! one lock covers a filter decision and its quota charge (issue 30: two pods racing for
//! the last of a quota never both pass).
//!
//! A pod's charge follows its holding exactly: charged when the state records what it holds
//! (a filter decision, or its allocation annotations seen through the informer), charged
//! again when its node's registered GPUs change (an AMD share is a fraction of the GPU's
//! CUs, and the node may be listed after its pods at start-up), released when the holding
//! goes (the pod ended — Succeeded, Failed, deleted —, a re-filter, a failed patch). A pod
//! being deleted (`deletionTimestamp` set) still holds: its containers may still run.
//!
//! [`ClusterState`]: crate::state::ClusterState

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use hami_protocol::device_list::{ContainerDevices, decode_pod_devices};
use hami_protocol::names::Vendor;
use hami_protocol::node_register::DeviceInfo;
use hami_protocol::requests::{ContainerKind, container_kinds, pod_ref};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};

use crate::quota::{
    Amounts, QuotaLedger, QuotaRefusal, QuotaRow, QuotaWarning, charge_of_allocation,
    quota_from_object,
};
use crate::snapshot::NodeDevices;

/// Where a ResourceQuota's ignored values are reported (the shell posts an Event);
/// `Sync` so the state stays shareable (the web UI reads it across awaits).
pub type WarningSink = Box<dyn FnMut(QuotaWarning) + Send + Sync>;

/// What a pod's charge is computed from, kept so it can be computed again.
#[derive(Debug, Clone)]
struct Held {
    namespace: String,
    node: String,
    kinds: Vec<ContainerKind>,
    runs: Vec<(Vendor, Vec<ContainerDevices>)>,
}

impl Held {
    fn charge(&self, node: Option<&NodeDevices>) -> Amounts {
        let runs: Vec<(Vendor, &[ContainerDevices])> =
            self.runs.iter().map(|(v, r)| (*v, r.as_slice())).collect();
        charge_of_allocation(&self.kinds, &runs, |id| lookup(node, id))
    }
}

fn lookup<'a>(node: Option<&'a NodeDevices>, id: &str) -> Option<&'a DeviceInfo> {
    node?.gpus.iter().find(|g| g.info.id == id).map(|g| &g.info)
}

/// The quota ledger with what each charge came from, and the warnings already reported.
#[derive(Default)]
pub struct QuotaBook {
    ledger: QuotaLedger,
    held: HashMap<String, Held>,
    /// Per quota (`namespace/name`), the warnings last reported: a relist or an update
    /// that changes nothing bad does not repeat its Event.
    warned: BTreeMap<String, Vec<QuotaWarning>>,
    sink: Option<WarningSink>,
}

impl fmt::Debug for QuotaBook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaBook")
            .field("ledger", &self.ledger)
            .field("pods", &self.held.len())
            .field("warned", &self.warned)
            .finish()
    }
}

/// `namespace/name`, the key of a quota in the book and the informer.
pub fn quota_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl QuotaBook {
    /// No quota, nothing used, warnings dropped until a sink is set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where new warnings go from now on.
    pub fn set_sink(&mut self, sink: WarningSink) {
        self.sink = Some(sink);
    }

    /// The ledger (checks, usage, metric rows).
    pub fn ledger(&self) -> &QuotaLedger {
        &self.ledger
    }

    /// Adds or replaces a ResourceQuota (its HAMi keys; bad values ignored, each new one
    /// reported once to the sink).
    pub fn apply_quota(&mut self, object: &ResourceQuota) {
        let (quota, warnings) = quota_from_object(object);
        let key = quota_key(&quota.namespace, &quota.name);
        self.ledger.set_quota(quota);
        let before = self.warned.remove(&key).unwrap_or_default();
        if let Some(sink) = &mut self.sink {
            for w in warnings.iter().filter(|w| !before.contains(w)) {
                sink(w.clone());
            }
        }
        if !warnings.is_empty() {
            self.warned.insert(key, warnings);
        }
    }

    /// Removes a deleted ResourceQuota (`namespace/name`).
    pub fn remove_quota(&mut self, key: &str) {
        if let Some((namespace, name)) = key.split_once('/') {
            self.ledger.remove_quota(namespace, name);
        }
        self.warned.remove(key);
    }

    /// The keys (`namespace/name`) of every quota known.
    pub fn quota_keys(&self) -> Vec<String> {
        self.ledger
            .rows()
            .into_iter()
            .map(|r| quota_key(&r.namespace, &r.quota))
            .chain(self.warned.keys().cloned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// Charges a live pod placed by this scheduler on `node` from its allocation
    /// annotations; `devices` is that node's registered GPUs when known.
    pub fn observe_pod(&mut self, uid: &str, pod: &Pod, node: &str, devices: Option<&NodeDevices>) {
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let mut runs = Vec::new();
        for vendor in Vendor::ALL {
            let Some(text) = annotations.get(vendor.names().devices_allocated) else {
                continue;
            };
            // The state read the same annotation before calling here; a list it cannot
            // read leaves the pod uncharged, as it leaves it holding nothing.
            let Ok(decoded) = decode_pod_devices(text) else {
                self.release(uid);
                return;
            };
            runs.push((vendor, decoded));
        }
        let held = Held {
            namespace: pod_ref(pod).namespace,
            node: node.to_owned(),
            kinds: container_kinds(pod),
            runs,
        };
        self.ledger
            .charge(uid, &held.namespace, held.charge(devices));
        self.held.insert(uid.to_owned(), held);
    }

    /// Filter's step, under the state's lock: the pod's decision (its device-list runs on
    /// `devices`' GPUs) is checked against every quota of its namespace and charged when it
    /// fits. A namespace without a quota is charged too (a quota made later counts it).
    pub fn check_and_charge_decision(
        &mut self,
        uid: &str,
        pod: &Pod,
        runs: Vec<(Vendor, Vec<ContainerDevices>)>,
        devices: &NodeDevices,
    ) -> Result<(), QuotaRefusal> {
        let held = Held {
            namespace: pod_ref(pod).namespace,
            node: devices.name.clone(),
            kinds: container_kinds(pod),
            runs,
        };
        let charge = held.charge(Some(devices));
        self.ledger.check_and_charge(uid, &held.namespace, charge)?;
        self.held.insert(uid.to_owned(), held);
        Ok(())
    }

    /// Charges again the pods `uids` on a node whose registered GPUs changed.
    pub fn recharge<'a>(
        &mut self,
        uids: impl IntoIterator<Item = &'a String>,
        devices: &NodeDevices,
    ) {
        for uid in uids {
            if let Some(held) = self.held.get(uid)
                && held.node == devices.name
            {
                self.ledger
                    .charge(uid, &held.namespace, held.charge(Some(devices)));
            }
        }
    }

    /// Releases what the pod `uid` is charged.
    pub fn release(&mut self, uid: &str) {
        self.held.remove(uid);
        self.ledger.release(uid);
    }

    /// Whether `ask` fits `namespace`'s quotas (admission: nothing charged).
    pub fn check(&self, namespace: &str, ask: &Amounts) -> Result<(), QuotaRefusal> {
        self.ledger.check(namespace, ask, None)
    }

    /// The metric rows.
    pub fn rows(&self) -> Vec<QuotaRow> {
        self.ledger.rows()
    }
}
