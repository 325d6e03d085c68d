//! User impersonation (`Impersonate-User`, `Impersonate-Group` headers, what kubeconfig's
//! `as:` sends): the request is then made, authorized and admitted as that user. With
//! authentication on, the authenticated user needs the `impersonate` verb on `users`
//! (`serviceaccounts` in its namespace for a service account name) and on `groups`, as
//! upstream's impersonation filter checks; with it off every caller is the admin, who may.
//! Stacks that run with authentication off use it to give each component its own
//! ServiceAccount identity, so that webhooks tell the scheduler's writes from a user's.

use axum::http::HeaderMap;

use crate::rbac::{self, Policy, ResourceAttributes, UserInfo};
use crate::status::ApiError;

const SA_PREFIX: &str = "system:serviceaccount:";

/// The user a request asks to act as, if any. Groups without a user are refused (400), as
/// upstream refuses them. The groups are those asked for; a service account without any
/// gets its own (`system:serviceaccounts`, `system:serviceaccounts:<ns>`), and every
/// impersonated user but `system:anonymous` is `system:authenticated`.
pub fn from_headers(headers: &HeaderMap) -> Result<Option<UserInfo>, ApiError> {
    let values = |name: &str| -> Result<Vec<String>, ApiError> {
        headers
            .get_all(name)
            .iter()
            .map(|v| {
                v.to_str().map(str::to_string).map_err(|_| {
                    ApiError::bad_request(format!("the {name} header is not visible ASCII"))
                })
            })
            .collect()
    };
    let users = values("impersonate-user")?;
    let mut groups = values("impersonate-group")?;
    let Some(name) = users.first().cloned() else {
        if groups.is_empty() {
            return Ok(None);
        }
        return Err(ApiError::bad_request(format!(
            "requested {groups:?} without impersonating a user"
        )));
    };
    if users.len() > 1 || name.is_empty() {
        return Err(ApiError::bad_request(
            "exactly one non-empty Impersonate-User header is allowed",
        ));
    }
    if groups.is_empty()
        && let Some(ns) = service_account_namespace(&name)
    {
        groups.push("system:serviceaccounts".into());
        groups.push(format!("system:serviceaccounts:{ns}"));
    }
    if name != rbac::ANONYMOUS && !groups.iter().any(|g| g == "system:authenticated") {
        groups.push("system:authenticated".into());
    }
    Ok(Some(UserInfo { name, groups }))
}

fn service_account_namespace(user: &str) -> Option<&str> {
    let (ns, name) = user.strip_prefix(SA_PREFIX)?.split_once(':')?;
    (!ns.is_empty() && !name.is_empty()).then_some(ns)
}

/// Whether `user` may act as `target` (the user, then each group it asked for); Err is
/// the message of the 403.
pub fn authorize(policy: &Policy, user: &UserInfo, target: &UserInfo) -> Result<(), String> {
    let attrs = |resource: &str, namespace: Option<&str>, name: &str| ResourceAttributes {
        verb: "impersonate".into(),
        api_group: String::new(),
        resource: resource.into(),
        subresource: None,
        namespace: namespace.map(str::to_string),
        name: Some(name.to_string()),
    };
    let user_attrs = match target
        .name
        .strip_prefix(SA_PREFIX)
        .and_then(|r| r.split_once(':'))
    {
        Some((ns, sa)) => attrs("serviceaccounts", Some(ns), sa),
        None => attrs("users", None, &target.name),
    };
    rbac::authorize(policy, user, &user_attrs)?;
    for g in &target.groups {
        // The groups added for the target, not asked for, need no grant.
        if g == "system:authenticated" || g.starts_with("system:serviceaccounts") {
            continue;
        }
        rbac::authorize(policy, user, &attrs("groups", None, g))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn service_accounts_get_their_groups() {
        let u = from_headers(&headers(&[(
            "impersonate-user",
            "system:serviceaccount:kube-system:hami-scheduler",
        )]))
        .unwrap()
        .unwrap();
        assert_eq!(u.name, "system:serviceaccount:kube-system:hami-scheduler");
        assert_eq!(
            u.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:kube-system",
                "system:authenticated"
            ]
        );
        assert_eq!(from_headers(&HeaderMap::new()).unwrap(), None);
        let e = from_headers(&headers(&[("impersonate-group", "g")])).unwrap_err();
        assert_eq!(e.code, 400);
        let u = from_headers(&headers(&[
            ("impersonate-user", "alice"),
            ("impersonate-group", "devs"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(u.groups, ["devs", "system:authenticated"]);
    }

    #[test]
    fn impersonating_needs_the_verb_unless_a_master() {
        let policy = Policy::default();
        let alice = UserInfo {
            name: "alice".into(),
            groups: vec!["system:authenticated".into()],
        };
        let sa = from_headers(&headers(&[(
            "impersonate-user",
            "system:serviceaccount:kube-system:hami-scheduler",
        )]))
        .unwrap()
        .unwrap();
        let e = authorize(&policy, &alice, &sa).unwrap_err();
        assert!(
            e.contains("impersonate") && e.contains("serviceaccounts"),
            "{e}"
        );
        let admin = crate::admission::unauthenticated_admin();
        assert_eq!(authorize(&policy, &admin, &sa), Ok(()));
    }
}
