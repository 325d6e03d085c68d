//! The accounting operations of an attached session: the per-device lock (taken over from
//! a dead holder), reserve and release against the limit, usage views, and the reclaim of
//! dead processes' bytes.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::accounting;
use crate::layout::{
    DeviceAccount, MAX_DEVICES, MAX_PROCS, ProcSlot, SLOT_ACTIVE, SLOT_FREE, lock_holder,
    slot_offset,
};
use hami_kernel_locks::file_lock::{flock_exclusive, flock_unlock, record_locked_elsewhere};

use super::*;

/// Holds a device's accounting lock; released on drop.
pub struct DeviceLock<'a> {
    account: &'a DeviceAccount,
    word: u64,
}

impl Drop for DeviceLock<'_> {
    fn drop(&mut self) {
        // Only the holder stores 0; a stealer would have replaced our word first.
        let _ = self
            .account
            .lock
            .compare_exchange(self.word, 0, Release, Relaxed);
    }
}

impl Session {
    pub(super) fn slot_alive(&self, index: usize) -> bool {
        // A failing probe counts as alive: never take bytes or locks away on doubt.
        record_locked_elsewhere(&self.probe, slot_offset(index)).unwrap_or(true)
    }

    /// Takes device `device`'s accounting lock. If its holder died (its slot's record lock
    /// is gone, or the slot was freed or claimed again since, also by this process), the
    /// lock is taken over and the device total rebuilt from the slots, so a holder killed
    /// mid-update neither blocks nor skews anyone.
    pub fn lock_device(&self, device: usize) -> Option<DeviceLock<'_>> {
        let account = self.layout().devices.get(device)?;
        let mut attempts: u32 = 0;
        loop {
            match account
                .lock
                .compare_exchange_weak(0, self.word, Acquire, Relaxed)
            {
                Ok(_) => {
                    return Some(DeviceLock {
                        account,
                        word: self.word,
                    });
                }
                Err(holder_word) => {
                    attempts = attempts.wrapping_add(1);
                    if holder_word != 0
                        && attempts.is_multiple_of(64)
                        && self.holder_gone(holder_word)
                        && account
                            .lock
                            .compare_exchange(holder_word, self.word, Acquire, Relaxed)
                            .is_ok()
                    {
                        self.rebuild_total(device);
                        return Some(DeviceLock {
                            account,
                            word: self.word,
                        });
                    }
                    hami_kernel_locks::lock_backoff::wait(attempts, 16);
                }
            }
        }
    }

    /// Whether the holder `word` names is gone ([`crate::takeover::stale`] over its slot).
    pub(super) fn holder_gone(&self, word: u64) -> bool {
        crate::takeover::stale(word, self.word, |index| {
            let slot = self.layout().slots.get(index)?;
            let free = slot.status.load(Acquire) != SLOT_ACTIVE;
            Some(crate::takeover::HolderSlot {
                free,
                generation: slot.generation.load(Acquire),
                alive: !free && self.slot_alive(index),
            })
        })
    }

    /// Caller holds `device`'s lock.
    pub(super) fn rebuild_total(&self, device: usize) {
        let layout = self.layout();
        let high = layout.header.slot_high_water.load(Relaxed) as usize;
        let total = accounting::sum_of_slots(
            layout.slots[..high.min(MAX_PROCS)]
                .iter()
                .map(|slot| slot.used[device].load(Relaxed)),
        );
        layout.devices[device].used.store(total, Relaxed);
    }

    pub(super) fn own_slot(&self) -> &ProcSlot {
        &self.layout().slots[self.slot]
    }

    pub(super) fn reserve_once(&self, device: usize, size: u64) -> Result<(), ReserveError> {
        let guard = self
            .lock_device(device)
            .ok_or(ReserveError::NoSuchDevice(device))?;
        let account = guard.account;
        let used = account.used.load(Relaxed);
        let limit = accounting::limit_in_force(account.limit.load(Relaxed), self.ceiling[device]);
        let total = accounting::reserve(used, limit, size)
            .map_err(|over| ReserveError::OverLimit { device, over })?;
        account.used.store(total, Relaxed);
        account.peak.fetch_max(total, Relaxed);
        let mine = &self.own_slot().used[device];
        mine.store(mine.load(Relaxed).saturating_add(size), Relaxed);
        Ok(())
    }

    /// Reserves `size` bytes on `device` before the real allocation. Over the limit, dead
    /// processes are reclaimed once and the reservation retried.
    pub fn reserve(&self, device: usize, size: u64) -> Result<(), ReserveError> {
        match self.reserve_once(device, size) {
            Err(ReserveError::OverLimit { .. }) if self.reclaim_dead().slots > 0 => {
                self.reserve_once(device, size)
            }
            other => other,
        }
    }

    /// Returns up to `size` bytes this process holds on `device` (after a free, or a failed
    /// allocation). Returns the bytes actually returned.
    pub fn release(&self, device: usize, size: u64) -> u64 {
        let Some(guard) = self.lock_device(device) else {
            return 0;
        };
        let mine = &self.own_slot().used[device];
        let taken = accounting::releasable(mine.load(Relaxed), size);
        mine.store(mine.load(Relaxed) - taken, Relaxed);
        let account = guard.account;
        account
            .used
            .store(account.used.load(Relaxed).saturating_sub(taken), Relaxed);
        taken
    }

    /// Bytes this process holds on `device`.
    pub fn own_used(&self, device: usize) -> u64 {
        self.layout()
            .slots
            .get(self.slot)
            .and_then(|slot| slot.used.get(device))
            .map_or(0, |used| used.load(Relaxed))
    }

    /// The device's usage, limit in force (the stored one, capped by
    /// [`Session::cap_limits`]) and peak (no lock: a consistent-enough read for reporting).
    pub fn device_usage(&self, device: usize) -> Option<DeviceUsage> {
        let account = self.layout().devices.get(device)?;
        Some(DeviceUsage {
            used: account.used.load(Relaxed),
            limit: accounting::limit_in_force(account.limit.load(Relaxed), self.ceiling[device]),
            peak: account.peak.load(Relaxed),
        })
    }

    /// Changes `device`'s limit in force (an operator's or monitor's action; HAMi's monitor
    /// does the same). Bytes already reserved stay reserved: usage may then sit above the
    /// limit, which `ACTIVE_OOM_KILLER` acts on.
    pub fn set_limit(&self, device: usize, bytes: u64) -> Result<(), ReserveError> {
        let guard = self
            .lock_device(device)
            .ok_or(ReserveError::NoSuchDevice(device))?;
        guard.account.limit.store(bytes, Relaxed);
        Ok(())
    }

    /// Frees the slots of processes that died without detaching and returns their bytes.
    pub fn reclaim_dead(&self) -> Reclaimed {
        let _threads = self
            .reclaim_mutex
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if flock_exclusive(&self.probe).is_err() {
            return Reclaimed::default();
        }
        let reclaimed = self.reclaim_dead_locked();
        let _ = flock_unlock(&self.probe);
        reclaimed
    }

    /// Caller holds the region's flock (through either file).
    pub(super) fn reclaim_dead_locked(&self) -> Reclaimed {
        let layout = self.layout();
        let high = (layout.header.slot_high_water.load(Relaxed) as usize).min(MAX_PROCS);
        let mut reclaimed = Reclaimed::default();
        for index in 0..high {
            let slot = &layout.slots[index];
            if index == self.slot
                || slot.status.load(Acquire) != SLOT_ACTIVE
                || self.slot_alive(index)
            {
                continue;
            }
            reclaimed.slots += 1;
            reclaimed.bytes += self.return_slot_bytes(index);
            slot.pid.store(0, Relaxed);
            slot.status.store(SLOT_FREE, Release);
        }
        reclaimed
    }

    /// Moves every byte slot `index` holds back to its device, taking over any device lock
    /// the slot's (dead) owner held.
    pub(super) fn return_slot_bytes(&self, index: usize) -> u64 {
        let layout = self.layout();
        let slot = &layout.slots[index];
        let mut returned = 0u64;
        for device in 0..MAX_DEVICES {
            let held_by_slot =
                lock_holder(layout.devices[device].lock.load(Relaxed)) == Some(index);
            if slot.used[device].load(Relaxed) == 0 && !held_by_slot {
                continue;
            }
            let Some(guard) = self.lock_device(device) else {
                continue;
            };
            let bytes = slot.used[device].swap(0, Relaxed);
            let account = guard.account;
            account
                .used
                .store(account.used.load(Relaxed).saturating_sub(bytes), Relaxed);
            returned = returned.saturating_add(bytes);
        }
        returned
    }

    /// Every claimed slot, with liveness from its record lock.
    pub fn slots(&self) -> Vec<SlotView> {
        let layout = self.layout();
        let high = (layout.header.slot_high_water.load(Relaxed) as usize).min(MAX_PROCS);
        layout.slots[..high]
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.status.load(Acquire) == SLOT_ACTIVE)
            .map(|(index, slot)| SlotView {
                index,
                pid: slot.pid.load(Relaxed),
                hostpid: slot.hostpid.load(Relaxed),
                alive: self.slot_alive(index),
                used: (0..MAX_DEVICES)
                    .filter_map(|d| {
                        let bytes = slot.used[d].load(Relaxed);
                        (bytes > 0).then_some((d, bytes))
                    })
                    .collect(),
            })
            .collect()
    }
}
