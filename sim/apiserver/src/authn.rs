//! Bearer-token authentication, on when `Config::auth` is set. Two kinds of token:
//! - the admin token of `AuthConfig` (user `system:admin`, group `system:masters`), the one
//!   the written kubeconfig carries;
//! - service-account tokens: Secrets of type `kubernetes.io/service-account-token`
//!   annotated `kubernetes.io/service-account.name`, as Kubernetes' legacy token controller
//!   keeps them. Creating such a Secret without `data.token` makes the server fill in a
//!   fresh random token (the token controller's job); the service account must exist.
//!
//! No header: `system:anonymous`. A token that matches nothing: 401 Unauthorized.

use std::hash::{BuildHasher, Hasher};

use k8s_openapi::api::core::v1::Secret;
use serde_json::{Value, json};

use crate::rbac::UserInfo;
use crate::resources;
use crate::status::ApiError;
use crate::store::Store;

/// The Secret `type` of a ServiceAccount token Secret, the only Secrets whose tokens authenticate.
pub const SA_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";
/// The annotation on a token Secret naming the ServiceAccount it authenticates as.
pub const SA_NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";

/// Authentication settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    /// Token of the `system:masters` user (tests, kubectl, seeding).
    pub admin_token: String,
}

impl Default for AuthConfig {
    /// The token the server's kubeconfig has always carried, so it stays an admin kubeconfig.
    fn default() -> Self {
        AuthConfig {
            admin_token: crate::kubeconfig::PLACEHOLDER_TOKEN.into(),
        }
    }
}

/// The 401 Status answered for a bearer token that is malformed or matches neither the
/// admin token nor a token Secret (a request without credentials is anonymous instead).
pub fn unauthorized() -> ApiError {
    ApiError::new(401, "Unauthorized", "Unauthorized")
}

/// A random 256-bit token, hex (std's SipHash keys are seeded from the OS RNG).
pub fn random_token() -> String {
    let mut out = String::new();
    for i in 0..4u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// The token controller: fills `data.token` (and `data.namespace`) of a new
/// service-account token Secret that has none.
pub fn fill_token_secret(obj: &mut Value, namespace: &str) {
    if obj.get("type").and_then(Value::as_str) != Some(SA_TOKEN_TYPE) {
        return;
    }
    let has_token = obj
        .pointer("/data/token")
        .is_some_and(|t| t.as_str().is_some_and(|s| !s.is_empty()));
    if has_token {
        return;
    }
    let b64 = |s: &str| {
        serde_json::to_value(k8s_openapi::ByteString(s.as_bytes().to_vec())).unwrap_or(Value::Null)
    };
    let data = obj
        .as_object_mut()
        .map(|o| o.entry("data").or_insert_with(|| json!({})));
    if let Some(Value::Object(d)) = data {
        d.insert("token".into(), b64(&random_token()));
        d.insert("namespace".into(), b64(namespace));
    }
}

/// `serviceaccounts/<name>/token` (what `kubectl create token` and kubelet call): a token
/// that authenticates as the ServiceAccount, answered as a `TokenRequest`. Bound to a pod
/// (`spec.boundObjectRef`, kubelet's requests): a token of its own, valid while the pod and
/// the account exist (see `bound_tokens`). Unbound: the account's legacy token Secret
/// `<name>-token` (created if missing), valid while the account exists, its
/// `expirationTimestamp` reported but not enforced. `audiences` are echoed, not checked.
pub fn token_request(
    store: &mut Store,
    namespace: &str,
    name: &str,
    request: &Value,
) -> Result<Value, ApiError> {
    let sas = resources::lookup("", "v1", "serviceaccounts").expect("served");
    store.get(sas, namespace, name)?;
    if let Some(k) = request.get("kind").and_then(Value::as_str)
        && k != "TokenRequest"
    {
        return Err(ApiError::bad_request(format!(
            "the body of a serviceaccounts/token request must be a TokenRequest, not {k}"
        )));
    }
    let seconds = match request.pointer("/spec/expirationSeconds") {
        None | Some(Value::Null) => 3600,
        Some(v) => match v.as_i64() {
            Some(s) if s >= 600 => s,
            _ => {
                return Err(ApiError::invalid(
                    "authentication.k8s.io",
                    "TokenRequest",
                    name,
                    &[(
                        "spec.expirationSeconds",
                        format!(
                            "Invalid value: {v}: may not specify a duration less than 10 minutes"
                        ),
                    )],
                ));
            }
        },
    };
    let bound = request
        .pointer("/spec/boundObjectRef")
        .filter(|b| !b.is_null());
    let token = match bound {
        // Bound to a pod: a token of its own that dies with the pod (bound_tokens).
        Some(b) => crate::bound_tokens::issue(store, namespace, name, b, seconds)?.0,
        None => legacy_token(store, namespace, name)?,
    };
    // meta::now_timestamp: jiff's own clock needs its `std` feature, which a build of
    // this crate alone does not turn on.
    let now = crate::meta::now_timestamp();
    let expires = now
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(seconds))
        .unwrap_or(now);
    let fmt = |t: k8s_openapi::jiff::Timestamp| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    Ok(json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": fmt(now)},
        "spec": {
            "audiences": request.pointer("/spec/audiences").cloned().unwrap_or(json!([])),
            "expirationSeconds": seconds,
            "boundObjectRef": request.pointer("/spec/boundObjectRef").cloned().unwrap_or(Value::Null),
        },
        "status": {"token": token, "expirationTimestamp": fmt(expires)},
    }))
}

/// The token of the account's legacy token Secret `<name>-token`, created if missing.
fn legacy_token(store: &mut Store, namespace: &str, name: &str) -> Result<String, ApiError> {
    let secrets = resources::lookup("", "v1", "secrets").expect("served");
    let secret_name = format!("{name}-token");
    if store.get(secrets, namespace, &secret_name).is_err() {
        store.create(
            secrets,
            Some(namespace),
            json!({"apiVersion": "v1", "kind": "Secret", "type": SA_TOKEN_TYPE,
                   "metadata": {"name": secret_name, "namespace": namespace,
                                "annotations": {SA_NAME_ANNOTATION: name}}}),
        )?;
    }
    let secret = store.get(secrets, namespace, &secret_name)?;
    let token: k8s_openapi::ByteString =
        serde_json::from_value(secret.pointer("/data/token").cloned().unwrap_or_default())
            .map_err(|e| {
                ApiError::internal(format!("token Secret {namespace}/{secret_name}: {e}"))
            })?;
    String::from_utf8(token.0).map_err(|_| ApiError::internal("the token is not UTF-8"))
}

/// Who sent the request (`authorization` is the header value, if any).
pub fn authenticate(
    store: &Store,
    config: &AuthConfig,
    authorization: Option<&str>,
) -> Result<UserInfo, ApiError> {
    let Some(header) = authorization else {
        return Ok(UserInfo::anonymous());
    };
    let token = header
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(unauthorized)?;
    if token == config.admin_token {
        return Ok(UserInfo::admin());
    }
    if let Some(user) = crate::bound_tokens::authenticate(store, token) {
        return user;
    }
    let secrets = resources::lookup("", "v1", "secrets").ok_or_else(unauthorized)?;
    let sas = resources::lookup("", "v1", "serviceaccounts").ok_or_else(unauthorized)?;
    for stored in store.objects_of(secrets) {
        if !stored.json.contains(SA_TOKEN_TYPE) {
            continue;
        }
        let Ok(secret) = serde_json::from_str::<Secret>(&stored.json) else {
            continue;
        };
        if secret.type_.as_deref() != Some(SA_TOKEN_TYPE) {
            continue;
        }
        let matches = secret
            .data
            .as_ref()
            .and_then(|d| d.get("token"))
            .is_some_and(|t| t.0 == token.as_bytes());
        if !matches {
            continue;
        }
        let ns = secret.metadata.namespace.clone().unwrap_or_default();
        let Some(sa) = secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SA_NAME_ANNOTATION))
        else {
            return Err(unauthorized());
        };
        // A token outlives nothing: its service account must still exist.
        if store.get(sas, &ns, sa).is_err() {
            return Err(unauthorized());
        }
        return Ok(UserInfo::service_account(&ns, sa));
    }
    Err(unauthorized())
}
