//! RBAC authorization, as Kubernetes' RBAC authorizer decides it: a request is allowed when
//! a ClusterRoleBinding, or a RoleBinding in the request's namespace, binds the user (or one
//! of its groups, or its service account) to a role with a rule that matches the verb, the
//! API group, the resource (with subresource: `pods/binding`, `pods/*`, `*/status`, `*`)
//! and, when the rule lists `resourceNames`, the object's name. Pure: the policy objects
//! are passed in.

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};

/// The authenticated user of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// The user name (`system:serviceaccount:<ns>:<name>` for a service account).
    pub name: String,
    /// The groups the user belongs to, matched against `Group` subjects.
    pub groups: Vec<String>,
}

/// The group that is allowed everything, without consulting any binding (as in Kubernetes).
pub const MASTERS_GROUP: &str = "system:masters";
/// The user name of a request without credentials.
pub const ANONYMOUS: &str = "system:anonymous";

impl UserInfo {
    /// `system:serviceaccount:<ns>:<name>` with the groups Kubernetes gives it.
    pub fn service_account(namespace: &str, name: &str) -> UserInfo {
        UserInfo {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }

    /// The user of a request without credentials, in group `system:unauthenticated`.
    pub fn anonymous() -> UserInfo {
        UserInfo {
            name: ANONYMOUS.into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }

    /// The holder of the admin token: `system:admin`, in [`MASTERS_GROUP`].
    pub fn admin() -> UserInfo {
        UserInfo {
            name: "system:admin".into(),
            groups: vec![MASTERS_GROUP.into(), "system:authenticated".into()],
        }
    }

    fn service_account_parts(&self) -> Option<(&str, &str)> {
        self.name
            .strip_prefix("system:serviceaccount:")?
            .split_once(':')
    }
}

/// What a resource request does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceAttributes {
    /// The Kubernetes verb (`get`, `list`, `create`, ...).
    pub verb: String,
    /// The API group, empty for the core group.
    pub api_group: String,
    /// The resource plural.
    pub resource: String,
    /// The subresource, such as `status` or `binding`.
    pub subresource: Option<String>,
    /// The namespace of the request; None for cluster-scoped resources and cluster-wide requests.
    pub namespace: Option<String>,
    /// The object's name, when the request names one (matched against `resourceNames`).
    pub name: Option<String>,
}

/// Every RBAC object of the cluster.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Every ClusterRole.
    pub cluster_roles: Vec<ClusterRole>,
    /// Every Role, of every namespace.
    pub roles: Vec<Role>,
    /// Every ClusterRoleBinding.
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    /// Every RoleBinding, of every namespace.
    pub role_bindings: Vec<RoleBinding>,
}

fn has(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

/// Reads every RBAC object from the store (objects that do not parse grant nothing).
pub fn policy_from_store(store: &crate::store::Store) -> Policy {
    fn all<T: serde::de::DeserializeOwned>(store: &crate::store::Store, plural: &str) -> Vec<T> {
        crate::resources::lookup("rbac.authorization.k8s.io", "v1", plural)
            .map(|r| {
                store
                    .objects_of(r)
                    .iter()
                    .filter_map(|o| serde_json::from_str(&o.json).ok())
                    .collect()
            })
            .unwrap_or_default()
    }
    Policy {
        cluster_roles: all(store, "clusterroles"),
        roles: all(store, "roles"),
        cluster_role_bindings: all(store, "clusterrolebindings"),
        role_bindings: all(store, "rolebindings"),
    }
}

/// Whether one rule grants the request.
pub fn rule_allows(rule: &PolicyRule, a: &ResourceAttributes) -> bool {
    if !has(&rule.verbs, &a.verb) {
        return false;
    }
    if !has(rule.api_groups.as_deref().unwrap_or_default(), &a.api_group) {
        return false;
    }
    let resources = rule.resources.as_deref().unwrap_or_default();
    let resource_ok = match &a.subresource {
        None => has(resources, &a.resource),
        Some(sub) => resources.iter().any(|r| {
            r == "*"
                || *r == format!("{}/{sub}", a.resource)
                || *r == format!("{}/*", a.resource)
                || *r == format!("*/{sub}")
        }),
    };
    if !resource_ok {
        return false;
    }
    match rule.resource_names.as_deref() {
        None | Some([]) => true,
        // A name-restricted rule never grants list/watch/create without a name.
        Some(names) => a.name.as_ref().is_some_and(|n| names.contains(n)),
    }
}

/// Whether a binding subject is this user.
pub fn subject_matches(s: &Subject, user: &UserInfo, binding_namespace: Option<&str>) -> bool {
    match s.kind.as_str() {
        "User" => s.name == user.name,
        "Group" => user.groups.contains(&s.name),
        "ServiceAccount" => {
            // An empty namespace means the binding's own namespace.
            let ns = s
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .or(binding_namespace);
            user.service_account_parts() == ns.map(|ns| (ns, s.name.as_str()))
        }
        _ => false,
    }
}

fn cluster_role_rules<'p>(policy: &'p Policy, name: &str) -> &'p [PolicyRule] {
    policy
        .cluster_roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(name))
        .and_then(|r| r.rules.as_deref())
        .unwrap_or_default()
}

fn role_rules<'p>(policy: &'p Policy, role_ref: &RoleRef, namespace: &str) -> &'p [PolicyRule] {
    match role_ref.kind.as_str() {
        "ClusterRole" => cluster_role_rules(policy, &role_ref.name),
        "Role" => policy
            .roles
            .iter()
            .find(|r| {
                r.metadata.name.as_deref() == Some(role_ref.name.as_str())
                    && r.metadata.namespace.as_deref() == Some(namespace)
            })
            .and_then(|r| r.rules.as_deref())
            .unwrap_or_default(),
        _ => &[],
    }
}

/// The rules that apply to this user for a request in `namespace` (None: cluster scope).
pub fn applicable_rules<'p>(
    policy: &'p Policy,
    user: &UserInfo,
    namespace: Option<&str>,
) -> Vec<&'p PolicyRule> {
    let mut out = Vec::new();
    for b in &policy.cluster_role_bindings {
        let subjects = b.subjects.as_deref().unwrap_or_default();
        if b.role_ref.kind == "ClusterRole"
            && subjects.iter().any(|s| subject_matches(s, user, None))
        {
            out.extend(cluster_role_rules(policy, &b.role_ref.name));
        }
    }
    if let Some(ns) = namespace {
        for b in policy
            .role_bindings
            .iter()
            .filter(|b| b.metadata.namespace.as_deref() == Some(ns))
        {
            let subjects = b.subjects.as_deref().unwrap_or_default();
            if subjects.iter().any(|s| subject_matches(s, user, Some(ns))) {
                out.extend(role_rules(policy, &b.role_ref, ns));
            }
        }
    }
    out
}

/// Allowed, or the reason Kubernetes gives for the 403.
pub fn authorize(policy: &Policy, user: &UserInfo, a: &ResourceAttributes) -> Result<(), String> {
    if user.groups.iter().any(|g| g == MASTERS_GROUP) {
        return Ok(());
    }
    if applicable_rules(policy, user, a.namespace.as_deref())
        .iter()
        .any(|r| rule_allows(r, a))
    {
        return Ok(());
    }
    Err(forbidden_message(user, a))
}

/// `pods "p" is forbidden: User "u" cannot patch resource "pods" in API group "" in the
/// namespace "default"`, as Kubernetes words it.
pub fn forbidden_message(user: &UserInfo, a: &ResourceAttributes) -> String {
    let gr = if a.api_group.is_empty() {
        a.resource.clone()
    } else {
        format!("{}.{}", a.resource, a.api_group)
    };
    let what = match &a.name {
        Some(n) => format!("{gr} \"{n}\""),
        None => gr,
    };
    let resource = match &a.subresource {
        Some(s) => format!("{}/{s}", a.resource),
        None => a.resource.clone(),
    };
    let scope = match &a.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".into(),
    };
    format!(
        "{what} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
        user.name, a.verb, a.api_group
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use proptest::prelude::*;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        PolicyRule {
            api_groups: Some(v(groups)),
            resources: Some(v(resources)),
            verbs: v(verbs),
            resource_names: (!names.is_empty()).then(|| v(names)),
            non_resource_urls: None,
        }
    }

    fn attrs(
        verb: &str,
        group: &str,
        res: &str,
        sub: Option<&str>,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> ResourceAttributes {
        ResourceAttributes {
            verb: verb.into(),
            api_group: group.into(),
            resource: res.into(),
            subresource: sub.map(String::from),
            namespace: ns.map(String::from),
            name: name.map(String::from),
        }
    }

    fn meta(name: &str, ns: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: ns.map(String::from),
            ..Default::default()
        }
    }

    fn sa_subject(ns: &str, name: &str) -> Subject {
        Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(ns.into()),
            api_group: None,
        }
    }

    fn policy() -> Policy {
        Policy {
            cluster_roles: vec![ClusterRole {
                metadata: meta("sched", None),
                rules: Some(vec![
                    rule(&[""], &["pods"], &["get", "list", "watch", "patch"], &[]),
                    rule(&[""], &["pods/binding"], &["create"], &[]),
                ]),
                aggregation_rule: None,
            }],
            roles: vec![Role {
                metadata: meta("lease", Some("hami")),
                rules: Some(vec![
                    rule(&["coordination.k8s.io"], &["leases"], &["create"], &[]),
                    rule(
                        &["coordination.k8s.io"],
                        &["leases"],
                        &["get", "update"],
                        &["hami-scheduler"],
                    ),
                ]),
            }],
            cluster_role_bindings: vec![ClusterRoleBinding {
                metadata: meta("sched", None),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: "sched".into(),
                },
                subjects: Some(vec![sa_subject("hami", "scheduler")]),
            }],
            role_bindings: vec![RoleBinding {
                metadata: meta("lease", Some("hami")),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: "lease".into(),
                },
                subjects: Some(vec![Subject {
                    namespace: None,
                    ..sa_subject("", "scheduler")
                }]),
            }],
        }
    }

    #[test]
    fn cluster_and_namespaced_grants() {
        let p = policy();
        let u = UserInfo::service_account("hami", "scheduler");
        assert!(
            authorize(
                &p,
                &u,
                &attrs("patch", "", "pods", None, Some("default"), Some("x"))
            )
            .is_ok()
        );
        assert!(authorize(&p, &u, &attrs("watch", "", "pods", None, None, None)).is_ok());
        assert!(
            authorize(
                &p,
                &u,
                &attrs("create", "", "pods", Some("binding"), Some("a"), Some("x"))
            )
            .is_ok()
        );
        // Not granted: another verb, the subresource's parent verb, another subresource.
        let e = authorize(
            &p,
            &u,
            &attrs("delete", "", "pods", None, Some("default"), Some("x")),
        )
        .unwrap_err();
        assert_eq!(
            e,
            "pods \"x\" is forbidden: User \"system:serviceaccount:hami:scheduler\" cannot delete resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        assert!(authorize(&p, &u, &attrs("create", "", "pods", None, Some("a"), None)).is_err());
        assert!(
            authorize(
                &p,
                &u,
                &attrs("patch", "", "pods", Some("status"), Some("a"), Some("x"))
            )
            .is_err()
        );
        // The Role works in its namespace only, with its resourceNames.
        assert!(
            authorize(
                &p,
                &u,
                &attrs(
                    "get",
                    "coordination.k8s.io",
                    "leases",
                    None,
                    Some("hami"),
                    Some("hami-scheduler")
                )
            )
            .is_ok()
        );
        assert!(
            authorize(
                &p,
                &u,
                &attrs(
                    "get",
                    "coordination.k8s.io",
                    "leases",
                    None,
                    Some("hami"),
                    Some("other")
                )
            )
            .is_err()
        );
        assert!(
            authorize(
                &p,
                &u,
                &attrs(
                    "create",
                    "coordination.k8s.io",
                    "leases",
                    None,
                    Some("hami"),
                    None
                )
            )
            .is_ok()
        );
        assert!(
            authorize(
                &p,
                &u,
                &attrs(
                    "list",
                    "coordination.k8s.io",
                    "leases",
                    None,
                    Some("hami"),
                    None
                )
            )
            .is_err()
        );
        let e = authorize(
            &p,
            &u,
            &attrs(
                "create",
                "coordination.k8s.io",
                "leases",
                None,
                Some("kube-system"),
                None,
            ),
        )
        .unwrap_err();
        assert!(
            e.contains("leases.coordination.k8s.io is forbidden") && e.contains("\"kube-system\""),
            "{e}"
        );
        // Another service account, anonymous: nothing; masters: everything.
        assert!(
            authorize(
                &p,
                &UserInfo::service_account("other", "scheduler"),
                &attrs("get", "", "pods", None, Some("a"), Some("x"))
            )
            .is_err()
        );
        assert!(
            authorize(
                &p,
                &UserInfo::anonymous(),
                &attrs("get", "", "pods", None, Some("a"), Some("x"))
            )
            .is_err()
        );
        assert!(
            authorize(
                &p,
                &UserInfo::admin(),
                &attrs("delete", "", "nodes", None, None, Some("n"))
            )
            .is_ok()
        );
        let e = authorize(&p, &u, &attrs("patch", "", "nodes", None, None, Some("n"))).unwrap_err();
        assert!(e.ends_with("at the cluster scope"), "{e}");
    }

    #[test]
    fn wildcards_and_groups() {
        let all_sub = rule(&["*"], &["pods/*"], &["*"], &[]);
        assert!(rule_allows(
            &all_sub,
            &attrs("create", "", "pods", Some("eviction"), Some("a"), Some("p"))
        ));
        assert!(!rule_allows(
            &all_sub,
            &attrs("get", "", "pods", None, Some("a"), Some("p"))
        ));
        let any_status = rule(&[""], &["*/status"], &["patch"], &[]);
        assert!(rule_allows(
            &any_status,
            &attrs("patch", "", "nodes", Some("status"), None, Some("n"))
        ));
        assert!(!rule_allows(
            &any_status,
            &attrs("patch", "", "nodes", None, None, Some("n"))
        ));
        let group = Subject {
            kind: "Group".into(),
            name: "system:serviceaccounts:hami".into(),
            namespace: None,
            api_group: None,
        };
        assert!(subject_matches(
            &group,
            &UserInfo::service_account("hami", "x"),
            None
        ));
        assert!(!subject_matches(
            &group,
            &UserInfo::service_account("hamix", "x"),
            None
        ));
    }

    proptest! {
        /// A rule grants exactly its verbs: removing the request's verb from it denies.
        #[test]
        fn granting_is_monotone(verb in prop::sample::select(vec!["get","list","watch","create","update","patch","delete"]),
                                extra in prop::collection::vec(prop::sample::select(vec!["get","list","watch","create","update","patch","delete"]), 0..4),
                                named in any::<bool>()) {
            let a = attrs(verb, "", "pods", None, Some("ns"), named.then_some("p"));
            let mut verbs: Vec<&str> = extra.clone();
            verbs.push(verb);
            let r = rule(&[""], &["pods"], &verbs, &[]);
            prop_assert!(rule_allows(&r, &a));
            let without: Vec<&str> = verbs.iter().copied().filter(|v| *v != verb).collect();
            prop_assert!(!rule_allows(&rule(&[""], &["pods"], &without, &[]), &a));
            // Name-restricted rules need the name.
            let restricted = rule(&[""], &["pods"], &verbs, &["p"]);
            prop_assert_eq!(rule_allows(&restricted, &a), named);
        }
    }
}
