//! Checks of the embedded API server's request parsing, through its own entry points:
//! create/update bodies (JSON, YAML, protobuf: `codec::decode_object`), PATCH bodies of
//! every patch type (`patch::parse_body` and `Store::patch`), and label and field
//! selectors. Each is total (no panic, every error a 4xx `ApiError`), and what it accepts
//! round-trips.

use std::sync::Arc;

use hami_apiserver::ApiError;
use hami_apiserver::codec;
use hami_apiserver::depth::{MAX_OBJECT_DEPTH, depth_capped};
use hami_apiserver::patch::{self, PatchType};
use hami_apiserver::protobuf;
use hami_apiserver::resources::{ResourceType, lookup, lookup_kind};
use hami_apiserver::selector::{FieldSelector, LabelSelector};
use hami_apiserver::store::{Store, Subresource};
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use prost::Message;
use serde_json::{Value, json};

/// An error a request body may earn: a client error with a reason, never a 5xx.
fn assert_client_error(e: &ApiError, what: &str) {
    assert!(
        (400..500).contains(&e.code) && !e.reason.is_empty(),
        "{what}: a bad body must be a typed 4xx, got {} {:?}: {}",
        e.code,
        e.reason,
        e.message
    );
}

fn pods() -> &'static ResourceType {
    lookup("", "v1", "pods").expect("pods are served")
}

/// A store with the default namespaces, as a fresh server has.
fn store() -> Store {
    let mut s = Store::new(64);
    s.ensure_default_namespaces();
    s
}

/// Stores a decoded body the way POST does (by the kind it names, pods when it names none
/// the server serves): total, typed errors, and what is stored is what a GET returns, which
/// it returns.
fn create_decoded(obj: Value) -> Option<Value> {
    let r = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .zip(obj.get("kind").and_then(Value::as_str))
        .and_then(|(av, k)| lookup_kind(av, k))
        .unwrap_or_else(pods);
    let ns = r.namespaced.then_some("default");
    let mut s = store();
    match s.create(r, ns, obj) {
        Ok(out) => {
            let name = out
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .expect("a created object has a name");
            let got = s.get(r, ns.unwrap_or(""), name).expect("created, so found");
            assert!(Arc::ptr_eq(&got, &out) || *got == *out, "GET after create");
            assert!(depth_capped(&out, MAX_OBJECT_DEPTH) <= MAX_OBJECT_DEPTH);
            Some((*out).clone())
        }
        Err(e) => {
            assert_client_error(&e, "create");
            None
        }
    }
}

/// JSON create/update bodies: only objects are accepted, they re-encode to themselves, and
/// the store takes or refuses them with a typed error. DELETE bodies are total too.
pub fn apiserver_json_body(data: &[u8]) {
    match codec::decode_object(Some("application/json"), data) {
        Ok(v) => {
            assert!(v.is_object(), "decode_object returns objects only");
            let again = codec::decode_object(None, &serde_json::to_vec(&v).expect("encodes"))
                .expect("what decoded re-decodes");
            assert_eq!(again, v, "JSON body round trip");
            let _ = create_decoded(v);
        }
        Err(e) => assert_client_error(&e, "JSON body"),
    }
    if let Err(e) = codec::decode_delete_options(None, data) {
        assert_client_error(&e, "DeleteOptions body");
    }
}

/// YAML create bodies (`kubectl create -f` with `Content-Type: application/yaml`): objects
/// only; any the store could hold (within the depth rule) survive the JSON the server
/// answers and journals in; the store takes or refuses them with a typed error.
pub fn apiserver_yaml_body(data: &[u8]) {
    match codec::decode_object(Some("application/yaml"), data) {
        Ok(v) => {
            assert!(v.is_object(), "decode_object returns objects only");
            if depth_capped(&v, MAX_OBJECT_DEPTH) <= MAX_OBJECT_DEPTH {
                let json = serde_json::to_vec(&v).expect("encodes");
                let again = codec::decode_object(Some("application/json"), &json)
                    .expect("the JSON of a YAML body decodes");
                assert_eq!(again, v, "YAML body → JSON → same object");
            }
            let _ = create_decoded(v);
        }
        Err(e) => assert_client_error(&e, "YAML body"),
    }
}

/// What a typed client (kube-rs, k8s-openapi) makes of an object stored from a protobuf
/// body: it must read it (a watch of that type would otherwise fail on it), and
/// its own JSON of it must read back as the same value.
fn typed_round_trip<T>(v: &Value)
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    let typed: T = serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("a typed client cannot read the decoded object: {e}\n{v}"));
    let back: T = serde_json::from_value(serde_json::to_value(&typed).expect("typed encodes"))
        .expect("typed");
    assert_eq!(back, typed, "typed JSON round trip");
}

fn typed_check(api_version: &str, kind: &str, v: &Value) {
    use k8s_openapi::api::{
        admissionregistration, authentication, coordination, core, events, policy, rbac,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta;
    match (api_version, kind) {
        ("v1", "Namespace") => typed_round_trip::<core::v1::Namespace>(v),
        ("v1", "Node") => typed_round_trip::<core::v1::Node>(v),
        ("v1", "Pod") => typed_round_trip::<core::v1::Pod>(v),
        ("v1", "Event") => typed_round_trip::<core::v1::Event>(v),
        ("v1", "ConfigMap") => typed_round_trip::<core::v1::ConfigMap>(v),
        ("v1", "Secret") => typed_round_trip::<core::v1::Secret>(v),
        ("v1", "ResourceQuota") => typed_round_trip::<core::v1::ResourceQuota>(v),
        ("v1", "ServiceAccount") => typed_round_trip::<core::v1::ServiceAccount>(v),
        ("v1", "Binding") => typed_round_trip::<core::v1::Binding>(v),
        ("policy/v1", "Eviction") => typed_round_trip::<policy::v1::Eviction>(v),
        ("authentication.k8s.io/v1", "TokenRequest") => {
            typed_round_trip::<authentication::v1::TokenRequest>(v)
        }
        ("coordination.k8s.io/v1", "Lease") => typed_round_trip::<coordination::v1::Lease>(v),
        ("events.k8s.io/v1", "Event") => typed_round_trip::<events::v1::Event>(v),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
            typed_round_trip::<rbac::v1::ClusterRole>(v)
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            typed_round_trip::<rbac::v1::ClusterRoleBinding>(v)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => typed_round_trip::<rbac::v1::Role>(v),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
            typed_round_trip::<rbac::v1::RoleBinding>(v)
        }
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            typed_round_trip::<admissionregistration::v1::MutatingWebhookConfiguration>(v)
        }
        (_, "DeleteOptions") => typed_round_trip::<meta::v1::DeleteOptions>(v),
        _ => {}
    }
}

/// Protobuf bodies (magic + `runtime.Unknown`): total, typed errors; what decodes names its
/// apiVersion and kind, decodes the same from prost's re-encoding of the message
/// (decode(encode(decode(x))) == decode(x)), and what the store takes of it is JSON a typed
/// client reads back.
pub fn apiserver_protobuf_body(data: &[u8]) {
    let decoded = codec::decode_object(Some(protobuf::MEDIA_TYPE), data);
    let env = match protobuf::envelope(data) {
        Ok(env) => env,
        Err(e) => {
            assert_client_error(&e, "protobuf envelope");
            assert!(decoded.is_err(), "a bad envelope fails the body too");
            return;
        }
    };
    let v = match decoded {
        Ok(v) => v,
        Err(e) => {
            assert_client_error(&e, "protobuf body");
            return;
        }
    };
    assert_eq!(v["apiVersion"], json!(env.api_version));
    assert_eq!(v["kind"], json!(env.kind));
    let (_, canonical) = protobuf::decode_kind_reencoded(&env.api_version, &env.kind, &env.raw)
        .expect("decoded once, so decodes again");
    let mut body = protobuf::MAGIC.to_vec();
    body.extend(
        Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some(env.api_version.clone()),
                kind: Some(env.kind.clone()),
            }),
            raw: Some(canonical),
            ..Default::default()
        }
        .encode_to_vec(),
    );
    let again = protobuf::decode(&body).expect("the re-encoded body decodes");
    assert_eq!(again, v, "protobuf → prost → protobuf gives the same JSON");
    // Kinds the server stores; the others (Binding, Eviction, DeleteOptions, ...) only once
    // they decode, which a typed client must read as well.
    let stored = if lookup_kind(&env.api_version, &env.kind).is_some() {
        create_decoded(v)
    } else {
        Some(v)
    };
    if let Some(obj) = stored {
        typed_check(&env.api_version, &env.kind, &obj);
    }
}

/// The stored pod every patch applies to: labels, annotations, containers with env and
/// ports, a status (so the strategic merge's keyed lists have entries to merge into).
fn patched_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default",
            "labels": {"app": "web"}, "annotations": {"hami.io/vgpu-node": "n1"},
            "finalizers": ["hami.io/f"]},
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"name": "main", "image": "nginx",
                 "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                 "ports": [{"containerPort": 80, "protocol": "TCP"}],
                 "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "4096"}}},
                {"name": "side", "image": "busybox", "args": ["sleep", "1"]}
            ],
            "tolerations": [{"key": "k", "operator": "Exists"}]
        },
        "status": {"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}]}
    })
}

/// PATCH bodies: the first byte picks the patch type and subresource, the rest is the body.
/// Parsing and applying are total with typed errors; what the store takes keeps the pod's
/// identity and is what a GET returns; a merge patch is idempotent (RFC 7386).
pub fn apiserver_patch(data: &[u8]) {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let ty = [
        PatchType::Json,
        PatchType::Merge,
        PatchType::Strategic,
        PatchType::Apply,
    ][usize::from(sel & 3)];
    let sub = if sel & 4 == 0 {
        Subresource::Main
    } else {
        Subresource::Status
    };
    let parsed = match patch::parse_body(ty, body) {
        Ok(p) => p,
        Err(e) => return assert_client_error(&e, "patch body"),
    };
    let mut s = store();
    let r = pods();
    s.create(r, Some("default"), patched_pod())
        .expect("the fixture pod is valid");
    let current = s.get(r, "default", "web").expect("stored");
    // The server names a default field manager for apply; force on request (bit 3).
    s.ctx.force = sel & 8 != 0;
    match s.patch(r, "default", "web", ty, &parsed, sub) {
        Ok(out) => {
            assert_eq!(out.pointer("/metadata/name"), Some(&json!("web")));
            assert_eq!(out.pointer("/metadata/namespace"), Some(&json!("default")));
            assert_eq!(
                out.pointer("/metadata/uid"),
                current.pointer("/metadata/uid"),
                "a patch keeps the uid"
            );
            assert!(depth_capped(&out, MAX_OBJECT_DEPTH) <= MAX_OBJECT_DEPTH);
            let got = s.get(r, "default", "web").expect("patched, so found");
            assert_eq!(*got, *out, "GET after PATCH");
        }
        Err(e) => assert_client_error(&e, "PATCH"),
    }
    if ty == PatchType::Merge
        && let Ok(once) = patch::apply(ty, &current, &parsed)
    {
        let twice = patch::apply(ty, &once, &parsed).expect("applied once, so again");
        assert_eq!(twice, once, "a merge patch is idempotent");
    }
}

/// The resources a field selector may name (each has its own field labels).
const SELECTOR_PLURALS: &[&str] = &["pods", "nodes", "namespaces", "secrets", "events", "leases"];

/// Label and field selectors (`?labelSelector=`, `?fieldSelector=`): the first byte picks
/// the resource, the rest is the selector text. Parsing is total with typed errors; what
/// parses prints in a form that parses back to the same selector; matching is total.
pub fn apiserver_selectors(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let Some(text) = crate::text(rest) else {
        return;
    };
    let plural = SELECTOR_PLURALS[usize::from(sel) % SELECTOR_PLURALS.len()];
    let obj = patched_pod();
    match LabelSelector::parse(text) {
        Ok(ls) => {
            let shown = ls.to_string();
            let again = LabelSelector::parse(&shown)
                .unwrap_or_else(|e| panic!("{shown:?} (printed from {text:?}): {}", e.message));
            assert_eq!(again, ls, "label selector parse → print → parse");
            let _ = ls.matches(&obj);
        }
        Err(e) => assert_client_error(&e, "label selector"),
    }
    match FieldSelector::parse(text, plural) {
        Ok(fs) => {
            let shown = fs.to_string();
            let again = FieldSelector::parse(&shown, plural)
                .unwrap_or_else(|e| panic!("{shown:?} (printed from {text:?}): {}", e.message));
            assert_eq!(again, fs, "field selector parse → print → parse");
            let _ = fs.matches(&obj);
        }
        Err(e) => assert_client_error(&e, "field selector"),
    }
}
