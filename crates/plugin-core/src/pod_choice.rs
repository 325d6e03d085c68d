//! Which pod an Allocate belongs to (pure): kubelet's request names only share slots, so
//! the plugin finds the pod the scheduler is binding to this node.

use hami_protocol::device_list::{decode_pod_devices, first_non_empty_run};
use hami_protocol::names::pod as pod_keys;
use hami_protocol::node_lock::{BindPhase, NodeLock, PodRef};
use k8s_openapi::api::core::v1::Pod;

/// The pod an Allocate belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodChoice {
    /// HAMi tracks it: the lock owner, or the oldest allocating pod on the node.
    Tracked(PodRef),
    /// No pending HAMi pod: hand the kubelet-chosen devices over as whole cards.
    None,
}

/// A pod annotation.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

pub use hami_protocol::requests::pod_ref;

/// Picks the pod among the pods of the node: the lock owner when the lock names one, else
/// the oldest (by `hami.io/bind-time`, then name) pod with `bind-phase=allocating` whose
/// `vgpu-node` is this node and whose `to_allocate_key` list (the vendor's
/// devices-to-allocate annotation) still has a run to allocate.
pub fn choose_pod(
    lock: Option<&str>,
    node: &str,
    pods: &[Pod],
    to_allocate_key: &str,
) -> Result<PodChoice, String> {
    if let Some(value) = lock {
        let lock = NodeLock::parse(value).map_err(|e| format!("node {node}: {e}"))?;
        if let Some(owner) = lock.owner {
            return Ok(PodChoice::Tracked(owner));
        }
    }
    let mut candidates: Vec<(&str, PodRef)> = pods
        .iter()
        .filter(|p| annotation(p, pod_keys::BIND_PHASE) == Some(BindPhase::Allocating.as_str()))
        .filter(|p| annotation(p, pod_keys::VGPU_NODE) == Some(node))
        .filter(|p| {
            annotation(p, to_allocate_key)
                // A list that does not decode still names this pod: Allocate then
                // fails with the decoding error instead of "no pod".
                .is_some_and(|t| {
                    !decode_pod_devices(t).is_ok_and(|runs| first_non_empty_run(&runs).is_none())
                })
        })
        .map(|p| (annotation(p, pod_keys::BIND_TIME).unwrap_or(""), pod_ref(p)))
        .collect();
    candidates.sort_by(|a, b| {
        let ta: i64 = a.0.parse().unwrap_or(i64::MAX);
        let tb: i64 = b.0.parse().unwrap_or(i64::MAX);
        ta.cmp(&tb).then_with(|| a.1.cmp(&b.1))
    });
    Ok(candidates
        .into_iter()
        .next()
        .map_or(PodChoice::None, |(_, p)| PodChoice::Tracked(p)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &str = "hami.io/vgpu-devices-to-allocate";

    fn pod(name: &str, ann: &[(&str, &str)]) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "annotations": ann.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>()},
        }))
        .unwrap()
    }

    fn allocating(name: &str, t: &str, list: &str) -> Pod {
        pod(
            name,
            &[
                (pod_keys::BIND_PHASE, "allocating"),
                (pod_keys::VGPU_NODE, "n1"),
                (pod_keys::BIND_TIME, t),
                (KEY, list),
            ],
        )
    }

    #[test]
    fn lock_owner_first_else_oldest_allocating_of_this_vendor() {
        let pods = vec![
            allocating("late", "200", "GPU-1,NVIDIA,10,30:;"),
            allocating("early", "100", "GPU-1,NVIDIA,10,30:;"),
            allocating("done", "50", ";;"),
            // Another vendor's pod: not a candidate for this key.
            pod(
                "amd",
                &[
                    (pod_keys::BIND_PHASE, "allocating"),
                    (pod_keys::VGPU_NODE, "n1"),
                    (pod_keys::BIND_TIME, "1"),
                    ("hami.io/amd-devices-to-allocate", "A,AMD X,1,1:;"),
                ],
            ),
        ];
        assert_eq!(
            choose_pod(None, "n1", &pods, KEY),
            Ok(PodChoice::Tracked(PodRef::new("ns", "early")))
        );
        assert_eq!(
            choose_pod(Some("2026-08-04T10:00:00Z,ns,late"), "n1", &pods, KEY),
            Ok(PodChoice::Tracked(PodRef::new("ns", "late")))
        );
        assert_eq!(
            choose_pod(Some("2026-08-04T10:00:00Z"), "n1", &pods, KEY),
            Ok(PodChoice::Tracked(PodRef::new("ns", "early")))
        );
        assert_eq!(choose_pod(None, "n2", &pods, KEY), Ok(PodChoice::None));
        assert!(
            choose_pod(Some("garbage,x"), "n1", &pods, KEY)
                .unwrap_err()
                .contains("node n1")
        );
        // A list that does not decode still names its pod.
        let bad = vec![allocating("bad", "5", "x,y:;")];
        assert_eq!(
            choose_pod(None, "n1", &bad, KEY),
            Ok(PodChoice::Tracked(PodRef::new("ns", "bad")))
        );
    }
}
