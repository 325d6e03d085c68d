//! A model of kube-scheduler's structured-parameters allocator for what this driver uses
//! (the simulated kube-scheduler and the planner call it; the real scheduler runs upstream's):
//! `exactly` requests with `ExactCount`, selectors by attribute equality (the classes' and
//! the request's, see [`crate::selector`]), consumable capacity with request policies
//! (default, `validValues`, `validRange` rounded up to `min + n·step`), exclusive vs
//! `allowMultipleAllocations` devices, `matchAttribute` and `distinctAttribute` constraints,
//! devices with `NoSchedule`/`NoExecute` taints skipped, only complete pools at their newest
//! generation, depth-first search with backtracking in slice/device order.
//!
//! Not modelled, refused with an error naming it: `firstAvailable`, `allocationMode: All`,
//! `adminAccess`, tolerations, full CEL, counters (`consumesCounters`), opaque config.
//! Like upstream (KEP-5075), one multi-allocatable device may serve several requests or
//! several devices of one request of the same claim, each with its own share; ask for
//! `distinctAttribute` to spread.

use std::collections::BTreeMap;

use crate::api::{
    CapacityRequestPolicy, Device, DeviceAttribute, DeviceClaim, DeviceRequestAllocationResult,
    ResourceSlice,
};
use crate::quantity;
use crate::selector::{self, Term};

/// A DeviceClass as the allocator needs it: its name and CEL selectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceClass {
    /// The class's name.
    pub name: String,
    /// Its CEL selectors, each read by [`crate::selector::parse`].
    pub selectors: Vec<String>,
}

/// Why a claim could not be allocated; each names the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The claim uses a feature this model does not implement.
    #[error("request {request:?}: {what} is not supported by this allocator model")]
    Unsupported {
        /// The request.
        request: String,
        /// The feature.
        what: String,
    },
    /// The request names a class that does not exist.
    #[error("request {request:?}: device class {class:?} does not exist")]
    NoClass {
        /// The request.
        request: String,
        /// The class name.
        class: String,
    },
    /// A selector is not one this model reads.
    #[error(transparent)]
    Selector(#[from] selector::SelectorError),
    /// A capacity request is not a whole quantity.
    #[error("request {request:?}: bad quantity: {source}")]
    Quantity {
        /// The request.
        request: String,
        /// What is wrong with the quantity.
        source: quantity::QuantityError,
    },
    /// A count below 1.
    #[error("request {request:?}: count {count} must be at least 1")]
    Count {
        /// The request.
        request: String,
        /// The count given.
        count: i64,
    },
    /// A constraint names a request the claim lacks; that name.
    #[error("constraint names request {0:?}, which the claim does not have")]
    ConstraintRequest(String),
    /// No combination of free devices fits; what was short.
    #[error("cannot allocate all requests: no combination of free devices fits ({0})")]
    Unsatisfiable(String),
    /// The search hit its step budget; the steps taken.
    #[error("search gave up after {0} steps")]
    Budget(u64),
}

type Key = (String, String, String);

/// What existing allocations hold of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceUse {
    /// Claims holding the device.
    pub allocations: u32,
    /// Capacity consumed, by capacity name.
    pub consumed: BTreeMap<String, u64>,
}

struct Candidate<'a> {
    key: Key,
    driver: &'a str,
    device: &'a Device,
    capacity: BTreeMap<&'a str, u64>,
}

struct Slot<'a> {
    request: &'a str,
    candidates: Vec<(usize, BTreeMap<String, u64>)>,
}

/// The devices of complete pools at their newest generation.
fn usable_devices(slices: &[ResourceSlice]) -> Vec<(&ResourceSlice, &Device)> {
    let mut newest: BTreeMap<(&str, &str), (i64, i64, usize)> = BTreeMap::new();
    for s in slices {
        let k = (s.spec.driver.as_str(), s.spec.pool.name.as_str());
        let e = newest.entry(k).or_insert((
            s.spec.pool.generation,
            s.spec.pool.resource_slice_count,
            0,
        ));
        if s.spec.pool.generation > e.0 {
            *e = (s.spec.pool.generation, s.spec.pool.resource_slice_count, 0);
        }
        if s.spec.pool.generation == e.0 {
            e.2 += 1;
        }
    }
    slices
        .iter()
        .filter(|s| {
            let (g, count, seen) = newest[&(s.spec.driver.as_str(), s.spec.pool.name.as_str())];
            s.spec.pool.generation == g && seen as i64 == count
        })
        .flat_map(|s| s.spec.devices.iter().map(move |d| (s, d)))
        .collect()
}

/// An attribute by fully qualified name: unqualified keys belong to the driver's domain.
pub fn attribute<'a>(driver: &str, device: &'a Device, name: &str) -> Option<&'a DeviceAttribute> {
    if let Some(short) = name.strip_prefix(driver).and_then(|r| r.strip_prefix('/'))
        && let Some(a) = device.attributes.get(short)
    {
        return Some(a);
    }
    device.attributes.get(name)
}

fn matches(driver: &str, device: &Device, terms: &[Term]) -> bool {
    terms.iter().all(|t| match t {
        Term::Driver(d) => d == driver,
        Term::Attribute { name, value } => attribute(driver, device, name) == Some(value),
    })
}

/// The amount a request consumes of one capacity under the device's policy (rounded up), or
/// `None` when no valid amount covers the request.
pub fn consumed_amount(
    value: u64,
    policy: Option<&CapacityRequestPolicy>,
    requested: Option<u64>,
) -> Result<Option<u64>, quantity::QuantityError> {
    let Some(p) = policy else {
        return Ok(Some(requested.unwrap_or(value)));
    };
    let base = match (requested, &p.default) {
        (Some(r), _) => r,
        (None, Some(d)) => quantity::parse(d)?,
        (None, None) => value,
    };
    if !p.valid_values.is_empty() {
        let mut vals = p
            .valid_values
            .iter()
            .map(|v| quantity::parse(v))
            .collect::<Result<Vec<_>, _>>()?;
        vals.sort_unstable();
        return Ok(vals.into_iter().find(|v| *v >= base));
    }
    if let Some(r) = &p.valid_range {
        let min = quantity::parse(&r.min)?;
        let mut amount = base.max(min);
        if let Some(step) = &r.step {
            let step = quantity::parse(step)?.max(1);
            amount = min + (amount - min).div_ceil(step) * step;
        }
        if let Some(max) = &r.max
            && amount > quantity::parse(max)?
        {
            return Ok(None);
        }
        return Ok(Some(amount));
    }
    Ok(Some(base))
}

/// Sums existing allocations per device (consumed capacity of shared devices).
pub fn usage(
    allocated: &[DeviceRequestAllocationResult],
) -> Result<BTreeMap<Key, DeviceUse>, quantity::QuantityError> {
    let mut out: BTreeMap<Key, DeviceUse> = BTreeMap::new();
    for r in allocated {
        let u = out
            .entry((r.driver.clone(), r.pool.clone(), r.device.clone()))
            .or_default();
        u.allocations += 1;
        for (k, v) in &r.consumed_capacity {
            *u.consumed.entry(k.clone()).or_default() += quantity::parse(v)?;
        }
    }
    Ok(out)
}

/// Allocates `claim` on `slices` given what `allocated` already holds. `share_seed` (the
/// claim's UID) makes share ids deterministic.
pub fn allocate(
    claim: &DeviceClaim,
    classes: &[DeviceClass],
    slices: &[ResourceSlice],
    allocated: &[DeviceRequestAllocationResult],
    share_seed: &str,
) -> Result<Vec<DeviceRequestAllocationResult>, AllocError> {
    let devices = usable_devices(slices);
    let candidates: Vec<Candidate> = devices
        .iter()
        .map(|(s, d)| Candidate {
            key: (
                s.spec.driver.clone(),
                s.spec.pool.name.clone(),
                d.name.clone(),
            ),
            driver: &s.spec.driver,
            device: d,
            capacity: d
                .capacity
                .iter()
                .filter_map(|(k, c)| quantity::parse(&c.value).ok().map(|v| (k.as_str(), v)))
                .collect(),
        })
        .collect();
    let used = usage(allocated).map_err(|source| AllocError::Quantity {
        request: String::new(),
        source,
    })?;

    let mut slots = Vec::new();
    for req in &claim.requests {
        let unsupported = |what: &str| AllocError::Unsupported {
            request: req.name.clone(),
            what: what.into(),
        };
        if !req.first_available.is_empty() {
            return Err(unsupported("firstAvailable"));
        }
        let ex = req
            .exactly
            .as_ref()
            .ok_or_else(|| unsupported("a request without `exactly`"))?;
        if ex
            .allocation_mode
            .as_deref()
            .is_some_and(|m| m != "ExactCount")
        {
            return Err(unsupported("allocationMode other than ExactCount"));
        }
        if ex.admin_access == Some(true) {
            return Err(unsupported("adminAccess"));
        }
        if !ex.tolerations.is_empty() {
            return Err(unsupported("tolerations"));
        }
        let count = ex.count.unwrap_or(1);
        if count < 1 {
            return Err(AllocError::Count {
                request: req.name.clone(),
                count,
            });
        }
        let class = classes
            .iter()
            .find(|c| c.name == ex.device_class_name)
            .ok_or_else(|| AllocError::NoClass {
                request: req.name.clone(),
                class: ex.device_class_name.clone(),
            })?;
        let mut terms: Vec<Vec<Term>> = Vec::new();
        for e in &class.selectors {
            terms.push(selector::parse(e)?);
        }
        for s in &ex.selectors {
            let cel = s
                .cel
                .as_ref()
                .ok_or_else(|| unsupported("a selector without cel"))?;
            terms.push(selector::parse(&cel.expression)?);
        }
        let mut wanted = BTreeMap::new();
        for (k, v) in ex.capacity.iter().flat_map(|c| &c.requests) {
            let n = quantity::parse(v).map_err(|source| AllocError::Quantity {
                request: req.name.clone(),
                source,
            })?;
            wanted.insert(k.as_str(), n);
        }
        let mut cands = Vec::new();
        'dev: for (i, c) in candidates.iter().enumerate() {
            if !terms.iter().all(|t| matches(c.driver, c.device, t)) {
                continue;
            }
            if c.device
                .taints
                .iter()
                .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            {
                continue;
            }
            if wanted.keys().any(|k| !c.capacity.contains_key(k)) {
                continue;
            }
            let mut consumed = BTreeMap::new();
            if c.device.allow_multiple_allocations {
                for (k, value) in &c.capacity {
                    let policy = c.device.capacity[*k].request_policy.as_ref();
                    match consumed_amount(*value, policy, wanted.get(k).copied()).map_err(
                        |source| AllocError::Quantity {
                            request: req.name.clone(),
                            source,
                        },
                    )? {
                        Some(a) if a <= *value => {
                            consumed.insert(k.to_string(), a);
                        }
                        _ => continue 'dev,
                    }
                }
            } else if wanted.iter().any(|(k, n)| *n > c.capacity[k]) {
                continue;
            }
            cands.push((i, consumed));
        }
        for _ in 0..count {
            slots.push(Slot {
                request: &req.name,
                candidates: cands.clone(),
            });
        }
    }
    for con in &claim.constraints {
        for r in &con.requests {
            if !claim.requests.iter().any(|q| &q.name == r) {
                return Err(AllocError::ConstraintRequest(r.clone()));
            }
        }
    }

    let mut search = Search {
        claim,
        candidates: &candidates,
        used: &used,
        slots: &slots,
        chosen: Vec::new(),
        extra: BTreeMap::new(),
        steps: 0,
    };
    if !search.dfs(0)? {
        let reason = match slots.iter().find(|s| s.candidates.is_empty()) {
            Some(s) => format!(
                "request {:?} matches no device with enough capacity",
                s.request
            ),
            None => "the free devices cannot satisfy all requests and constraints together".into(),
        };
        return Err(AllocError::Unsatisfiable(reason));
    }
    Ok(search
        .chosen
        .iter()
        .enumerate()
        .map(|(n, (slot, cand))| {
            let (i, consumed) = &slots[*slot].candidates[*cand];
            let c = &candidates[*i];
            let shared = c.device.allow_multiple_allocations;
            DeviceRequestAllocationResult {
                request: slots[*slot].request.to_string(),
                driver: c.key.0.clone(),
                pool: c.key.1.clone(),
                device: c.key.2.clone(),
                share_id: shared.then(|| share_id(share_seed, n)),
                consumed_capacity: consumed
                    .iter()
                    .map(|(k, v)| {
                        let text = if k == crate::slice::MEMORY {
                            quantity::format_bytes(*v)
                        } else {
                            quantity::format_count(*v)
                        };
                        (k.clone(), text)
                    })
                    .collect(),
                ..Default::default()
            }
        })
        .collect())
}

/// A UUID-shaped share id from the claim UID and the result's index (FNV-1a, 128 bits).
pub fn share_id(seed: &str, n: usize) -> String {
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for b in seed.bytes().chain((n as u64).to_le_bytes()) {
        h ^= u128::from(b);
        h = h.wrapping_mul(0x0000000001000000000000000000013B);
    }
    let x = format!("{h:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &x[0..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..32]
    )
}

const BUDGET: u64 = 200_000;

struct Search<'a, 'b> {
    claim: &'a DeviceClaim,
    candidates: &'b [Candidate<'a>],
    used: &'b BTreeMap<Key, DeviceUse>,
    slots: &'b [Slot<'a>],
    chosen: Vec<(usize, usize)>,
    /// What this claim's earlier slots took, per candidate.
    extra: BTreeMap<usize, DeviceUse>,
    steps: u64,
}

impl Search<'_, '_> {
    fn dfs(&mut self, slot: usize) -> Result<bool, AllocError> {
        if slot == self.slots.len() {
            return Ok(true);
        }
        for (ci, (i, consumed)) in self.slots[slot].candidates.iter().enumerate() {
            self.steps += 1;
            if self.steps > BUDGET {
                return Err(AllocError::Budget(BUDGET));
            }
            if !self.fits(*i, consumed) || !self.constraints_hold(slot, *i) {
                continue;
            }
            let e = self.extra.entry(*i).or_default();
            e.allocations += 1;
            for (k, v) in consumed {
                *e.consumed.entry(k.clone()).or_default() += v;
            }
            self.chosen.push((slot, ci));
            if self.dfs(slot + 1)? {
                return Ok(true);
            }
            self.chosen.pop();
            let e = self.extra.get_mut(i).expect("inserted above");
            e.allocations -= 1;
            for (k, v) in consumed {
                *e.consumed.get_mut(k).expect("inserted above") -= v;
            }
        }
        Ok(false)
    }

    fn fits(&self, i: usize, consumed: &BTreeMap<String, u64>) -> bool {
        let c = &self.candidates[i];
        let before = self.used.get(&c.key);
        let mine = self.extra.get(&i);
        let held = before.map_or(0, |u| u.allocations) + mine.map_or(0, |u| u.allocations);
        if !c.device.allow_multiple_allocations {
            return held == 0;
        }
        consumed.iter().all(|(k, v)| {
            let taken = before.and_then(|u| u.consumed.get(k)).copied().unwrap_or(0)
                + mine.and_then(|u| u.consumed.get(k)).copied().unwrap_or(0);
            taken.saturating_add(*v) <= c.capacity.get(k.as_str()).copied().unwrap_or(0)
        })
    }

    fn constraints_hold(&self, slot: usize, i: usize) -> bool {
        let me = &self.candidates[i];
        let request = self.slots[slot].request;
        for con in &self.claim.constraints {
            let covers = |r: &str| con.requests.is_empty() || con.requests.iter().any(|q| q == r);
            if !covers(request) {
                continue;
            }
            let others = self
                .chosen
                .iter()
                .filter(|(s, _)| covers(self.slots[*s].request))
                .map(|(s, c)| &self.candidates[self.slots[*s].candidates[*c].0]);
            if let Some(name) = &con.match_attribute {
                let Some(mine) = attribute(me.driver, me.device, name) else {
                    return false;
                };
                for o in others.clone() {
                    if attribute(o.driver, o.device, name) != Some(mine) {
                        return false;
                    }
                }
            }
            if let Some(name) = &con.distinct_attribute {
                let Some(mine) = attribute(me.driver, me.device, name) else {
                    return false;
                };
                for o in others {
                    if attribute(o.driver, o.device, name) == Some(mine) {
                        return false;
                    }
                }
            }
        }
        true
    }
}
