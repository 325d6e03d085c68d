//! Kubernetes object names (RFC 1123, as upstream's `IsDNS1123Label` /
//! `IsDNS1123Subdomain` validate them): a name that passes is safe as one URL path segment
//! (no `/`, `?`, `#`, `%`, space or upper case), so a component that puts a name it was
//! handed (by kubelet, an annotation) into an API URL checks it here first (the AMD DRA
//! driver's claim identity, `hami_dra_core::claim_identity`).

/// A DNS label's longest length (namespaces, many object kinds).
pub const LABEL_MAX: usize = 63;
/// A DNS subdomain's longest length (most object names).
pub const SUBDOMAIN_MAX: usize = 253;

/// Why a name is not a DNS label or subdomain; the message names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsNameError {
    /// The name is empty.
    #[error("is empty")]
    Empty,
    /// Longer than the kind allows.
    #[error("is {len} characters long; at most {max} are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A character outside the kind's set, or a label not starting and ending alphanumeric.
    #[error(
        "must consist of lower case alphanumeric characters{dots}, and must start and end with an alphanumeric character (regex '{regex}')"
    )]
    Characters {
        /// `, '-' or '.'` for a subdomain, ` or '-'` for a label.
        dots: &'static str,
        /// The upstream validation regex.
        regex: &'static str,
    },
}

const LABEL_REGEX: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const SUBDOMAIN_REGEX: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

/// Whether `part` is `[a-z0-9]([-a-z0-9]*[a-z0-9])?` (no length check).
fn label_chars(part: &str) -> bool {
    let b = part.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && b.iter().all(|c| alnum(c) || *c == b'-')
        }
        _ => false,
    }
}

/// Checks an RFC 1123 label: at most 63 lower-case alphanumerics or `-`, starting and
/// ending alphanumeric (a namespace, a container name).
pub fn check_label(name: &str) -> Result<(), DnsNameError> {
    if name.is_empty() {
        return Err(DnsNameError::Empty);
    }
    if name.len() > LABEL_MAX {
        return Err(DnsNameError::TooLong {
            len: name.len(),
            max: LABEL_MAX,
        });
    }
    if !label_chars(name) {
        return Err(DnsNameError::Characters {
            dots: " or '-'",
            regex: LABEL_REGEX,
        });
    }
    Ok(())
}

/// Checks an RFC 1123 subdomain: at most 253 characters, labels of lower-case
/// alphanumerics or `-` joined by `.`, each starting and ending alphanumeric (most object
/// names, a ResourceClaim's included).
pub fn check_subdomain(name: &str) -> Result<(), DnsNameError> {
    if name.is_empty() {
        return Err(DnsNameError::Empty);
    }
    if name.len() > SUBDOMAIN_MAX {
        return Err(DnsNameError::TooLong {
            len: name.len(),
            max: SUBDOMAIN_MAX,
        });
    }
    if !name.split('.').all(label_chars) {
        return Err(DnsNameError::Characters {
            dots: ", '-' or '.'",
            regex: SUBDOMAIN_REGEX,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains_as_upstream_validates_them() {
        for ok in ["a", "0", "my-name", "123-abc", &"a".repeat(63)] {
            assert_eq!(check_label(ok), Ok(()), "{ok}");
            assert_eq!(check_subdomain(ok), Ok(()), "{ok}");
        }
        for ok in ["example.com", "a.b-c.d", &format!("{}.b", "a".repeat(63))] {
            assert_eq!(check_subdomain(ok), Ok(()), "{ok}");
            assert!(check_label(ok).is_err(), "{ok} is no label");
        }
        let long = [
            "a".repeat(63),
            "a".repeat(63),
            "a".repeat(63),
            "a".repeat(61),
        ]
        .join(".");
        assert_eq!(long.len(), 253);
        assert_eq!(check_subdomain(&long), Ok(()));
        assert_eq!(
            check_subdomain(&format!("{long}a")),
            Err(DnsNameError::TooLong { len: 254, max: 253 })
        );
        assert_eq!(
            check_label(&"a".repeat(64)),
            Err(DnsNameError::TooLong { len: 64, max: 63 })
        );
        assert_eq!(check_label(""), Err(DnsNameError::Empty));
        assert_eq!(check_subdomain(""), Err(DnsNameError::Empty));
        for bad in [
            "c?watch=true",
            "a/b",
            "..",
            ".a",
            "a.",
            "a..b",
            "-a",
            "a-",
            "A",
            "a b",
            "a%2fb",
            "a#b",
            "a\0",
            "é",
        ] {
            assert!(
                matches!(check_subdomain(bad), Err(DnsNameError::Characters { .. })),
                "{bad:?}"
            );
            assert!(check_label(bad).is_err(), "{bad:?}");
        }
        let text = check_label("Ns").unwrap_err().to_string();
        assert!(
            text.contains("lower case alphanumeric") && text.contains("[a-z0-9]"),
            "{text}"
        );
    }
}
