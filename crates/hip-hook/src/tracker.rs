//! What this process allocated through the hook: pointer or handle → device and bytes, so a
//! free returns the bytes to the device they were taken from (not the current device).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Addresses are unique and well spread; a multiply-shift hash is enough and several times
/// cheaper than SipHash on the allocation path.
#[derive(Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.write_u64(u64::from(*byte));
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

type Fast = BuildHasherDefault<AddressHasher>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
/// The kind of handle a record is keyed by: each is freed by its own calls.
pub enum Space {
    /// Device pointers (hipFree / hipFreeAsync).
    Pointer,
    /// Array handles (hipFreeArray).
    Array,
    /// Physical allocation handles (hipMemRelease).
    Physical,
    /// Mipmapped arrays (hipFreeMipmappedArray, hipMipmappedArrayDestroy).
    Mipmapped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// What a live allocation holds in the region.
pub struct Record {
    /// The device it was reserved on.
    pub device: usize,
    /// Bytes reserved for it.
    pub bytes: u64,
}

#[derive(Debug, Default)]
/// The hook's live allocations and known memory pools, so frees release what was reserved.
pub struct Tracker {
    live: HashMap<(Space, usize), Record, Fast>,
    /// Memory pools whose device we saw (hipMemPoolCreate, hipDeviceGetDefaultMemPool).
    pools: HashMap<usize, usize, Fast>,
}

impl Tracker {
    /// Records a new allocation. A stale record at the same address (freed behind the hook's
    /// back) is replaced; its bytes are returned as the second value to be released.
    pub fn insert(&mut self, space: Space, address: usize, record: Record) -> Option<Record> {
        self.live.insert((space, address), record)
    }

    /// Forgets an allocation, returning what it held (`None`: not one of ours).
    pub fn remove(&mut self, space: Space, address: usize) -> Option<Record> {
        self.live.remove(&(space, address))
    }

    /// Notes the device of a memory pool.
    pub fn note_pool(&mut self, pool: usize, device: usize) {
        self.pools.insert(pool, device);
    }

    /// The device of a pool seen before.
    pub fn pool_device(&self, pool: usize) -> Option<usize> {
        self.pools.get(&pool).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frees_find_the_allocating_device() {
        let mut tracker = Tracker::default();
        tracker.insert(
            Space::Pointer,
            0x1000,
            Record {
                device: 3,
                bytes: 64,
            },
        );
        tracker.insert(
            Space::Array,
            0x1000,
            Record {
                device: 1,
                bytes: 8,
            },
        );
        assert_eq!(
            tracker.remove(Space::Pointer, 0x1000),
            Some(Record {
                device: 3,
                bytes: 64
            })
        );
        assert_eq!(tracker.remove(Space::Pointer, 0x1000), None);
        assert_eq!(
            tracker.remove(Space::Array, 0x1000).map(|r| r.device),
            Some(1)
        );
        tracker.note_pool(0x77, 2);
        assert_eq!(tracker.pool_device(0x77), Some(2));
        assert_eq!(tracker.pool_device(0x78), None);
    }
}
