//! What a node offers (its registered GPUs) and how much of each GPU is taken.

use std::collections::BTreeMap;
use std::sync::Arc;

use hami_protocol::dra;
use hami_protocol::names::Vendor;
use hami_protocol::node_register::{DeviceInfo, decode_node_devices};
use k8s_openapi::api::core::v1::Node;

use crate::fit::refusal;
use crate::usage::DeviceCharge;

/// A registered GPU (a whole card or one hard partition) of one vendor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Whose register annotation it came from.
    pub vendor: Vendor,
    /// The registered device.
    pub info: DeviceInfo,
}

/// The GPUs a node registered, decoded once per annotation change and shared.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeDevices {
    /// The node's name.
    pub name: String,
    /// Every vendor's GPUs, in annotation order.
    pub gpus: Vec<Gpu>,
    /// Register annotations that did not decode; the node offers nothing of that vendor
    /// and filter reports why.
    pub register_errors: Vec<(Vendor, String)>,
    /// The refusal label of each register error (`fit::refusal`), for the metrics.
    pub register_labels: Vec<(Vendor, &'static str)>,
}

impl NodeDevices {
    /// Reads the register annotations of a node.
    pub fn from_annotations(name: &str, annotations: &BTreeMap<String, String>) -> Self {
        let mut devices = NodeDevices {
            name: name.to_owned(),
            ..Default::default()
        };
        for vendor in Vendor::ALL {
            let key = vendor.names().node_register;
            let Some(text) = annotations.get(key) else {
                continue;
            };
            match decode_node_devices(text) {
                Ok(list) => devices
                    .gpus
                    .extend(list.into_iter().map(|info| Gpu { vendor, info })),
                Err(err) => devices.push_register_error(
                    vendor,
                    refusal::REGISTER_INVALID,
                    format!("annotation {key} does not decode: {err}"),
                ),
            }
        }
        devices
    }

    /// Reads a node: its register annotations, then withdraws every vendor whose device
    /// plugin is not serving on it ([`withdrawn`]).
    pub fn from_node(node: &Node) -> Self {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let mut devices = Self::from_annotations(name, &annotations);
        // A DRA node serves AMD GPUs as ResourceSlices, never through this extender: say so,
        // and count it as such, rather than "node unregistered", when a device-plugin pod
        // is refused there. The label wins over a register annotation still there (a node
        // switched to DRA before its device plugin's annotation went stale): the DRA driver
        // allocates those GPUs now, and two allocators on one GPU would over-commit it.
        let dra = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(dra::AMD_MODE_LABEL))
            .is_some_and(|v| v == dra::AMD_MODE_DRA);
        if dra {
            devices.gpus.retain(|g| g.vendor != Vendor::Amd);
            devices.register_errors.retain(|(v, _)| *v != Vendor::Amd);
            devices.register_labels.retain(|(v, _)| *v != Vendor::Amd);
            devices.push_register_error(
                Vendor::Amd,
                refusal::NODE_DRA_MODE,
                format!(
                    "node serves AMD GPUs through the DRA driver (label {label}={dra}), not the device plugin: annotate the pod {annotation}: {dra} to run it there, or leave it to a node without that label",
                    label = dra::AMD_MODE_LABEL,
                    dra = dra::AMD_MODE_DRA,
                    annotation = dra::AMD_MODE_ANNOTATION,
                ),
            );
        }
        for vendor in Vendor::ALL {
            if let Some(why) = withdrawn(node, vendor)
                && devices.offers(vendor)
            {
                devices.gpus.retain(|g| g.vendor != vendor);
                devices.push_register_error(vendor, refusal::PLUGIN_NOT_SERVING, why);
            }
        }
        devices
    }

    /// Whether the node registered any GPU of `vendor`.
    pub fn offers(&self, vendor: Vendor) -> bool {
        self.gpus.iter().any(|g| g.vendor == vendor)
    }

    /// Records why `vendor` is not offered, with its refusal label.
    pub fn push_register_error(&mut self, vendor: Vendor, label: &'static str, why: String) {
        self.register_errors.push((vendor, why));
        self.register_labels.push((vendor, label));
    }

    /// The refusal label of `vendor`'s register error (`RegisterInvalid` when none was given).
    pub fn register_label(&self, vendor: Vendor) -> &'static str {
        self.register_labels
            .iter()
            .find(|(v, _)| *v == vendor)
            .map_or(refusal::REGISTER_INVALID, |(_, l)| *l)
    }

    /// Why `vendor`'s register annotation did not decode, if it did not.
    pub fn register_error(&self, vendor: Vendor) -> Option<&str> {
        self.register_errors
            .iter()
            .find(|(v, _)| *v == vendor)
            .map(|(_, e)| e.as_str())
    }
}

/// The node's count resource of `vendor` (`amd.com/gpu`, `nvidia.com/gpu`) as kubelet
/// reports it: `status.allocatable`, or `status.capacity` where allocatable is not given.
pub fn kubelet_count(node: &Node, vendor: Vendor) -> Option<String> {
    let status = node.status.as_ref()?;
    let key = vendor.names().resource_count;
    status
        .allocatable
        .as_ref()
        .and_then(|a| a.get(key))
        .or_else(|| status.capacity.as_ref().and_then(|c| c.get(key)))
        .map(|q| q.0.trim().to_owned())
}

/// Whether the node must not be offered for `vendor` although its register annotation
/// lists GPUs, and why. Rule: kubelet reports the vendor's count resource as 0. Kubelet
/// sets it from the device plugin's ListAndWatch and drops it to 0 when the plugin is
/// gone or reports every device unhealthy, so a dead plugin's annotation, which nobody
/// removes, no longer attracts pods. A node that reports no such resource at all (a
/// plugin that registered only annotations, test nodes) is judged by the annotation alone.
pub fn withdrawn(node: &Node, vendor: Vendor) -> Option<String> {
    let count = kubelet_count(node, vendor)?;
    (count.parse::<i64>() == Ok(0)).then(|| {
        format!(
            "node reports {} allocatable 0: its {} device plugin is not serving (not registered with kubelet, or every device unhealthy)",
            vendor.names().resource_count,
            vendor.word()
        )
    })
}

/// How much of one GPU is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuUsage {
    /// Pods (slots) sharing it.
    pub used: u32,
    /// MiB reserved.
    pub mem_mib: u64,
    /// CUs for AMD, percent for NVIDIA.
    pub cores: u64,
}

/// A node's GPUs with their usage, the input of [`crate::fit`].
#[derive(Debug, Clone)]
pub struct NodeSnapshot {
    /// The node's registered GPUs (shared with the state).
    pub devices: Arc<NodeDevices>,
    /// Same order as `devices.gpus`.
    pub usage: Vec<GpuUsage>,
    /// Same order: held whole by a pod the scheduler did not place ([`Self::hold_whole`]),
    /// so fit can say why (`CardHeldWhole`) rather than "no share left".
    pub held_whole: Vec<bool>,
}

impl NodeSnapshot {
    /// The node with nothing taken.
    pub fn idle(devices: Arc<NodeDevices>) -> Self {
        let usage = vec![GpuUsage::default(); devices.gpus.len()];
        let held_whole = vec![false; devices.gpus.len()];
        Self {
            devices,
            usage,
            held_whole,
        }
    }

    /// Adds a pod's charges; charges on unknown device ids are returned (a GPU vanished
    /// or was renamed: worth a log line, never a panic).
    pub fn charge<'a>(&mut self, charges: &'a [DeviceCharge]) -> Vec<&'a str> {
        let mut unknown = Vec::new();
        for charge in charges {
            match self
                .devices
                .gpus
                .iter()
                .position(|g| g.info.id == charge.uuid)
            {
                Some(i) => {
                    let u = &mut self.usage[i];
                    u.used = u.used.saturating_add(charge.slots);
                    u.mem_mib = u.mem_mib.saturating_add(charge.mem_mib);
                    u.cores = u.cores.saturating_add(charge.cores);
                }
                None => unknown.push(charge.uuid.as_str()),
            }
        }
        unknown
    }

    /// Marks `cards` held whole by a pod the scheduler did not place (issue 26 item 1,
    /// `hami_protocol::whole_cards`): each is full — every share, all its memory and cores
    /// taken — so no slice is ever offered on it. Ids this node does not register are
    /// returned (worth a log line).
    pub fn hold_whole<'a>(&mut self, cards: &'a [String]) -> Vec<&'a str> {
        let mut unknown = Vec::new();
        for card in cards {
            match self.devices.gpus.iter().position(|g| g.info.id == *card) {
                Some(i) => {
                    let info = &self.devices.gpus[i].info;
                    let u = &mut self.usage[i];
                    u.used = u.used.max(info.count).max(1);
                    u.mem_mib = u.mem_mib.max(info.devmem);
                    u.cores = u.cores.max(u64::from(info.devcore));
                    self.held_whole[i] = true;
                }
                None => unknown.push(card.as_str()),
            }
        }
        unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(status: serde_json::Value) -> Node {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n", "annotations": {
            "hami.io/node-amd-register": r#"[{"id":"G","count":10,"devmem":1000,"devcore":100,"type":"AMD X","health":true}]"#,
            "hami.io/node-nvidia-register": r#"[{"id":"GPU-1","count":10,"devmem":1000,"devcore":100,"type":"NVIDIA-A100","health":true}]"#}},
            "status": status}))
        .unwrap()
    }

    #[test]
    fn a_vendor_whose_kubelet_count_is_zero_is_withdrawn() {
        use serde_json::json;
        let both = NodeDevices::from_node(&node(json!({})));
        assert!(both.offers(Vendor::Amd) && both.offers(Vendor::Nvidia));
        let n = node(json!({"allocatable": {"amd.com/gpu": "0", "nvidia.com/gpu": "10"}}));
        let d = NodeDevices::from_node(&n);
        assert!(!d.offers(Vendor::Amd) && d.offers(Vendor::Nvidia));
        assert!(
            d.register_error(Vendor::Amd)
                .unwrap()
                .contains("amd.com/gpu allocatable 0")
        );
        // Capacity counts where allocatable is not reported.
        let n = node(json!({"capacity": {"nvidia.com/gpu": "0"}}));
        assert!(!NodeDevices::from_node(&n).offers(Vendor::Nvidia));
        // Allocatable wins over capacity.
        let n =
            node(json!({"capacity": {"amd.com/gpu": "0"}, "allocatable": {"amd.com/gpu": "80"}}));
        assert!(NodeDevices::from_node(&n).offers(Vendor::Amd));
    }

    #[test]
    fn a_dra_node_says_why_it_takes_no_device_plugin_pod() {
        use serde_json::json;
        let dra_node = |annotations: serde_json::Value| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "d",
                "labels": {"hami.io/amd-mode": "dra"}, "annotations": annotations}}))
            .unwrap()
        };
        let d = NodeDevices::from_node(&dra_node(json!({})));
        assert!(!d.offers(Vendor::Amd));
        let why = d.register_error(Vendor::Amd).unwrap();
        assert!(
            why.contains("DRA driver") && why.contains("hami.io/amd-mode: dra"),
            "{why}"
        );
        assert_eq!(d.register_label(Vendor::Amd), refusal::NODE_DRA_MODE);
        // Its NVIDIA GPUs are unaffected; a node without the label stays "unregistered".
        let nv = r#"[{"id":"GPU-1","count":10,"devmem":1000,"devcore":100,"type":"NVIDIA-A100","health":true}]"#;
        let d = NodeDevices::from_node(&dra_node(json!({"hami.io/node-nvidia-register": nv})));
        assert!(d.offers(Vendor::Nvidia) && d.register_error(Vendor::Nvidia).is_none());
        assert!(
            d.register_error(Vendor::Amd)
                .unwrap()
                .contains("DRA driver")
        );
        // A register annotation left from the device plugin does not bring the GPUs back,
        // nor does a broken one change the reason.
        let amd =
            r#"[{"id":"G","count":10,"devmem":1000,"devcore":100,"type":"AMD X","health":true}]"#;
        for left in [amd, "not json"] {
            let d = NodeDevices::from_node(&dra_node(json!({"hami.io/node-amd-register": left})));
            assert!(!d.offers(Vendor::Amd), "{left}");
            assert_eq!(
                d.register_label(Vendor::Amd),
                refusal::NODE_DRA_MODE,
                "{left}"
            );
            assert!(
                d.register_error(Vendor::Amd)
                    .unwrap()
                    .contains("DRA driver")
            );
        }
        let plain: Node = serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
        assert!(
            NodeDevices::from_node(&plain)
                .register_error(Vendor::Amd)
                .is_none()
        );
    }

    #[test]
    fn bad_register_annotation_is_recorded_not_fatal() {
        let mut a = BTreeMap::new();
        a.insert(
            "hami.io/node-amd-register".to_string(),
            "[{\"id\":\"x\",\"count\":-1}]".to_string(),
        );
        a.insert(
            "hami.io/node-nvidia-register".to_string(),
            r#"[{"id":"GPU-1","count":10,"devmem":1000,"devcore":100,"type":"NVIDIA-A100","health":true}]"#.to_string(),
        );
        let d = NodeDevices::from_annotations("n", &a);
        assert!(d.offers(Vendor::Nvidia) && !d.offers(Vendor::Amd));
        assert!(d.register_error(Vendor::Amd).unwrap().contains("\"count\""));
        let mut snap = NodeSnapshot::idle(Arc::new(d));
        let charges = [
            DeviceCharge {
                uuid: "GPU-1".into(),
                slots: 1,
                mem_mib: 10,
                cores: 5,
            },
            DeviceCharge {
                uuid: "gone".into(),
                slots: 1,
                mem_mib: 10,
                cores: 5,
            },
        ];
        assert_eq!(snap.charge(&charges), vec!["gone"]);
        // A card held whole is full, whatever slices say; unknown ids are returned.
        let mut held = snap.clone();
        assert_eq!(
            held.hold_whole(&["GPU-1".into(), "nope".into()]),
            vec!["nope"]
        );
        assert_eq!(
            held.usage[0],
            GpuUsage {
                used: 10,
                mem_mib: 1000,
                cores: 100
            }
        );
        assert_eq!(
            snap.usage[0],
            GpuUsage {
                used: 1,
                mem_mib: 10,
                cores: 5
            }
        );
    }
}
