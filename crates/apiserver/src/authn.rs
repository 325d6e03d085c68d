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

pub const SA_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";
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
