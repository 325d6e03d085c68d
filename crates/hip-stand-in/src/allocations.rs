//! The process's live allocations: what each pointer or handle is, on which device, how big.

use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// hipMalloc and friends, freed by hipFree / hipFreeAsync.
    Linear,
    /// hipMallocArray / hipMalloc3DArray, freed by hipFreeArray.
    Array,
    /// hipMemCreate, released by hipMemRelease.
    Physical,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub device: usize,
    pub size: u64,
    pub kind: Kind,
}

/// Hands out distinct fake device addresses (never dereferenced) and remembers them.
#[derive(Debug)]
pub struct Table {
    next: usize,
    live: HashMap<usize, Allocation>,
}

impl Default for Table {
    fn default() -> Self {
        Self {
            next: 0x1000_0000_0000,
            live: HashMap::new(),
        }
    }
}

impl Table {
    pub fn insert(&mut self, allocation: Allocation) -> usize {
        let address = self.next;
        let span = usize::try_from(allocation.size)
            .unwrap_or(usize::MAX)
            .max(1)
            .next_multiple_of(256);
        self.next = self.next.saturating_add(span);
        self.live.insert(address, allocation);
        address
    }

    /// Removes `address` if it is a live allocation of `kind`.
    pub fn remove(&mut self, address: usize, kind: Kind) -> Option<Allocation> {
        match self.live.get(&address) {
            Some(found) if found.kind == kind => self.live.remove(&address),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_distinct_and_removed_once() {
        let mut table = Table::default();
        let a = table.insert(Allocation {
            device: 0,
            size: 10,
            kind: Kind::Linear,
        });
        let b = table.insert(Allocation {
            device: 1,
            size: 0,
            kind: Kind::Array,
        });
        assert_ne!(a, b);
        assert_eq!(table.remove(b, Kind::Linear), None);
        assert_eq!(table.remove(a, Kind::Linear).map(|x| x.device), Some(0));
        assert_eq!(table.remove(a, Kind::Linear), None);
    }
}
