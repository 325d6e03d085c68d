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
//! DRA-mode pods (D-29) hold nothing our Filter sees: the webhook reserves what their
//! claims ask when it admits them ([`QuotaBook::admit`]), and from the moment the informer
//! shows the pod its charge comes from the annotation the webhook wrote, until it ends.
//!
//! [`ClusterState`]: crate::state::ClusterState

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::time::{Duration, Instant};

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
    /// DRA mode (D-29): the pods charged from their admission's annotation (ledger key
    /// `dra/<uid>`), apart from the holdings, which a DRA pod never has.
    dra_pods: HashSet<String>,
    /// DRA mode: admissions charged but whose pod the informer has not shown yet.
    admitted: Vec<Admitted>,
    /// Numbers the reservations' ledger keys.
    next_ticket: u64,
}

/// How long an admission's reservation waits for its pod to be seen: past it, the pod was
/// never stored (another webhook or validation refused it) and the quota is given back.
pub const ADMISSION_HOLD: Duration = Duration::from_secs(30);

/// An admitted DRA pod not yet seen, charged under the ledger key `key`.
#[derive(Debug, Clone)]
struct Admitted {
    key: String,
    namespace: String,
    amounts: Amounts,
    until: Instant,
}

/// An admission's reservation, for [`QuotaBook::cancel_admission`] when the pod is denied
/// after all (its claim templates could not be made).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket(String);

fn dra_key(uid: &str) -> String {
    format!("dra/{uid}")
}

impl fmt::Debug for QuotaBook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaBook")
            .field("ledger", &self.ledger)
            .field("pods", &self.held.len())
            .field("warned", &self.warned)
            .field("dra_pods", &self.dra_pods.len())
            .field("admitted", &self.admitted)
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
        // A DRA admission whose pod never came must not hold the quota against this pod.
        self.expire(Instant::now());
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

    /// The webhook's step in DRA mode (D-29), under the state's lock: `total` (the whole
    /// pod's ask) is checked against `namespace`'s quotas, and `dra` (what its claims ask,
    /// which no Filter will charge) is reserved until its pod is seen ([`ADMISSION_HOLD`]
    /// at most), so a second pod admitted before the first is placed sees it. Nothing is
    /// reserved when `reserve` is false (dry run) or `dra` is zero.
    pub fn admit(
        &mut self,
        namespace: &str,
        total: &Amounts,
        dra: Amounts,
        reserve: bool,
        now: Instant,
    ) -> Result<Option<Ticket>, QuotaRefusal> {
        self.expire(now);
        self.ledger.check(namespace, total, None)?;
        if !reserve || dra.is_zero() {
            return Ok(None);
        }
        self.next_ticket += 1;
        let key = format!("admitted/{}", self.next_ticket);
        self.ledger.charge(&key, namespace, dra);
        self.admitted.push(Admitted {
            key: key.clone(),
            namespace: namespace.to_owned(),
            amounts: dra,
            until: now + ADMISSION_HOLD,
        });
        Ok(Some(Ticket(key)))
    }

    /// Gives back an admission's reservation (the pod was denied after all).
    pub fn cancel_admission(&mut self, ticket: &Ticket) {
        self.admitted.retain(|a| a.key != ticket.0);
        self.ledger.release(&ticket.0);
    }

    fn expire(&mut self, now: Instant) {
        if self.admitted.iter().all(|a| a.until > now) {
            return;
        }
        let (gone, kept): (Vec<Admitted>, Vec<Admitted>) =
            self.admitted.drain(..).partition(|a| a.until <= now);
        self.admitted = kept;
        for a in gone {
            self.ledger.release(&a.key);
        }
    }

    /// Charges a DRA-mode pod from the charge its admission wrote
    /// ([`DRA_CHARGE_ANNOTATION`](crate::quota_admission::DRA_CHARGE_ANNOTATION)), taking
    /// over its admission's reservation the first time it is seen; releases it once it has
    /// `ended` (Succeeded, Failed) or carries no readable charge.
    pub fn observe_dra_pod(&mut self, uid: &str, pod: &Pod, ended: bool) {
        let charge = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::quota_admission::DRA_CHARGE_ANNOTATION))
            .filter(|_| !ended)
            .and_then(|text| crate::quota_admission::parse_charge(text).ok())
            .filter(|a| !a.is_zero());
        let key = dra_key(uid);
        let Some(amounts) = charge else {
            self.forget_dra_pod(uid);
            return;
        };
        if self.ledger.charged(&key) == Some(&amounts) {
            return;
        }
        let namespace = pod_ref(pod).namespace;
        if self.dra_pods.insert(uid.to_owned())
            && let Some(i) = self
                .admitted
                .iter()
                .position(|a| a.namespace == namespace && a.amounts == amounts)
        {
            // Equal reservations of a namespace are interchangeable: any one is this pod's.
            let taken = self.admitted.remove(i);
            self.ledger.release(&taken.key);
        }
        self.ledger.charge(&key, &namespace, amounts);
    }

    /// Releases a DRA-mode pod's charge (deleted, ended).
    pub fn forget_dra_pod(&mut self, uid: &str) {
        if self.dra_pods.remove(uid) {
            self.ledger.release(&dra_key(uid));
        }
    }

    /// The pods charged in DRA mode (a relist forgets those it no longer lists).
    pub fn dra_pods(&self) -> impl Iterator<Item = &String> {
        self.dra_pods.iter()
    }
}
