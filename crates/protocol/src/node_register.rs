//! The node registration annotation (SPEC §2.1): `hami.io/node-amd-register` and
//! `hami.io/node-nvidia-register`, a JSON array with one object per registered device.
//!
//! The decoder follows the reference where it is contract (every field but `id` may be
//! missing; a missing `health` is false, so the device is never allocated) and is strict
//! where the reference silently misbehaves: numbers must be integers in range, and a type
//! or id containing a device-list separator, or two entries with one id (D-8), are refused
//! with the field named.

use serde::Serialize;
use serde_json::{Map, Value};

/// How a registered device is sliced.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum DeviceMode {
    /// The field is missing or empty.
    #[default]
    Unspecified,
    /// A card sliced in software (AMD CU masks, NVIDIA HAMi-core).
    HamiCore,
    /// One AMD hard compute partition.
    Xcp,
    /// An NVIDIA MIG instance.
    Mig,
    /// An NVIDIA GPU shared through MPS.
    Mps,
    /// A mode this version does not know, kept as written.
    Other(String),
}

impl DeviceMode {
    /// Reads the `mode` field; unknown values are kept, not refused.
    pub fn parse(text: &str) -> Self {
        match text {
            "" => DeviceMode::Unspecified,
            "hami-core" => DeviceMode::HamiCore,
            "xcp" => DeviceMode::Xcp,
            "mig" => DeviceMode::Mig,
            "mps" => DeviceMode::Mps,
            other => DeviceMode::Other(other.to_owned()),
        }
    }

    /// The `mode` field as written.
    pub fn as_str(&self) -> &str {
        match self {
            DeviceMode::Unspecified => "",
            DeviceMode::HamiCore => "hami-core",
            DeviceMode::Xcp => "xcp",
            DeviceMode::Mig => "mig",
            DeviceMode::Mps => "mps",
            DeviceMode::Other(other) => other,
        }
    }
}

/// AMD extras of a registered device (`custominfo`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct CustomInfo {
    /// PCI address of the card.
    #[serde(rename = "pciBDF", skip_serializing_if = "Option::is_none")]
    pub pci_bdf: Option<String>,
    /// 2 on RDNA (CUs come in WGP pairs), 1 otherwise.
    #[serde(rename = "cuPerWGP", skip_serializing_if = "Option::is_none")]
    pub cu_per_wgp: Option<u32>,
    /// KFD `num_cp_queues`.
    #[serde(rename = "computeQueues", skip_serializing_if = "Option::is_none")]
    pub compute_queues: Option<u32>,
    /// PCI addresses of the GPUs this one reaches over XGMI.
    #[serde(rename = "xgmiPeers", skip_serializing_if = "Vec::is_empty")]
    pub xgmi_peers: Vec<String>,
    /// The card's compute partition mode, e.g. `CPX`.
    #[serde(rename = "computePartition", skip_serializing_if = "Option::is_none")]
    pub compute_partition: Option<String>,
    /// The card's memory partition mode, e.g. `NPS1`.
    #[serde(rename = "memoryPartition", skip_serializing_if = "Option::is_none")]
    pub memory_partition: Option<String>,
}

impl CustomInfo {
    fn is_empty(&self) -> bool {
        *self == CustomInfo::default()
    }
}

/// One registered device: a whole card, or one hard partition of it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceInfo {
    /// AMD SMI UUID, partition id (D-8) or NVIDIA UUID.
    pub id: String,
    /// DRM card minor for AMD, NVML index for NVIDIA.
    pub index: u32,
    /// How many pods may share it.
    pub count: u32,
    /// Device memory in MiB (already scaled).
    pub devmem: u64,
    /// AMD: effective CU count. NVIDIA: 100 (× core scaling).
    pub devcore: u32,
    /// Product type; must contain the vendor word to be matched.
    pub device_type: String,
    /// NUMA node, -1 when unknown.
    pub numa: i32,
    /// How the device is sliced.
    pub mode: DeviceMode,
    /// Whether it may be allocated (a missing field reads as false).
    pub health: bool,
    /// `devicevendor`, e.g. `AMD`.
    pub device_vendor: String,
    /// AMD extras (`custominfo`).
    pub custom_info: CustomInfo,
}

/// Why a register annotation could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The value is not JSON; the parser's message.
    #[error("register annotation is not JSON: {0}")]
    Json(String),
    /// The JSON is not an array.
    #[error("register annotation must be a JSON array of device objects")]
    NotArray,
    /// An entry is not an object.
    #[error("device {device}: must be a JSON object")]
    NotObject {
        /// Index of the entry.
        device: usize,
    },
    /// A field is missing, mistyped or out of range.
    #[error("device {device}, field {field:?}: {problem}")]
    Field {
        /// Index of the entry.
        device: usize,
        /// The field's JSON name.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// Two entries share an id (D-8).
    #[error(
        "devices {first} and {second} share the id {id:?}: every registered device needs its own id"
    )]
    DuplicateId {
        /// Index of the first entry.
        first: usize,
        /// Index of the second entry.
        second: usize,
        /// The shared id.
        id: String,
    },
}

/// Reads a register annotation value.
pub fn decode_node_devices(text: &str) -> Result<Vec<DeviceInfo>, RegisterError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| RegisterError::Json(e.to_string()))?;
    let Value::Array(items) = value else {
        return Err(RegisterError::NotArray);
    };
    let devices = items
        .iter()
        .enumerate()
        .map(|(device, item)| {
            let Value::Object(obj) = item else {
                return Err(RegisterError::NotObject { device });
            };
            decode_device(device, obj)
        })
        .collect::<Result<Vec<_>, _>>()?;
    validate(&devices)?;
    Ok(devices)
}

/// Writes a register annotation value, refusing what the decoder would refuse.
pub fn encode_node_devices(devices: &[DeviceInfo]) -> Result<String, RegisterError> {
    validate(devices)?;
    #[derive(Serialize)]
    struct Wire<'a> {
        id: &'a str,
        index: u32,
        count: u32,
        devmem: u64,
        devcore: u32,
        #[serde(rename = "type")]
        device_type: &'a str,
        numa: i32,
        mode: &'a str,
        health: bool,
        devicevendor: &'a str,
        #[serde(skip_serializing_if = "CustomInfo::is_empty")]
        custominfo: &'a CustomInfo,
    }
    let wire: Vec<Wire<'_>> = devices
        .iter()
        .map(|d| Wire {
            id: &d.id,
            index: d.index,
            count: d.count,
            devmem: d.devmem,
            devcore: d.devcore,
            device_type: &d.device_type,
            numa: d.numa,
            mode: d.mode.as_str(),
            health: d.health,
            devicevendor: &d.device_vendor,
            custominfo: &d.custom_info,
        })
        .collect();
    serde_json::to_string(&wire).map_err(|e| RegisterError::Json(e.to_string()))
}

fn validate(devices: &[DeviceInfo]) -> Result<(), RegisterError> {
    for (device, d) in devices.iter().enumerate() {
        let separator = |field: &'static str, value: &str| {
            if value.contains([',', ':', ';']) {
                Err(RegisterError::Field {
                    device,
                    field,
                    problem: format!(
                        "{value:?} contains one of , : ; which pod device lists reserve; rename it"
                    ),
                })
            } else {
                Ok(())
            }
        };
        if d.id.is_empty() {
            return Err(RegisterError::Field {
                device,
                field: "id",
                problem: "must be a non-empty string".into(),
            });
        }
        separator("id", &d.id)?;
        separator("type", &d.device_type)?;
        if let Some(first) = devices[..device].iter().position(|o| o.id == d.id) {
            return Err(RegisterError::DuplicateId {
                first,
                second: device,
                id: d.id.clone(),
            });
        }
    }
    Ok(())
}

fn decode_device(device: usize, obj: &Map<String, Value>) -> Result<DeviceInfo, RegisterError> {
    let fields = Fields { device, obj };
    let custom_info = match obj.get("custominfo") {
        None | Some(Value::Null) => CustomInfo::default(),
        Some(Value::Object(info)) => {
            let info_fields = Fields { device, obj: info };
            CustomInfo {
                pci_bdf: info_fields.opt_string("pciBDF")?,
                cu_per_wgp: info_fields
                    .opt_uint("cuPerWGP", u32::MAX.into())?
                    .map(narrow),
                compute_queues: info_fields
                    .opt_uint("computeQueues", u32::MAX.into())?
                    .map(narrow),
                xgmi_peers: info_fields.string_list("xgmiPeers")?,
                compute_partition: info_fields.opt_string("computePartition")?,
                memory_partition: info_fields.opt_string("memoryPartition")?,
            }
        }
        Some(_) => {
            return Err(RegisterError::Field {
                device,
                field: "custominfo",
                problem: "must be a JSON object".into(),
            });
        }
    };
    Ok(DeviceInfo {
        id: fields.opt_string("id")?.unwrap_or_default(),
        index: narrow(fields.opt_uint("index", u32::MAX.into())?.unwrap_or(0)),
        count: narrow(fields.opt_uint("count", u32::MAX.into())?.unwrap_or(0)),
        devmem: fields.opt_uint("devmem", u64::MAX)?.unwrap_or(0),
        devcore: narrow(fields.opt_uint("devcore", u32::MAX.into())?.unwrap_or(0)),
        device_type: fields.opt_string("type")?.unwrap_or_default(),
        numa: fields.opt_numa()?,
        mode: DeviceMode::parse(&fields.opt_string("mode")?.unwrap_or_default()),
        health: fields.opt_bool("health")?.unwrap_or(false),
        device_vendor: fields.opt_string("devicevendor")?.unwrap_or_default(),
        custom_info,
    })
}

/// Values were range-checked against `u32::MAX` before.
fn narrow(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

struct Fields<'a> {
    device: usize,
    obj: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn err(&self, field: &'static str, problem: String) -> RegisterError {
        RegisterError::Field {
            device: self.device,
            field,
            problem,
        }
    }

    fn present(&self, field: &str) -> Option<&Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    fn opt_string(&self, field: &'static str) -> Result<Option<String>, RegisterError> {
        match self.present(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.err(field, format!("must be a string, got {other}"))),
        }
    }

    fn opt_bool(&self, field: &'static str) -> Result<Option<bool>, RegisterError> {
        match self.present(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.err(field, format!("must be true or false, got {other}"))),
        }
    }

    fn opt_uint(&self, field: &'static str, max: u64) -> Result<Option<u64>, RegisterError> {
        match self.present(field) {
            None => Ok(None),
            Some(value) => match value.as_u64() {
                Some(n) if n <= max => Ok(Some(n)),
                _ => Err(self.err(
                    field,
                    format!("must be an integer between 0 and {max}, got {value}"),
                )),
            },
        }
    }

    fn opt_numa(&self) -> Result<i32, RegisterError> {
        match self.present("numa") {
            None => Ok(0),
            Some(value) => value
                .as_i64()
                .filter(|n| *n >= -1)
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| {
                    self.err(
                        "numa",
                        format!("must be -1 (unknown) or a NUMA node number, got {value}"),
                    )
                }),
        }
    }

    fn string_list(&self, field: &'static str) -> Result<Vec<String>, RegisterError> {
        match self.present(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(self.err(field, format!("must hold strings, got {other}"))),
                })
                .collect(),
            Some(other) => Err(self.err(field, format!("must be a list of strings, got {other}"))),
        }
    }
}

/// Default share count of an AMD card (SPEC §2.1): 2 on gfx12, else 10.
pub fn default_amd_share_count(gfx_target_version: u32) -> u32 {
    if (120_000..=129_999).contains(&gfx_target_version) {
        2
    } else {
        10
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mi300x() -> DeviceInfo {
        DeviceInfo {
            id: "8eff74b5-0000-1000-801b-b56457addd1b".into(),
            index: 1,
            count: 10,
            devmem: 196_288,
            devcore: 304,
            device_type: "AMD Instinct MI300X VF".into(),
            numa: 0,
            mode: DeviceMode::HamiCore,
            health: true,
            device_vendor: "AMD".into(),
            custom_info: CustomInfo {
                pci_bdf: Some("0000:83:00.0".into()),
                cu_per_wgp: Some(1),
                compute_queues: Some(24),
                xgmi_peers: vec!["0000:03:00.0".into()],
                compute_partition: Some("SPX".into()),
                memory_partition: Some("NPS1".into()),
            },
        }
    }

    #[test]
    fn reference_plugin_output_decodes() {
        // Exact output of the reference AMD plugin (card1, NUMA 0 omitted, no mode).
        let text = r#"[{"id":"8eff74b5-0000-1000-801b-b56457addd1b","index":1,"count":10,"devmem":196288,"devcore":304,"type":"AMD Instinct MI300X VF","health":true,"devicevendor":"amd","custominfo":{"pciBDF":"0000:83:00.0"}}]"#;
        let devices = decode_node_devices(text).unwrap();
        assert_eq!(devices.len(), 1);
        let d = &devices[0];
        assert_eq!(
            (d.index, d.count, d.devmem, d.devcore, d.numa),
            (1, 10, 196_288, 304, 0)
        );
        assert_eq!(d.mode, DeviceMode::Unspecified);
        assert!(d.health);
        assert_eq!(d.custom_info.pci_bdf.as_deref(), Some("0000:83:00.0"));
        // NVIDIA shape of the reference, with extra keys we do not model.
        let nv = r#"[{"id":"GPU-xxxx","index":0,"count":10,"devmem":32768,"devcore":100,"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":0,"mode":"hami-core","health":true,"migProfiles":null}]"#;
        assert_eq!(
            decode_node_devices(nv).unwrap()[0].mode,
            DeviceMode::HamiCore
        );
    }

    #[test]
    fn missing_health_is_false() {
        let devices = decode_node_devices(r#"[{"id":"a"}]"#).unwrap();
        assert!(!devices[0].health);
        assert_eq!(devices[0].count, 0);
        assert_eq!(decode_node_devices("[]").unwrap(), vec![]);
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let devices = vec![
            mi300x(),
            DeviceInfo {
                id: "GPU-0000000000000001-3".into(),
                mode: DeviceMode::Xcp,
                count: 1,
                numa: -1,
                ..mi300x()
            },
        ];
        let text = encode_node_devices(&devices).unwrap();
        assert!(text.contains(r#""health":true"#));
        assert!(text.contains(r#""xgmiPeers":["0000:03:00.0"]"#));
        assert_eq!(decode_node_devices(&text).unwrap(), devices);
    }

    #[test]
    fn bad_inputs_name_the_field() {
        let cases: &[(&str, &str)] = &[
            ("", "not JSON"),
            ("[", "not JSON"),
            (r#"{"id":"a"}"#, "JSON array"),
            (r#"[1]"#, "device 0: must be a JSON object"),
            (r#"[{}]"#, "\"id\""),
            (r#"[{"id":""}]"#, "\"id\""),
            (r#"[{"id":"a","count":-1}]"#, "\"count\""),
            (r#"[{"id":"a","count":1.5}]"#, "\"count\""),
            (r#"[{"id":"a","count":"10"}]"#, "\"count\""),
            (r#"[{"id":"a","devcore":99999999999}]"#, "\"devcore\""),
            (r#"[{"id":"a","devmem":1e30}]"#, "\"devmem\""),
            (r#"[{"id":"a","numa":-2}]"#, "\"numa\""),
            (r#"[{"id":"a","health":"true"}]"#, "\"health\""),
            (r#"[{"id":"a","type":"AMD, Inc"}]"#, "rename it"),
            (r#"[{"id":"a:b"}]"#, "\"id\""),
            (r#"[{"id":"a","custominfo":[]}]"#, "\"custominfo\""),
            (
                r#"[{"id":"a","custominfo":{"xgmiPeers":"x"}}]"#,
                "\"xgmiPeers\"",
            ),
            (
                r#"[{"id":"a","custominfo":{"cuPerWGP":-2}}]"#,
                "\"cuPerWGP\"",
            ),
            (r#"[{"id":"a"},{"id":"a"}]"#, "share the id"),
        ];
        for (input, expected) in cases {
            let message = decode_node_devices(input).unwrap_err().to_string();
            assert!(message.contains(expected), "{input}: {message}");
        }
        let mut bad = mi300x();
        bad.device_type = "AMD;X".into();
        assert!(encode_node_devices(&[bad]).is_err());
    }

    #[test]
    fn share_count_defaults() {
        assert_eq!(default_amd_share_count(120_001), 2);
        assert_eq!(default_amd_share_count(90_402), 10);
        assert_eq!(default_amd_share_count(110_000), 10);
    }

    fn device() -> impl Strategy<Value = DeviceInfo> {
        (
            "[a-zA-Z0-9-]{1,36}",
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            "[^,:;]{0,30}",
            -1i32..8,
            any::<bool>(),
            prop::option::of(1u32..3),
            prop::collection::vec("[0-9a-f:.]{12}", 0..3),
        )
            .prop_map(
                |(id, index, count, devmem, devcore, ty, numa, health, wgp, peers)| DeviceInfo {
                    id,
                    index,
                    count,
                    devmem,
                    devcore,
                    device_type: ty,
                    numa,
                    mode: DeviceMode::HamiCore,
                    health,
                    device_vendor: "AMD".into(),
                    custom_info: CustomInfo {
                        cu_per_wgp: wgp,
                        xgmi_peers: peers,
                        ..CustomInfo::default()
                    },
                },
            )
    }

    proptest! {
        #[test]
        fn round_trip(devices in prop::collection::vec(device(), 0..5)) {
            // Ids must be unique to be valid.
            let mut seen = std::collections::HashSet::new();
            let devices: Vec<_> = devices.into_iter().filter(|d| seen.insert(d.id.clone())).collect();
            let text = encode_node_devices(&devices).unwrap();
            let back = decode_node_devices(&text).unwrap();
            prop_assert_eq!(&back, &devices);
            prop_assert_eq!(encode_node_devices(&back).unwrap(), text);
        }

        #[test]
        fn total(text in ".{0,200}") {
            let _ = decode_node_devices(&text);
        }

        #[test]
        fn total_on_json_like(text in r#"[\[\]{}":,a-z0-9 -]{0,80}"#) {
            let _ = decode_node_devices(&text);
        }
    }
}
