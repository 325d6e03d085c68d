//! What the extender's bind does with a pod, decided before any write (pure: the pod as
//! read, what the informer's state holds for it, no I/O). `runtime::Scheduler::bind` is
//! the shell that carries it out, in this order:
//!
//! 1. refuse a pod re-created under the same name (its UID is not the one kube-scheduler
//!    filtered), without an Event: the new pod is another pod, kube-scheduler retries;
//! 2. a pod already bound to the node asked for is done: a repeated bind (a follower
//!    retrying a forwarded bind whose answer was lost after the leader bound the pod, or
//!    kube-scheduler repeating one) answers success and writes nothing, so the node lock
//!    stays with the pod until the device plugin's bind-phase success or its expiry; a pod
//!    bound to another node is refused, without an Event, and nothing is written;
//! 3. refuse, with a `BindingFailed` Event, a pod that filter placed on another node;
//! 4. refuse, with a `BindingFailed` Event and nothing written (no lock, no bind phase), a
//!    pod that asks for HAMi-managed GPU resources but carries no filter decision for the
//!    node (`hami.io/vgpu-node` naming it and a `*-devices-to-allocate` list for each vendor
//!    it asks for, as filter writes before it answers): one `/filter` refused, or one that
//!    never went through filter. Bound anyway it would stay `allocating` for good, hold the
//!    node lock until expiry, and its device plugin would hand the slice pod a whole card;
//! 5. a pod that asks for GPUs (whatever the informer has seen of filter's patch so far)
//!    takes the node lock, then is marked `bind-phase=allocating` ([`allocating_patch`],
//!    conditional on the pod being as read: a pod bound meanwhile by another bind of it,
//!    whose device plugin may have written success already, is not marked again; on a
//!    conflict, [`after_allocating_conflict`] with the pod read again);
//!    a pod without GPU requests, or whose requests do not parse, takes no lock;
//! 6. then `pods/binding` ([`binding`]); a failure is settled by [`after_failure`] with the
//!    pod read again: bound where asked after all (another bind of the same pod got there
//!    first) is success and keeps the lock for the plugin (one this bind wrote is removed
//!    when the pod is no longer allocating: the plugin is done with it); otherwise only a
//!    lock this bind wrote is released, never one it found already the pod's (that one
//!    belongs to another bind of the pod, perhaps one that succeeded or is under way).

use hami_protocol::names::{Vendor, pod as pod_keys};
use hami_protocol::node_lock::{BindPhase, PodRef};
use hami_protocol::placement::requests_managed_resource;
use hami_protocol::requests::{RequestDefaults, pod_requests};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::extender::ExtenderBindingArgs;

/// What bind does with a pod it may bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindPlan {
    /// The pod, as the node lock names its owner.
    pub owner: PodRef,
    /// Whether it takes the node lock and is marked allocating first (it asks for GPUs).
    pub takes_lock: bool,
    /// The pod is already bound to the node asked for: answer success, write nothing
    /// (and leave the node lock alone).
    pub already_bound: bool,
}

/// Why bind refuses a pod before any write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindRefusal {
    /// The error returned to kube-scheduler.
    pub message: String,
    /// Whether it is also recorded as a `BindingFailed` Event on the pod.
    pub event: bool,
}

/// Decides bind for `pod` (as just read) against `args`; `held_on` is the node the
/// informer's state says filter placed the pod on, if any.
pub fn plan_bind(
    args: &ExtenderBindingArgs,
    pod: &Pod,
    held_on: Option<&str>,
    defaults: &RequestDefaults,
) -> Result<BindPlan, BindRefusal> {
    if !args.pod_uid.is_empty() && pod.metadata.uid.as_deref() != Some(args.pod_uid.as_str()) {
        return Err(BindRefusal {
            message: format!(
                "pod {}/{} has uid {:?}, not {:?}: it was re-created; kube-scheduler will retry",
                args.pod_namespace, args.pod_name, pod.metadata.uid, args.pod_uid
            ),
            event: false,
        });
    }
    let owner = PodRef::new(&args.pod_namespace, &args.pod_name);
    let requests = pod_requests(pod, defaults);
    let takes_lock = requests
        .as_ref()
        .is_ok_and(|r| r.iter().any(|c| !c.is_empty()));
    match bound_to(pod) {
        Some(node) if node == args.node => {
            return Ok(BindPlan {
                owner,
                takes_lock,
                already_bound: true,
            });
        }
        Some(node) => {
            return Err(BindRefusal {
                message: format!(
                    "pod {owner} is already bound to {node}, not {}; nothing was changed",
                    args.node
                ),
                event: false,
            });
        }
        None => {}
    }
    if let Some(node) = held_on
        && node != args.node
    {
        return Err(BindRefusal {
            message: format!(
                "filter placed pod {owner} on {node} but bind asks for {}; the pod will be filtered again",
                args.node
            ),
            event: true,
        });
    }
    if takes_lock || requests_managed_resource(pod) {
        // The vendors filter must have decided for: those asked for (none known when the
        // requests do not parse: filter refused such a pod, so it has no decision).
        let vendors: Vec<Vendor> = match &requests {
            Ok(r) => Vendor::ALL
                .into_iter()
                .filter(|v| r.iter().any(|c| c.get(*v).is_some()))
                .collect(),
            Err(_) => Vec::new(),
        };
        if let Some(missing) = missing_decision(pod, &args.node, &vendors, requests.is_err()) {
            return Err(BindRefusal {
                message: format!(
                    "no filter decision for node {node}; the pod must be scheduled through the hami filter: pod {owner} asks for HAMi GPU resources but {missing}; nothing was changed",
                    node = args.node
                ),
                event: true,
            });
        }
    }
    Ok(BindPlan {
        owner,
        takes_lock,
        already_bound: false,
    })
}

/// What of filter's decision for `node` the pod lacks (`None`: it has it all): the
/// `hami.io/vgpu-node` annotation naming the node, and each vendor's devices-to-allocate
/// list. `unparsable`: the requests do not parse, so filter refused the pod.
fn missing_decision(pod: &Pod, node: &str, vendors: &[Vendor], unparsable: bool) -> Option<String> {
    let annotations = pod.metadata.annotations.as_ref();
    let get = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .filter(|v| !v.is_empty())
    };
    if unparsable {
        return Some("its requests do not parse (filter refused it)".to_owned());
    }
    match get(pod_keys::VGPU_NODE) {
        None => return Some(format!("it has no {} annotation", pod_keys::VGPU_NODE)),
        Some(placed) if placed != node => {
            return Some(format!(
                "filter placed it on {placed} ({})",
                pod_keys::VGPU_NODE
            ));
        }
        Some(_) => {}
    }
    let lists: Vec<&str> = vendors
        .iter()
        .map(|v| v.names().devices_to_allocate)
        .filter(|key| get(key).is_none())
        .collect();
    (!lists.is_empty()).then(|| format!("it has no {} annotation", lists.join(" or ")))
}

/// The node `pod` is bound to, if any (`spec.nodeName`).
fn bound_to(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// What bind does after its allocating patch met a conflict (the pod changed since read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocatingConflict {
    /// The pod is still unbound (another bind of it marked it allocating, or another
    /// writer changed it): mark it again, conditional on this `resource_version`.
    Again {
        /// The pod's resourceVersion as read again.
        resource_version: Option<String>,
    },
    /// The pod is bound (by another bind of it) or re-created: stop here and let
    /// [`after_failure`] settle it.
    Settle,
}

/// Decides after an allocating-patch conflict, from the pod read again (`now`) and its UID
/// as bind first read it.
pub fn after_allocating_conflict(uid: Option<&str>, now: &Pod) -> AllocatingConflict {
    if now.metadata.uid.as_deref() != uid || bound_to(now).is_some() {
        return AllocatingConflict::Settle;
    }
    AllocatingConflict::Again {
        resource_version: now.metadata.resource_version.clone(),
    }
}

/// How a bind whose writes failed ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// The pod is bound to the node asked for all the same (another bind of it got there
    /// first: a retry of a bind whose answer was lost, or one still under way): success.
    Bound {
        /// Remove the node lock: only one this bind wrote, and only once the pod is no
        /// longer `bind-phase=allocating` (its plugin is done). A lock the pod holds while
        /// allocating stays for the plugin.
        release: bool,
    },
    /// The bind failed.
    Failed {
        /// Remove the node lock: only when this bind wrote it.
        release: bool,
    },
}

/// Settles a bind of `args` whose allocating patch or `pods/binding` failed. `uid` is the
/// pod's UID as bind first read it, `now` the pod read again after the failure (`None`
/// when gone or unreadable), `wrote_lock` whether this bind wrote the node lock (taken
/// free or over; not when it found the lock already the pod's).
pub fn after_failure(
    args: &ExtenderBindingArgs,
    uid: Option<&str>,
    now: Option<&Pod>,
    wrote_lock: bool,
) -> AfterFailure {
    let bound_here = now.is_some_and(|p| {
        uid.is_some() && p.metadata.uid.as_deref() == uid && bound_to(p) == Some(&args.node)
    });
    if bound_here {
        let allocating = now
            .and_then(|p| p.metadata.annotations.as_ref())
            .and_then(|a| a.get(pod_keys::BIND_PHASE))
            .is_some_and(|v| v == BindPhase::Allocating.as_str());
        AfterFailure::Bound {
            release: wrote_lock && !allocating,
        }
    } else {
        AfterFailure::Failed {
            release: wrote_lock,
        }
    }
}

/// The merge patch that marks a pod allocating at unix time `now` (SPEC §2.4); with the
/// pod's `resource_version` as bind read it, the API server refuses it (409) if the pod
/// changed since (bound by another bind of it, perhaps already marked success).
pub fn allocating_patch(now: i64, resource_version: Option<&str>) -> Value {
    let mut patch = json!({"metadata": {"annotations": {
        pod_keys::BIND_PHASE: BindPhase::Allocating.as_str(),
        pod_keys::BIND_TIME: now.to_string(),
    }}});
    if let Some(rv) = resource_version {
        patch["metadata"]["resourceVersion"] = json!(rv);
    }
    patch
}

/// The `pods/binding` body that binds the pod of `args` (with its `uid`, so a re-created
/// pod is not bound in its place) to `args.node`.
pub fn binding(args: &ExtenderBindingArgs, uid: Option<&str>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": args.pod_name, "namespace": args.pod_namespace, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(uid: &str, node: &str) -> ExtenderBindingArgs {
        ExtenderBindingArgs {
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            pod_uid: uid.into(),
            node: node.into(),
        }
    }

    /// A pod as filter leaves it when it placed the pod on `n1` (the decision annotations
    /// for every vendor a request names).
    fn pod(uid: &str, limits: Value) -> Pod {
        let mut annotations = json!({pod_keys::VGPU_NODE: "n1"});
        for v in Vendor::ALL {
            if limits
                .to_string()
                .contains(v.names().resource_count.split('/').next().unwrap())
            {
                annotations[v.names().devices_to_allocate] = json!("G,AMD,100,10:;");
            }
        }
        undecided_with(uid, limits, annotations)
    }

    /// A pod without filter's decision.
    fn undecided(uid: &str, limits: Value) -> Pod {
        undecided_with(uid, limits, json!({}))
    }

    fn undecided_with(uid: &str, limits: Value, annotations: Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": uid, "annotations": annotations},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}),
        )
        .unwrap()
    }

    /// Issue 26 item 4: a `/bind` for a GPU pod `/filter` refused (or never saw) is refused
    /// with the reason, recorded as an Event, and nothing is written (no lock taken).
    #[test]
    fn a_gpu_pod_without_a_filter_decision_for_the_node_is_refused() {
        let d = RequestDefaults::default();
        let cases = [
            (
                undecided("u1", json!({"amd.com/gpu": "1", "amd.com/gpucores": "10"})),
                "it has no hami.io/vgpu-node annotation",
            ),
            (
                undecided_with(
                    "u1",
                    json!({"amd.com/gpu": "1"}),
                    json!({pod_keys::VGPU_NODE: "n1"}),
                ),
                "it has no hami.io/amd-devices-to-allocate annotation",
            ),
            (
                undecided_with(
                    "u1",
                    json!({"amd.com/gpu": "1"}),
                    json!({pod_keys::VGPU_NODE: "n2", "hami.io/amd-devices-to-allocate": "G,AMD,100,10:;"}),
                ),
                "filter placed it on n2",
            ),
            (
                // Both vendors asked for, NVIDIA's list missing.
                undecided_with(
                    "u1",
                    json!({"amd.com/gpu": "1", "nvidia.com/gpu": "1"}),
                    json!({pod_keys::VGPU_NODE: "n1", "hami.io/amd-devices-to-allocate": "G,AMD,100,10:;"}),
                ),
                "it has no hami.io/vgpu-devices-to-allocate annotation",
            ),
            (
                // An empty list is no decision either.
                undecided_with(
                    "u1",
                    json!({"amd.com/gpu": "1"}),
                    json!({pod_keys::VGPU_NODE: "n1", "hami.io/amd-devices-to-allocate": ""}),
                ),
                "it has no hami.io/amd-devices-to-allocate annotation",
            ),
            (
                // Requests that do not parse: filter refused the pod.
                undecided("u1", json!({"amd.com/gpu": "1", "amd.com/gpucores": "150"})),
                "its requests do not parse",
            ),
            (
                // Memory alone asks for a GPU too.
                undecided("u1", json!({"nvidia.com/gpumem": "1024"})),
                "it has no hami.io/vgpu-node annotation",
            ),
        ];
        for (p, why) in cases {
            for held_on in [None, Some("n1")] {
                let refused = plan_bind(&args("u1", "n1"), &p, held_on, &d).unwrap_err();
                assert!(refused.event, "{why}");
                assert!(
                    refused.message.starts_with(
                        "no filter decision for node n1; the pod must be scheduled through the hami filter: pod ns/p"
                    ) && refused.message.contains(why)
                        && refused.message.ends_with("nothing was changed"),
                    "{}",
                    refused.message
                );
            }
        }
        // A pod already bound where asked is a repeated bind, decision or not.
        let mut bound_here = undecided("u1", json!({"amd.com/gpu": "1"}));
        bound_here.spec.as_mut().unwrap().node_name = Some("n1".into());
        assert!(
            plan_bind(&args("u1", "n1"), &bound_here, None, &d)
                .unwrap()
                .already_bound
        );
        // No GPU asked for (or the priority alone): no decision needed, no lock.
        for limits in [json!({"cpu": "1"}), json!({"nvidia.com/priority": "1"})] {
            let plan = plan_bind(&args("u1", "n1"), &undecided("u1", limits), None, &d).unwrap();
            assert!(!plan.takes_lock);
        }
    }

    #[test]
    fn gpu_pods_take_the_lock_others_do_not() {
        let d = RequestDefaults::default();
        let gpu = pod("u1", json!({"amd.com/gpu": "1"}));
        let plan = plan_bind(&args("u1", "n1"), &gpu, None, &d).unwrap();
        assert_eq!(plan.owner, PodRef::new("ns", "p"));
        assert!(plan.takes_lock);
        // Held on the node asked for: fine. No UID in the args: not checked.
        assert!(
            plan_bind(&args("", "n1"), &gpu, Some("n1"), &d)
                .unwrap()
                .takes_lock
        );
        let plain = pod("u1", json!({"cpu": "1"}));
        assert!(
            !plan_bind(&args("u1", "n1"), &plain, None, &d)
                .unwrap()
                .takes_lock
        );
    }

    #[test]
    fn refusals() {
        let d = RequestDefaults::default();
        let gpu = pod("u2", json!({"amd.com/gpu": "1"}));
        let recreated = plan_bind(&args("u1", "n1"), &gpu, None, &d).unwrap_err();
        assert!(!recreated.event);
        assert!(
            recreated.message.contains("it was re-created"),
            "{}",
            recreated.message
        );
        let elsewhere = plan_bind(&args("u2", "n1"), &gpu, Some("n2"), &d).unwrap_err();
        assert!(elsewhere.event);
        assert_eq!(
            elsewhere.message,
            "filter placed pod ns/p on n2 but bind asks for n1; the pod will be filtered again"
        );
    }

    fn bound(uid: &str, node: &str) -> Pod {
        let mut p = pod(uid, json!({"amd.com/gpu": "1"}));
        p.spec.as_mut().unwrap().node_name = Some(node.into());
        p
    }

    #[test]
    fn a_pod_bound_where_asked_is_done_and_writes_nothing() {
        let d = RequestDefaults::default();
        // A repeated bind: whatever filter's record says, the pod is bound as asked.
        for held_on in [None, Some("n1"), Some("n2")] {
            let plan = plan_bind(&args("u1", "n1"), &bound("u1", "n1"), held_on, &d).unwrap();
            assert!(plan.already_bound, "{held_on:?}");
            assert_eq!(plan.owner, PodRef::new("ns", "p"));
        }
        // Not yet bound: a bind to carry out.
        let pending = pod("u1", json!({"amd.com/gpu": "1"}));
        assert!(
            !plan_bind(&args("u1", "n1"), &pending, Some("n1"), &d)
                .unwrap()
                .already_bound
        );
        // An empty nodeName is not bound.
        assert!(
            !plan_bind(&args("u1", "n1"), &bound("u1", ""), None, &d)
                .unwrap()
                .already_bound
        );
        // Bound elsewhere: refused, nothing written, no Event.
        let elsewhere = plan_bind(&args("u1", "n1"), &bound("u1", "n2"), None, &d).unwrap_err();
        assert!(!elsewhere.event);
        assert_eq!(
            elsewhere.message,
            "pod ns/p is already bound to n2, not n1; nothing was changed"
        );
        // A re-created pod is still refused first, bound or not.
        let recreated = plan_bind(&args("u0", "n1"), &bound("u1", "n1"), None, &d).unwrap_err();
        assert!(
            recreated.message.contains("re-created"),
            "{}",
            recreated.message
        );
    }

    #[test]
    fn a_failed_bind_releases_only_a_lock_it_wrote_and_not_when_bound_after_all() {
        let a = args("u1", "n1");
        let uid = Some("u1");
        // Another bind of the pod bound it where asked and its plugin is still to come:
        // success, the lock is kept, whoever wrote it.
        let mut allocating = bound("u1", "n1");
        allocating.metadata.annotations = Some(
            [(pod_keys::BIND_PHASE.to_owned(), "allocating".to_owned())]
                .into_iter()
                .collect(),
        );
        for wrote in [false, true] {
            assert_eq!(
                after_failure(&a, uid, Some(&allocating), wrote),
                AfterFailure::Bound { release: false }
            );
        }
        // Its plugin is done (success or failed, or no phase): a lock this bind wrote
        // meanwhile would only block the node; one it found is not its to remove.
        for phase in [Some("success"), Some("failed"), None] {
            let mut done = bound("u1", "n1");
            done.metadata.annotations = phase.map(|v| {
                [(pod_keys::BIND_PHASE.to_owned(), v.to_owned())]
                    .into_iter()
                    .collect()
            });
            assert_eq!(
                after_failure(&a, uid, Some(&done), true),
                AfterFailure::Bound { release: true },
                "{phase:?}"
            );
            assert_eq!(
                after_failure(&a, uid, Some(&done), false),
                AfterFailure::Bound { release: false },
                "{phase:?}"
            );
        }
        let unbound = pod("u1", json!({"amd.com/gpu": "1"}));
        for now in [
            None,
            Some(&unbound),
            // Bound elsewhere, or a re-created pod bound here: not our bind.
            Some(&bound("u1", "n2")),
            Some(&bound("u2", "n1")),
        ] {
            assert_eq!(
                after_failure(&a, uid, now, true),
                AfterFailure::Failed { release: true },
                "{now:?}"
            );
            // A lock found already the pod's belongs to another bind of it: left alone.
            assert_eq!(
                after_failure(&a, uid, now, false),
                AfterFailure::Failed { release: false },
                "{now:?}"
            );
        }
        // Without the UID first read, a bound pod cannot be told from a re-created one.
        assert_eq!(
            after_failure(&a, None, Some(&bound("u1", "n1")), true),
            AfterFailure::Failed { release: true }
        );
    }

    #[test]
    fn an_allocating_conflict_marks_again_only_an_unbound_pod() {
        let mut unbound = pod("u1", json!({"amd.com/gpu": "1"}));
        unbound.metadata.resource_version = Some("7".into());
        assert_eq!(
            after_allocating_conflict(Some("u1"), &unbound),
            AllocatingConflict::Again {
                resource_version: Some("7".into())
            }
        );
        // Bound meanwhile (its plugin may be done): never marked again.
        assert_eq!(
            after_allocating_conflict(Some("u1"), &bound("u1", "n1")),
            AllocatingConflict::Settle
        );
        assert_eq!(
            after_allocating_conflict(Some("u1"), &bound("u1", "n2")),
            AllocatingConflict::Settle
        );
        // Re-created under the same name: another pod.
        assert_eq!(
            after_allocating_conflict(Some("u1"), &pod("u2", json!({}))),
            AllocatingConflict::Settle
        );
    }

    #[test]
    fn bodies() {
        let patch = allocating_patch(1_700_000_000, None);
        assert_eq!(
            patch["metadata"]["annotations"][pod_keys::BIND_PHASE],
            "allocating"
        );
        assert_eq!(
            patch["metadata"]["annotations"][pod_keys::BIND_TIME],
            "1700000000"
        );
        assert!(patch["metadata"].get("resourceVersion").is_none());
        let conditional = allocating_patch(1_700_000_000, Some("42"));
        assert_eq!(conditional["metadata"]["resourceVersion"], "42");
        assert_eq!(
            conditional["metadata"]["annotations"],
            patch["metadata"]["annotations"]
        );
        let b = binding(&args("u1", "n1"), Some("u1"));
        assert_eq!(b["metadata"]["uid"], "u1");
        assert_eq!(b["target"]["name"], "n1");
        assert_eq!(b["kind"], "Binding");
    }
}
