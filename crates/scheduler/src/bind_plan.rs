//! What the extender's bind does with a pod, decided before any write (pure: the pod as
//! read, what the informer's state holds for it, no I/O). `runtime::Scheduler::bind` is
//! the shell that carries it out, in this order:
//!
//! 1. refuse a pod re-created under the same name (its UID is not the one kube-scheduler
//!    filtered), without an Event: the new pod is another pod, kube-scheduler retries;
//! 2. refuse, with a `BindingFailed` Event, a pod that filter placed on another node;
//! 3. a pod that asks for GPUs (whatever the informer has seen of filter's patch so far)
//!    takes the node lock, then is marked `bind-phase=allocating` ([`allocating_patch`]);
//!    a pod without GPU requests, or whose requests do not parse, takes no lock;
//! 4. then `pods/binding` ([`binding`]); any failure after the lock releases it.

use hami_protocol::names::pod as pod_keys;
use hami_protocol::node_lock::{BindPhase, PodRef};
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
    let takes_lock = pod_requests(pod, defaults).is_ok_and(|r| r.iter().any(|c| !c.is_empty()));
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
    Ok(BindPlan { owner, takes_lock })
}

/// The merge patch that marks a pod allocating at unix time `now` (SPEC §2.4).
pub fn allocating_patch(now: i64) -> Value {
    json!({"metadata": {"annotations": {
        pod_keys::BIND_PHASE: BindPhase::Allocating.as_str(),
        pod_keys::BIND_TIME: now.to_string(),
    }}})
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

    fn pod(uid: &str, limits: Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}),
        )
        .unwrap()
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
        // Requests that do not parse take no lock (filter refused them already).
        let bad = pod("u1", json!({"amd.com/gpu": "1", "amd.com/gpucores": "150"}));
        assert!(
            !plan_bind(&args("u1", "n1"), &bad, None, &d)
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

    #[test]
    fn bodies() {
        let patch = allocating_patch(1_700_000_000);
        assert_eq!(
            patch["metadata"]["annotations"][pod_keys::BIND_PHASE],
            "allocating"
        );
        assert_eq!(
            patch["metadata"]["annotations"][pod_keys::BIND_TIME],
            "1700000000"
        );
        let b = binding(&args("u1", "n1"), Some("u1"));
        assert_eq!(b["metadata"]["uid"], "u1");
        assert_eq!(b["target"]["name"], "n1");
        assert_eq!(b["kind"], "Binding");
    }
}
