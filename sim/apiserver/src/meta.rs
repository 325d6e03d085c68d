//! Object metadata helpers: uids, timestamps, generated names and name validation.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// 64 unpredictable-enough bits: a per-process random hasher over a counter and the clock.
/// (No `rand`/`uuid` dependency is available; uniqueness matters here, not secrecy.)
fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    h.write_u64(now);
    h.finish()
}

/// The value at a JSON pointer made of plain object keys (`/metadata/name`): what
/// `Value::pointer` answers for such a path, without the two strings it allocates per token
/// to unescape `~0`/`~1` (the store's hot paths read a few of these per write).
pub fn at<'a>(v: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    let rest = path.strip_prefix('/')?;
    rest.split('/').try_fold(v, |cur, key| cur.get(key))
}

/// A random (version 4 layout) UUID string.
pub fn new_uid() -> String {
    let a = random_u64();
    let b = random_u64();
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_be_bytes());
    bytes[8..].copy_from_slice(&b.to_be_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    // 8-4-4-4-12 hex digits, written directly (every create takes one).
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(36);
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 0x0f)] as char);
    }
    out
}

/// The 5-character suffix alphabet Kubernetes uses for `generateName` (no vowels, no 0/1/3).
const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// A `generateName` result: `prefix` (cut so the name stays within 63 characters) plus 5
/// random characters from Kubernetes' alphabet.
pub fn generate_name(prefix: &str) -> String {
    // Kubernetes truncates the prefix so that the result stays within 63 characters.
    let max_prefix = 63 - 5;
    let prefix = if prefix.len() > max_prefix {
        &prefix[..max_prefix]
    } else {
        prefix
    };
    let mut r = random_u64();
    let mut s = String::from(prefix);
    for _ in 0..5 {
        s.push(ALPHANUMS[(r % ALPHANUMS.len() as u64) as usize] as char);
        r /= ALPHANUMS.len() as u64;
    }
    s
}

/// Now, as a jiff timestamp (built from the system clock; jiff's own clock needs a feature
/// that the workspace does not enable).
pub fn now_timestamp() -> k8s_openapi::jiff::Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    k8s_openapi::jiff::Timestamp::new(d.as_secs() as i64, d.subsec_nanos() as i32)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

/// The current time as Kubernetes serialises `metav1.Time`: RFC 3339, seconds, UTC.
pub fn now_rfc3339() -> String {
    let ts = now_timestamp();
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The current time as `metav1.MicroTime` (events.k8s.io eventTime, lease renewTime).
pub fn now_rfc3339_micros() -> String {
    let ts = now_timestamp();
    ts.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
}

/// DNS-1123 label: at most 63 lower-case alphanumerics or '-', starting and ending alphanumeric.
pub fn dns1123_label_error(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("name must not be empty".into());
    }
    if name.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    let b = name.as_bytes();
    let ok_char = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-';
    let ok_end = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !b.iter().all(|&c| ok_char(c)) || !ok_end(b[0]) || !ok_end(b[b.len() - 1]) {
        return Some(format!(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?') (got {name:?})"
        ));
    }
    None
}

/// DNS-1123 subdomain: at most 253 characters, dot-separated labels of lower-case
/// alphanumerics and '-'.
pub fn dns1123_subdomain_error(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("name must not be empty".into());
    }
    if name.len() > 253 {
        return Some("must be no more than 253 characters".into());
    }
    let ok = name.split('.').all(|part| {
        let b = part.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    });
    if !ok {
        return Some(format!(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*') (got {name:?})"
        ));
    }
    None
}

/// Validates a name for a resource type the way its Kubernetes strategy does.
pub fn name_error(plural: &str, name: &str) -> Option<String> {
    match plural {
        // Namespaces (and service accounts in practice) must be labels.
        "namespaces" => dns1123_label_error(name),
        _ => dns1123_subdomain_error(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn uid_shape() {
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!("89ab".contains(&u[19..20]), "{u}: RFC 4122 variant");
        for (i, c) in u.char_indices() {
            match i {
                8 | 13 | 18 | 23 => assert_eq!(c, '-', "{u}"),
                _ => assert!(c.is_ascii_hexdigit() && !c.is_ascii_uppercase(), "{u}"),
            }
        }
        assert_ne!(new_uid(), new_uid());
    }

    #[test]
    fn names() {
        assert!(dns1123_subdomain_error("a.b-c.d").is_none());
        assert!(dns1123_subdomain_error("Upper").is_some());
        assert!(dns1123_subdomain_error("a..b").is_some());
        assert!(dns1123_subdomain_error("-a").is_some());
        assert!(dns1123_label_error("a.b").is_some());
        assert!(dns1123_label_error("kube-system").is_none());
        let g = generate_name("web-");
        assert!(g.starts_with("web-") && g.len() == 9);
        assert!(dns1123_subdomain_error(&g).is_none());
    }

    #[test]
    fn time_format() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z'));
        assert_eq!(now_rfc3339_micros().len(), 27);
    }

    proptest! {
        #[test]
        fn generated_names_are_valid(prefix in "[a-z][a-z0-9-]{0,70}") {
            let n = generate_name(&prefix);
            prop_assert!(n.len() <= 63);
        }
    }
}
