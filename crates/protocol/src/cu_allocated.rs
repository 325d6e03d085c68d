//! `hami.io/amd-cu-allocated` (SPEC §2.3): JSON object, registered device id → CU ID list,
//! keys sorted. It is the pod-level union of the CUs its containers were given; the union
//! over the live pods of a node is what is taken on each GPU.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::cu_list::{CuListError, CuSet};

/// CUs per device id. `BTreeMap` keeps the keys sorted as the wire format requires.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CuAllocation(pub BTreeMap<String, CuSet>);

/// Why a `hami.io/amd-cu-allocated` value was refused; each names the device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CuAllocatedError {
    /// The value is not JSON; the parser's message.
    #[error("hami.io/amd-cu-allocated is not JSON: {0}")]
    Json(String),
    /// The JSON is not an object.
    #[error("hami.io/amd-cu-allocated must be a JSON object of device id to CU list")]
    NotObject,
    /// A device's value is not a string.
    #[error("hami.io/amd-cu-allocated[{device:?}]: must be a CU list string such as \"0-75\"")]
    NotString {
        /// The device id.
        device: String,
    },
    /// A device's CU list is malformed.
    #[error("hami.io/amd-cu-allocated[{device:?}]: {source}")]
    List {
        /// The device id.
        device: String,
        /// What is wrong with its list.
        #[source]
        source: CuListError,
    },
    /// A key is the empty string.
    #[error("hami.io/amd-cu-allocated[{device:?}]: an empty device id")]
    EmptyId {
        /// The (empty) key.
        device: String,
    },
    /// [`CuAllocation::add`] was given CUs the device already holds.
    #[error("CUs {overlap} of device {device:?} are given twice")]
    Overlap {
        /// The device id.
        device: String,
        /// The CUs given twice, as a CU list.
        overlap: String,
    },
}

impl CuAllocation {
    /// Decodes the annotation; CU ids are not checked against a GPU's size here (callers do).
    pub fn parse(text: &str) -> Result<Self, CuAllocatedError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| CuAllocatedError::Json(e.to_string()))?;
        let Value::Object(map) = value else {
            return Err(CuAllocatedError::NotObject);
        };
        let mut out = BTreeMap::new();
        for (device, list) in map {
            if device.is_empty() {
                return Err(CuAllocatedError::EmptyId { device });
            }
            let Value::String(list) = list else {
                return Err(CuAllocatedError::NotString { device });
            };
            // The GPU's size is not known here; callers check ids against devcore.
            let set = CuSet::parse(&list, u32::MAX).map_err(|source| CuAllocatedError::List {
                device: device.clone(),
                source,
            })?;
            out.insert(device, set);
        }
        Ok(Self(out))
    }

    /// The annotation value: keys sorted, devices with no CUs left out.
    pub fn encode(&self) -> String {
        let map: serde_json::Map<String, Value> = self
            .0
            .iter()
            .filter(|(_, set)| !set.is_empty())
            .map(|(device, set)| (device.clone(), Value::String(set.to_string())))
            .collect();
        Value::Object(map).to_string()
    }

    /// Adds `set` to `device`, refusing CUs that are already there.
    pub fn add(&mut self, device: &str, set: &CuSet) -> Result<(), CuAllocatedError> {
        let entry = self.0.entry(device.to_owned()).or_default();
        let shared = entry.intersection(set);
        if !shared.is_empty() {
            return Err(CuAllocatedError::Overlap {
                device: device.to_owned(),
                overlap: shared.to_string(),
            });
        }
        *entry = entry.union(set);
        Ok(())
    }

    /// Every CU id lies below the device's `devcore` (from the register annotation).
    pub fn check_bounds(
        &self,
        devcore_of: impl Fn(&str) -> Option<u32>,
    ) -> Result<(), CuAllocatedError> {
        for (device, set) in &self.0 {
            let devcore = devcore_of(device).unwrap_or(0);
            if let Some(max) = set.max()
                && max >= devcore
            {
                return Err(CuAllocatedError::List {
                    device: device.clone(),
                    source: CuListError::OutOfRange {
                        id: max.into(),
                        devcore,
                    },
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn spec_example() {
        let text = r#"{"8eff74b5-0000-1000-801b-b56457addd1b":"0-75"}"#;
        let alloc = CuAllocation::parse(text).unwrap();
        assert_eq!(alloc.encode(), text);
        let two = CuAllocation::parse(r#"{"B":"0","A":"0-3,8,10-12"}"#).unwrap();
        assert_eq!(two.encode(), r#"{"A":"0-3,8,10-12","B":"0"}"#);
        assert_eq!(CuAllocation::parse("{}").unwrap().encode(), "{}");
    }

    #[test]
    fn add_refuses_overlap() {
        let mut alloc = CuAllocation::default();
        alloc.add("A", &CuSet::range(0, 76)).unwrap();
        alloc.add("A", &CuSet::range(76, 76)).unwrap();
        assert_eq!(alloc.encode(), r#"{"A":"0-151"}"#);
        let err = alloc.add("A", &CuSet::range(150, 4)).unwrap_err();
        assert_eq!(
            err,
            CuAllocatedError::Overlap {
                device: "A".into(),
                overlap: "150-151".into()
            }
        );
        assert_eq!(alloc.encode(), r#"{"A":"0-151"}"#, "nothing half-written");
    }

    #[test]
    fn bounds() {
        let alloc = CuAllocation::parse(r#"{"A":"0-303","B":"0-400"}"#).unwrap();
        let devcore = |id: &str| (id == "A" || id == "B").then_some(304);
        assert!(
            matches!(alloc.check_bounds(devcore), Err(CuAllocatedError::List { device, .. }) if device == "B")
        );
        assert!(
            CuAllocation::parse(r#"{"C":"0"}"#)
                .unwrap()
                .check_bounds(devcore)
                .is_err()
        );
    }

    #[test]
    fn bad_inputs() {
        for (input, expected) in [
            ("", "not JSON"),
            ("[]", "JSON object"),
            (r#"{"A":1}"#, "CU list string"),
            (r#"{"A":""}"#, "empty"),
            (r#"{"A":"3-1"}"#, "backwards"),
            (r#"{"A":"x"}"#, "not N or A-B"),
            (r#"{"":"1"}"#, "empty device id"),
            (r#"{"A":"0-99999999999999"}"#, "outside"),
        ] {
            let message = CuAllocation::parse(input).unwrap_err().to_string();
            assert!(message.contains(expected), "{input}: {message}");
        }
    }

    proptest! {
        #[test]
        fn round_trip(entries in prop::collection::btree_map("[a-f0-9-]{1,12}", (0u32..300, 1u32..20), 0..4)) {
            let alloc = CuAllocation(entries.into_iter().map(|(k, (a, n))| (k, CuSet::range(a, n))).collect());
            let text = alloc.encode();
            let back = CuAllocation::parse(&text).unwrap();
            prop_assert_eq!(&back, &alloc);
            prop_assert_eq!(back.encode(), text);
        }

        #[test]
        fn total(text in ".{0,80}") {
            let _ = CuAllocation::parse(&text);
        }
    }
}
