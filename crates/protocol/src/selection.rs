//! Pod annotations that steer device choice (SPEC §1): type and uuid include/exclude lists,
//! NUMA and XGMI binding, GPU and node scheduling policies.

use std::collections::BTreeMap;

use crate::names::{Vendor, pod};

/// Why a steering annotation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectionError {
    /// Not a Go boolean.
    #[error("annotation {key}={value:?}: expected true or false")]
    Bool {
        /// The annotation.
        key: &'static str,
        /// Its value.
        value: String,
    },
    /// Not a GPU policy.
    #[error(
        "annotation {key}={value:?}: expected binpack, spread or mutex, optionally with numa (e.g. binpack,numa)"
    )]
    GpuPolicy {
        /// The annotation.
        key: &'static str,
        /// Its value.
        value: String,
    },
    /// Not a node policy.
    #[error("annotation {key}={value:?}: expected binpack or spread")]
    NodePolicy {
        /// The annotation.
        key: &'static str,
        /// Its value.
        value: String,
    },
}

/// Include/exclude rules of one vendor for one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceSelector {
    /// `use-gputype`: only types containing one of these (case-insensitive).
    pub use_types: Vec<String>,
    /// `nouse-gputype`: no type containing one of these (case-insensitive).
    pub nouse_types: Vec<String>,
    /// `use-gpuuuid`: only these ids (exact).
    pub use_uuids: Vec<String>,
    /// `nouse-gpuuuid`: none of these ids (exact).
    pub nouse_uuids: Vec<String>,
    /// All GPUs of a container on one NUMA node.
    pub numa_bind: bool,
    /// AMD: multi-GPU containers only on GPUs that are XGMI peers of each other.
    pub link_bind: bool,
}

fn comma_list(value: Option<&String>) -> Vec<String> {
    value
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Go's `strconv.ParseBool`, which the reference uses for these annotations.
fn parse_bool(key: &'static str, value: Option<&String>) -> Result<bool, SelectionError> {
    match value.map(String::as_str) {
        None => Ok(false),
        Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(true),
        Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(false),
        Some(other) => Err(SelectionError::Bool {
            key,
            value: other.to_owned(),
        }),
    }
}

impl DeviceSelector {
    /// Reads `vendor`'s selection annotations; absent ones select everything.
    pub fn from_annotations(
        vendor: Vendor,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Self, SelectionError> {
        let names = vendor.names();
        Ok(Self {
            use_types: comma_list(annotations.get(names.use_gputype)),
            nouse_types: comma_list(annotations.get(names.nouse_gputype)),
            use_uuids: comma_list(annotations.get(names.use_gpuuuid)),
            nouse_uuids: comma_list(annotations.get(names.nouse_gpuuuid)),
            numa_bind: parse_bool(names.numa_bind, annotations.get(names.numa_bind))?,
            link_bind: match names.link_bind {
                Some(key) => parse_bool(key, annotations.get(key))?,
                None => false,
            },
        })
    }

    /// Case-insensitive substring match, as the reference: included by any `use` entry
    /// (or no `use` list) and by no `nouse` entry.
    pub fn type_allowed(&self, device_type: &str) -> bool {
        // The filter asks this for every GPU of every node: no allocation without rules.
        if self.use_types.is_empty() && self.nouse_types.is_empty() {
            return true;
        }
        let ty = device_type.to_lowercase();
        let hit = |entries: &[String]| entries.iter().any(|e| ty.contains(&e.to_lowercase()));
        (self.use_types.is_empty() || hit(&self.use_types)) && !hit(&self.nouse_types)
    }

    /// Exact match.
    pub fn uuid_allowed(&self, uuid: &str) -> bool {
        (self.use_uuids.is_empty() || self.use_uuids.iter().any(|u| u == uuid))
            && !self.nouse_uuids.iter().any(|u| u == uuid)
    }
}

/// Order in which a node's GPUs are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuPolicyKind {
    /// Most used first: fills cards.
    Binpack,
    /// Least used first (the default).
    #[default]
    Spread,
    /// Only idle cards.
    Mutex,
}

/// How to pick GPUs on a node (`hami.io/gpu-scheduler-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuPolicy {
    /// Binpack, spread or mutex.
    pub kind: GpuPolicyKind,
    /// Prefer keeping a container's GPUs on one NUMA node.
    pub numa: bool,
}

impl GpuPolicy {
    /// Reads the annotation value, e.g. `binpack,numa` (case-insensitive).
    pub fn parse(value: &str) -> Result<Self, SelectionError> {
        let err = || SelectionError::GpuPolicy {
            key: pod::GPU_SCHEDULER_POLICY,
            value: value.to_owned(),
        };
        let mut policy = GpuPolicy::default();
        let mut kind = None;
        for part in value.split(',').map(str::trim) {
            let part_kind = match part.to_ascii_lowercase().as_str() {
                "binpack" => GpuPolicyKind::Binpack,
                "spread" => GpuPolicyKind::Spread,
                "mutex" => GpuPolicyKind::Mutex,
                "numa" if !policy.numa => {
                    policy.numa = true;
                    continue;
                }
                _ => return Err(err()),
            };
            if kind.replace(part_kind).is_some() {
                return Err(err());
            }
        }
        policy.kind = kind.unwrap_or_default();
        Ok(policy)
    }
}

/// How to pick a node (`hami.io/node-scheduler-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodePolicy {
    /// Fill nodes (the default).
    #[default]
    Binpack,
    /// Spread pods across nodes.
    Spread,
}

impl NodePolicy {
    /// Reads the annotation value (case-insensitive).
    pub fn parse(value: &str) -> Result<Self, SelectionError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "binpack" => Ok(NodePolicy::Binpack),
            "spread" => Ok(NodePolicy::Spread),
            _ => Err(SelectionError::NodePolicy {
                key: pod::NODE_SCHEDULER_POLICY,
                value: value.to_owned(),
            }),
        }
    }
}

/// The policies a pod asks for; `None` means "use the scheduler's configured default".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodPolicies {
    /// `hami.io/gpu-scheduler-policy`, when given.
    pub gpu: Option<GpuPolicy>,
    /// `hami.io/node-scheduler-policy`, when given.
    pub node: Option<NodePolicy>,
}

impl PodPolicies {
    /// Reads both annotations from a pod's annotations.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Self, SelectionError> {
        Ok(Self {
            gpu: annotations
                .get(pod::GPU_SCHEDULER_POLICY)
                .map(|v| GpuPolicy::parse(v))
                .transpose()?,
            node: annotations
                .get(pod::NODE_SCHEDULER_POLICY)
                .map(|v| NodePolicy::parse(v))
                .transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn type_and_uuid_filters() {
        let a = annotations(&[
            ("amd.com/use-gputype", "mi300x, MI210"),
            ("amd.com/nouse-gputype", "VF"),
            ("amd.com/use-gpu-uuid", "a,b"),
            ("amd.com/nouse-gpu-uuid", " b "),
            ("amd.com/link-bind", "true"),
        ]);
        let s = DeviceSelector::from_annotations(Vendor::Amd, &a).unwrap();
        assert!(s.type_allowed("AMD Instinct MI300X"));
        assert!(s.type_allowed("AMD Instinct MI210"));
        assert!(!s.type_allowed("AMD Instinct MI300X VF"));
        assert!(!s.type_allowed("AMD Radeon PRO W7900"));
        assert!(s.uuid_allowed("a") && !s.uuid_allowed("b") && !s.uuid_allowed("c"));
        assert!(s.link_bind && !s.numa_bind);
        // NVIDIA keys have no dash before uuid and no link-bind.
        let n = annotations(&[
            ("nvidia.com/use-gpuuuid", "GPU-1"),
            ("nvidia.com/numa-bind", "1"),
        ]);
        let s = DeviceSelector::from_annotations(Vendor::Nvidia, &n).unwrap();
        assert_eq!(s.use_uuids, vec!["GPU-1"]);
        assert!(s.numa_bind);
        let empty = DeviceSelector::from_annotations(
            Vendor::Amd,
            &annotations(&[("amd.com/use-gputype", " ")]),
        )
        .unwrap();
        assert!(empty.type_allowed("anything"));
        let bad = DeviceSelector::from_annotations(
            Vendor::Amd,
            &annotations(&[("amd.com/numa-bind", "yes")]),
        );
        assert!(bad.unwrap_err().to_string().contains("amd.com/numa-bind"));
    }

    #[test]
    fn policies() {
        assert_eq!(
            GpuPolicy::parse("binpack").unwrap(),
            GpuPolicy {
                kind: GpuPolicyKind::Binpack,
                numa: false
            }
        );
        assert_eq!(
            GpuPolicy::parse("binpack,numa").unwrap(),
            GpuPolicy {
                kind: GpuPolicyKind::Binpack,
                numa: true
            }
        );
        assert_eq!(
            GpuPolicy::parse("numa").unwrap(),
            GpuPolicy {
                kind: GpuPolicyKind::Spread,
                numa: true
            }
        );
        assert_eq!(
            GpuPolicy::parse("Mutex").unwrap().kind,
            GpuPolicyKind::Mutex
        );
        for bad in ["", "fast", "binpack,spread", "numa,numa", "binpack,,numa"] {
            assert!(GpuPolicy::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(NodePolicy::parse("spread").unwrap(), NodePolicy::Spread);
        assert!(NodePolicy::parse("mutex").is_err());
        let p = PodPolicies::from_annotations(&annotations(&[(
            "hami.io/gpu-scheduler-policy",
            "spread,numa",
        )]))
        .unwrap();
        assert_eq!(p.gpu.unwrap().kind, GpuPolicyKind::Spread);
        assert_eq!(p.node, None);
        let err =
            PodPolicies::from_annotations(&annotations(&[("hami.io/node-scheduler-policy", "x")]))
                .unwrap_err();
        assert!(err.to_string().contains("hami.io/node-scheduler-policy"));
    }

    proptest! {
        #[test]
        fn total(value in ".{0,30}") {
            let _ = GpuPolicy::parse(&value);
            let _ = NodePolicy::parse(&value);
            let a = annotations(&[("amd.com/numa-bind", &value), ("amd.com/use-gputype", &value)]);
            let _ = DeviceSelector::from_annotations(Vendor::Amd, &a);
        }
    }
}
