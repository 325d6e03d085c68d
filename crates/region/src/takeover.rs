//! When a waiter may take a device's accounting lock word over: the pure rule, over what the
//! word names and what that slot shows. A holder killed at any instant must never block
//! anyone, and a live holder must never lose the word.
//!
//! The word is `lock_word(slot, generation)` of its holder's claim. It is **live** only while
//! that exact claim runs: the slot is active, at that generation, and its owner holds the
//! slot's record lock. For the waiter's own slot, the word is live only at the waiter's own
//! generation (another of its threads holds it: threads lock devices independently). Stale,
//! and taken over:
//! - a word naming the waiter's own slot with another generation: a previous owner of the
//!   slot left it (the waiter holds the slot's record lock, so that owner is dead; the CUDA
//!   hook's region had this flaw, issue 26 item 12, and this one the same rule);
//! - a word naming no slot, a slot out of range, a free slot, another generation of the
//!   slot, or an owner whose record lock is gone.
//!
//! A word equal to the waiter's own (forged, or after 2^32 claims of one slot) is waited on:
//! only a tenant writing its own container's region can produce it.

use crate::layout::lock_holder;

/// What the slot a lock word names shows now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HolderSlot {
    /// The slot is free.
    pub free: bool,
    /// The slot's current generation.
    pub generation: u32,
    /// Its owner holds the slot's record lock.
    pub alive: bool,
}

/// Whether lock word `word` is stale for a waiter whose own word is `own_word` (0 without a
/// slot). `holder(index)` is what slot `index` shows (`None` past the region's slots); it is
/// asked only for another slot than the waiter's, so the liveness probe (a system call) runs
/// only when needed.
pub fn stale(word: u64, own_word: u64, holder: impl FnOnce(usize) -> Option<HolderSlot>) -> bool {
    if word == 0 {
        return false; // free: nothing to take over
    }
    let Some(index) = lock_holder(word) else {
        return true; // names no slot: nobody holds it
    };
    let generation = (word >> 32) as u32;
    if own_word != 0 && lock_holder(own_word) == Some(index) {
        return word != own_word;
    }
    match holder(index) {
        None => true,
        Some(slot) => slot.free || slot.generation != generation || !slot.alive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{MAX_PROCS, lock_word};
    use proptest::prelude::*;

    /// "Live" as the module defines it, for the comparison.
    fn live(word: u64, own_word: u64, slots: &[Option<HolderSlot>]) -> bool {
        if word == 0 {
            return true; // nothing to take over (reported as "not stale")
        }
        let low = word & 0xffff_ffff;
        if low == 0 {
            return false;
        }
        let index = (low - 1) as usize;
        if own_word != 0 && (own_word & 0xffff_ffff) - 1 == low - 1 {
            return word == own_word;
        }
        slots.get(index).copied().flatten().is_some_and(|slot| {
            !slot.free && slot.alive && u64::from(slot.generation) == word >> 32
        })
    }

    #[test]
    fn every_slot_generation_and_liveness_combination() {
        let mut checked = 0;
        for own_word in [0, lock_word(0, 5)] {
            for word_slot in [0usize, 1, 2, MAX_PROCS + 3] {
                for word_generation in [0u32, 4, 5, 6] {
                    for free in [false, true] {
                        for slot_generation in [4u32, 5, 6] {
                            for alive in [false, true] {
                                let state = HolderSlot {
                                    free,
                                    generation: slot_generation,
                                    alive,
                                };
                                let slots: Vec<Option<HolderSlot>> =
                                    (0..3).map(|_| Some(state)).collect();
                                let word = lock_word(word_slot, word_generation);
                                let asked = std::cell::Cell::new(false);
                                let got = stale(word, own_word, |i| {
                                    asked.set(true);
                                    slots.get(i).copied().flatten()
                                });
                                assert_eq!(
                                    got,
                                    !live(word, own_word, &slots),
                                    "word slot {word_slot} gen {word_generation}, {state:?}, own {own_word:#x}"
                                );
                                if own_word != 0 && word_slot == 0 {
                                    assert!(!asked.get(), "no probe for our own slot");
                                }
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 4 * 4 * 2 * 3 * 2);
    }

    #[test]
    fn a_word_of_our_slots_old_generation_is_taken_over() {
        let me = |_| {
            Some(HolderSlot {
                free: false,
                generation: 2,
                alive: true,
            })
        };
        assert!(stale(lock_word(0, 1), lock_word(0, 2), me));
        assert!(!stale(lock_word(0, 2), lock_word(0, 2), me), "our thread's");
        assert!(stale(1 << 40, lock_word(0, 2), me), "names no slot");
        assert!(!stale(0, lock_word(0, 2), me));
    }

    proptest! {
        #[test]
        fn matches_the_definition_for_any_words(
            word in any::<u64>(),
            own in proptest::option::of((0usize..4, any::<u32>())),
            slots in proptest::collection::vec(proptest::option::of((any::<bool>(), any::<u32>(), any::<bool>())), 0..5),
        ) {
            let own_word = own.map_or(0, |(s, g)| lock_word(s, g));
            let slots: Vec<Option<HolderSlot>> = slots
                .into_iter()
                .map(|s| s.map(|(free, generation, alive)| HolderSlot { free, generation, alive }))
                .collect();
            let got = stale(word, own_word, |i| slots.get(i).copied().flatten());
            prop_assert_eq!(got, !live(word, own_word, &slots));
        }
    }
}
