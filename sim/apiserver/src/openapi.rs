//! OpenAPI documents, just enough for kubectl.
//!
//! kubectl fetches OpenAPI before `create -f`/`apply -f` (validation is `strict` by default):
//! - kubectl 1.27 asks for `/openapi/v2` in protobuf only
//!   (`Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf`); a 404 there
//!   aborts with "error validating data: the server could not find the requested resource".
//! - kubectl 1.33 reads the `/openapi/v3` root (JSON), then still `/openapi/v2`.
//!
//! We serve a valid v2 document (protobuf, hand-encoded gnostic `openapi_v2.Document`) and a
//! v3 root that declare no paths and no definitions. kubectl then finds no server-side
//! field validation for any kind, falls back to client-side schema validation, finds no
//! schema for the kind and skips it; `apply` computes strategic merge patches from the Go
//! types compiled into kubectl. Net effect: no unknown-field validation (see README).

use serde_json::{Value, json};

fn put_len(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// A length-delimited protobuf field (wire type 2).
fn field_bytes(out: &mut Vec<u8>, number: u8, bytes: &[u8]) {
    out.push((number << 3) | 2);
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// The gnostic `openapi_v2.Document` as protobuf: `swagger: "2.0"`, `info {title, version}`.
pub fn v2_protobuf() -> Vec<u8> {
    let mut info = Vec::new();
    field_bytes(&mut info, 1, b"Kubernetes");
    field_bytes(
        &mut info,
        2,
        format!(
            "v{}.{}.0",
            crate::discovery::SERVER_MAJOR,
            crate::discovery::SERVER_MINOR
        )
        .as_bytes(),
    );
    let mut doc = Vec::new();
    field_bytes(&mut doc, 1, b"2.0");
    field_bytes(&mut doc, 2, &info);
    doc
}

/// The same document as JSON, for clients that ask for JSON.
pub fn v2_json() -> Value {
    json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", crate::discovery::SERVER_MAJOR, crate::discovery::SERVER_MINOR)}, "paths": {}, "definitions": {}})
}

/// The `/openapi/v3` discovery root: no group-version documents.
pub fn v3_root() -> Value {
    json!({"paths": {}})
}

/// A group-version OpenAPI v3 document; none are served.
pub fn v3_group_version(_group: &str, _version: &str) -> Option<Value> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protobuf_encoding() {
        let d = v2_protobuf();
        assert_eq!(&d[..5], &[0x0a, 3, b'2', b'.', b'0']);
        assert_eq!(d[5], 0x12);
        assert_eq!(d[6] as usize, d.len() - 7);
        let mut v = Vec::new();
        put_len(&mut v, 300);
        assert_eq!(v, vec![0xac, 0x02]);
    }
}
