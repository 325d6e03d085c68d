//! Tokens of TokenRequests bound to a pod (`spec.boundObjectRef`, what kubelet asks for
//! the `serviceAccountToken` projection of a pod's `kube-api-access` volume). As upstream's
//! bound tokens, one authenticates as its service account only while the account and the
//! pod it is bound to both exist with the UIDs they had when it was issued, and until it
//! expires (a token asked for 3607 s, the injected volume's lifetime, is valid for a year,
//! as kube-apiserver's `--service-account-extend-token-expiration` makes it). Upstream's are
//! signed JWTs; these are opaque random strings kept in memory, so a restarted server
//! forgets them (the kubelet asks again when its token is refused).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::rbac::UserInfo;
use crate::resources;
use crate::status::ApiError;
use crate::store::Store;

/// What one issued token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundToken {
    /// The service account's namespace.
    pub namespace: String,
    /// The service account's name.
    pub service_account: String,
    /// Its UID at issue time.
    pub service_account_uid: String,
    /// The pod the token is bound to.
    pub pod: String,
    /// The pod's UID at issue time.
    pub pod_uid: String,
    /// When the token stops authenticating.
    pub expires: SystemTime,
}

/// Tokens issued so far, by token.
pub type BoundTokens = HashMap<String, BoundToken>;

/// The lifetime kube-apiserver gives a token requested for exactly
/// [`crate::service_accounts::WARN_ONLY_EXPIRATION_SECONDS`].
pub const EXTENDED_EXPIRATION: Duration = Duration::from_secs(365 * 24 * 3600);

fn uid(v: &Value) -> String {
    v.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Checks `bound` (the request's `spec.boundObjectRef`) against the store as upstream's
/// TokenRequest storage does, and issues a token bound to that pod for `ns/sa`, valid for
/// `seconds`. Answers the token and how long it is valid.
pub fn issue(
    store: &mut Store,
    ns: &str,
    sa: &str,
    bound: &Value,
    seconds: i64,
) -> Result<(String, Duration), ApiError> {
    let api_version = bound
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = bound.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "Pod" || !(api_version.is_empty() || api_version == "v1") {
        return Err(ApiError::bad_request(format!(
            "cannot bind token to object of type {api_version}, Kind={kind}: this server binds tokens to pods (apiVersion v1, kind Pod) only"
        )));
    }
    let name = bound.get("name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() {
        return Err(ApiError::bad_request(
            "spec.boundObjectRef.name is required: the name of the pod the token is bound to",
        ));
    }
    let pods = resources::lookup("", "v1", "pods").expect("served");
    let sas = resources::lookup("", "v1", "serviceaccounts").expect("served");
    let account = store.get(sas, ns, sa)?;
    let pod = store.get(pods, ns, name)?;
    let want_uid = bound.get("uid").and_then(Value::as_str).unwrap_or("");
    if !want_uid.is_empty() && want_uid != uid(&pod) {
        return Err(ApiError::conflict(
            "",
            "Pod",
            name,
            &format!(
                "the UID in the bound object reference ({want_uid}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    let runs_as = pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(crate::service_accounts::DEFAULT_SERVICE_ACCOUNT);
    if runs_as != sa {
        return Err(ApiError::bad_request(format!(
            "cannot bind token for serviceaccount {sa:?} to pod running with different serviceaccount name."
        )));
    }
    let lifetime = if seconds == crate::service_accounts::WARN_ONLY_EXPIRATION_SECONDS {
        EXTENDED_EXPIRATION
    } else {
        Duration::from_secs(seconds.max(0) as u64)
    };
    let now = SystemTime::now();
    // Forget what can never authenticate again, so the table stays as large as the pods.
    let stale: Vec<String> = store
        .bound_tokens
        .iter()
        .filter(|(_, t)| check(store, t, now).is_err())
        .map(|(k, _)| k.clone())
        .collect();
    for k in stale {
        store.bound_tokens.remove(&k);
    }
    let token = crate::authn::random_token();
    store.bound_tokens.insert(
        token.clone(),
        BoundToken {
            namespace: ns.into(),
            service_account: sa.into(),
            service_account_uid: uid(&account),
            pod: name.into(),
            pod_uid: uid(&pod),
            expires: now + lifetime,
        },
    );
    Ok((token, lifetime))
}

/// Whether `t` still authenticates at `now`: not expired, its account and pod still there
/// with the same UIDs.
fn check(store: &Store, t: &BoundToken, now: SystemTime) -> Result<(), ()> {
    let pods = resources::lookup("", "v1", "pods").ok_or(())?;
    let sas = resources::lookup("", "v1", "serviceaccounts").ok_or(())?;
    if now >= t.expires {
        return Err(());
    }
    let account = store
        .get(sas, &t.namespace, &t.service_account)
        .map_err(|_| ())?;
    let pod = store.get(pods, &t.namespace, &t.pod).map_err(|_| ())?;
    if uid(&account) != t.service_account_uid || uid(&pod) != t.pod_uid {
        return Err(());
    }
    Ok(())
}

/// The user a bound token authenticates as; None: not a bound token. A bound token that no
/// longer holds (expired, or its pod or account gone) is 401, as upstream answers it.
pub fn authenticate(store: &Store, token: &str) -> Option<Result<UserInfo, ApiError>> {
    let t = store.bound_tokens.get(token)?;
    Some(
        check(store, t, SystemTime::now())
            .map(|()| UserInfo::service_account(&t.namespace, &t.service_account))
            .map_err(|()| crate::authn::unauthorized()),
    )
}
