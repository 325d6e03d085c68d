//! The accounting decisions, as plain functions over plain numbers. The shell
//! (`region.rs`) calls them while holding a device's accounting lock.

use crate::layout::LIMIT_NONE;

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverLimit {
    /// Bytes already reserved on the device.
    pub used: u64,
    /// The device's limit.
    pub limit: u64,
    /// Bytes asked for.
    pub requested: u64,
}

/// Reserve-before-allocate: the new device total if `size` more bytes fit under `limit`.
/// `limit == LIMIT_NONE` only guards against overflow; `limit == 0` refuses everything but 0.
pub fn reserve(used: u64, limit: u64, size: u64) -> Result<u64, OverLimit> {
    let refused = OverLimit {
        used,
        limit,
        requested: size,
    };
    match used.checked_add(size) {
        Some(total) if limit == LIMIT_NONE || total <= limit => Ok(total),
        _ => Err(refused),
    }
}

/// The limit in force on a device: the region's stored `limit`, never above `ceiling` — the
/// limit of the device plugin's read-only config where one exists ([`LIMIT_NONE`] where
/// none does). Every process of the container can write the region, so its value may lower
/// the limit (an operator's `set_limit`) but never raise it (issue 26 item 3).
pub fn limit_in_force(limit: u64, ceiling: u64) -> u64 {
    limit.min(ceiling)
}

/// Bytes a release of `size` may take back from a slot that holds `slot_used`: never more
/// than the slot holds, so a device total can never underflow nor drift from the slots' sum.
pub fn releasable(slot_used: u64, size: u64) -> u64 {
    slot_used.min(size)
}

/// Free bytes to report under a limit: `min(limit - used, physical_free)`, clamped at 0
/// (the reference underflowed here, HAMi-core #200).
pub fn free_under_limit(limit: u64, used: u64, physical_free: u64) -> u64 {
    if limit == LIMIT_NONE {
        physical_free
    } else {
        limit.saturating_sub(used).min(physical_free)
    }
}

/// Total bytes to report under a limit: the limit, but never more than the device has
/// (HAMi-core PR #80: a total above physical memory breaks frameworks' planning).
pub fn total_under_limit(limit: u64, physical_total: u64) -> u64 {
    if limit == LIMIT_NONE {
        physical_total
    } else {
        limit.min(physical_total)
    }
}

/// The device total rebuilt from the slots (used after a lock holder died mid-update).
pub fn sum_of_slots(slot_used: impl IntoIterator<Item = u64>) -> u64 {
    slot_used
        .into_iter()
        .fold(0u64, |sum, used| sum.saturating_add(used))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_region_can_lower_the_configured_limit_but_never_raise_it() {
        let config = 1 << 20;
        assert_eq!(
            limit_in_force(LIMIT_NONE, config),
            config,
            "raised: ignored"
        );
        assert_eq!(limit_in_force(4 << 20, config), config);
        assert_eq!(
            limit_in_force(1 << 19, config),
            1 << 19,
            "lowered: in force"
        );
        assert_eq!(limit_in_force(0, config), 0);
        assert_eq!(limit_in_force(1 << 19, LIMIT_NONE), 1 << 19, "no config");
        assert_eq!(limit_in_force(LIMIT_NONE, LIMIT_NONE), LIMIT_NONE);
    }

    #[test]
    fn reserve_up_to_the_limit_and_not_a_byte_more() {
        assert_eq!(reserve(0, 100, 100), Ok(100));
        assert_eq!(
            reserve(100, 100, 1),
            Err(OverLimit {
                used: 100,
                limit: 100,
                requested: 1
            })
        );
        assert_eq!(reserve(40, 100, 60), Ok(100));
        assert_eq!(reserve(0, 0, 0), Ok(0));
        assert!(reserve(0, 0, 1).is_err());
        assert!(reserve(u64::MAX - 1, LIMIT_NONE, 2).is_err());
        assert_eq!(reserve(5, LIMIT_NONE, 7), Ok(12));
    }

    #[test]
    fn reported_sizes_are_clamped() {
        assert_eq!(free_under_limit(100, 150, 1000), 0);
        assert_eq!(free_under_limit(100, 30, 1000), 70);
        assert_eq!(free_under_limit(100, 30, 10), 10);
        assert_eq!(free_under_limit(LIMIT_NONE, 30, 10), 10);
        assert_eq!(total_under_limit(100, 1000), 100);
        assert_eq!(total_under_limit(2000, 1000), 1000);
        assert_eq!(total_under_limit(LIMIT_NONE, 1000), 1000);
    }

    /// A model of the region: per-slot holdings and a device total, driven by arbitrary
    /// interleavings of reserve/release/death steps from several processes.
    #[derive(Debug, Clone)]
    enum Step {
        Reserve { slot: usize, size: u64 },
        Release { slot: usize, size: u64 },
        Die { slot: usize },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0usize..4, 0u64..400).prop_map(|(slot, size)| Step::Reserve { slot, size }),
            (0usize..4, 0u64..400).prop_map(|(slot, size)| Step::Release { slot, size }),
            (0usize..4).prop_map(|slot| Step::Die { slot }),
        ]
    }

    proptest! {
        #[test]
        fn interleavings_never_exceed_the_limit(limit in 0u64..1000, steps in proptest::collection::vec(step(), 0..200)) {
            let mut slots = [0u64; 4];
            let mut total = 0u64;
            for step in steps {
                match step {
                    Step::Reserve { slot, size } => match reserve(total, limit, size) {
                        Ok(new_total) => { total = new_total; slots[slot] += size; }
                        Err(refused) => prop_assert!(refused.used + refused.requested > limit),
                    },
                    Step::Release { slot, size } => {
                        let taken = releasable(slots[slot], size);
                        slots[slot] -= taken;
                        total -= taken;
                    }
                    Step::Die { slot } => {
                        total -= slots[slot];
                        slots[slot] = 0;
                    }
                }
                prop_assert!(total <= limit);
                prop_assert_eq!(total, sum_of_slots(slots));
            }
        }

        #[test]
        fn free_plus_used_never_exceeds_total(limit in 0u64..10_000, used in 0u64..20_000, phys in 0u64..10_000) {
            let free = free_under_limit(limit, used, phys);
            prop_assert!(free <= total_under_limit(limit, phys));
            prop_assert!(free <= phys);
        }
    }
}
