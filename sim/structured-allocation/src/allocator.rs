//! A model of kube-scheduler's structured-parameters allocator for what this driver uses
//! (the simulated kube-scheduler and the planner call it; the real scheduler runs upstream's):
//! `exactly` requests and `firstAvailable` sub-requests with `ExactCount`, selectors (the
//! classes' and the request's, in the CEL subset of [`crate::selector`]: attribute equality
//! and `in`, capacity `compareTo(quantity(…))`, `!(…)`), consumable capacity with request
//! policies (default, `validValues`, `validRange` rounded up to `min + n·step`), exclusive vs
//! `allowMultipleAllocations` devices, `matchAttribute` and `distinctAttribute` constraints,
//! devices with `NoSchedule`/`NoExecute` taints skipped, only complete pools at their newest
//! generation, depth-first search with backtracking in slice/device order.
//!
//! `firstAvailable` as upstream: a request's sub-requests are tried in order and the first
//! one with which the whole claim (later requests and constraints included) can be allocated
//! is taken; a failure later in the claim backtracks into the next sub-request. Results name
//! `<request>/<sub>`; a constraint naming `<request>` covers whichever sub-request was chosen,
//! one naming `<request>/<sub>` only that one. At most [`FIRST_AVAILABLE_MAX`] sub-requests.
//!
//! A selector's runtime error (a lookup of an attribute or capacity the device lacks) aborts
//! the claim's allocation on this node when the search reaches that device, as upstream's
//! lazy evaluation does: not when an earlier device or sub-request already satisfied the
//! claim, nor for an exclusive device in use (upstream skips those before the selectors).
//!
//! Not modelled, refused with an error naming it: `allocationMode: All`, `adminAccess`,
//! tolerations, CEL beyond [`crate::selector`]'s subset, counters (`consumesCounters`),
//! opaque config, upstream's node scoring by the chosen sub-request's rank (the simulated
//! kube-scheduler orders nodes by its own policy).
//! Like upstream (KEP-5075), one multi-allocatable device may serve several requests or
//! several devices of one request of the same claim, each with its own share; ask for
//! `distinctAttribute` to spread.

use std::collections::BTreeMap;

use crate::selector::{self, Term};
use hami_dra_core::api::{
    CapacityRequestPolicy, Device, DeviceAttribute, DeviceClaim, DeviceRequestAllocationResult,
    ExactDeviceRequest, FIRST_AVAILABLE_MAX, ResourceSlice,
};
use hami_dra_core::quantity;

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
    /// A selector failed on a device (CEL runtime error): upstream aborts the allocation.
    #[error(
        "request {request:?}: selector {expression:?} on device {device:?}: CEL runtime error: {problem}"
    )]
    Runtime {
        /// The request (`<request>/<sub>` for a sub-request).
        request: String,
        /// The selector.
        expression: String,
        /// The device (`<pool>/<device>`).
        device: String,
        /// What failed.
        problem: String,
    },
    /// The request is not valid (upstream's API validation would refuse it).
    #[error("request {request:?}: {problem}")]
    Invalid {
        /// The request.
        request: String,
        /// What is wrong.
        problem: String,
    },
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

/// One way to satisfy a request: its `exactly`, or one of its sub-requests.
struct Alt<'a> {
    /// What the results name: `<request>` or `<request>/<sub>`.
    result_name: String,
    /// The sub-request's name.
    sub: Option<&'a str>,
    /// Devices it needs.
    count: usize,
    /// Matching devices, in device order.
    candidates: Vec<Pick>,
}

/// A device an alternative may take.
struct Pick {
    /// Index into the candidates.
    device: usize,
    /// What it would consume.
    consumed: BTreeMap<String, u64>,
    /// A selector's runtime error on this device: the search aborts with it when it reaches
    /// the device, as upstream's lazy evaluation does (not when it never gets there).
    error: Option<Box<AllocError>>,
}

/// A top-level request and its alternatives, tried in order.
struct Group<'a> {
    request: &'a str,
    alts: Vec<Alt<'a>>,
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

    let mut groups = Vec::new();
    for req in &claim.requests {
        let invalid = |problem: String| AllocError::Invalid {
            request: req.name.clone(),
            problem,
        };
        let alts = match (&req.exactly, req.first_available.as_slice()) {
            (Some(_), [_, ..]) => {
                return Err(invalid("sets both `exactly` and `firstAvailable`".into()));
            }
            (None, []) => {
                return Err(invalid(
                    "sets neither `exactly` nor `firstAvailable`".into(),
                ));
            }
            (Some(ex), []) => vec![alternative(
                req.name.clone(),
                None,
                ex,
                classes,
                &candidates,
            )?],
            (None, subs) => {
                if subs.len() > FIRST_AVAILABLE_MAX {
                    return Err(invalid(format!(
                        "firstAvailable has {} sub-requests; at most {FIRST_AVAILABLE_MAX}",
                        subs.len()
                    )));
                }
                let mut alts = Vec::with_capacity(subs.len());
                for (i, sub) in subs.iter().enumerate() {
                    if sub.name.is_empty() || sub.name.contains('/') {
                        return Err(invalid(format!(
                            "sub-request name {:?} is not a DNS label",
                            sub.name
                        )));
                    }
                    if subs[..i].iter().any(|o| o.name == sub.name) {
                        return Err(invalid(format!(
                            "sub-request name {:?} appears twice",
                            sub.name
                        )));
                    }
                    alts.push(alternative(
                        format!("{}/{}", req.name, sub.name),
                        Some(&sub.name),
                        &sub.as_exact(),
                        classes,
                        &candidates,
                    )?);
                }
                alts
            }
        };
        groups.push(Group {
            request: &req.name,
            alts,
        });
    }
    for con in &claim.constraints {
        for r in &con.requests {
            let known = match r.split_once('/') {
                None => claim.requests.iter().any(|q| &q.name == r),
                Some((parent, sub)) => claim
                    .requests
                    .iter()
                    .any(|q| q.name == parent && q.first_available.iter().any(|s| s.name == sub)),
            };
            if !known {
                return Err(AllocError::ConstraintRequest(r.clone()));
            }
        }
    }

    let mut search = Search {
        claim,
        candidates: &candidates,
        used: &used,
        groups: &groups,
        chosen: Vec::new(),
        extra: BTreeMap::new(),
        steps: 0,
    };
    if !search.request(0)? {
        let reason = match groups.iter().find(|g| {
            g.alts
                .iter()
                .all(|a| a.candidates.iter().all(|p| p.error.is_some()))
        }) {
            Some(g) if g.alts.len() > 1 => format!(
                "none of request {:?}'s {} sub-requests matches a device with enough capacity",
                g.request,
                g.alts.len()
            ),
            Some(g) => format!(
                "request {:?} matches no device with enough capacity",
                g.request
            ),
            None => "the free devices cannot satisfy all requests and constraints together".into(),
        };
        return Err(AllocError::Unsatisfiable(reason));
    }
    Ok(search
        .chosen
        .iter()
        .enumerate()
        .map(|(n, &(g, a, cand))| {
            let alt = &groups[g].alts[a];
            let Pick {
                device: i,
                consumed,
                ..
            } = &alt.candidates[cand];
            let c = &candidates[*i];
            let shared = c.device.allow_multiple_allocations;
            DeviceRequestAllocationResult {
                request: alt.result_name.clone(),
                driver: c.key.0.clone(),
                pool: c.key.1.clone(),
                device: c.key.2.clone(),
                share_id: shared.then(|| share_id(share_seed, n)),
                consumed_capacity: consumed
                    .iter()
                    .map(|(k, v)| {
                        let text = if k == hami_dra_core::slice::MEMORY {
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

/// Reads one `exactly` request or sub-request (`name` is what results and errors call it)
/// and finds the devices it matches, with what each would consume.
fn alternative<'a>(
    name: String,
    sub: Option<&'a str>,
    ex: &ExactDeviceRequest,
    classes: &[DeviceClass],
    candidates: &[Candidate],
) -> Result<Alt<'a>, AllocError> {
    let unsupported = |what: &str| AllocError::Unsupported {
        request: name.clone(),
        what: what.into(),
    };
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
            request: name.clone(),
            count,
        });
    }
    let class = classes
        .iter()
        .find(|c| c.name == ex.device_class_name)
        .ok_or_else(|| AllocError::NoClass {
            request: name.clone(),
            class: ex.device_class_name.clone(),
        })?;
    // Class selectors first, then the request's, each expression in order: the first false
    // one rejects the device, as upstream (an error past it is never reached).
    let mut selectors: Vec<(&str, Vec<Term>)> = Vec::new();
    for e in &class.selectors {
        selectors.push((e, selector::parse(e)?));
    }
    for s in &ex.selectors {
        let cel = s
            .cel
            .as_ref()
            .ok_or_else(|| unsupported("a selector without cel"))?;
        selectors.push((&cel.expression, selector::parse(&cel.expression)?));
    }
    let mut wanted = BTreeMap::new();
    for (k, v) in ex.capacity.iter().flat_map(|c| &c.requests) {
        let n = quantity::parse(v).map_err(|source| AllocError::Quantity {
            request: name.clone(),
            source,
        })?;
        wanted.insert(k.as_str(), n);
    }
    let mut cands = Vec::new();
    'dev: for (i, c) in candidates.iter().enumerate() {
        for (expression, terms) in &selectors {
            match selector::eval(c.driver, c.device, terms) {
                Ok(true) => {}
                Ok(false) => continue 'dev,
                Err(problem) => {
                    cands.push(Pick {
                        device: i,
                        consumed: BTreeMap::new(),
                        error: Some(Box::new(AllocError::Runtime {
                            request: name.clone(),
                            expression: expression.to_string(),
                            device: format!("{}/{}", c.key.1, c.key.2),
                            problem,
                        })),
                    });
                    continue 'dev;
                }
            }
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
                match consumed_amount(*value, policy, wanted.get(k).copied()).map_err(|source| {
                    AllocError::Quantity {
                        request: name.clone(),
                        source,
                    }
                })? {
                    Some(a) if a <= *value => {
                        consumed.insert(k.to_string(), a);
                    }
                    _ => continue 'dev,
                }
            }
        } else if wanted.iter().any(|(k, n)| *n > c.capacity[k]) {
            continue;
        }
        cands.push(Pick {
            device: i,
            consumed,
            error: None,
        });
    }
    Ok(Alt {
        result_name: name,
        sub,
        count: count as usize,
        candidates: cands,
    })
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
    groups: &'b [Group<'a>],
    /// (group, alternative, candidate index within the alternative) per device taken.
    chosen: Vec<(usize, usize, usize)>,
    /// What this claim's earlier picks took, per candidate.
    extra: BTreeMap<usize, DeviceUse>,
    steps: u64,
}

impl Search<'_, '_> {
    /// Satisfies request `g` and all after it: its alternatives in order, each backtracked
    /// into when the rest of the claim fails with it.
    fn request(&mut self, g: usize) -> Result<bool, AllocError> {
        if g == self.groups.len() {
            return Ok(true);
        }
        for a in 0..self.groups[g].alts.len() {
            if self.device(g, a, 0)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Picks device `k` of alternative `a` of request `g`, then the rest of the claim.
    fn device(&mut self, g: usize, a: usize, k: usize) -> Result<bool, AllocError> {
        let groups = self.groups;
        let alt = &groups[g].alts[a];
        if k == alt.count {
            return self.request(g + 1);
        }
        for (ci, pick) in alt.candidates.iter().enumerate() {
            let (i, consumed) = (&pick.device, &pick.consumed);
            self.steps += 1;
            if self.steps > BUDGET {
                return Err(AllocError::Budget(BUDGET));
            }
            if let Some(e) = &pick.error {
                // Upstream skips an exclusive device in use before evaluating selectors.
                if !self.candidates[*i].device.allow_multiple_allocations
                    && !self.fits(*i, consumed)
                {
                    continue;
                }
                return Err((**e).clone());
            }
            if !self.fits(*i, consumed) || !self.constraints_hold(g, a, *i) {
                continue;
            }
            let e = self.extra.entry(*i).or_default();
            e.allocations += 1;
            for (k, v) in consumed {
                *e.consumed.entry(k.clone()).or_default() += v;
            }
            self.chosen.push((g, a, ci));
            if self.device(g, a, k + 1)? {
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

    fn constraints_hold(&self, g: usize, a: usize, i: usize) -> bool {
        let me = &self.candidates[i];
        let groups = self.groups;
        // Upstream's rule: `<request>` covers any of its sub-requests, `<request>/<sub>` only
        // that one.
        let covers = |con: &hami_dra_core::api::DeviceConstraint, g: usize, a: usize| {
            let alt = &groups[g].alts[a];
            con.requests.is_empty()
                || con
                    .requests
                    .iter()
                    .any(|q| q == groups[g].request || (alt.sub.is_some() && *q == alt.result_name))
        };
        for con in &self.claim.constraints {
            if !covers(con, g, a) {
                continue;
            }
            let others = self
                .chosen
                .iter()
                .filter(|(og, oa, _)| covers(con, *og, *oa))
                .map(|(og, oa, c)| &self.candidates[groups[*og].alts[*oa].candidates[*c].device]);
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
