//! The names a claim goes by: the content-addressed template name, the pod's claim entry
//! per container, the managed label; and when two template specs mean the same.

use std::collections::BTreeMap;

use hami_protocol::dra::{CLAIM_PREFIX, MANAGED_BY_LABEL, MANAGED_BY_WEBHOOK};
use k8s_openapi::api::resource::v1::ResourceClaimTemplateSpec;
use serde_json::{Value, json};

pub(super) fn managed_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_WEBHOOK.to_owned())])
}

/// 64-bit FNV-1a: a stable content hash without a dependency (names, not security: a
/// template of our name with another spec is refused, never used).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `hami-amd-<16 hex>` of the spec's JSON.
pub fn template_name(spec: &ResourceClaimTemplateSpec) -> String {
    let json = serde_json::to_vec(spec).unwrap_or_default();
    format!("{CLAIM_PREFIX}{:016x}", fnv1a(&json))
}

/// Whether `name` is a DNS label (RFC 1123: ≤ 63, lowercase alphanumerics and `-`, no `-`
/// at either end).
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The pod claim entry of a container: `hami-amd-<container>`, or, when that is no DNS
/// label, a cleaned prefix of it with 8 hex of the name's hash (stable, distinct per name).
pub fn entry_name(container: &str) -> String {
    let plain = format!("{CLAIM_PREFIX}{container}");
    if is_dns_label(&plain) {
        return plain;
    }
    let hash = format!("{:08x}", fnv1a(container.as_bytes()) as u32);
    let clean: String = container
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(63 - CLAIM_PREFIX.len() - hash.len() - 1)
        .collect();
    let clean = clean.trim_matches('-');
    if clean.is_empty() {
        format!("{CLAIM_PREFIX}{hash}")
    } else {
        format!("{CLAIM_PREFIX}{clean}-{hash}")
    }
}

/// Whether two claim specs mean the same (quantities compared by value: the API server
/// writes them canonically, `4096Mi` as `4Gi`).
pub fn same_spec(a: &ResourceClaimTemplateSpec, b: &ResourceClaimTemplateSpec) -> bool {
    fn canonical(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for (key, value) in map.iter_mut() {
                    if key == "requests"
                        && let Value::Object(q) = value
                    {
                        for amount in q.values_mut() {
                            if let Some(n) = amount
                                .as_str()
                                .and_then(|s| hami_protocol::capacity::parse(s).ok())
                            {
                                *amount = json!(n);
                            }
                        }
                    } else {
                        canonical(value);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(canonical),
            _ => {}
        }
    }
    let norm = |s: &ResourceClaimTemplateSpec| {
        let mut v = serde_json::to_value(&s.spec).unwrap_or_default();
        canonical(&mut v);
        v
    };
    norm(a) == norm(b)
}
