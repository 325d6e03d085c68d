//! Request bodies by Content-Type: JSON, YAML, or Kubernetes protobuf, into the JSON
//! object the store works on. No HTTP types: a content type and the bytes.

use serde_json::Value;

use crate::status::ApiError;
use crate::store::DeleteOptions;

/// Decodes a create/update body: JSON, YAML, or Kubernetes protobuf (by Content-Type).
pub fn decode_object(ct: Option<&str>, body: &[u8]) -> Result<Value, ApiError> {
    let base = ct
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let v: Value = match base.as_str() {
        "application/json" | "" | "*/*" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("error decoding the request body as JSON: {e}"))
        })?,
        crate::protobuf::MEDIA_TYPE => crate::protobuf::decode(body)?,
        "application/yaml" => {
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiError::bad_request("the YAML body is not UTF-8"))?;
            serde_saphyr::from_str(text).map_err(|e| {
                ApiError::bad_request(format!("error decoding the request body as YAML: {e}"))
            })?
        }
        other => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {other:?})"
                ),
            ));
        }
    };
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(v)
}

/// A DELETE body (may be empty): `DeleteOptions` as JSON or protobuf.
pub fn decode_delete_options(ct: Option<&str>, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    if body.is_empty() {
        return Ok(DeleteOptions::default());
    }
    if ct.is_some_and(|c| c.starts_with(crate::protobuf::MEDIA_TYPE)) {
        return Ok(DeleteOptions::from_body(&crate::protobuf::decode(body)?));
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
    Ok(DeleteOptions::from_body(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        let v = decode_object(Some("application/json; charset=utf-8"), br#"{"a":1}"#).unwrap();
        assert_eq!(v["a"], 1);
        let v = decode_object(Some("application/yaml"), b"a: 1\n").unwrap();
        assert_eq!(v["a"], 1);
        assert_eq!(
            decode_object(Some("text/plain"), b"x").unwrap_err().code,
            415
        );
        assert_eq!(decode_object(None, b"[1]").unwrap_err().code, 400);
        assert_eq!(
            decode_object(Some(crate::protobuf::MEDIA_TYPE), b"{}")
                .unwrap_err()
                .code,
            400
        );
        let d = decode_delete_options(None, br#"{"preconditions":{"uid":"u"}}"#).unwrap();
        assert_eq!(d.precondition_uid.as_deref(), Some("u"));
        assert!(
            decode_delete_options(None, b"")
                .unwrap()
                .precondition_uid
                .is_none()
        );
    }
}
