//! Reading `HSA_CU_MASK` (SPEC §2.5) the way ROCr does at initialisation, to report how
//! many compute units a device exposes. The grammar is `hami_protocol::cu_list`'s.

use hami_protocol::cu_list::{CuSet, HsaCuMask};

/// Compute units of `device` enabled by `mask`, out of `cu_count`. A device the mask does not
/// name keeps all its CUs; an unreadable mask is ignored, as ROCr does (with a warning).
pub fn enabled_cus(mask: Option<&str>, device: usize, cu_count: u32) -> u32 {
    let Some(Ok(mask)) = mask.map(HsaCuMask::parse) else {
        return cu_count;
    };
    let Some(set) = u32::try_from(device).ok().and_then(|d| mask.get(d)) else {
        return cu_count;
    };
    // Ids beyond the device are ignored.
    let enabled = set.intersection(&CuSet::range(0, cu_count)).len();
    u32::try_from(enabled).unwrap_or(cu_count)
}

/// Compute units `ROC_GLOBAL_CU_MASK` (HIP's process-wide mask, `0x` + hex, CU `n` = bit
/// `n`, read by walking `environ`) leaves of `cu_count`; an unreadable mask is ignored.
pub fn global_mask_cus(mask: Option<&str>, cu_count: u32) -> u32 {
    let Some(digits) = mask.and_then(|m| m.trim().strip_prefix("0x")) else {
        return cu_count;
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return cu_count;
    }
    let mut enabled = 0;
    for (position, digit) in digits.bytes().rev().enumerate() {
        let nibble = char::from(digit).to_digit(16).unwrap_or(0);
        for bit in 0..4u32 {
            let cu = position as u32 * 4 + bit;
            if nibble & (1 << bit) != 0 && cu < cu_count {
                enabled += 1;
            }
        }
    }
    if enabled == 0 { cu_count } else { enabled }
}

/// What a device exposes under both masks: ROCr's `HSA_CU_MASK` (honoured only by runtimes
/// whose ROCr reads it) and HIP's `ROC_GLOBAL_CU_MASK`.
pub fn exposed_cus(hsa: Option<&str>, global: Option<&str>, device: usize, cu_count: u32) -> u32 {
    enabled_cus(hsa, device, cu_count).min(global_mask_cus(global, cu_count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_device_own_entry() {
        assert_eq!(enabled_cus(None, 0, 64), 64);
        assert_eq!(enabled_cus(Some("0:0-15"), 0, 64), 16);
        assert_eq!(enabled_cus(Some("0:0-15;1:0,2,4-5"), 1, 64), 4);
        assert_eq!(enabled_cus(Some("1:0-3"), 0, 64), 64);
        assert_eq!(enabled_cus(Some("0:0-200"), 0, 64), 64);
        assert_eq!(enabled_cus(Some("garbage"), 0, 64), 64);
    }

    #[test]
    fn counts_the_global_mask_bits() {
        assert_eq!(global_mask_cus(None, 64), 64);
        assert_eq!(global_mask_cus(Some("0xf"), 64), 4);
        assert_eq!(global_mask_cus(Some("0xf0"), 64), 4);
        assert_eq!(global_mask_cus(Some("0xffffffffffffffffffff"), 64), 64);
        assert_eq!(global_mask_cus(Some("f"), 64), 64);
        assert_eq!(exposed_cus(Some("0:0-7"), Some("0xf"), 0, 64), 4);
    }
}
