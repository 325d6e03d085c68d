//! `helm install` and `helm upgrade`, replayed in Helm's order on Helm's own rendering.
//!
//! Helm creates pre-install hooks first (sorted by `helm.sh/hook-weight`, then by kind in
//! its install order, then by name), waits for each hook Job to complete, then creates the
//! ordinary objects, then runs the post-install hooks; hooks with `hook-succeeded` are
//! deleted when their phase has succeeded. A Job's pod is only created once its
//! ServiceAccount exists, and it can only do its work with the rights bound to that
//! account, so at the moment each hook Job is created its ServiceAccount and every binding
//! the chart gives that account (and the roles they name) must exist. The certgen Jobs'
//! RBAC used to be ordinary objects: the pre-install Job waited for an account that Helm
//! had not created yet, and `helm install` timed out.

use std::collections::BTreeSet;

use crate::peers::Case;
use serde_json::{Value, json};

/// Helm's `InstallOrder` (pkg/release/util/kind_sorter.go) for the kinds the chart uses.
const INSTALL_ORDER: &[&str] = &[
    "Namespace",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "DaemonSet",
    "Deployment",
    "Job",
    "MutatingWebhookConfiguration",
];

fn kind_rank(v: &Value) -> usize {
    let k = v["kind"].as_str().unwrap_or("");
    INSTALL_ORDER
        .iter()
        .position(|x| *x == k)
        .unwrap_or(INSTALL_ORDER.len())
}

type Id = (String, String, String);

fn id(v: &Value) -> Id {
    (
        v["kind"].as_str().unwrap_or("").into(),
        v["metadata"]["namespace"].as_str().unwrap_or("").into(),
        v["metadata"]["name"].as_str().unwrap_or("").into(),
    )
}

fn hooks_of(v: &Value) -> Vec<String> {
    v["metadata"]["annotations"]["helm.sh/hook"]
        .as_str()
        .map(|h| h.split(',').map(|s| s.trim().to_string()).collect())
        .unwrap_or_default()
}

fn weight(v: &Value) -> i64 {
    v["metadata"]["annotations"]["helm.sh/hook-weight"]
        .as_str()
        .map(|w| w.parse().unwrap())
        .unwrap_or(0)
}

/// What must exist for a Job's pod to be created and allowed to work.
fn needs(job: &Value, ns: &str, all: &[Value]) -> Vec<Id> {
    let sa = job["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default")
        .to_string();
    let mut out = vec![("ServiceAccount".into(), ns.into(), sa.clone())];
    for b in all
        .iter()
        .filter(|b| b["kind"] == "RoleBinding" || b["kind"] == "ClusterRoleBinding")
    {
        let binds_sa = b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == sa.as_str() && s["namespace"] == ns
        });
        if binds_sa {
            out.push(id(b));
            let role_kind = b["roleRef"]["kind"].as_str().unwrap().to_string();
            let role_ns = if role_kind == "Role" {
                b["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            } else {
                String::new()
            };
            let role = (
                role_kind,
                role_ns,
                b["roleRef"]["name"].as_str().unwrap().to_string(),
            );
            // Built-in roles (system:*) are the cluster's own.
            if all.iter().any(|o| id(o) == role) {
                out.push(role);
            }
        }
    }
    out
}

/// Replays one release action; returns every violation.
fn replay(objects: &[Value], ns: &str, pre: &str, post: &str, upgrade: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let ordinary: Vec<&Value> = objects.iter().filter(|o| hooks_of(o).is_empty()).collect();
    let mut exists: BTreeSet<Id> = BTreeSet::new();
    if upgrade {
        // The previous release's ordinary objects are there; its hooks were deleted.
        exists.extend(ordinary.iter().map(|o| id(o)));
    }
    let phase = |name: &str, exists: &mut BTreeSet<Id>, problems: &mut Vec<String>| {
        let mut hooks: Vec<&Value> = objects
            .iter()
            .filter(|o| hooks_of(o).iter().any(|h| h == name))
            .collect();
        hooks.sort_by_key(|h| {
            (
                weight(h),
                kind_rank(h),
                h["metadata"]["name"].as_str().unwrap_or("").to_string(),
            )
        });
        for h in &hooks {
            if h["kind"] == "Job" {
                for need in needs(h, ns, objects) {
                    if !exists.contains(&need) {
                        problems.push(format!(
                            "{name}: Job {} is created before its {} {}",
                            h["metadata"]["name"], need.0, need.2
                        ));
                    }
                }
            }
            exists.insert(id(h));
        }
        for h in &hooks {
            let policy = h["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
                .as_str()
                .unwrap_or("");
            if policy.contains("hook-succeeded") {
                exists.remove(&id(h));
            }
        }
    };
    phase(pre, &mut exists, &mut problems);
    let mut sorted = ordinary.clone();
    sorted.sort_by_key(|o| kind_rank(o));
    exists.extend(sorted.iter().map(|o| id(o)));
    phase(post, &mut exists, &mut problems);
    // Nothing the hooks made is left behind once the release is done.
    for o in objects.iter().filter(|o| !hooks_of(o).is_empty()) {
        if exists.contains(&id(o)) {
            problems.push(format!("hook {:?} outlives the release action", id(o)));
        }
    }
    problems
}

#[test]
fn certgen_hooks_find_their_identity_on_install_and_upgrade() {
    let answer = crate::peers::run(
        &[
            Case::new("certgen", "hami-system", "v1.33.0", json!({})),
            Case::new("certgen 1.27", "gpu", "v1.27.0", json!({})),
        ],
        &[],
    );
    for r in &answer.cases {
        assert!(r.error.is_none(), "{}: {:?}", r.name, r.error);
        let objects: Vec<Value> = r.objects().into_iter().map(|(_, v)| v).collect();
        let ns = objects
            .iter()
            .find(|o| o["kind"] == "Deployment")
            .map(|o| o["metadata"]["namespace"].as_str().unwrap().to_string())
            .unwrap();
        let jobs = objects.iter().filter(|o| o["kind"] == "Job").count();
        assert_eq!(jobs, 2, "{}: the create and patch Jobs", r.name);
        let install = replay(&objects, &ns, "pre-install", "post-install", false);
        assert!(install.is_empty(), "{}: helm install: {install:#?}", r.name);
        let upgrade = replay(&objects, &ns, "pre-upgrade", "post-upgrade", true);
        assert!(upgrade.is_empty(), "{}: helm upgrade: {upgrade:#?}", r.name);
    }
}

#[test]
fn the_replay_catches_rbac_that_is_not_a_hook() {
    // The chart as it shipped: the certgen ServiceAccount and bindings as ordinary objects.
    let answer = crate::peers::run(
        &[Case::new("certgen", "hami-system", "v1.33.0", json!({}))],
        &[],
    );
    let mut objects: Vec<Value> = answer.cases[0]
        .objects()
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    for o in &mut objects {
        if o["kind"] != "Job" && !hooks_of(o).is_empty() {
            o["metadata"].as_object_mut().unwrap().remove("annotations");
        }
    }
    let install = replay(
        &objects,
        "hami-system",
        "pre-install",
        "post-install",
        false,
    );
    assert!(
        install
            .iter()
            .any(|p| p.contains("hami-certgen-create") && p.contains("ServiceAccount")),
        "{install:?}"
    );
}
