//! The CUs in use on a node (SPEC §4): the union of `hami.io/amd-cu-allocated` of the live
//! pods (not Succeeded/Failed). Fail closed: a malformed annotation or two pods holding the
//! same CU stop allocation with both named, rather than risk handing a CU out twice.

use hami_protocol::cu_allocated::{CuAllocatedError, CuAllocation};
use hami_protocol::node_lock::PodRef;

/// One pod as the usage rebuild sees it.
#[derive(Debug, Clone, Copy)]
pub struct PodCus<'a> {
    pub pod: &'a PodRef,
    /// `status.phase`.
    pub phase: Option<&'a str>,
    pub cu_allocated: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    #[error("pod {pod}: {source}")]
    Malformed {
        pod: PodRef,
        #[source]
        source: Box<CuAllocatedError>,
    },
    #[error("pods {} and {} both hold CUs {} of device {}: fix or delete one of them", .0.first, .0.second, .0.overlap, .0.device)]
    Overlap(Box<OverlapInfo>),
}

/// Two pods holding the same CUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlapInfo {
    pub first: PodRef,
    pub second: PodRef,
    pub device: String,
    pub overlap: String,
}

/// Union of the CUs held by live pods other than `exclude`.
pub fn cus_in_use<'a>(
    pods: impl IntoIterator<Item = PodCus<'a>>,
    exclude: Option<&PodRef>,
) -> Result<CuAllocation, UsageError> {
    let mut total = CuAllocation::default();
    let mut owners: Vec<(&PodRef, CuAllocation)> = Vec::new();
    for p in pods {
        if Some(p.pod) == exclude || matches!(p.phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let Some(text) = p.cu_allocated.filter(|t| !t.trim().is_empty()) else {
            continue;
        };
        let alloc = CuAllocation::parse(text).map_err(|source| UsageError::Malformed {
            pod: p.pod.clone(),
            source: Box::new(source),
        })?;
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
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            },
            PodCus {
                pod: &b,
                phase: Some("Succeeded"),
                cu_allocated: Some(r#"{"G":"0-5"}"#),
            },
            PodCus {
                pod: &c,
                phase: Some("Pending"),
                cu_allocated: Some(r#"{"G":"8","H":"0"}"#),
            },
            PodCus {
                pod: &d,
                phase: None,
                cu_allocated: None,
            },
        ];
        let used = cus_in_use(pods, None).unwrap();
        assert_eq!(used.encode(), r#"{"G":"0-5,8","H":"0"}"#);
        assert_eq!(
            cus_in_use(pods, Some(&a)).unwrap().encode(),
            r#"{"G":"8","H":"0"}"#
        );
        let clash = [
            pods[0],
            PodCus {
                pod: &c,
                phase: Some("Running"),
                cu_allocated: Some(r#"{"G":"3-9"}"#),
            },
        ];
        let err = cus_in_use(clash, None).unwrap_err().to_string();
        assert!(
            err.contains("ns/a") && err.contains("ns/c") && err.contains("3-5"),
            "{err}"
        );
        let bad = [PodCus {
            pod: &d,
            phase: Some("Running"),
            cu_allocated: Some("{nope"),
        }];
        assert!(
            cus_in_use(bad, None)
                .unwrap_err()
                .to_string()
                .contains("ns/d")
        );
    }
}
