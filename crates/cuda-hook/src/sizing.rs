//! Bytes an allocation takes, for the calls whose size is not a plain argument.

/// Row size the driver rounds pitched allocations to before it answers (the real pitch is
/// settled after the call).
pub const PITCH_ALIGN: u64 = 512;

/// Bytes reserved for a pitched allocation of `height` rows of `width` bytes before the
/// driver says the real pitch (rows rounded up to [`PITCH_ALIGN`]); `None` on overflow.
pub fn pitch_estimate(width: u64, height: u64) -> Option<u64> {
    width
        .checked_next_multiple_of(PITCH_ALIGN)?
        .checked_mul(height)
}

/// Bytes per channel of a `CUarray_format`; unknown (newer, compressed) formats count 16 so
/// that they are over- rather than under-counted.
pub fn format_bytes(format: u32) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 16,
    }
}

/// Bytes of a CUDA array (1D/2D/3D: zero height or depth count as 1); `None` on overflow.
pub fn array_bytes(width: u64, height: u64, depth: u64, format: u32, channels: u32) -> Option<u64> {
    width
        .checked_mul(height.max(1))?
        .checked_mul(depth.max(1))?
        .checked_mul(u64::from(channels.max(1)))?
        .checked_mul(format_bytes(format))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn arrays_and_pitch() {
        assert_eq!(array_bytes(100, 0, 0, 0x20, 4), Some(1600));
        assert_eq!(array_bytes(10, 10, 10, 0x01, 1), Some(1000));
        assert_eq!(array_bytes(u64::MAX, 2, 1, 0x01, 1), None);
        assert_eq!(pitch_estimate(100, 3), Some(1536));
    }

    proptest! {
        #[test]
        fn pitch_covers_the_rows(w in 1..1u64 << 20, h in 0..4096u64) {
            let bytes = pitch_estimate(w, h).unwrap();
            prop_assert!(bytes >= w * h);
            prop_assert!(bytes < (w + PITCH_ALIGN) * h.max(1) + 1);
        }
    }
}
