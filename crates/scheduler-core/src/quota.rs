//! Namespace quotas on GPU slices (issue 30 item 1): HAMi's `limits.<resource>` keys of a
//! ResourceQuota's `spec.hard`, for both vendors, with HAMi's arithmetic — per-GPU value ×
//! GPU count, a pod's ask = max(sum of its app containers, max of its init containers).
//!
//! kube-apiserver never evaluates `limits.` keys of extended resources (native quota counts
//! only `requests.<name>`, summed per container, with no per-GPU meaning), so the scheduler
//! enforces them: at admission against the smallest GPU the pod could get ([`admission_ask`]),
//! and in Filter against the GPUs actually chosen ([`charge_of_placement`]), where a
//! `gpumem-percentage` or omitted-memory request is charged the chosen GPU's real MiB and
//! `gpucores` the real share (AMD: the CUs given, as a percentage of the GPU's CUs, rounded
//! up). Usage is rebuilt from the pods' allocation annotations ([`charge_of_pod`]), so a
//! restarted scheduler counts what it counted before.
//!
//! Bad values are ignored with a warning naming the key ([`QuotaWarning`]), as HAMi's
//! `LimitSet` treats an unset key; an explicit 0 blocks every ask of that key.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use hami_protocol::capacity;
use hami_protocol::device_list::{ContainerDevices, decode_pod_devices};
use hami_protocol::names::Vendor;
use hami_protocol::node_register::DeviceInfo;
use hami_protocol::quantity::{CountProblem, parse_count};
use hami_protocol::requests::{
    ContainerKind, ContainerRequest, MemoryRequest, amd_cu_count, container_kinds, pod_ref,
};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};

use crate::fit::Placement;
use crate::snapshot::{Gpu, NodeDevices};
use crate::state::{HoldingError, pod_holding, pod_name};

/// The Event reason recorded on a pod a quota refuses.
pub const QUOTA_EXCEEDED_REASON: &str = "QuotaExceeded";

/// The Event reason recorded on a ResourceQuota with a value that is ignored.
pub const QUOTA_INVALID_REASON: &str = "QuotaValueIgnored";

/// What a quota key counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dimension {
    /// GPUs (slices) taken: `<vendor>/gpu`.
    Slices,
    /// Device memory in MiB: `<vendor>/gpumem`.
    MemoryMib,
    /// Percent of a GPU's compute: `<vendor>/gpucores`.
    CoresPercent,
}

/// One of the six keys HAMi's quotas understand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuotaKey {
    /// Whose resource.
    pub vendor: Vendor,
    /// What it counts.
    pub dimension: Dimension,
}

/// The prefix of the keys HAMi reads (`limits.`): kube-apiserver ignores these for
/// extended resources, so only the scheduler enforces them.
pub const KEY_PREFIX: &str = "limits.";

impl QuotaKey {
    /// Every key, in the order reports list them.
    pub const ALL: [QuotaKey; 6] = [
        QuotaKey::new(Vendor::Amd, Dimension::Slices),
        QuotaKey::new(Vendor::Amd, Dimension::MemoryMib),
        QuotaKey::new(Vendor::Amd, Dimension::CoresPercent),
        QuotaKey::new(Vendor::Nvidia, Dimension::Slices),
        QuotaKey::new(Vendor::Nvidia, Dimension::MemoryMib),
        QuotaKey::new(Vendor::Nvidia, Dimension::CoresPercent),
    ];

    /// The key of `vendor`'s `dimension`.
    pub const fn new(vendor: Vendor, dimension: Dimension) -> Self {
        Self { vendor, dimension }
    }

    const fn index(self) -> usize {
        let v = match self.vendor {
            Vendor::Amd => 0,
            Vendor::Nvidia => 3,
        };
        v + match self.dimension {
            Dimension::Slices => 0,
            Dimension::MemoryMib => 1,
            Dimension::CoresPercent => 2,
        }
    }

    /// The resource it limits, e.g. `nvidia.com/gpumem` (the `limit` label of
    /// `hami_resource_quota_used`).
    pub fn resource(self) -> &'static str {
        let names = self.vendor.names();
        match self.dimension {
            Dimension::Slices => names.resource_count,
            Dimension::MemoryMib => names.resource_memory,
            Dimension::CoresPercent => names.resource_cores,
        }
    }

    /// The `spec.hard` key, e.g. `limits.nvidia.com/gpumem`.
    pub fn key(self) -> String {
        format!("{KEY_PREFIX}{}", self.resource())
    }

    /// The key `spec.hard` names, if it is one of ours.
    pub fn from_key(key: &str) -> Option<Self> {
        let resource = key.strip_prefix(KEY_PREFIX)?;
        Self::ALL.into_iter().find(|k| k.resource() == resource)
    }

    /// The unit a value is in, for messages.
    pub fn unit(self) -> &'static str {
        match self.dimension {
            Dimension::Slices => "GPUs",
            Dimension::MemoryMib => "MiB",
            Dimension::CoresPercent => "percent of a GPU",
        }
    }
}

/// An amount per key: a pod's ask, or a namespace's usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Amounts([u64; 6]);

impl Amounts {
    /// The amount of `key`.
    pub fn get(&self, key: QuotaKey) -> u64 {
        self.0[key.index()]
    }

    /// Sets the amount of `key`.
    pub fn set(&mut self, key: QuotaKey, value: u64) {
        self.0[key.index()] = value;
    }

    /// Whether every amount is 0.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|v| *v == 0)
    }

    /// The sum, saturating.
    pub fn plus(&self, other: &Amounts) -> Amounts {
        Amounts(std::array::from_fn(|i| {
            self.0[i].saturating_add(other.0[i])
        }))
    }

    /// The difference, never below 0.
    pub fn minus(&self, other: &Amounts) -> Amounts {
        Amounts(std::array::from_fn(|i| {
            self.0[i].saturating_sub(other.0[i])
        }))
    }

    fn max(&self, other: &Amounts) -> Amounts {
        Amounts(std::array::from_fn(|i| self.0[i].max(other.0[i])))
    }

    /// Each key with its amount, in [`QuotaKey::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (QuotaKey, u64)> + '_ {
        QuotaKey::ALL.into_iter().map(|k| (k, self.get(k)))
    }
}

/// One ResourceQuota's HAMi limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// The namespace it governs.
    pub namespace: String,
    /// The ResourceQuota's name.
    pub name: String,
    /// The limits it sets; a key not here is not limited by this quota.
    pub limits: BTreeMap<QuotaKey, u64>,
}

/// A `spec.hard` value that is ignored, for an Event on the ResourceQuota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaWarning {
    /// The quota's namespace.
    pub namespace: String,
    /// The quota's name.
    pub quota: String,
    /// The key, e.g. `limits.amd.com/gpumem`.
    pub key: String,
    /// The value as written.
    pub value: String,
    /// Why it is ignored.
    pub problem: String,
}

impl fmt::Display for QuotaWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ResourceQuota {}/{}: spec.hard[{}] = {:?} {}; the key is ignored (no limit) until it is a whole number, 0 to block",
            self.namespace, self.quota, self.key, self.value, self.problem
        )
    }
}

/// Reads a quantity as the API server writes it (a plain integer, or canonical decimal
/// and binary suffixes: `40000` is stored as `40k`); negative, fractional and non-numeric
/// values are refused with the protocol's own wording.
fn parse_limit(text: &str) -> Result<u64, String> {
    match parse_count(text) {
        Ok(v) => Ok(v),
        Err(CountProblem::HasUnit(_)) => capacity::parse(text.trim()).map_err(|e| e.to_string()),
        Err(problem) => Err(problem.to_string()),
    }
}

/// Reads one ResourceQuota's `spec.hard` (`(key, value)` pairs). Keys that are not ours
/// are skipped silently (native quota handles them); ours with a bad value are ignored
/// with a warning.
pub fn parse_quota<'a>(
    namespace: &str,
    name: &str,
    hard: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> (Quota, Vec<QuotaWarning>) {
    let mut quota = Quota {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        limits: BTreeMap::new(),
    };
    let mut warnings = Vec::new();
    for (key, value) in hard {
        let Some(k) = QuotaKey::from_key(key) else {
            continue;
        };
        match parse_limit(value) {
            Ok(limit) => {
                quota.limits.insert(k, limit);
            }
            Err(problem) => warnings.push(QuotaWarning {
                namespace: namespace.to_owned(),
                quota: name.to_owned(),
                key: key.to_owned(),
                value: value.to_owned(),
                problem,
            }),
        }
    }
    (quota, warnings)
}

/// [`parse_quota`] of a ResourceQuota object (`default` namespace when unset).
pub fn quota_from_object(object: &ResourceQuota) -> (Quota, Vec<QuotaWarning>) {
    let namespace = object.metadata.namespace.as_deref().unwrap_or("default");
    let name = object.metadata.name.as_deref().unwrap_or_default();
    let hard = object.spec.as_ref().and_then(|s| s.hard.as_ref());
    parse_quota(
        namespace,
        name,
        hard.into_iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.0.as_str())),
    )
}

/// The real share of a GPU's compute a grant takes, in percent: NVIDIA grants are written
/// in percent; AMD grants in CUs, charged as `ceil(CUs × 100 / devcore)` — what the pod
/// got, not what it wrote (a memory-only AMD pod gets every CU: 100). A grant on a GPU the
/// node does not register (gone, renamed) counts as the whole GPU: never under-charge.
pub fn cores_share(vendor: Vendor, cores: u64, gpu: Option<&DeviceInfo>) -> u64 {
    match vendor {
        Vendor::Nvidia => cores,
        Vendor::Amd => match gpu {
            Some(info) if info.devcore > 0 => {
                (cores.saturating_mul(100)).div_ceil(u64::from(info.devcore))
            }
            _ => 100,
        },
    }
}

/// A pod's charge from per-container amounts: max(sum of the containers that run together
/// — app containers and sidecars —, max of the init containers), per key.
pub(crate) fn combine(kinds: &[ContainerKind], per_container: &[Amounts]) -> Amounts {
    let mut together = Amounts::default();
    let mut init = Amounts::default();
    for (i, amounts) in per_container.iter().enumerate() {
        match kinds.get(i) {
            Some(ContainerKind::Init) => init = init.max(amounts),
            // Unaligned runs (a list the reference wrote) are summed: can only over-count.
            _ => together = together.plus(amounts),
        }
    }
    together.max(&init)
}

/// The charge of an allocation: per vendor, the pod's device-list runs (one per
/// container, device-list order); `gpu` looks a device id up on the pod's node.
pub fn charge_of_allocation<'a>(
    kinds: &[ContainerKind],
    runs: &[(Vendor, &[ContainerDevices])],
    gpu: impl Fn(&str) -> Option<&'a DeviceInfo>,
) -> Amounts {
    let containers = runs.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
    let mut per_container = vec![Amounts::default(); containers];
    for (vendor, vendor_runs) in runs {
        for (i, run) in vendor_runs.iter().enumerate() {
            let a = &mut per_container[i];
            for dev in run {
                let slices = QuotaKey::new(*vendor, Dimension::Slices);
                let mem = QuotaKey::new(*vendor, Dimension::MemoryMib);
                let cores = QuotaKey::new(*vendor, Dimension::CoresPercent);
                let share = cores_share(*vendor, u64::from(dev.cores), gpu(&dev.uuid));
                a.set(slices, a.get(slices).saturating_add(1));
                a.set(mem, a.get(mem).saturating_add(dev.mem_mib));
                a.set(cores, a.get(cores).saturating_add(share));
            }
        }
    }
    combine(kinds, &per_container)
}

/// What Filter's decision charges: the placement's runs on `node`'s GPUs.
pub fn charge_of_placement(
    containers: &[ContainerRequest],
    placement: &Placement,
    node: &NodeDevices,
) -> Amounts {
    let kinds: Vec<ContainerKind> = containers.iter().map(|c| c.kind).collect();
    let runs: Vec<(Vendor, &[ContainerDevices])> = placement
        .runs
        .iter()
        .map(|(v, r)| (*v, r.as_slice()))
        .collect();
    charge_of_allocation(&kinds, &runs, |id| lookup(node, id))
}

fn lookup<'a>(node: &'a NodeDevices, id: &str) -> Option<&'a DeviceInfo> {
    node.gpus.iter().find(|g| g.info.id == id).map(|g| &g.info)
}

/// What a live pod placed by `scheduler_name` is charged, from its allocation annotations
/// (the same pods and rule as the node usage: `state::pod_holding`); `node` is its node's
/// registered GPUs when known. `None` when it holds nothing (finished, not ours).
pub fn charge_of_pod(
    pod: &Pod,
    scheduler_name: &str,
    node: Option<&NodeDevices>,
) -> Result<Option<(String, Amounts)>, HoldingError> {
    if pod_holding(pod, scheduler_name)?.is_none() {
        return Ok(None);
    }
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let mut decoded = Vec::new();
    for vendor in Vendor::ALL {
        let key = vendor.names().devices_allocated;
        let Some(text) = annotations.get(key) else {
            continue;
        };
        let runs = decode_pod_devices(text).map_err(|e| HoldingError {
            pod: pod_name(pod),
            key,
            problem: e.to_string(),
        })?;
        decoded.push((vendor, runs));
    }
    let runs: Vec<(Vendor, &[ContainerDevices])> =
        decoded.iter().map(|(v, r)| (*v, r.as_slice())).collect();
    let charge = charge_of_allocation(&container_kinds(pod), &runs, |id| {
        node.and_then(|n| lookup(n, id))
    });
    Ok(Some((pod_ref(pod).namespace, charge)))
}

/// The size of a GPU the pod could be given, for the admission check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuShape {
    /// Whose GPU.
    pub vendor: Vendor,
    /// MiB.
    pub devmem: u64,
    /// AMD: CUs; NVIDIA: 100.
    pub devcore: u32,
    /// AMD: CUs per WGP (2 on RDNA), else 1.
    pub cu_per_wgp: u32,
}

impl GpuShape {
    /// The shape of a registered GPU.
    pub fn of(gpu: &Gpu) -> Self {
        Self {
            vendor: gpu.vendor,
            devmem: gpu.info.devmem,
            devcore: gpu.info.devcore,
            cu_per_wgp: gpu.info.custom_info.cu_per_wgp.unwrap_or(1),
        }
    }
}

/// The least a pod can be charged: each container's per-GPU memory and cores on the
/// smallest GPU of `shapes` (the GPUs of the cluster it could get) × its count. A MiB ask
/// and an NVIDIA percentage are exact; a memory percentage, a whole-memory ask and an AMD
/// share depend on the GPU and count 0 when no shape of the vendor is known (Filter then
/// charges them exactly).
pub fn admission_ask(containers: &[ContainerRequest], shapes: &[GpuShape]) -> Amounts {
    let per_container: Vec<Amounts> = containers
        .iter()
        .map(|c| {
            let mut a = Amounts::default();
            for vendor in Vendor::ALL {
                let Some(r) = c.get(vendor) else { continue };
                let count = u64::from(r.count);
                let of_vendor = shapes.iter().filter(|s| s.vendor == vendor);
                let mem = match r.memory {
                    MemoryRequest::Mib(m) => m,
                    other => of_vendor
                        .clone()
                        .map(|s| other.resolve(s.devmem))
                        .min()
                        .unwrap_or(0),
                };
                let cores = match vendor {
                    Vendor::Nvidia => u64::from(r.cores_percent),
                    Vendor::Amd => of_vendor
                        .map(|s| {
                            let cus = amd_cu_count(r.cores_percent, s.devcore, s.cu_per_wgp);
                            let info = DeviceInfo {
                                devcore: s.devcore,
                                ..Default::default()
                            };
                            cores_share(vendor, u64::from(cus), Some(&info))
                        })
                        .min()
                        .unwrap_or(0),
                };
                a.set(QuotaKey::new(vendor, Dimension::Slices), count);
                a.set(
                    QuotaKey::new(vendor, Dimension::MemoryMib),
                    mem.saturating_mul(count),
                );
                a.set(
                    QuotaKey::new(vendor, Dimension::CoresPercent),
                    cores.saturating_mul(count),
                );
            }
            a
        })
        .collect();
    let kinds: Vec<ContainerKind> = containers.iter().map(|c| c.kind).collect();
    combine(&kinds, &per_container)
}

/// A pod a quota refuses: the numbers, and (Display) the message for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaRefusal {
    /// The namespace.
    pub namespace: String,
    /// The ResourceQuota's name.
    pub quota: String,
    /// The `spec.hard` key, e.g. `limits.nvidia.com/gpumem`.
    pub key: String,
    /// Used in the namespace before this pod.
    pub used: u64,
    /// What the pod asks for.
    pub asked: u64,
    /// The limit.
    pub limit: u64,
}

impl fmt::Display for QuotaRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = QuotaKey::from_key(&self.key).map_or("", QuotaKey::unit);
        let over = self
            .used
            .saturating_add(self.asked)
            .saturating_sub(self.limit);
        write!(
            f,
            "ResourceQuota {}/{} limits {} to {} {unit}: {} used in the namespace, the pod asks for {}; {over} over: free some, ask for less or raise the limit",
            self.namespace, self.quota, self.key, self.limit, self.used, self.asked
        )
    }
}

impl std::error::Error for QuotaRefusal {}

/// One row of `hami_resource_quota_used` / `hami_resource_quota_limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaRow {
    /// The namespace.
    pub namespace: String,
    /// The ResourceQuota's name.
    pub quota: String,
    /// The resource, e.g. `nvidia.com/gpumem` (HAMi's `limit` label).
    pub resource: &'static str,
    /// Used in the namespace.
    pub used: u64,
    /// The limit.
    pub limit: u64,
}

/// The quotas in force and what each namespace uses, charged per pod (by UID) so a pod's
/// charge is released exactly once, when it ends or its decision is voided.
#[derive(Debug, Clone, Default)]
pub struct QuotaLedger {
    quotas: BTreeMap<String, BTreeMap<String, Quota>>,
    pods: HashMap<String, (String, Amounts)>,
    used: HashMap<String, Amounts>,
}

impl QuotaLedger {
    /// No quota, nothing used.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a quota (an update swaps it whole: no moment without a limit).
    pub fn set_quota(&mut self, quota: Quota) {
        self.quotas
            .entry(quota.namespace.clone())
            .or_default()
            .insert(quota.name.clone(), quota);
    }

    /// Removes a deleted quota.
    pub fn remove_quota(&mut self, namespace: &str, name: &str) {
        if let Some(q) = self.quotas.get_mut(namespace) {
            q.remove(name);
            if q.is_empty() {
                self.quotas.remove(namespace);
            }
        }
    }

    /// Whether `namespace` has any quota with one of our keys.
    pub fn governs(&self, namespace: &str) -> bool {
        self.quotas
            .get(namespace)
            .is_some_and(|q| q.values().any(|q| !q.limits.is_empty()))
    }

    /// Records what the pod `uid` holds (replacing any earlier charge of it); a zero charge
    /// releases it.
    pub fn charge(&mut self, uid: &str, namespace: &str, amounts: Amounts) {
        self.release(uid);
        if amounts.is_zero() {
            return;
        }
        let used = self.used.entry(namespace.to_owned()).or_default();
        *used = used.plus(&amounts);
        self.pods
            .insert(uid.to_owned(), (namespace.to_owned(), amounts));
    }

    /// Releases what the pod `uid` holds (it ended, was deleted, or its decision voided).
    pub fn release(&mut self, uid: &str) {
        if let Some((ns, amounts)) = self.pods.remove(uid)
            && let Some(used) = self.used.get_mut(&ns)
        {
            *used = used.minus(&amounts);
            if used.is_zero() {
                self.used.remove(&ns);
            }
        }
    }

    /// Rebuilds usage from every pod (start-up, relist): `(uid, namespace, charge)`.
    pub fn rebuild(&mut self, pods: impl IntoIterator<Item = (String, String, Amounts)>) {
        self.pods.clear();
        self.used.clear();
        for (uid, ns, amounts) in pods {
            self.charge(&uid, &ns, amounts);
        }
    }

    /// What `namespace` uses.
    pub fn used(&self, namespace: &str) -> Amounts {
        self.used.get(namespace).copied().unwrap_or_default()
    }

    /// What the pod `uid` is charged, if anything.
    pub fn charged(&self, uid: &str) -> Option<&Amounts> {
        self.pods.get(uid).map(|(_, a)| a)
    }

    /// Whether `ask` fits every quota of `namespace`; `replacing` is a pod whose current
    /// charge the ask replaces (a re-filter), not counted as used. The first refusal in
    /// quota-name and key order.
    pub fn check(
        &self,
        namespace: &str,
        ask: &Amounts,
        replacing: Option<&str>,
    ) -> Result<(), QuotaRefusal> {
        let Some(quotas) = self.quotas.get(namespace) else {
            return Ok(());
        };
        let mut used = self.used(namespace);
        if let Some((ns, own)) = replacing.and_then(|uid| self.pods.get(uid))
            && ns == namespace
        {
            used = used.minus(own);
        }
        for quota in quotas.values() {
            for (key, limit) in &quota.limits {
                let asked = ask.get(*key);
                let have = used.get(*key);
                if asked > 0 && have.saturating_add(asked) > *limit {
                    return Err(QuotaRefusal {
                        namespace: namespace.to_owned(),
                        quota: quota.name.clone(),
                        key: key.key(),
                        used: have,
                        asked,
                        limit: *limit,
                    });
                }
            }
        }
        Ok(())
    }

    /// [`Self::check`], then the charge: Filter's step under its one lock, so two pods
    /// racing for the last of a quota never both pass.
    pub fn check_and_charge(
        &mut self,
        uid: &str,
        namespace: &str,
        ask: Amounts,
    ) -> Result<(), QuotaRefusal> {
        self.check(namespace, &ask, Some(uid))?;
        self.charge(uid, namespace, ask);
        Ok(())
    }

    /// Every quota key in force with its usage: the metric rows.
    pub fn rows(&self) -> Vec<QuotaRow> {
        let mut rows = Vec::new();
        for (ns, quotas) in &self.quotas {
            let used = self.used(ns);
            for quota in quotas.values() {
                for (key, limit) in &quota.limits {
                    rows.push(QuotaRow {
                        namespace: ns.clone(),
                        quota: quota.name.clone(),
                        resource: key.resource(),
                        used: used.get(*key),
                        limit: *limit,
                    });
                }
            }
        }
        rows
    }
}

#[cfg(test)]
#[path = "quota_tests.rs"]
mod tests;
