//! Whether every shipped grant is needed: the request log replayed through the embedded
//! API server's authorizer with one verb of one rule removed at a time. A verb whose
//! removal denies none of the requests a component made is a grant it does not use.

use hami_apiserver::RequestRecord;
use hami_apiserver::rbac::{Policy, ResourceAttributes, UserInfo, authorize};
use hami_manifests::Object;
use k8s_openapi::api::rbac::v1::PolicyRule;

/// A grant only a race exercises: (service account, API group, resource, verb). A run may
/// or may not use it (the race is timing: plugin-core's pod watch may not yet have shown the
/// lock owner); every other grant must be used. Name the code path that needs it beside the
/// entry.
pub type RaceOnly = (&'static str, &'static str, &'static str, &'static str);

/// The RBAC part of `objs` as the authorizer's policy (other kinds are skipped).
pub fn policy_of(objs: &[Object]) -> Policy {
    let mut p = Policy::default();
    for o in objs {
        match o {
            Object::ClusterRole(r) => p.cluster_roles.push(r.clone()),
            Object::Role(r) => p.roles.push(r.clone()),
            Object::ClusterRoleBinding(b) => p.cluster_role_bindings.push(b.clone()),
            Object::RoleBinding(b) => p.role_bindings.push(b.clone()),
            _ => {}
        }
    }
    p
}

/// A logged request as the authorizer sees it.
pub fn attrs_of(r: &RequestRecord) -> ResourceAttributes {
    let (resource, sub) = match r.resource.split_once('/') {
        Some((res, sub)) => (res.to_string(), Some(sub.to_string())),
        None => (r.resource.clone(), None),
    };
    ResourceAttributes {
        verb: r.verb.clone(),
        api_group: r.api_group.clone(),
        resource,
        subresource: sub,
        namespace: r.namespace.clone(),
        name: r.name.clone(),
    }
}

/// The service account `ns/sa`'s identity and the requests it made (those naming a
/// resource), as the authorizer sees them.
pub fn made_by(log: &[RequestRecord], ns: &str, sa: &str) -> (UserInfo, Vec<ResourceAttributes>) {
    let who = UserInfo::service_account(ns, sa);
    let made = log
        .iter()
        .filter(|r| r.user.as_deref() == Some(who.name.as_str()) && !r.resource.is_empty())
        .map(attrs_of)
        .collect();
    (who, made)
}

/// Whether some request of `made` is denied once `verb` is removed from the rule `rule`
/// picks in a copy of `policy`.
fn needed(
    policy: &Policy,
    who: &UserInfo,
    made: &[ResourceAttributes],
    verb: &str,
    rule: impl FnOnce(&mut Policy) -> &mut PolicyRule,
) -> bool {
    let mut reduced = policy.clone();
    rule(&mut reduced).verbs.retain(|v| v != verb);
    made.iter().any(|a| authorize(&reduced, who, a).is_err())
}

fn is_race_only(race_only: &[RaceOnly], sa: &str, rule: &PolicyRule, verb: &str) -> bool {
    race_only.iter().any(|(s, g, r, v)| {
        *s == sa
            && rule.api_groups.as_deref() == Some(&[g.to_string()][..])
            && rule.resources.as_deref() == Some(&[r.to_string()][..])
            && *v == verb
    })
}

/// Every verb of every rule bound to one of `accounts` (service accounts in `ns`) that none
/// of its requests in `log` needed (removing it denies nothing) and that is not listed in
/// `race_only`: empty when the grants are exactly what the components use.
pub fn unused_grants(
    policy: &Policy,
    log: &[RequestRecord],
    ns: &str,
    accounts: &[&str],
    race_only: &[RaceOnly],
) -> Vec<String> {
    unused_grants_among(policy, log, ns, accounts, race_only, |_, _| true)
}

/// [`unused_grants`] of the rules `checked(account, rule)` picks (the others stay granted
/// and are not checked): for a component whose other rules another test covers.
pub fn unused_grants_among(
    policy: &Policy,
    log: &[RequestRecord],
    ns: &str,
    accounts: &[&str],
    race_only: &[RaceOnly],
    checked: impl Fn(&str, &PolicyRule) -> bool,
) -> Vec<String> {
    let mut unused = Vec::new();
    for &sa in accounts {
        let (who, made) = made_by(log, ns, sa);
        for (ri, role) in policy.cluster_roles.iter().enumerate() {
            let bound_to_sa = policy.cluster_role_bindings.iter().any(|b| {
                b.role_ref.name == role.metadata.name.clone().unwrap()
                    && b.subjects.iter().flatten().any(|s| s.name == sa)
            });
            if !bound_to_sa {
                continue;
            }
            for (rule_i, rule) in role.rules.iter().flatten().enumerate() {
                if !checked(sa, rule) {
                    continue;
                }
                for verb in &rule.verbs {
                    let used = needed(policy, &who, &made, verb, |p| {
                        &mut p.cluster_roles[ri].rules.as_mut().unwrap()[rule_i]
                    });
                    let race = is_race_only(race_only, sa, rule, verb);
                    if !used && !race {
                        unused.push(format!("{sa}: ClusterRole {} {:?} {:?} {verb} (used: {used}, listed as race-only: {race})", role.metadata.name.as_deref().unwrap(), rule.api_groups, rule.resources));
                    }
                }
            }
        }
        for (ri, role) in policy.roles.iter().enumerate() {
            let bound_to_sa = policy.role_bindings.iter().any(|b| {
                b.metadata.namespace == role.metadata.namespace
                    && b.role_ref.kind == "Role"
                    && b.role_ref.name == role.metadata.name.clone().unwrap()
                    && b.subjects.iter().flatten().any(|s| s.name == sa)
            });
            if !bound_to_sa {
                continue;
            }
            for (rule_i, rule) in role.rules.iter().flatten().enumerate() {
                if !checked(sa, rule) {
                    continue;
                }
                for verb in &rule.verbs {
                    let used = needed(policy, &who, &made, verb, |p| {
                        &mut p.roles[ri].rules.as_mut().unwrap()[rule_i]
                    });
                    let race = is_race_only(race_only, sa, rule, verb);
                    if !used && !race {
                        unused.push(format!(
                            "{sa}: Role {} {:?} {:?} {verb} (used: {used}, listed as race-only: {race})",
                            role.metadata.name.as_deref().unwrap(),
                            rule.api_groups,
                            rule.resources
                        ));
                    }
                }
            }
        }
    }
    unused
}
