//! When a waiter may take the region lock word (`owner_pid`) over: the pure rule, over what
//! the word names and what that slot shows. A holder killed at any instant must never block
//! the next process, and a live holder must never lose the word.
//!
//! The word is `lock_word(slot, generation)` of its holder's claim. It is **live** only while
//! that exact claim runs: the slot is occupied, at that generation, by a process that still
//! holds its liveness lock — or, for the waiter's own slot, while one of the waiter's own
//! threads holds it. Everything else is stale and is taken over:
//! - a word naming the **waiter's own slot** with another generation: a previous owner of
//!   the slot left it (the waiter holds the slot's liveness lock, so that owner is dead);
//!   issue 26 item 12: a process killed holding the word had its slot reclaimed and given
//!   to the next process, which then waited on itself for good;
//! - a word naming the waiter's own slot **and** generation while none of the waiter's
//!   threads can hold it (the CUDA region's writers are serialised in-process before they
//!   wait): only a forged or wrapped-around word looks like that;
//! - a word naming no slot or a slot out of range, a free slot, another generation of the slot, or an
//!   owner that no longer holds its liveness lock.

use crate::layout::lock_holder;

/// What the slot a lock word names shows now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HolderSlot {
    /// The slot is free.
    pub free: bool,
    /// The slot's current generation (compared in its low 32 bits, as the word carries).
    pub generation: u64,
    /// Its owner still holds the slot's liveness lock (and its pid exists).
    pub alive: bool,
}

/// The waiter: its own lock word (0 before it has a slot) and whether another of its
/// threads may hold the word while it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    /// `lock_word(own slot, own generation)`, or 0 without a slot.
    pub own_word: u64,
    /// Another thread of this process may hold the word now (false where the process's
    /// writers are serialised before they take the word).
    pub threads_may_hold: bool,
}

/// Whether lock word `word` is stale and may be taken over by `waiter`. `holder(index)` is
/// what slot `index` shows (`None` past the region's slots); it is asked only for a slot
/// other than the waiter's own, so a liveness probe (a system call) runs only when needed.
pub fn stale(word: u64, waiter: Waiter, holder: impl FnOnce(usize) -> Option<HolderSlot>) -> bool {
    if word == 0 {
        return false; // free: nothing to take over
    }
    let Some((index, generation)) = lock_holder(word) else {
        return true; // names no slot (a foreign value): nobody holds it
    };
    if let Some((own_index, own_generation)) = lock_holder(waiter.own_word)
        && index == own_index
    {
        return generation != own_generation || !waiter.threads_may_hold;
    }
    match holder(index) {
        None => true,
        Some(slot) => slot.free || slot.generation & 0xffff_ffff != generation || !slot.alive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{MAX_PROCS, lock_word};
    use proptest::prelude::*;

    /// The rule restated as "live" from the module's definition, for the comparison.
    fn live(word: u64, waiter: Waiter, slots: &[Option<HolderSlot>]) -> bool {
        if word == 0 {
            return true; // nothing to take over (reported as "not stale")
        }
        if word & 0xffff_ffff == 0 {
            return false; // names no slot
        }
        let (index, generation) = (((word & 0xffff_ffff) - 1) as usize, word >> 32);
        if waiter.own_word != 0 && (waiter.own_word & 0xffff_ffff) - 1 == index as u64 {
            return word == waiter.own_word && waiter.threads_may_hold;
        }
        slots.get(index).copied().flatten().is_some_and(|slot| {
            !slot.free && slot.alive && (slot.generation & 0xffff_ffff) == generation
        })
    }

    #[test]
    fn every_slot_generation_and_liveness_combination() {
        // Slots 0..3 (0 = the waiter's), generations around the waiter's, every state of
        // the named slot, both kinds of waiter, and a waiter without a slot.
        let own_generation = 5u64;
        let mut checked = 0;
        for own_slot in [None, Some(0usize)] {
            for threads_may_hold in [false, true] {
                let waiter = Waiter {
                    own_word: own_slot.map_or(0, |s| lock_word(s, own_generation)),
                    threads_may_hold,
                };
                for word_slot in [0usize, 1, 2, MAX_PROCS + 3] {
                    for word_generation in [0u64, 4, 5, 6, 1 << 32 | 5] {
                        for free in [false, true] {
                            for slot_generation in [4u64, 5, 6, 1 << 32 | 5] {
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
                                    let got = stale(word, waiter, |i| {
                                        asked.set(true);
                                        slots.get(i).copied().flatten()
                                    });
                                    assert_eq!(
                                        got,
                                        !live(word, waiter, &slots),
                                        "word slot {word_slot} gen {word_generation}, {state:?}, {waiter:?}"
                                    );
                                    if own_slot == Some(word_slot) {
                                        assert!(!asked.get(), "no probe for our own slot");
                                    }
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 2 * 4 * 5 * 2 * 4 * 2);
    }

    #[test]
    fn the_issue_case_a_word_of_our_slots_old_generation_is_taken_over() {
        // Killed holding the word at slot 0, generation 1; the next process got slot 0,
        // generation 2, and its liveness probe of slot 0 says "alive" (itself).
        let alive_self = |_| {
            Some(HolderSlot {
                free: false,
                generation: 2,
                alive: true,
            })
        };
        for threads_may_hold in [false, true] {
            let waiter = Waiter {
                own_word: lock_word(0, 2),
                threads_may_hold,
            };
            assert!(stale(lock_word(0, 1), waiter, alive_self));
        }
        // The same word with our own generation: ours only if a thread of ours may hold it.
        let serialised = Waiter {
            own_word: lock_word(0, 1),
            threads_may_hold: false,
        };
        assert!(stale(lock_word(0, 1), serialised, alive_self));
        let threaded = Waiter {
            threads_may_hold: true,
            ..serialised
        };
        assert!(!stale(lock_word(0, 1), threaded, alive_self));
        assert!(!stale(0, serialised, alive_self));
    }

    proptest! {
        #[test]
        fn matches_the_definition_for_any_words(
            word in any::<u64>(),
            own_slot in proptest::option::of(0usize..4),
            own_generation in any::<u32>(),
            threads_may_hold in any::<bool>(),
            slots in proptest::collection::vec(proptest::option::of((any::<bool>(), any::<u64>(), any::<bool>())), 0..5),
        ) {
            let waiter = Waiter {
                own_word: own_slot.map_or(0, |s| lock_word(s, u64::from(own_generation))),
                threads_may_hold,
            };
            let slots: Vec<Option<HolderSlot>> = slots
                .into_iter()
                .map(|s| s.map(|(free, generation, alive)| HolderSlot { free, generation, alive }))
                .collect();
            let got = stale(word, waiter, |i| slots.get(i).copied().flatten());
            prop_assert_eq!(got, !live(word, waiter, &slots));
        }

        #[test]
        fn a_live_holders_word_is_never_taken(slot in 0usize..8, generation in any::<u32>(), own in 0usize..8, own_generation in any::<u32>(), threads_may_hold in any::<bool>()) {
            prop_assume!(slot != own);
            let waiter = Waiter { own_word: lock_word(own, u64::from(own_generation)), threads_may_hold };
            let holder = HolderSlot { free: false, generation: u64::from(generation), alive: true };
            prop_assert!(!stale(lock_word(slot, u64::from(generation)), waiter, |_| Some(holder)));
        }
    }
}
