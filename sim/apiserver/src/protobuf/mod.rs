//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`), which kubectl 1.32+
//! and every client-go typed client send: the `k8s\0` magic, then a `runtime.Unknown`
//! whose `raw` is the object's message. Decoded with k8s-pb's generated prost types and
//! turned into the JSON object the store holds; the rest of the request is then the same
//! as a JSON one. Answers stay JSON (clients accept it; see `accepts_json`).

mod generated;
pub mod to_json;

use k8s_pb::apimachinery::pkg::runtime::Unknown;
use prost::Message;
use serde_json::Value;

use crate::status::ApiError;
use to_json::ToJson;

/// The media type of Kubernetes' protobuf encoding.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The four bytes that start every Kubernetes protobuf document.
pub const MAGIC: &[u8] = b"k8s\0";

/// One decoded message: its JSON form, and (when asked for) its canonical re-encoding.
type Decoded = (Value, Option<Vec<u8>>);

fn message<M: Message + Default + ToJson>(
    raw: &[u8],
    kind: &str,
    reencode: bool,
) -> Result<Decoded, ApiError> {
    M::decode(raw)
        .map(|m| (m.to_json(), reencode.then(|| m.encode_to_vec())))
        .map_err(|e| {
            ApiError::bad_request(format!("error decoding the protobuf body as a {kind}: {e}"))
        })
}

/// The JSON form of one message, by the apiVersion and kind the envelope names.
pub fn decode_kind(api_version: &str, kind: &str, raw: &[u8]) -> Result<Value, ApiError> {
    dispatch(api_version, kind, raw, false).map(|(v, _)| v)
}

/// As [`decode_kind`], plus the message re-encoded by prost (unknown fields dropped, fields
/// in canonical order). For round-trip checks (the `apiserver_protobuf_body` fuzz target):
/// decoding the re-encoding must give the same JSON.
pub fn decode_kind_reencoded(
    api_version: &str,
    kind: &str,
    raw: &[u8],
) -> Result<(Value, Vec<u8>), ApiError> {
    dispatch(api_version, kind, raw, true).map(|(v, b)| (v, b.unwrap_or_default()))
}

fn dispatch(api_version: &str, kind: &str, raw: &[u8], re: bool) -> Result<Decoded, ApiError> {
    use k8s_pb::api::{
        admissionregistration, authentication, coordination, core, events, policy, rbac, resource,
    };
    use k8s_pb::apimachinery::pkg::apis::meta;
    match (api_version, kind) {
        ("v1", "Namespace") => message::<core::v1::Namespace>(raw, kind, re),
        ("v1", "Node") => message::<core::v1::Node>(raw, kind, re),
        ("v1", "Pod") => message::<core::v1::Pod>(raw, kind, re),
        ("v1", "Event") => message::<core::v1::Event>(raw, kind, re),
        ("v1", "ConfigMap") => message::<core::v1::ConfigMap>(raw, kind, re),
        ("v1", "Secret") => message::<core::v1::Secret>(raw, kind, re),
        ("v1", "ResourceQuota") => message::<core::v1::ResourceQuota>(raw, kind, re),
        ("v1", "ServiceAccount") => message::<core::v1::ServiceAccount>(raw, kind, re),
        ("v1", "Binding") => message::<core::v1::Binding>(raw, kind, re),
        ("policy/v1", "Eviction") => message::<policy::v1::Eviction>(raw, kind, re),
        ("policy/v1", "PodDisruptionBudget") => {
            message::<policy::v1::PodDisruptionBudget>(raw, kind, re)
        }
        ("authentication.k8s.io/v1", "TokenRequest") => {
            message::<authentication::v1::TokenRequest>(raw, kind, re)
        }
        ("coordination.k8s.io/v1", "Lease") => message::<coordination::v1::Lease>(raw, kind, re),
        ("events.k8s.io/v1", "Event") => message::<events::v1::Event>(raw, kind, re),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
            message::<rbac::v1::ClusterRole>(raw, kind, re)
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            message::<rbac::v1::ClusterRoleBinding>(raw, kind, re)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => message::<rbac::v1::Role>(raw, kind, re),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
            message::<rbac::v1::RoleBinding>(raw, kind, re)
        }
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            message::<admissionregistration::v1::MutatingWebhookConfiguration>(raw, kind, re)
        }
        ("resource.k8s.io/v1", "DeviceClass") => {
            message::<resource::v1::DeviceClass>(raw, kind, re)
        }
        ("resource.k8s.io/v1", "ResourceSlice") => {
            message::<resource::v1::ResourceSlice>(raw, kind, re)
        }
        ("resource.k8s.io/v1", "ResourceClaim") => {
            message::<resource::v1::ResourceClaim>(raw, kind, re)
        }
        ("resource.k8s.io/v1", "ResourceClaimTemplate") => {
            message::<resource::v1::ResourceClaimTemplate>(raw, kind, re)
        }
        // client-go sends DeleteOptions in the version of the resource it deletes.
        (_, "DeleteOptions") => message::<meta::v1::DeleteOptions>(raw, kind, re),
        _ => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "this server does not decode {kind} ({api_version}) from protobuf; send it as application/json"
            ),
        )),
    }
}

/// What the `runtime.Unknown` envelope of a protobuf body names, and the message it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// `typeMeta.apiVersion` of the envelope.
    pub api_version: String,
    /// `typeMeta.kind` of the envelope: with the apiVersion, it picks the message type.
    pub kind: String,
    /// The object's own protobuf message, still encoded.
    pub raw: Vec<u8>,
}

/// Reads the magic and the `runtime.Unknown` envelope of a protobuf body (400 when either is
/// malformed, 415 for a content encoding we do not decode); the message is left undecoded.
pub fn envelope(body: &[u8]) -> Result<Envelope, ApiError> {
    let rest = body.strip_prefix(MAGIC).ok_or_else(|| {
        ApiError::bad_request(format!(
            "the {MEDIA_TYPE} body does not start with the Kubernetes magic number \"k8s\\x00\""
        ))
    })?;
    let unknown = Unknown::decode(rest).map_err(|e| {
        ApiError::bad_request(format!(
            "error decoding the protobuf envelope (runtime.Unknown): {e}"
        ))
    })?;
    if let Some(enc) = unknown
        .content_encoding
        .as_deref()
        .filter(|e| !e.is_empty())
    {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("protobuf bodies with contentEncoding {enc:?} are not supported"),
        ));
    }
    let tm = unknown.type_meta.unwrap_or_default();
    Ok(Envelope {
        api_version: tm.api_version.unwrap_or_default(),
        kind: tm.kind.unwrap_or_default(),
        raw: unknown.raw.unwrap_or_default(),
    })
}

/// Decodes a protobuf request body into the JSON object it stands for, `apiVersion` and
/// `kind` included.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let Envelope {
        api_version,
        kind,
        raw,
    } = envelope(body)?;
    let mut obj = decode_kind(&api_version, &kind, &raw)?;
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(api_version));
        m.insert("kind".into(), Value::String(kind));
    }
    // Go writes the non-pointer `generation` even when 0, and its JSON leaves 0 out.
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut)
        && meta.get("generation") == Some(&Value::from(0))
    {
        meta.remove("generation");
    }
    Ok(obj)
}

/// Whether an `Accept` header lets us answer JSON (absent, `*/*`, `application/*`,
/// `application/json` with any parameters, in any position of the list).
pub fn accepts_json(accept: &str) -> bool {
    accept.trim().is_empty()
        || accept.split(',').any(|range| {
            let base = range.split(';').next().unwrap_or("").trim();
            matches!(base, "*/*" | "application/*" | "application/json" | "")
        })
}

#[cfg(test)]
mod tests;
