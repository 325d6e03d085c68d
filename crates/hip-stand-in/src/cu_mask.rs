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
}
