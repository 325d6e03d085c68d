//! The claim kubelet names in `NodePrepareResources` (namespace, name, UID), checked before
//! the driver uses any of it: the namespace and name go into the API server's URL as path
//! segments (an unchecked `c?watch=true` turned the claim GET into an endless watch), the
//! UID names the claim's files. Every API server accepts only RFC 1123 names there, so
//! anything else is refused, naming the field and the rule.

use hami_protocol::dns_name::{self, DnsNameError};

/// A claim identity whose parts are safe as URL path segments and file names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimIdentity {
    /// An RFC 1123 label.
    pub namespace: String,
    /// An RFC 1123 subdomain.
    pub name: String,
    /// One path component (see [`crate::prepare::claim_paths`]).
    pub uid: String,
}

/// Why kubelet's claim identity is refused; the message names the field, its value and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimIdentityError {
    /// The namespace is not a DNS label.
    #[error(
        "claim namespace {value:?} is not a valid Kubernetes namespace (an RFC 1123 label of at most 63 characters): it {source}; refused before any API call"
    )]
    Namespace {
        /// The namespace as sent.
        value: String,
        /// The rule it breaks.
        source: DnsNameError,
    },
    /// The name is not a DNS subdomain.
    #[error(
        "claim name {value:?} is not a valid ResourceClaim name (an RFC 1123 subdomain of at most 253 characters): it {source}; refused before any API call"
    )]
    Name {
        /// The name as sent.
        value: String,
        /// The rule it breaks.
        source: DnsNameError,
    },
    /// The UID cannot name a file.
    #[error(
        "claim UID {value:?} is not a single path component (empty, '.', '..', or holding '/' or NUL); the driver names the claim's files by it and refuses it"
    )]
    Uid {
        /// The UID as sent.
        value: String,
    },
}

/// Whether `uid` can name a file of its own: one non-empty path component.
pub fn is_path_component(uid: &str) -> bool {
    !(uid.is_empty() || uid == "." || uid == ".." || uid.contains(['/', '\0']))
}

/// Checks kubelet's `Claim` fields: namespace a DNS label, name a DNS subdomain, UID one
/// path component (in that order: the first broken rule is reported).
pub fn claim_identity(
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<ClaimIdentity, ClaimIdentityError> {
    dns_name::check_label(namespace).map_err(|source| ClaimIdentityError::Namespace {
        value: namespace.into(),
        source,
    })?;
    dns_name::check_subdomain(name).map_err(|source| ClaimIdentityError::Name {
        value: name.into(),
        source,
    })?;
    if !is_path_component(uid) {
        return Err(ClaimIdentityError::Uid { value: uid.into() });
    }
    Ok(ClaimIdentity {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_dns_names_are_refused_naming_the_field() {
        let ok = claim_identity("ml", "gpu-claim.v1", "3f2c0b9e-5d6a").unwrap();
        assert_eq!(
            (ok.namespace.as_str(), ok.name.as_str()),
            ("ml", "gpu-claim.v1")
        );
        let e = claim_identity("default", "c?watch=true", "u").unwrap_err();
        assert!(matches!(e, ClaimIdentityError::Name { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("claim name \"c?watch=true\"") && text.contains("RFC 1123 subdomain"),
            "{text}"
        );
        let e = claim_identity("Kube_System", "c", "u").unwrap_err();
        assert!(
            e.to_string().starts_with("claim namespace \"Kube_System\""),
            "{e}"
        );
        let e = claim_identity(&"n".repeat(64), "c", "u").unwrap_err();
        assert!(
            e.to_string().contains("64 characters long; at most 63"),
            "{e}"
        );
        for uid in ["", ".", "..", "a/b", "a\0"] {
            assert!(
                matches!(
                    claim_identity("ns", "c", uid),
                    Err(ClaimIdentityError::Uid { .. })
                ),
                "{uid:?}"
            );
        }
    }
}
