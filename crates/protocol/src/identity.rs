//! Device identities (SPEC §2.8, D-8).

use core::fmt;

/// Partition index of a whole GPU in the AMD SMI UUID.
pub const WHOLE_GPU_PARTITION: u8 = 0xff;

/// The AMD SMI UUID (amd-smi's generator) of a GPU or one of its partitions.
///
/// `serial` is the 64-bit ASIC serial (KFD `unique_id`), `device_id` the PCI device id,
/// `partition` the partition index or [`WHOLE_GPU_PARTITION`].
pub fn amd_smi_uuid(serial: u64, device_id: u16, partition: u8) -> String {
    format!(
        "{:02x}{:02x}{:04x}-0000-1000-80{:02x}-{:04x}{:08x}",
        serial >> 56,
        partition,
        device_id,
        (serial >> 48) & 0xff,
        (serial >> 32) & 0xffff,
        serial & 0xffff_ffff
    )
}

/// The ROCr id of a KFD node: `GPU-` + 16 lower-case hex digits of `unique_id`. This is
/// what `ROCR_VISIBLE_DEVICES` accepts (ROCr does not accept AMD SMI UUIDs).
pub fn rocr_id(unique_id: u64) -> String {
    format!("GPU-{unique_id:016x}")
}

/// Why an identity string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Not `GPU-` + 16 hex digits; the text as given.
    #[error("{0:?} is not a ROCr id: expected GPU- followed by 16 hex digits")]
    RocrId(String),
    /// Not `<device key>#<share index>`; the text as given.
    #[error("{0:?} is not a kubelet device id: expected <device key>#<share index>")]
    KubeletDeviceId(String),
}

/// Reads a ROCr id back into the KFD `unique_id`.
pub fn parse_rocr_id(text: &str) -> Result<u64, IdentityError> {
    let err = || IdentityError::RocrId(text.to_owned());
    let hex = text.strip_prefix("GPU-").ok_or_else(err)?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(err());
    }
    u64::from_str_radix(hex, 16).map_err(|_| err())
}

/// The registered id of a hard (XCP) partition. D-8: partitions of one card share one
/// `unique_id`, so the partition index is appended and no two entries share an id.
pub fn partition_device_id(unique_id: u64, partition_index: u8) -> String {
    format!("{}-{partition_index}", rocr_id(unique_id))
}

/// Partition index of a KFD node: the low 3 bits of its `location_id`.
pub fn partition_index_from_location_id(location_id: u64) -> u8 {
    (location_id & 0x7) as u8
}

/// A kubelet device id: `<device key>#<k>`, one per share of a GPU (key = PCI BDF, or the
/// XCP platform device name for partitions).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KubeletDeviceId {
    /// PCI BDF of the card, or `amdgpu_xcp_<n>` of a partition.
    pub device_key: String,
    /// Which share of the device, from 0.
    pub share: u32,
}

impl KubeletDeviceId {
    /// Reads `<device key>#<share>`; the key may itself contain `#` (the last one splits).
    pub fn parse(text: &str) -> Result<Self, IdentityError> {
        let err = || IdentityError::KubeletDeviceId(text.to_owned());
        let (key, share) = text.rsplit_once('#').ok_or_else(err)?;
        if key.is_empty() || share.is_empty() || !share.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        Ok(Self {
            device_key: key.to_owned(),
            share: share.parse().map_err(|_| err())?,
        })
    }
}

impl fmt::Display for KubeletDeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.device_key, self.share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_amd_smi_pair() {
        assert_eq!(
            amd_smi_uuid(0x8e1b_b564_57ad_dd1b, 0x74b5, WHOLE_GPU_PARTITION),
            "8eff74b5-0000-1000-801b-b56457addd1b"
        );
        assert_eq!(
            amd_smi_uuid(0x8e1b_b564_57ad_dd1b, 0x74b5, 3),
            "8e0374b5-0000-1000-801b-b56457addd1b"
        );
    }

    #[test]
    fn rocr_ids() {
        assert_eq!(rocr_id(14073402507705256556), "GPU-c34ec50444dd0a6c");
        assert_eq!(rocr_id(1), "GPU-0000000000000001");
        assert_eq!(
            parse_rocr_id("GPU-c34ec50444dd0a6c"),
            Ok(14073402507705256556)
        );
        for bad in [
            "",
            "GPU-",
            "GPU-c34ec50444dd0a6",
            "gpu-c34ec50444dd0a6c",
            "GPU-+34ec50444dd0a6c",
            "GPU-c34ec50444dd0a6cc",
        ] {
            assert!(parse_rocr_id(bad).is_err(), "{bad}");
        }
        assert_eq!(partition_device_id(1, 5), "GPU-0000000000000001-5");
        assert_eq!(partition_index_from_location_id(0x8a0b), 3);
    }

    #[test]
    fn kubelet_ids() {
        let id = KubeletDeviceId::parse("0000:83:00.0#3").unwrap();
        assert_eq!(id.device_key, "0000:83:00.0");
        assert_eq!(id.share, 3);
        assert_eq!(id.to_string(), "0000:83:00.0#3");
        assert_eq!(KubeletDeviceId::parse("amdgpu_xcp_30#0").unwrap().share, 0);
        for bad in ["", "#1", "a#", "a", "a#-1", "a#1x", "a#99999999999"] {
            assert!(KubeletDeviceId::parse(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn rocr_round_trip(id in any::<u64>()) {
            prop_assert_eq!(parse_rocr_id(&rocr_id(id)), Ok(id));
        }

        #[test]
        fn amd_smi_uuid_shape(serial in any::<u64>(), dev in any::<u16>(), part in any::<u8>()) {
            let uuid = amd_smi_uuid(serial, dev, part);
            prop_assert_eq!(uuid.len(), 36);
            let parts: Vec<&str> = uuid.split('-').collect();
            prop_assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), vec![8, 4, 4, 4, 12]);
        }

        #[test]
        fn parsers_are_total(text in ".{0,40}") {
            let _ = parse_rocr_id(&text);
            if let Ok(id) = KubeletDeviceId::parse(&text) {
                prop_assert_eq!(KubeletDeviceId::parse(&id.to_string()).unwrap(), id);
            }
        }
    }
}
