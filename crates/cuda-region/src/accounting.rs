//! The writer's operations on a region, as plain functions over [`SharedRegion`]. Callers
//! that change more than their own slot's counters hold the region lock (the file shell in
//! `region.rs` does); `alive(index)` says whether a slot's owner still runs.
//!
//! Differences from HAMi-core, all inside the compatible layout:
//! - **stable slots**: a slot never moves (no swap-compaction), so no process ever writes a
//!   stale index (HAMi-core #241); a freed slot is zeroed, then marked free, and reused;
//! - **reserve before allocate**: the bytes are added to the caller's slot under the lock
//!   *before* the real allocation, so concurrent allocations can never all pass (#273);
//! - dead slots are reclaimed whole (counters zeroed, seqlock made even again), so a writer
//!   killed mid-update never leaves readers spinning.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::layout::{MAX_DEVICES, MAX_PROCS, ProcSlot, STATUS_FREE, STATUS_RUNNING, SharedRegion};

/// An allocation that does not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The device index.
    pub device: usize,
    /// Bytes asked for.
    pub requested: u64,
    /// Bytes the container already uses on the device.
    pub used: u64,
    /// The device's limit in bytes.
    pub limit: u64,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "device {}: {} bytes requested, {} of {} bytes in use by this container",
            self.device, self.requested, self.used, self.limit
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// Why no process slot could be claimed.
pub enum SlotError {
    /// All 1,024 process slots hold live processes.
    Full,
}

impl std::fmt::Display for SlotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "all {MAX_PROCS} process slots of the region are taken by live processes; \
             run fewer GPU processes in this container"
        )
    }
}

/// Whether `bytes` more fit under `limit` with `used` already taken (0 = no limit).
pub fn fits(used: u64, bytes: u64, limit: u64) -> bool {
    limit == 0 || used.checked_add(bytes).is_some_and(|total| total <= limit)
}

fn proc_num(region: &SharedRegion) -> usize {
    (region.proc_num.load(Acquire).clamp(0, MAX_PROCS as i32)) as usize
}

/// Σ `used[device].total` over the occupied slots.
pub fn device_usage(region: &SharedRegion, device: usize) -> u64 {
    if device >= MAX_DEVICES {
        return 0;
    }
    region.procs[..proc_num(region)]
        .iter()
        .filter(|slot| slot.status.load(Acquire) != STATUS_FREE)
        .fold(0u64, |sum, slot| {
            sum.saturating_add(slot.used[device].total.load(Acquire))
        })
}

fn zero_slot(slot: &ProcSlot) {
    for used in &slot.used {
        used.context_size.store(0, Relaxed);
        used.module_size.store(0, Relaxed);
        used.data_size.store(0, Relaxed);
        used.offset.store(0, Relaxed);
        used.total.store(0, Relaxed);
    }
    for (monitor, util) in slot.monitorused.iter().zip(&slot.device_util) {
        monitor.store(0, Relaxed);
        util.sm_util.store(0, Relaxed);
        util.dec_util.store(0, Relaxed);
        util.enc_util.store(0, Relaxed);
    }
    slot.hostpid.store(0, Relaxed);
    slot.start_time.store(0, Relaxed);
    // Even again, whatever a dead writer left.
    let seq = slot.seqlock.load(Relaxed);
    slot.seqlock.store(seq.wrapping_add(seq & 1), Release);
}

/// Frees slot `index`: counters to zero first, then `status`/`pid`, so a reader never sums
/// a free slot's stale bytes. Lock held.
pub fn free_slot(region: &SharedRegion, index: usize) {
    let slot = &region.procs[index];
    zero_slot(slot);
    slot.status.store(STATUS_FREE, Release);
    slot.pid.store(0, Release);
}

/// Frees every occupied slot whose owner is gone. Lock held. Returns how many.
pub fn reclaim_dead(region: &SharedRegion, alive: &dyn Fn(usize) -> bool) -> usize {
    let mut freed = 0;
    for index in 0..proc_num(region) {
        if region.procs[index].status.load(Acquire) != STATUS_FREE && !alive(index) {
            free_slot(region, index);
            freed += 1;
        }
    }
    freed
}

/// Claims a slot for `pid`: the lowest free slot below `proc_num`, else the next one. Dead
/// slots are reclaimed first. Lock held.
pub fn claim_slot(
    region: &SharedRegion,
    pid: i32,
    start_time: u64,
    alive: &dyn Fn(usize) -> bool,
) -> Result<usize, SlotError> {
    reclaim_dead(region, alive);
    let count = proc_num(region);
    let index = match (0..count).find(|i| region.procs[*i].status.load(Acquire) == STATUS_FREE) {
        Some(index) => index,
        None if count < MAX_PROCS => {
            region.proc_num.store(count as i32 + 1, Release);
            count
        }
        None => return Err(SlotError::Full),
    };
    let slot = &region.procs[index];
    zero_slot(slot);
    slot.generation.fetch_add(1, Relaxed);
    slot.start_time.store(start_time, Relaxed);
    slot.pid.store(pid, Relaxed);
    slot.status.store(STATUS_RUNNING, Release);
    Ok(index)
}

/// Adds (or, with `add` false, takes) `bytes` to the data counter of `device` in `slot`,
/// inside the seqlock HAMi-core readers expect. The caller excludes other writers of this
/// slot, so plain loads and stores suffice (no locked instruction on the hot path); another
/// process only ever writes a slot whose owner is dead (reclaim) or free (claim).
fn update_data(slot: &ProcSlot, device: usize, bytes: u64, add: bool) -> u64 {
    let seq = slot.seqlock.load(Relaxed);
    slot.seqlock.store(seq.wrapping_add(1), Relaxed);
    // Readers that see the new counters also see the odd seqlock.
    std::sync::atomic::fence(Release);
    let used = &slot.used[device];
    let before = used.data_size.load(Relaxed);
    let moved = if add { bytes } else { before.min(bytes) };
    let step = |value: u64| {
        if add {
            value.saturating_add(moved)
        } else {
            value.saturating_sub(moved)
        }
    };
    used.data_size.store(step(before), Relaxed);
    used.total.store(step(used.total.load(Relaxed)), Relaxed);
    slot.seqlock.store(seq.wrapping_add(2), Release);
    // What was actually moved (a release never takes more than the slot holds).
    moved
}

/// The limit in force (0 = none): the region's stored `limit`, never above `ceiling` — the
/// limit of the device plugin's read-only config where one exists (0 where none does). Every
/// process of the container can write the region, so its value may lower the limit but
/// never raise it (issue 26 item 3). The same rule serves the SM limit in percent.
pub fn limit_in_force(limit: u64, ceiling: u64) -> u64 {
    match (limit, ceiling) {
        (0, c) => c,
        (l, 0) => l,
        (l, c) => l.min(c),
    }
}

/// Reserves `bytes` of `device` for slot `index` if the container's usage plus `bytes` stays
/// within the device's limit in force ([`limit_in_force`] of the stored one and `ceiling`).
/// Lock held (this is what makes concurrent reservations safe).
pub fn reserve(
    region: &SharedRegion,
    index: usize,
    device: usize,
    bytes: u64,
    ceiling: u64,
) -> Result<(), Refusal> {
    let stored = region.limit.get(device).map_or(0, |l| l.load(Acquire));
    let limit = limit_in_force(stored, ceiling);
    let used = device_usage(region, device);
    if device >= MAX_DEVICES || !fits(used, bytes, limit) {
        return Err(Refusal {
            device,
            requested: bytes,
            used,
            limit,
        });
    }
    update_data(&region.procs[index], device, bytes, true);
    Ok(())
}

/// Returns `bytes` of `device` from slot `index`; returns what was actually returned. Needs
/// no region lock (usage only goes down), only exclusion of other writers of this slot.
pub fn release(region: &SharedRegion, index: usize, device: usize, bytes: u64) -> u64 {
    if device >= MAX_DEVICES {
        return 0;
    }
    update_data(&region.procs[index], device, bytes, false)
}

/// Whether the holder named by lock word `word` is gone, by [`crate::takeover::stale`] over
/// what its slot shows: a slot index out of range, a free slot, another generation (the slot
/// was reclaimed and claimed again), an owner that no longer holds its liveness lock, or —
/// for the waiter's own slot — a previous owner's generation (issue 26 item 12).
pub fn holder_gone(
    region: &SharedRegion,
    word: u64,
    waiter: crate::takeover::Waiter,
    alive: &dyn Fn(usize) -> bool,
) -> bool {
    crate::takeover::stale(word, waiter, |index| {
        let slot = region.procs.get(index)?;
        let free = slot.status.load(Acquire) == STATUS_FREE;
        Some(crate::takeover::HolderSlot {
            free,
            generation: slot.generation.load(Acquire),
            alive: !free && alive(index),
        })
    })
}

/// Initialises a zeroed (or foreign-magic-free) region: versions, limits, switches, then the
/// magic last with release order. Init lock held.
pub fn initialize(
    region: &SharedRegion,
    limits: &[u64; MAX_DEVICES],
    sm_limits: &[u64; MAX_DEVICES],
    priority: i32,
) {
    region
        .major_version
        .store(crate::layout::MAJOR_VERSION, Relaxed);
    region
        .minor_version
        .store(crate::layout::MINOR_VERSION, Relaxed);
    for device in 0..MAX_DEVICES {
        region.limit[device].store(limits[device], Relaxed);
        region.sm_limit[device].store(sm_limits[device], Relaxed);
    }
    region.sm_init_flag.store(0, Relaxed);
    region.owner_pid.store(0, Relaxed);
    region.utilization_switch.store(1, Relaxed);
    region.recent_kernel.store(2, Relaxed);
    region.proc_num.store(0, Relaxed);
    region.priority.store(priority, Relaxed);
    // SAFETY: the semaphores are in memory we own exclusively during initialisation (init
    // lock held, magic not yet set); pshared = 1 because the region is a shared mapping.
    unsafe {
        libc::sem_init(region.sem.get(), 1, 1);
        libc::sem_init(region.sem_postinit.get(), 1, 1);
    }
    region.initialized_flag.store(crate::layout::MAGIC, Release);
}

/// Writes the device count and NVML UUIDs (truncated to 95 bytes, NUL-terminated).
pub fn set_devices(region: &SharedRegion, uuids: &[String]) {
    let count = uuids.len().min(MAX_DEVICES);
    for (device, uuid) in uuids.iter().take(count).enumerate() {
        let bytes = uuid.as_bytes();
        for (at, cell) in region.uuids[device].iter().enumerate() {
            let byte = if at + 1 < crate::layout::UUID_LEN {
                bytes.get(at).copied().unwrap_or(0)
            } else {
                0
            };
            cell.store(byte, Relaxed);
        }
    }
    region.device_num.store(count as u64, Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(first: u64) -> [u64; MAX_DEVICES] {
        let mut l = [0; MAX_DEVICES];
        l[0] = first;
        l
    }

    #[test]
    fn reserve_respects_the_limit_to_the_byte() {
        let region = SharedRegion::boxed_zeroed();
        initialize(&region, &limits(1000), &[100; MAX_DEVICES], 1);
        let a = claim_slot(&region, 10, 1, &|_| true).unwrap();
        let b = claim_slot(&region, 11, 1, &|_| true).unwrap();
        assert_eq!((a, b), (0, 1));
        reserve(&region, a, 0, 600, 0).unwrap();
        let refusal = reserve(&region, b, 0, 401, 0).unwrap_err();
        assert_eq!((refusal.used, refusal.limit), (600, 1000));
        reserve(&region, b, 0, 400, 0).unwrap();
        assert_eq!(device_usage(&region, 0), 1000);
        assert_eq!(
            release(&region, a, 0, 700),
            600,
            "never more than the slot holds"
        );
        assert_eq!(device_usage(&region, 0), 400);
        // Device 1 has no limit.
        reserve(&region, a, 1, u64::MAX / 2, 0).unwrap();
        assert!(reserve(&region, a, MAX_DEVICES, 1, 0).is_err());
    }

    #[test]
    fn the_region_can_lower_the_configured_limit_but_never_raise_it() {
        let region = SharedRegion::boxed_zeroed();
        // A tenant wrote "no limit" (0) over the creator's 1000 bytes.
        initialize(&region, &limits(0), &[100; MAX_DEVICES], 1);
        let a = claim_slot(&region, 10, 1, &|_| true).unwrap();
        assert!(
            reserve(&region, a, 0, 1001, 1000).is_err(),
            "the config's 1000 hold"
        );
        reserve(&region, a, 0, 1000, 1000).unwrap();
        region.limit[0].store(5000, Relaxed);
        assert!(reserve(&region, a, 0, 1, 1000).is_err(), "raised: ignored");
        region.limit[0].store(500, Relaxed);
        release(&region, a, 0, 1000);
        assert!(
            reserve(&region, a, 0, 501, 1000).is_err(),
            "lowered: in force"
        );
        assert_eq!(limit_in_force(0, 0), 0);
        assert_eq!(limit_in_force(700, 0), 700, "no config: the region's");
        assert_eq!(limit_in_force(0, 700), 700);
        assert_eq!(limit_in_force(900, 700), 700);
        assert_eq!(limit_in_force(300, 700), 300);
    }

    #[test]
    fn slots_are_stable_and_dead_ones_are_reused_clean() {
        let region = SharedRegion::boxed_zeroed();
        initialize(&region, &limits(100), &[100; MAX_DEVICES], 1);
        let dead = std::cell::Cell::new(usize::MAX);
        let alive = |i: usize| i != dead.get();
        let s: Vec<usize> = (0..3)
            .map(|p| claim_slot(&region, p, 0, &alive).unwrap())
            .collect();
        reserve(&region, s[1], 0, 60, 0).unwrap();
        region.procs[s[1]].seqlock.store(7, Relaxed); // killed mid-update
        dead.set(1);
        assert!(
            reserve(&region, s[2], 0, 50, 0).is_err(),
            "dead bytes count until reclaimed"
        );
        assert_eq!(reclaim_dead(&region, &alive), 1);
        assert_eq!(region.procs[1].seqlock.load(Relaxed) % 2, 0);
        dead.set(usize::MAX);
        reserve(&region, s[2], 0, 50, 0).unwrap();
        // Slot 2 did not move; the newcomer takes the hole.
        assert_eq!(claim_slot(&region, 9, 0, &alive).unwrap(), 1);
        assert_eq!(region.proc_num.load(Relaxed), 3);
        assert_eq!(region.procs[2].used[0].total.load(Relaxed), 50);
    }

    #[test]
    fn only_a_gone_holder_loses_the_lock_word() {
        use crate::layout::lock_word;
        use crate::takeover::Waiter;
        let region = SharedRegion::boxed_zeroed();
        initialize(&region, &limits(100), &[100; MAX_DEVICES], 1);
        let a = claim_slot(&region, 10, 0, &|_| true).unwrap();
        let b = claim_slot(&region, 11, 0, &|_| true).unwrap();
        let gen_a = region.procs[a].generation.load(Relaxed);
        let gen_b = region.procs[b].generation.load(Relaxed);
        let waiter = |slot: usize, generation: u64| Waiter {
            own_word: lock_word(slot, generation),
            threads_may_hold: true,
        };
        let word = lock_word(a, gen_a);
        assert!(
            !holder_gone(&region, word, waiter(b, gen_b), &|_| true),
            "a live holder keeps it"
        );
        assert!(
            !holder_gone(&region, word, waiter(a, gen_a), &|_| false),
            "our own thread holds it"
        );
        assert!(
            holder_gone(&region, word, waiter(b, gen_b), &|i| i != a),
            "its liveness lock is gone"
        );
        assert!(holder_gone(
            &region,
            lock_word(a, gen_a + 1),
            waiter(b, gen_b),
            &|_| true
        ));
        // The slot is reclaimed and claimed again by a live process: the old word is stale,
        // for others and for the new owner of the slot itself (issue 26 item 12).
        free_slot(&region, a);
        assert!(holder_gone(&region, word, waiter(b, gen_b), &|_| true));
        assert_eq!(claim_slot(&region, 12, 0, &|_| true).unwrap(), a);
        assert!(holder_gone(&region, word, waiter(b, gen_b), &|_| true));
        let new_gen = region.procs[a].generation.load(Relaxed);
        assert_ne!(new_gen, gen_a);
        assert!(holder_gone(&region, word, waiter(a, new_gen), &|_| true));
        // A HAMi-core pid or any other foreign value names no live holder.
        assert!(holder_gone(&region, 4_000_000, waiter(b, gen_b), &|_| true));
        assert!(holder_gone(&region, 1 << 40, waiter(b, gen_b), &|_| true));
        assert!(!holder_gone(&region, 0, waiter(b, gen_b), &|_| false));
    }

    #[test]
    fn a_full_region_says_so() {
        let region = SharedRegion::boxed_zeroed();
        initialize(&region, &limits(0), &[100; MAX_DEVICES], 1);
        for pid in 0..MAX_PROCS {
            claim_slot(&region, pid as i32 + 1, 0, &|_| true).unwrap();
        }
        let err = claim_slot(&region, 5000, 0, &|_| true).unwrap_err();
        assert!(err.to_string().contains("1024"));
        assert_eq!(claim_slot(&region, 5000, 0, &|i| i != 77).unwrap(), 77);
    }

    #[test]
    fn uuids_are_nul_terminated_and_bounded() {
        let region = SharedRegion::boxed_zeroed();
        set_devices(&region, &["GPU-abc".into(), "x".repeat(200)]);
        assert_eq!(region.uuid(0), "GPU-abc");
        assert_eq!(region.uuid(1).len(), 95);
        assert_eq!(region.device_num.load(Relaxed), 2);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Claim,
        Reserve(usize, u64),
        Release(usize, u64),
        Kill(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Claim),
            (0..8usize, 0..400u64).prop_map(|(s, b)| Op::Reserve(s, b)),
            (0..8usize, 0..400u64).prop_map(|(s, b)| Op::Release(s, b)),
            (0..8usize).prop_map(Op::Kill),
        ]
    }

    proptest! {
        /// Whatever processes do (and however they die), the live usage never exceeds the
        /// limit and always equals what the live slots were granted minus what they returned.
        #[test]
        fn usage_never_exceeds_the_limit(limit in 1..2000u64, ops in proptest::collection::vec(op(), 1..80)) {
            let region = SharedRegion::boxed_zeroed();
            initialize(&region, &limits(limit), &[100; MAX_DEVICES], 1);
            let dead = std::cell::RefCell::new(std::collections::HashSet::new());
            let alive = |i: usize| !dead.borrow().contains(&i);
            let mut held: std::collections::HashMap<usize, u64> = Default::default();
            for op in ops {
                match op {
                    Op::Claim => if let Ok(i) = claim_slot(&region, 1, 0, &alive) {
                        dead.borrow_mut().remove(&i);
                        held.insert(i, 0);
                        for d in dead.borrow().iter() { held.remove(d); }
                    },
                    Op::Reserve(s, b) => if let Some(h) = held.get_mut(&s)
                        && !dead.borrow().contains(&s) && reserve(&region, s, 0, b, 0).is_ok() { *h += b; },
                    Op::Release(s, b) => if let Some(h) = held.get_mut(&s)
                        && !dead.borrow().contains(&s) { *h -= release(&region, s, 0, b); },
                    Op::Kill(s) => { dead.borrow_mut().insert(s); }
                }
                let usage = device_usage(&region, 0);
                prop_assert!(usage <= limit);
                let expect: u64 = held.iter().filter(|(i, _)| region.procs[**i].status.load(Relaxed) != 0).map(|(_, b)| *b).sum();
                prop_assert_eq!(usage, expect);
            }
        }

        #[test]
        fn fits_matches_arithmetic(used in any::<u64>(), bytes in any::<u64>(), limit in any::<u64>()) {
            let expected = limit == 0 || (used as u128 + bytes as u128) <= limit as u128;
            prop_assert_eq!(fits(used, bytes, limit), expected);
        }
    }
}
