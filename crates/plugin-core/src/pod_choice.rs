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

/// How many devices the pod's next run holds in its `to_allocate_key` list: `Some(n)`, or
/// `None` when the list does not decode (Allocate then fails with the decoding error).
fn next_run_len(pod: &Pod, to_allocate_key: &str) -> Option<usize> {
    let runs = decode_pod_devices(annotation(pod, to_allocate_key)?).ok()?;
    first_non_empty_run(&runs).map(|i| runs[i].len())
}

/// [`choose_pod`] with the request verified: kubelet admits only pods bound to this node,
/// and the request's device count must equal the pod's next run. The lock owner is chosen
/// only when it is such a pod; after an expired-lock take-over the owner is usually the
/// next pod (locked before it is bound) or a pod whose next run does not match, so the
/// pod is then the oldest allocating pod of the node whose next run matches. `None` (no
/// HAMi pod matches) sends the request to the whole-card path, which refuses every card
/// holding slices or reserved by a pending run.
pub fn choose_pod_for_request(
    lock: Option<&str>,
    node: &str,
    pods: &[Pod],
    to_allocate_key: &str,
    requested: usize,
) -> Result<PodChoice, String> {
    let owner = match lock {
        Some(value) => {
            NodeLock::parse(value)
                .map_err(|e| format!("node {node}: {e}"))?
                .owner
        }
        None => None,
    };
    let allocating = |p: &&Pod| {
        annotation(p, pod_keys::BIND_PHASE) == Some(BindPhase::Allocating.as_str())
            && annotation(p, pod_keys::VGPU_NODE) == Some(node)
            && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
            && annotation(p, to_allocate_key).is_some_and(|t| {
                !decode_pod_devices(t).is_ok_and(|runs| first_non_empty_run(&runs).is_none())
            })
    };
    // A list that does not decode still matches: Allocate then names the decoding error.
    let matches = |p: &&Pod| next_run_len(p, to_allocate_key).is_none_or(|n| n == requested);
    if let Some(owner) = &owner
        && let Some(p) = pods
            .iter()
            .filter(allocating)
            .find(|p| pod_ref(p) == *owner)
        && matches(&p)
    {
        return Ok(PodChoice::Tracked(owner.clone()));
    }
    let mut candidates: Vec<(i64, PodRef)> = pods
        .iter()
        .filter(allocating)
        .filter(matches)
        .map(|p| {
            let t = annotation(p, pod_keys::BIND_TIME)
                .and_then(|t| t.parse().ok())
                .unwrap_or(i64::MAX);
            (t, pod_ref(p))
        })
        .collect();
    candidates.sort();
    // No pod's next run matches, but the lock owner is being allocated here: its request
    // does not match its decision, and Allocate says so (count mismatch) for that pod.
    if candidates.is_empty()
        && let Some(owner) = &owner
        && pods.iter().filter(allocating).any(|p| pod_ref(p) == *owner)
    {
        return Ok(PodChoice::Tracked(owner.clone()));
    }
    if let (Some(owner), Some((_, chosen))) = (&owner, candidates.first()) {
        tracing::warn!(lock_owner = %owner, pod = %chosen, requested, "the node lock's owner is not the pod of this request (expired lock taken over?): allocating the oldest matching pod");
    }
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

    fn bound(mut p: Pod) -> Pod {
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some("n1".into()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn after_a_lock_take_over_the_request_picks_its_own_pod() {
        let one = "GPU-1,NVIDIA,10,30:;";
        let two = "GPU-1,NVIDIA,10,30:GPU-2,NVIDIA,10,30:;";
        let a = bound(allocating("a", "100", one));
        // b took over a's expired lock and is not bound to the node yet.
        let b_unbound = allocating("b", "200", one);
        let lock_b = "2026-08-04T10:01:01Z,ns,b";
        let pick = |pods: &[Pod], n| choose_pod_for_request(Some(lock_b), "n1", pods, KEY, n);
        assert_eq!(
            pick(&[a.clone(), b_unbound], 1),
            Ok(PodChoice::Tracked(PodRef::new("ns", "a")))
        );
        // b is bound but its next run holds 2 devices: a 1-device request is a's.
        let b_two = bound(allocating("b", "200", two));
        assert_eq!(
            pick(&[a.clone(), b_two.clone()], 1),
            Ok(PodChoice::Tracked(PodRef::new("ns", "a")))
        );
        // ... and a 2-device request is b's.
        assert_eq!(
            pick(&[a.clone(), b_two], 2),
            Ok(PodChoice::Tracked(PodRef::new("ns", "b")))
        );
        // The owner, bound and matching, is chosen even when older pods exist.
        let b_one = bound(allocating("b", "200", one));
        assert_eq!(
            pick(&[a.clone(), b_one], 1),
            Ok(PodChoice::Tracked(PodRef::new("ns", "b")))
        );
        // Nothing matches and the owner is not being allocated here: not a HAMi pod's
        // request (whole-card path).
        assert_eq!(pick(std::slice::from_ref(&a), 3), Ok(PodChoice::None));
        // Nothing matches but the owner is: its own mismatch, reported for it.
        let lock_a = "2026-08-04T10:01:01Z,ns,a";
        assert_eq!(
            choose_pod_for_request(Some(lock_a), "n1", std::slice::from_ref(&a), KEY, 3),
            Ok(PodChoice::Tracked(PodRef::new("ns", "a")))
        );
        // A pod not bound to this node is never chosen, lock or not.
        assert_eq!(
            choose_pod_for_request(None, "n1", &[allocating("c", "1", one)], KEY, 1),
            Ok(PodChoice::None)
        );
        // A list that does not decode still names its pod.
        let bad = bound(allocating("bad", "5", "x,y:;"));
        assert_eq!(
            choose_pod_for_request(None, "n1", &[bad], KEY, 1),
            Ok(PodChoice::Tracked(PodRef::new("ns", "bad")))
        );
        assert!(
            choose_pod_for_request(Some("garbage,x"), "n1", &[a], KEY, 1)
                .unwrap_err()
                .contains("node n1")
        );
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
