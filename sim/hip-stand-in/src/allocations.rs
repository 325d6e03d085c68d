//! The process's live allocations: what each pointer or handle is, on which device, how big.

use std::collections::HashMap;

/// Which API made an allocation, so only its own free call releases it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// hipMalloc and friends, freed by hipFree / hipFreeAsync.
    Linear,
    /// hipMallocArray / hipMalloc3DArray, freed by hipFreeArray.
    Array,
    /// hipMemCreate, released by hipMemRelease.
    Physical,
    /// hipMallocMipmappedArray / hipMipmappedArrayCreate, freed by hipFreeMipmappedArray /
    /// hipMipmappedArrayDestroy.
    Mipmapped,
}

/// One live allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Stand-in device index the bytes are charged to.
    pub device: usize,
    /// Bytes charged to the device (its block's span is this rounded up to 256).
    pub size: u64,
    /// Which API made it.
    pub kind: Kind,
}

/// Hands out fake device addresses (never dereferenced) and remembers them. Freed blocks
/// are reused last-freed-first, as real caching allocators (ROCclr's, PyTorch's) do: the
/// next allocation that fits gets the address just freed, so a hook that still holds a
/// record for it after the real free is caught.
#[derive(Debug)]
pub struct Table {
    next: usize,
    /// address → (allocation, span of its block).
    live: HashMap<usize, (Allocation, usize)>,
    /// Freed blocks `(address, span)`, most recently freed last.
    free: Vec<(usize, usize)>,
}

impl Default for Table {
    fn default() -> Self {
        Self {
            next: 0x1000_0000_0000,
            live: HashMap::new(),
            free: Vec::new(),
        }
    }
}

/// Freed blocks kept for reuse; older ones are forgotten (their addresses are not reused).
const FREE_LIST_MAX: usize = 4096;

impl Table {
    /// Records `allocation` and returns its fake address (a just-freed block that fits, if any).
    pub fn insert(&mut self, allocation: Allocation) -> usize {
        let span = usize::try_from(allocation.size)
            .unwrap_or(usize::MAX)
            .max(1)
            .next_multiple_of(256);
        let reused = self
            .free
            .iter()
            .rposition(|(_, free_span)| *free_span >= span)
            .map(|index| self.free.remove(index));
        let (address, span) = match reused {
            Some(block) => block,
            None => {
                let address = self.next;
                self.next = self.next.saturating_add(span);
                (address, span)
            }
        };
        self.live.insert(address, (allocation, span));
        address
    }

    /// Removes `address` if it is a live allocation of `kind`; its block becomes the first
    /// candidate for the next allocation.
    pub fn remove(&mut self, address: usize, kind: Kind) -> Option<Allocation> {
        match self.live.get(&address) {
            Some((found, _)) if found.kind == kind => {
                let (allocation, span) = self.live.remove(&address)?;
                if self.free.len() >= FREE_LIST_MAX {
                    self.free.remove(0);
                }
                self.free.push((address, span));
                Some(allocation)
            }
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

    #[test]
    fn freed_addresses_come_back_last_freed_first() {
        let mut table = Table::default();
        let linear = |size| Allocation {
            device: 0,
            size,
            kind: Kind::Linear,
        };
        let a = table.insert(linear(1000));
        let b = table.insert(linear(1000));
        assert!(table.remove(a, Kind::Linear).is_some());
        assert!(table.remove(b, Kind::Linear).is_some());
        assert_eq!(table.insert(linear(1000)), b, "the last freed block first");
        assert_eq!(
            table.insert(linear(10)),
            a,
            "a smaller request reuses a block"
        );
        let c = table.insert(linear(4096));
        assert!(c != a && c != b, "a bigger request needs a new block");
        assert!(table.remove(c, Kind::Array).is_none());
    }
}
