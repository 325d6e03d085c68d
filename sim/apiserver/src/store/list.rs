//! LIST: label and field selectors, pages and their opaque continue tokens.

use crate::resources::ResourceType;
use crate::status::ApiError;
use crate::stored::StoredObject;

use super::{Key, ListOptions, ListPage, Store, resource_index};

impl Store {
    /// Lists objects of one type, in one namespace or all (`ns = None`), sorted by namespace and name.
    pub fn list(
        &self,
        r: &ResourceType,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<ListPage, ApiError> {
        let map = &self.objects[resource_index(r)];
        let ns = if r.namespaced {
            ns.filter(|n| !n.is_empty())
        } else {
            None
        };
        let start: Option<Key> = match &opts.continue_token {
            Some(t) if !t.is_empty() => Some(decode_continue(t)?.1),
            _ => None,
        };
        let matches = |k: &Key, v: &StoredObject| {
            ns.is_none_or(|n| k.0 == n)
                && opts.labels.matches_stored(v)
                && opts.fields.matches_stored(v)
        };
        let limit = opts.limit.filter(|l| *l > 0);
        let mut items = Vec::new();
        let mut last_key: Option<&Key> = None;
        let mut more = false;
        let lower = match (&start, ns) {
            (Some(s), _) => std::ops::Bound::Excluded(s.clone()),
            (None, Some(n)) => std::ops::Bound::Included((n.to_string(), String::new())),
            (None, None) => std::ops::Bound::Unbounded,
        };
        for (k, v) in map.range((lower, std::ops::Bound::Unbounded)) {
            if let Some(n) = ns
                && k.0.as_str() > n
            {
                break;
            }
            if !matches(k, v) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                more = true;
                break;
            }
            items.push(v.clone());
            last_key = Some(k);
        }
        let continue_token = if more {
            last_key.map(|k| encode_continue(self.rv, k))
        } else {
            None
        };
        Ok(ListPage {
            items,
            resource_version: self.rv,
            continue_token,
            remaining: None,
        })
    }
}

/// Encodes a continue token (opaque to clients): list resourceVersion and the last key returned.
fn encode_continue(rv: u64, key: &Key) -> String {
    let raw = format!("{rv}\u{0}{}\u{0}{}", key.0, key.1);
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(token: &str) -> Result<(u64, Key), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Result<Vec<u8>, _> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16))
        .collect();
    let raw = String::from_utf8(bytes.map_err(|_| bad())?).map_err(|_| bad())?;
    let mut parts = raw.split('\u{0}');
    let rv = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let ns = parts.next().ok_or_else(bad)?.to_string();
    let name = parts.next().ok_or_else(bad)?.to_string();
    Ok((rv, (ns, name)))
}
