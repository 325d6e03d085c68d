//! Container device lists (SPEC §2.2): `hami.io/amd-devices-to-allocate`,
//! `hami.io/amd-devices-allocated` and the NVIDIA `hami.io/vgpu-devices-*` twins.
//!
//! Each device is `UUID,TYPE,MEM_MiB,CORES` followed by `:`; each container's run ends with
//! `;`. One run per container, init containers first, then app containers; a container
//! without devices is an empty run. D-1: the encoder always writes the full padding and the
//! decoder keeps empty runs, so run `i` is container `i`.

use core::fmt;

/// One device granted to one container.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "json", derive(serde::Serialize, serde::Deserialize))]
pub struct ContainerDevice {
    /// Registered device id (AMD SMI UUID, partition id, or NVIDIA UUID).
    pub uuid: String,
    /// Registered product type for AMD (`AMD Instinct MI300X VF`), `NVIDIA` for NVIDIA.
    #[cfg_attr(feature = "json", serde(rename = "type"))]
    pub device_type: String,
    /// Device memory in MiB, percentages already resolved.
    pub mem_mib: u64,
    /// AMD: a CU count. NVIDIA: a percentage of the SMs.
    pub cores: u32,
}

/// The devices of one container, in the order the container sees them.
pub type ContainerDevices = Vec<ContainerDevice>;

/// Separators of the format; no field may contain one.
const FIELD: char = ',';
const DEVICE: char = ':';
const CONTAINER: char = ';';

/// Why a device list could not be written or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceListError {
    /// A field to write contains a separator of the format.
    #[error(
        "container {container}, device {device}: {field} {value:?} contains one of , : ; which the device-list format reserves; rename it"
    )]
    SeparatorInField {
        /// Index of the container's run.
        container: usize,
        /// Index of the device in that run.
        device: usize,
        /// Which field: `device id` or `device type`.
        field: &'static str,
        /// Its value.
        value: String,
    },
    /// A device has an empty id.
    #[error("container {container}, device {device}: the device id is empty")]
    EmptyUuid {
        /// Index of the container's run.
        container: usize,
        /// Index of the device in that run.
        device: usize,
    },
    /// A device entry does not have four fields.
    #[error(
        "container {container}, device {device}: {entry:?} has {found} comma-separated fields, expected 4 (UUID,TYPE,MEM_MiB,CORES)"
    )]
    FieldCount {
        /// Index of the container's run.
        container: usize,
        /// Index of the device in that run.
        device: usize,
        /// The entry as written.
        entry: String,
        /// How many fields it has.
        found: usize,
    },
    /// A numeric field is not a non-negative integer.
    #[error(
        "container {container}, device {device}: {field} {value:?} is not a non-negative integer"
    )]
    BadNumber {
        /// Index of the container's run.
        container: usize,
        /// Index of the device in that run.
        device: usize,
        /// Which field: `memory` or `cores`.
        field: &'static str,
        /// Its value as written.
        value: String,
    },
}

/// Writes the annotation value for a pod, one run per container (init containers first).
pub fn encode_pod_devices(containers: &[ContainerDevices]) -> Result<String, DeviceListError> {
    let mut out = String::new();
    for (container, devices) in containers.iter().enumerate() {
        for (device, dev) in devices.iter().enumerate() {
            check_field(container, device, "device id", &dev.uuid)?;
            if dev.uuid.is_empty() {
                return Err(DeviceListError::EmptyUuid { container, device });
            }
            check_field(container, device, "device type", &dev.device_type)?;
            use fmt::Write as _;
            // Writing into a String cannot fail.
            let _ = write!(
                out,
                "{}{FIELD}{}{FIELD}{}{FIELD}{}{DEVICE}",
                dev.uuid, dev.device_type, dev.mem_mib, dev.cores
            );
        }
        out.push(CONTAINER);
    }
    Ok(out)
}

fn check_field(
    container: usize,
    device: usize,
    field: &'static str,
    value: &str,
) -> Result<(), DeviceListError> {
    if value.contains([FIELD, DEVICE, CONTAINER]) {
        return Err(DeviceListError::SeparatorInField {
            container,
            device,
            field,
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// Reads an annotation value into one run per container.
///
/// The final `;` terminates the last run; a value without it is read as if it were there
/// (older writers). An empty value has no runs.
pub fn decode_pod_devices(text: &str) -> Result<Vec<ContainerDevices>, DeviceListError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let body = text.strip_suffix(CONTAINER).unwrap_or(text);
    body.split(CONTAINER)
        .enumerate()
        .map(|(container, run)| decode_container(container, run))
        .collect()
}

fn decode_container(container: usize, run: &str) -> Result<ContainerDevices, DeviceListError> {
    run.split(DEVICE)
        // The trailing `:` after the last device leaves an empty piece.
        .filter(|entry| !entry.is_empty())
        .enumerate()
        .map(|(device, entry)| decode_device(container, device, entry))
        .collect()
}

fn decode_device(
    container: usize,
    device: usize,
    entry: &str,
) -> Result<ContainerDevice, DeviceListError> {
    let fields: Vec<&str> = entry.split(FIELD).collect();
    let [uuid, device_type, mem, cores] = fields[..] else {
        return Err(DeviceListError::FieldCount {
            container,
            device,
            entry: entry.to_owned(),
            found: fields.len(),
        });
    };
    if uuid.is_empty() {
        return Err(DeviceListError::EmptyUuid { container, device });
    }
    let bad = |field: &'static str, value: &str| DeviceListError::BadNumber {
        container,
        device,
        field,
        value: value.to_owned(),
    };
    let mem_mib = parse_decimal::<u64>(mem).ok_or_else(|| bad("memory", mem))?;
    let cores = parse_decimal::<u32>(cores).ok_or_else(|| bad("cores", cores))?;
    Ok(ContainerDevice {
        uuid: uuid.to_owned(),
        device_type: device_type.to_owned(),
        mem_mib,
        cores,
    })
}

/// Plain ASCII digits only: Rust's integer parser would also take a leading `+`.
fn parse_decimal<T: core::str::FromStr>(value: &str) -> Option<T> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// Index of the first run that still has devices, for consumers that take runs in order
/// (the device plugin's Allocate).
pub fn first_non_empty_run(runs: &[ContainerDevices]) -> Option<usize> {
    runs.iter().position(|run| !run.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn dev(uuid: &str, ty: &str, mem: u64, cores: u32) -> ContainerDevice {
        ContainerDevice {
            uuid: uuid.into(),
            device_type: ty.into(),
            mem_mib: mem,
            cores,
        }
    }

    #[test]
    fn spec_example_init_without_gpu_then_one_app_gpu() {
        let text = ";8eff74b5-0000-1000-801b-b56457addd1b,AMD Instinct MI300X VF,16384,76:;";
        let runs = decode_pod_devices(text).unwrap();
        assert_eq!(
            runs,
            vec![
                vec![],
                vec![dev(
                    "8eff74b5-0000-1000-801b-b56457addd1b",
                    "AMD Instinct MI300X VF",
                    16384,
                    76
                )]
            ]
        );
        assert_eq!(encode_pod_devices(&runs).unwrap(), text);
    }

    #[test]
    fn reference_examples() {
        assert_eq!(
            decode_pod_devices("GPU-aaa,NVIDIA,3000,30:;").unwrap(),
            vec![vec![dev("GPU-aaa", "NVIDIA", 3000, 30)]]
        );
        assert_eq!(
            decode_pod_devices("GPU-a,NVIDIA,0,100:GPU-b,NVIDIA,0,100:;").unwrap(),
            vec![vec![
                dev("GPU-a", "NVIDIA", 0, 100),
                dev("GPU-b", "NVIDIA", 0, 100)
            ]]
        );
    }

    #[test]
    fn full_padding_keeps_indices() {
        let runs = vec![vec![], vec![], vec![dev("A", "AMD X", 1, 2)], vec![]];
        let text = encode_pod_devices(&runs).unwrap();
        assert_eq!(text, ";;A,AMD X,1,2:;;");
        assert_eq!(decode_pod_devices(&text).unwrap(), runs);
        assert_eq!(first_non_empty_run(&runs), Some(2));
        assert_eq!(decode_pod_devices(";").unwrap(), vec![vec![]]);
        assert_eq!(
            decode_pod_devices("").unwrap(),
            Vec::<ContainerDevices>::new()
        );
        // Unterminated last run (older writers).
        assert_eq!(
            decode_pod_devices("A,T,1,2:").unwrap(),
            vec![vec![dev("A", "T", 1, 2)]]
        );
    }

    #[test]
    fn bad_inputs_name_what_is_wrong() {
        let err = decode_pod_devices("A,T,1:;").unwrap_err();
        assert!(
            matches!(err, DeviceListError::FieldCount { found: 3, .. }),
            "{err}"
        );
        // A type with a comma breaks the format: 5 fields.
        assert!(matches!(
            decode_pod_devices("A,AMD, Inc,1,2:;").unwrap_err(),
            DeviceListError::FieldCount { found: 5, .. }
        ));
        for bad in ["A,T,-1,2:;", "A,T,1,x:;", "A,T,,2:;", "A,T,1,99999999999:;"] {
            assert!(
                matches!(
                    decode_pod_devices(bad),
                    Err(DeviceListError::BadNumber { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            decode_pod_devices("A,T,18446744073709551616,1:;"),
            Err(DeviceListError::BadNumber {
                field: "memory",
                ..
            })
        ));
        assert!(matches!(
            decode_pod_devices(";,T,1,2:;"),
            Err(DeviceListError::EmptyUuid {
                container: 1,
                device: 0
            })
        ));
        let err = decode_pod_devices(";;A,T,1,2:B,T:;").unwrap_err();
        assert_eq!(
            err,
            DeviceListError::FieldCount {
                container: 2,
                device: 1,
                entry: "B,T".into(),
                found: 2
            }
        );
        assert!(err.to_string().contains("container 2, device 1"), "{err}");
        // Truncated in the middle of a number still decodes as that number: the format has
        // no checksum, so the caller compares with `*-devices-to-allocate`.
        assert!(decode_pod_devices("A,T,12").is_err());
    }

    #[test]
    fn separators_in_fields_are_refused_on_encode() {
        for ty in ["AMD, Inc", "AMD:X", "AMD;X"] {
            let err = encode_pod_devices(&[vec![dev("A", ty, 1, 1)]]).unwrap_err();
            assert!(
                matches!(err, DeviceListError::SeparatorInField { .. }),
                "{ty}"
            );
            assert!(err.to_string().contains("rename"));
        }
        assert!(matches!(
            encode_pod_devices(&[vec![dev("", "T", 1, 1)]]),
            Err(DeviceListError::EmptyUuid { .. })
        ));
    }

    fn field() -> impl Strategy<Value = String> {
        "[^,:;]{1,20}"
    }

    fn device() -> impl Strategy<Value = ContainerDevice> {
        (field(), "[^,:;]{0,20}", any::<u64>(), any::<u32>()).prop_map(
            |(uuid, device_type, mem_mib, cores)| ContainerDevice {
                uuid,
                device_type,
                mem_mib,
                cores,
            },
        )
    }

    proptest! {
        #[test]
        fn round_trip(runs in prop::collection::vec(prop::collection::vec(device(), 0..4), 0..6)) {
            let text = encode_pod_devices(&runs).unwrap();
            let decoded = decode_pod_devices(&text).unwrap();
            prop_assert_eq!(&decoded, &runs);
            prop_assert_eq!(encode_pod_devices(&decoded).unwrap(), text);
        }

        #[test]
        fn total_on_arbitrary_text(text in ".{0,200}") {
            if let Ok(runs) = decode_pod_devices(&text) {
                // Whatever decodes must encode and decode again to the same value.
                if let Ok(again) = encode_pod_devices(&runs) {
                    prop_assert_eq!(decode_pod_devices(&again).unwrap(), runs);
                }
            }
        }

        #[test]
        fn total_on_format_like_text(text in "[A-Z0-9,:; -]{0,80}") {
            let _ = decode_pod_devices(&text);
        }
    }
}
