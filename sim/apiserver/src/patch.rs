//! PATCH bodies by content type: JSON patch (RFC 6902), JSON merge patch (RFC 7386),
//! strategic merge patch, and server-side apply (treated as a merge patch; see README).

use serde_json::Value;

use crate::status::ApiError;
use crate::strategic_merge::strategic_merge;

/// The kind of a PATCH body, chosen by its Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`: RFC 6902 operations.
    Json,
    /// `application/merge-patch+json`: RFC 7386 merge patch.
    Merge,
    /// `application/strategic-merge-patch+json`: merges lists by their Kubernetes merge keys.
    Strategic,
    /// `application/apply-patch+yaml` (or `+cbor`): server-side apply.
    Apply,
}

impl PatchType {
    /// Maps a request Content-Type to a patch type; anything else is 415.
    pub fn from_content_type(ct: &str) -> Result<Self, ApiError> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchType::Apply),
            _ => Err(ApiError::unsupported_media_type(ct)),
        }
    }
}

/// Parses a patch body; apply patches may be YAML.
pub fn parse_body(ty: PatchType, body: &[u8]) -> Result<Value, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => Ok(v),
        Err(e) if ty == PatchType::Apply => {
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiError::bad_request("apply patch is not UTF-8"))?;
            serde_saphyr::from_str::<Value>(text).map_err(|ye| {
                ApiError::bad_request(format!("error decoding YAML: {ye} (as JSON: {e})"))
            })
        }
        Err(e) => Err(ApiError::bad_request(format!("error decoding patch: {e}"))),
    }
}

/// Applies a parsed patch to `current`, returning the new document (not yet validated).
pub fn apply(ty: PatchType, current: &Value, patch: &Value) -> Result<Value, ApiError> {
    match ty {
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("error decoding JSON patch: {e}")))?;
            let mut doc = current.clone();
            json_patch::patch(&mut doc, &ops).map_err(|e| {
                // The real server answers a failed operation (including a failed `test`) with 422.
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
            Ok(doc)
        }
        PatchType::Merge | PatchType::Apply => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            let mut doc = current.clone();
            json_patch::merge(&mut doc, patch);
            Ok(doc)
        }
        PatchType::Strategic => strategic_merge(current, patch).map_err(|e| {
            ApiError::bad_request(format!("unable to apply strategic merge patch: {e}"))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_types() {
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json").unwrap(),
            PatchType::Merge
        );
        assert_eq!(
            PatchType::from_content_type("application/json-patch+json; charset=utf-8").unwrap(),
            PatchType::Json
        );
        assert_eq!(
            PatchType::from_content_type("text/plain").unwrap_err().code,
            415
        );
        assert_eq!(
            PatchType::from_content_type("application/json")
                .unwrap_err()
                .code,
            415
        );
    }

    #[test]
    fn json_patch_test_failure_is_422() {
        let cur = json!({"metadata": {"resourceVersion": "5"}});
        let p = json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "4"}]);
        assert_eq!(apply(PatchType::Json, &cur, &p).unwrap_err().code, 422);
        let p = json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "5"}, {"op": "add", "path": "/x", "value": 1}]);
        assert_eq!(apply(PatchType::Json, &cur, &p).unwrap()["x"], 1);
        assert_eq!(
            apply(PatchType::Json, &cur, &json!({"op": "add"}))
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn apply_accepts_yaml() {
        let v = parse_body(PatchType::Apply, b"metadata:\n  labels:\n    a: b\n").unwrap();
        assert_eq!(v["metadata"]["labels"]["a"], "b");
        assert_eq!(
            parse_body(PatchType::Merge, b"{nope").unwrap_err().code,
            400
        );
    }
}
