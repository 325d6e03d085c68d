//! The CUs in use on a node (SPEC §4): the union of `hami.io/amd-cu-allocated` of the live
//! pods (not Succeeded/Failed) the scheduler placed (D-4: on any other pod the annotation is
//! forged and counts for nothing). Fail closed: two pods holding the same CU stop
//! allocation with both named, rather than risk handing a CU out twice. A malformed
//! annotation does not block the node: that pod is skipped (the shell records an Event
//! naming it) and, so that none of its CUs is handed out twice, every device its
//! `hami.io/amd-devices-allocated` names counts as fully used.

use hami_protocol::cu_allocated::{CuAllocatedError, CuAllocation};
use hami_protocol::cu_list::CuSet;
use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::names::pod as pod_keys;
use hami_protocol::node_lock::PodRef;
use hami_protocol::placement::placed_by_scheduler;
use k8s_openapi::api::core::v1::Pod;

/// One pod as the usage rebuild sees it.
#[derive(Debug, Clone, Copy)]
pub struct PodCus<'a> {
    /// Namespace and name.
    pub pod: &'a PodRef,
    /// `status.phase`.
    pub phase: Option<&'a str>,
    /// `hami.io/amd-cu-allocated`, when the scheduler placed the pod.
    pub cu_allocated: Option<&'a str>,
    /// `hami.io/amd-devices-allocated` (whose devices a malformed pod holds).
    pub allocated: Option<&'a str>,
}

/// A pod whose annotation could not be read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedPod {
    /// Namespace and name.
    pub pod: PodRef,
    /// Why its annotation was not read.
    pub reason: String,
}

/// The node's CUs in use and the pods left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// CUs held, per registered device id.
    pub used: CuAllocation,
    /// Pods left out because their annotation is unreadable.
    pub skipped: Vec<SkippedPod>,
}

impl<'a> PodCus<'a> {
    /// `pod` as the usage sees it: its CU annotation only when the scheduler named
    /// `scheduler_name` placed it (`placement::placed_by_scheduler`).
    pub fn of(pod: &'a Pod, pod_ref: &'a PodRef, scheduler_name: &str) -> PodCus<'a> {
        PodCus {
            pod: pod_ref,
            phase: pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            cu_allocated: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(pod_keys::AMD_CU_ALLOCATED))
                .map(String::as_str)
                .filter(|_| placed_by_scheduler(pod, scheduler_name)),
            allocated: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(hami_protocol::names::AMD.devices_allocated))
                .map(String::as_str)
                .filter(|_| placed_by_scheduler(pod, scheduler_name)),
        }
    }
}

/// Why the node's CU usage cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    /// A pod's `hami.io/amd-cu-allocated` cannot be read.
    #[error("pod {pod}: {source}")]
    Malformed {
        /// The pod.
        pod: PodRef,
        /// What is wrong with it.
        #[source]
        source: Box<CuAllocatedError>,
    },
    /// Two pods hold one CU.
    #[error("pods {} and {} both hold CUs {} of device {}: fix or delete one of them", .0.first, .0.second, .0.overlap, .0.device)]
    Overlap(Box<OverlapInfo>),
}

/// Two pods holding the same CUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlapInfo {
    /// One pod.
    pub first: PodRef,
    /// The other pod.
    pub second: PodRef,
    /// The registered device id.
    pub device: String,
    /// The CUs both hold, as a CU list.
    pub overlap: String,
}

/// Union of the CUs held by live pods other than `exclude`. `devcore(id)` is the CU count
/// of a device of this node (for the devices of a skipped pod).
pub fn cus_in_use<'a>(
    pods: impl IntoIterator<Item = PodCus<'a>>,
    exclude: Option<&PodRef>,
    devcore: impl Fn(&str) -> Option<u32>,
) -> Result<Usage, UsageError> {
    let mut total = CuAllocation::default();
    let mut skipped = Vec::new();
    let mut reserved: Vec<(String, CuSet)> = Vec::new();
    let mut owners: Vec<(&PodRef, CuAllocation)> = Vec::new();
    for p in pods {
        if Some(p.pod) == exclude || matches!(p.phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let Some(text) = p.cu_allocated.filter(|t| !t.trim().is_empty()) else {
            continue;
        };
        let alloc = match CuAllocation::parse(text) {
            Ok(a) => a,
            Err(source) => {
                let err = UsageError::Malformed {
                    pod: p.pod.clone(),
                    source: Box::new(source),
                };
                let devices: Vec<String> = p
                    .allocated
                    .and_then(|t| decode_pod_devices(t).ok())
                    .map(|runs| runs.into_iter().flatten().map(|d| d.uuid).collect())
                    .unwrap_or_default();
                for id in &devices {
                    if let Some(n) = devcore(id).filter(|n| *n > 0) {
                        reserved.push((id.clone(), CuSet::range(0, n)));
                    }
                }
                skipped.push(SkippedPod {
                    pod: p.pod.clone(),
                    reason: format!(
                        "{err}; its CUs are unknown, so its devices ({}) count as fully used until the annotation is fixed or the pod ends",
                        if devices.is_empty() {
                            "none named".to_owned()
                        } else {
                            devices.join(", ")
                        }
                    ),
                });
                continue;
            }
        };
        for (device, set) in &alloc.0 {
            if let Some(existing) = total.0.get(device)
                && existing.overlaps(set)
            {
                let (first, _) = owners
                    .iter()
                    .find(|(_, a)| a.0.get(device).is_some_and(|s| s.overlaps(set)))
                    .map(|(pod, a)| (*pod, a))
                    .unwrap_or((p.pod, &alloc));
                return Err(UsageError::Overlap(Box::new(OverlapInfo {
                    first: first.clone(),
                    second: p.pod.clone(),
                    device: device.clone(),
                    overlap: existing.intersection(set).to_string(),
                })));
            }
            let merged = total
                .0
                .get(device)
                .map(|e| e.union(set))
                .unwrap_or_else(|| set.clone());
            total.0.insert(device.clone(), merged);
        }
        owners.push((p.pod, alloc));
    }
    for (id, all) in reserved {
        let merged = total.0.get(&id).map(|e| e.union(&all)).unwrap_or(all);
        total.0.insert(id, merged);
    }
    Ok(Usage {
        used: total,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forged_annotations_on_pods_the_scheduler_did_not_place_count_for_nothing() {
        let make = |spec: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ns",
                    "annotations": {"hami.io/amd-cu-allocated": r#"{"G":"0-103"}"#}},
                "spec": spec, "status": {"phase": "Running"}}))
            .unwrap()
        };
        let r = PodRef::new("ns", "p");
        // The forgery of issue 17: a pod with no GPU request holding every CU of G.
        let forged = make(
            serde_json::json!({"schedulerName": "hami-scheduler", "containers": [{"name": "c"}]}),
        );
        let placed = make(serde_json::json!({"schedulerName": "hami-scheduler",
            "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]}));
        let forged_cus = PodCus::of(&forged, &r, "hami-scheduler");
        assert_eq!(forged_cus.cu_allocated, None);
        assert_eq!(forged_cus.phase, Some("Running"));
        assert!(
            cus_in_use([forged_cus], None, |_| None)
                .unwrap()
                .used
                .0
                .is_empty()
        );
        let used = cus_in_use([PodCus::of(&placed, &r, "hami-scheduler")], None, |_| None)
            .unwrap()
            .used;
        assert_eq!(used.encode(), r#"{"G":"0-103"}"#);
        assert_eq!(PodCus::of(&placed, &r, "other").cu_allocated, None);
    }

    #[test]
    fn union_skips_finished_and_excluded_pods_and_refuses_overlap() {
        let a = PodRef::new("ns", "a");
        let b = PodRef::new("ns", "b");
        let c = PodRef::new("ns", "c");
        let d = PodRef::new("ns", "d");
        let pods = [
            PodCus {
                pod: &a,
                phase: Some("Running"),
                cu_allocated: Some(r#"{"G":"0-5"}"#),
                allocated: None,
            },
            PodCus {
                pod: &b,
                phase: Some("Succeeded"),
                cu_allocated: Some(r#"{"G":"0-5"}"#),
                allocated: None,
            },
            PodCus {
                pod: &c,
                phase: Some("Pending"),
                cu_allocated: Some(r#"{"G":"8","H":"0"}"#),
                allocated: None,
            },
            PodCus {
                pod: &d,
                phase: None,
                cu_allocated: None,
                allocated: None,
            },
        ];
        let cores = |_: &str| Some(16);
        let used = cus_in_use(pods, None, cores).unwrap().used;
        assert_eq!(used.encode(), r#"{"G":"0-5,8","H":"0"}"#);
        assert_eq!(
            cus_in_use(pods, Some(&a), cores).unwrap().used.encode(),
            r#"{"G":"8","H":"0"}"#
        );
        let clash = [
            pods[0],
            PodCus {
                pod: &c,
                phase: Some("Running"),
                cu_allocated: Some(r#"{"G":"3-9"}"#),
                allocated: None,
            },
        ];
        let err = cus_in_use(clash, None, cores).unwrap_err().to_string();
        assert!(
            err.contains("ns/a") && err.contains("ns/c") && err.contains("3-5"),
            "{err}"
        );
        // One malformed annotation: skipped and named, the others still served, and the
        // devices it was given count as fully used.
        let bad = [
            pods[0],
            PodCus {
                pod: &d,
                phase: Some("Running"),
                cu_allocated: Some("{nope"),
                allocated: Some("H,AMD X,10,4:;"),
            },
        ];
        let usage = cus_in_use(bad, None, cores).unwrap();
        assert_eq!(usage.used.encode(), r#"{"G":"0-5","H":"0-15"}"#);
        assert_eq!(usage.skipped.len(), 1);
        assert_eq!(usage.skipped[0].pod, d);
        assert!(
            usage.skipped[0].reason.contains("ns/d") && usage.skipped[0].reason.contains("H"),
            "{}",
            usage.skipped[0].reason
        );
    }
}
