//! Checks of what a node agent reads from files a tenant or the kernel writes: shared
//! regions (HAMi-core's layouts and ours), DRM fdinfo, KFD property files.

use hami_monitor::{fdinfo as drm, hami_core_region as core_region, hip_region as our_region};
use hami_region::layout::{self, RegionHeader, RegionLayout};

const HEADER: usize = std::mem::offset_of!(RegionLayout, header);

/// A region of `size` bytes built from a short input: regions are megabytes, fuzz inputs
/// small. `data[0]` picks the size among `sizes` (or the input's own length) and, with its
/// top bit, whether the caller stamps a valid header over the input (so the fuzzer gets
/// past the header to the devices and process slots); `data[1..5]` is an offset where the
/// input is written a second time; the input itself is the header.
fn region_from(data: &[u8], sizes: &[usize]) -> (Vec<u8>, bool) {
    let Some((&pick, rest)) = data.split_first() else {
        return (Vec::new(), false);
    };
    (region_sized(pick & 0x7f, rest, sizes), pick & 0x80 != 0)
}

fn region_sized(pick: u8, rest: &[u8], sizes: &[usize]) -> Vec<u8> {
    let size = sizes.get(usize::from(pick) % (sizes.len() + 1)).copied();
    let Some(size) = size else {
        return rest.to_vec();
    };
    let mut region = vec![0u8; size];
    let n = rest.len().min(size);
    region[..n].copy_from_slice(&rest[..n]);
    if let Some((at, _)) = rest.split_first_chunk::<4>() {
        let at = u32::from_le_bytes(*at) as usize % size.max(1);
        let m = rest.len().min(size - at);
        region[at..at + m].copy_from_slice(&rest[..m]);
    }
    region
}

/// HAMi-core regions (v0, v1.1, v1.2 and unknown): the reader is total and bounded.
pub fn hami_core_region(data: &[u8]) {
    let sizes = [
        core_region::V1.size,
        core_region::V0.size,
        core_region::PRE_V0_SIZE,
        core_region::V1.size - 1,
    ];
    let (mut region, stamp) = region_from(data, &sizes);
    if stamp && region.len() >= core_region::HEADER_LEN {
        region[0..4].copy_from_slice(&core_region::MAGIC.to_le_bytes());
        let minor = if region.len() == core_region::V1.size {
            2u32
        } else {
            0
        };
        region[4..8].copy_from_slice(&u32::from(minor != 0).to_le_bytes());
        region[8..12].copy_from_slice(&minor.to_le_bytes());
    }
    let data = &region[..];
    let alive = |_pid: i32| true;
    let layout = core_region::detect_layout(data);
    match core_region::read_region(data, &alive) {
        Ok(reading) => {
            assert!(layout.is_ok(), "read a region whose layout was refused");
            assert!(
                reading.devices.len() <= core_region::MAX_DEVICES,
                "more devices than the layout holds"
            );
            assert!(reading.live_processes <= core_region::MAX_PROCS);
        }
        Err(error) => assert!(!error.kind().is_empty()),
    }
    // A reader must not trust the writer's liveness either way.
    let _ = core_region::read_region(data, &|_| false);
}

/// Our HIP region: the reader is total whatever the slots' owners are.
pub fn hip_region(data: &[u8]) {
    let (mut region, stamp) = region_from(data, &[layout::REGION_SIZE]);
    if stamp && region.len() == layout::REGION_SIZE {
        stamp_hip_header(&mut region);
    }
    let data = &region[..];
    let header = our_region::check_header(data);
    let mut alive = |index: usize| index.is_multiple_of(2);
    match our_region::read_region(data, &mut alive) {
        Ok(reading) => {
            assert!(header.is_ok(), "read a region whose header was refused");
            assert!(
                reading.devices.len() <= layout::MAX_DEVICES,
                "more devices than the layout holds"
            );
        }
        Err(error) => assert!(!error.kind().is_empty()),
    }
}

/// Writes the header hami-region's attach writes (magic, version, geometry).
fn stamp_hip_header(region: &mut [u8]) {
    use std::mem::offset_of;
    let mut put = |at: usize, bytes: &[u8]| region[at..at + bytes.len()].copy_from_slice(bytes);
    let u32s = [
        (offset_of!(RegionHeader, magic), layout::MAGIC),
        (offset_of!(RegionHeader, major), layout::MAJOR_VERSION),
        (offset_of!(RegionHeader, minor), layout::MINOR_VERSION),
        (
            offset_of!(RegionHeader, max_devices),
            layout::MAX_DEVICES as u32,
        ),
        (
            offset_of!(RegionHeader, max_procs),
            layout::MAX_PROCS as u32,
        ),
        (
            offset_of!(RegionHeader, slot_size),
            layout::SLOT_SIZE as u32,
        ),
    ];
    for (at, value) in u32s {
        put(HEADER + at, &value.to_le_bytes());
    }
    put(
        HEADER + offset_of!(RegionHeader, region_size),
        &(layout::REGION_SIZE as u64).to_le_bytes(),
    );
}

/// `/proc/<pid>/fdinfo/<fd>`: total; a client has a driver and a device.
pub fn fdinfo(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Some(client) = drm::parse_fdinfo(&text) {
        let mut sample = drm::BusySample::new();
        drm::add_client(&mut sample, &client);
        drm::add_client(&mut sample, &client);
        assert_eq!(sample.len(), 1, "a client is counted once");
    }
}

/// KFD `properties` files: names and values are single whitespace-free words.
pub fn kfd_properties(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let properties = hami_amd_discovery::sysfs::parse_properties(&text);
    for (name, value) in &properties {
        assert!(!name.is_empty() && !name.contains(char::is_whitespace));
        assert!(!value.is_empty() && !value.contains(char::is_whitespace));
    }
    let _ = hami_amd_discovery::sysfs::parse_int(&text);
}

#[cfg(test)]
mod tests {
    use super::*;

    // The stamping must really get inputs past the header checks, or the fuzzer never
    // reaches the readers' bodies.
    #[test]
    fn stamped_inputs_pass_the_header_checks() {
        let (mut hip, stamp) = region_from(&[0x80, 1, 2, 3, 4], &[layout::REGION_SIZE]);
        assert!(stamp);
        stamp_hip_header(&mut hip);
        assert_eq!(our_region::check_header(&hip[..]), Ok(()));

        let v1 = [core_region::V1.size];
        let (region, _) = region_from(&[0x00, 1, 2, 3, 4], &v1);
        assert_eq!(region.len(), core_region::V1.size);
        assert!(core_region::detect_layout(&region[..]).is_err());
    }
}
