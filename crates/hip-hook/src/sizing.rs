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
    }

    proptest! {
        #[test]
        fn the_estimate_covers_any_pitch_up_to_512_alignment(width in 1u64..100_000, rows in 1u64..1000, align_pow in 0u32..10) {
            let pitch = width.next_multiple_of(1 << align_pow);
            prop_assert!(pitch * rows <= pitched_estimate(width, rows).unwrap());
        }
    }
}
