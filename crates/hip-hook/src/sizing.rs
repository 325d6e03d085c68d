//! Bytes to reserve before allocations whose real size the runtime decides (pitch padding).

/// Row alignment the hook expects of the runtime's pitch (ROCm aligns rows to at most this
/// on current GPUs). The reservation is settled to the pitch the runtime really returns:
/// trimmed if smaller; topped up if larger, and the allocation undone if the top-up does not
/// fit.
pub const PITCH_ALIGNMENT: u64 = 512;

/// Bytes reserved before a pitched allocation of `rows` rows of `width` bytes.
pub fn pitched_estimate(width: u64, rows: u64) -> Option<u64> {
    width
        .max(1)
        .checked_next_multiple_of(PITCH_ALIGNMENT)?
        .checked_mul(rows.max(1))
}

/// Bytes of an array of `dims` elements of `bits_per_element` bits (`x+y+z+w` of the
/// channel descriptor); zero-sized dimensions count as 1, as in HIP.
pub fn array_bytes(bits_per_element: u64, dims: [u64; 3]) -> Option<u64> {
    if bits_per_element == 0 || !bits_per_element.is_multiple_of(8) {
        return None;
    }
    dims.iter()
        .try_fold(bits_per_element / 8, |acc, d| acc.checked_mul((*d).max(1)))
}

/// Bytes per channel of a driver-API array format (`hipArray_Format`, `HIP_AD_FORMAT_*`).
pub fn format_bytes(format: i32) -> Option<u64> {
    match format {
        0x01 | 0x08 => Some(1),        // unsigned / signed int8
        0x02 | 0x09 | 0x10 => Some(2), // int16, half
        0x03 | 0x0a | 0x20 => Some(4), // int32, float
        _ => None,
    }
}

/// Bytes of a driver-API array (`HIP_ARRAY[3D]_DESCRIPTOR`): channels × format × dims.
pub fn descriptor_bytes(format: i32, channels: u32, dims: [u64; 3]) -> Option<u64> {
    let element = format_bytes(format)?.checked_mul(u64::from(channels))?;
    if element == 0 {
        return None;
    }
    array_bytes(element * 8, dims)
}

/// Bytes of a mipmapped array: the sum over its levels of each level's array, every
/// dimension halved per level (at least 1; a zero dimension stays absent). `levels` is
/// clamped to 1..=the full chain, as the runtime does.
pub fn mipmap_bytes(element_bytes: u64, dims: [u64; 3], levels: u32) -> Option<u64> {
    if element_bytes == 0 {
        return None;
    }
    let largest = dims.iter().copied().max().unwrap_or(0).max(1);
    let full_chain = 64 - largest.leading_zeros();
    let levels = levels.clamp(1, full_chain);
    (0..levels).try_fold(0u64, |total, level| {
        let level_dims = dims.map(|d| if d == 0 { 0 } else { (d >> level).max(1) });
        total.checked_add(array_bytes(element_bytes * 8, level_dims)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        assert_eq!(pitched_estimate(100, 10), Some(5120));
        assert_eq!(pitched_estimate(4096, 2), Some(8192));
        assert_eq!(pitched_estimate(100, 0), Some(512));
        assert_eq!(pitched_estimate(u64::MAX, 2), None);
        assert_eq!(array_bytes(32, [10, 0, 0]), Some(40));
        assert_eq!(array_bytes(128, [4, 4, 2]), Some(512));
        assert_eq!(array_bytes(12, [1, 1, 1]), None);
        assert_eq!(descriptor_bytes(0x20, 4, [16, 16, 0]), Some(16 * 16 * 16));
        assert_eq!(descriptor_bytes(0x01, 1, [100, 0, 0]), Some(100));
        assert_eq!(descriptor_bytes(0x7f, 1, [1, 1, 1]), None);
        assert_eq!(descriptor_bytes(0x20, 0, [1, 1, 1]), None);
        // 8x8 of 4 bytes, 4 levels: 64 + 16 + 4 + 1 elements.
        assert_eq!(mipmap_bytes(4, [8, 8, 0], 4), Some(4 * 85));
        // More levels than the chain has are clamped; 0 levels means 1.
        assert_eq!(mipmap_bytes(4, [8, 8, 0], 40), Some(4 * 85));
        assert_eq!(mipmap_bytes(1, [8, 0, 0], 0), Some(8));
        assert_eq!(mipmap_bytes(1, [6, 3, 0], 3), Some(18 + 3 + 1));
    }

    proptest! {
        #[test]
        fn the_estimate_covers_any_pitch_up_to_512_alignment(width in 1u64..100_000, rows in 1u64..1000, align_pow in 0u32..10) {
            let pitch = width.next_multiple_of(1 << align_pow);
            prop_assert!(pitch * rows <= pitched_estimate(width, rows).unwrap());
        }

        #[test]
        fn a_mipmap_holds_its_base_level_and_less_than_twice_more(w in 1u64..5000, h in 0u64..5000, levels in 0u32..20) {
            let base = array_bytes(8, [w, h, 0]).unwrap();
            let all = mipmap_bytes(1, [w, h, 0], levels).unwrap();
            prop_assert!(all >= base);
            prop_assert!(all <= 2 * base + 64);
        }
    }
}
