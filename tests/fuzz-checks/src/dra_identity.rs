//! The claim identity the AMD DRA driver takes from kubelet (issue 27 item 6): namespace,
//! name and UID of each claim of a `NodePrepareResources` request, checked before the
//! driver puts them into an API URL or a file name.

use hami_deviceplugin_api::dra_v1::{Claim, NodePrepareResourcesRequest};
use hami_dra_core::claim_identity::{ClaimIdentityError, claim_identity};
use prost::Message;

/// An independent statement of RFC 1123 (upstream's regexes), by bytes.
fn reference_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && alnum(b[0])
        && alnum(b[b.len() - 1])
        && b.iter().all(|&c| alnum(c) || c == b'-')
}

fn reference_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(reference_label)
}

/// kubelet's DRA v1 `Claim` (alone, and every claim of a `NodePrepareResourcesRequest`):
/// the identity is accepted exactly when the namespace is an RFC 1123 label of at most 63,
/// the name a subdomain of at most 253, the UID one path component; what is accepted is
/// the input unchanged and safe as URL path segments (nothing a URL reads as a separator,
/// query, fragment or escape); a refusal is one line naming the field that broke its rule.
pub fn dra_claim_identity(data: &[u8]) {
    let mut claims: Vec<Claim> = Vec::new();
    if let Ok(c) = Claim::decode(data) {
        claims.push(c);
    }
    if let Ok(r) = NodePrepareResourcesRequest::decode(data) {
        claims.extend(r.claims);
    }
    for c in claims {
        let expected_ok = c.namespace.len() <= 63
            && reference_label(&c.namespace)
            && reference_subdomain(&c.name)
            && !(c.uid.is_empty() || c.uid == "." || c.uid == ".." || c.uid.contains(['/', '\0']));
        match claim_identity(&c.namespace, &c.name, &c.uid) {
            Ok(id) => {
                assert!(expected_ok, "accepted {c:?}");
                assert_eq!(
                    (id.namespace.as_str(), id.name.as_str(), id.uid.as_str()),
                    (c.namespace.as_str(), c.name.as_str(), c.uid.as_str())
                );
                let path = format!(
                    "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}",
                    id.namespace, id.name
                );
                assert!(
                    path.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"/-.".contains(&b)),
                    "{path}"
                );
                assert_eq!(path.split('/').count(), 8, "{path}");
            }
            Err(e) => {
                assert!(!expected_ok, "refused {c:?}: {e}");
                let text = e.to_string();
                assert!(!text.contains(['\n', '\r']), "two lines: {text:?}");
                let field = match e {
                    ClaimIdentityError::Namespace { .. } => "claim namespace ",
                    ClaimIdentityError::Name { .. } => "claim name ",
                    ClaimIdentityError::Uid { .. } => "claim UID ",
                };
                assert!(text.starts_with(field), "{text}");
            }
        }
    }
}
