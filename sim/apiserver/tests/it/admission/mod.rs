//! Mutating admission end to end: a real HTTPS webhook (rustls, a test CA from rcgen) is
//! registered with a MutatingWebhookConfiguration and called on pod CREATE, and on UPDATE
//! (PUT and every patch type; the status subresource only where a rule names it).
//! This file holds the test webhook (a test CA, its handlers, registration helpers);
//! `create` and `update` hold the tests of each operation.

use crate::common;

mod create;
mod update;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Json;
use axum::routing::post;
use common::{client, pod, start};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde_json::{Value, json};

struct TestCa {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn test_ca() -> TestCa {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    TestCa {
        ca_pem: ca.pem(),
        cert_pem: leaf.pem(),
        key_pem: leaf_key.serialize_pem(),
    }
}

/// The v1 webhook, written with kube's own admission types: labels the pod and sets the
/// scheduler, or denies pods labelled `deny`.
async fn mutate_v1(
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let req: AdmissionRequest<DynamicObject> =
        review.try_into().expect("valid AdmissionReview v1 request");
    let obj = req.object.clone().expect("object on CREATE");
    let resp = AdmissionResponse::from(&req);
    let labels = obj.metadata.labels.clone().unwrap_or_default();
    if labels.contains_key("deny") {
        return Json(resp.deny("no GPU memory left on any node").into_review());
    }
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/metadata/labels/hami.io~1mutated", "value": "v1"},
        {"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"}
    ]))
    .unwrap();
    Json(resp.with_patch(patch).unwrap().into_review())
}

/// A v1beta1 webhook in raw JSON (kube's types speak v1).
async fn mutate_v1beta1(Json(review): Json<Value>) -> Json<Value> {
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1beta1");
    let uid = review["request"]["uid"].clone();
    let patch = serde_json::to_value(k8s_openapi::ByteString(
        br#"[{"op":"add","path":"/metadata/annotations","value":{"beta":"yes"}}]"#.to_vec(),
    ))
    .unwrap();
    Json(
        json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "response": {"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": patch}}),
    )
}

/// The reviews `/update` received, for the tests to inspect.
static UPDATE_REVIEWS: std::sync::Mutex<Vec<Value>> = std::sync::Mutex::new(Vec::new());

/// The annotation only [`WRITER`] may set, change or remove (D-4's shape).
const OWNED: &str = "hami.io/vgpu-node";
const WRITER: &str = "system:serviceaccount:kube-system:hami-scheduler";

/// A D-4-like webhook: an UPDATE changing [`OWNED`] by anyone but [`WRITER`] is denied;
/// any other UPDATE is allowed with a label naming the resourceVersion it saw as old.
async fn on_update(Json(review): Json<Value>) -> Json<Value> {
    UPDATE_REVIEWS.lock().unwrap().push(review.clone());
    let req = &review["request"];
    let uid = req["uid"].clone();
    let owned = |o: &Value| o["metadata"]["annotations"][OWNED].clone();
    let user = req["userInfo"]["username"].as_str().unwrap_or("");
    let response = if req["operation"] == "UPDATE"
        && owned(&req["object"]) != owned(&req["oldObject"])
        && user != WRITER
    {
        json!({"uid": uid, "allowed": false, "status": {"code": 403,
            "message": format!("metadata.annotations[{OWNED}] is written by the scheduler only; {user} may not set, change or remove it")}})
    } else {
        let has_labels = req["object"]["metadata"]["labels"].is_object();
        let patch = if has_labels {
            json!([{"op": "add", "path": "/metadata/labels/webhook-saw", "value": "update"}])
        } else {
            json!([{"op": "add", "path": "/metadata/labels", "value": {"webhook-saw": "update"}}])
        };
        let bytes =
            serde_json::to_value(k8s_openapi::ByteString(patch.to_string().into_bytes())).unwrap();
        json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": bytes})
    };
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

async fn slow(Json(review): Json<Value>) -> Json<Value> {
    tokio::time::sleep(Duration::from_secs(4)).await;
    Json(review)
}

async fn start_webhook(ca: &TestCa) -> SocketAddr {
    let config = axum_server::tls_rustls::RustlsConfig::from_pem(
        ca.cert_pem.clone().into_bytes(),
        ca.key_pem.clone().into_bytes(),
    )
    .await
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/v1", post(mutate_v1))
        .route("/v1beta1", post(mutate_v1beta1))
        .route("/slow", post(slow))
        .route("/update", post(on_update));
    let server = axum_server::from_tcp_rustls(listener, config).unwrap();
    tokio::spawn(async move { server.serve(app.into_make_service()).await });
    addr
}

fn webhook(
    name: &str,
    url: String,
    ca_pem: &str,
    versions: &[&str],
    policy: &str,
    timeout: i32,
) -> Value {
    json!({
        "name": name,
        "clientConfig": {"url": url, "caBundle": serde_json::to_value(k8s_openapi::ByteString(ca_pem.as_bytes().to_vec())).unwrap()},
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
        "admissionReviewVersions": versions,
        "sideEffects": "None",
        "failurePolicy": policy,
        "timeoutSeconds": timeout,
        "objectSelector": {"matchExpressions": [{"key": "skip-webhooks", "operator": "DoesNotExist"}]}
    })
}

async fn register(c: &kube::Client, name: &str, hooks: Vec<Value>) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(c.clone());
    let cfg =
        serde_json::from_value(json!({"metadata": {"name": name}, "webhooks": hooks})).unwrap();
    api.create(&PostParams::default(), &cfg).await.unwrap();
}

async fn delete_config(c: &kube::Client, name: &str) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(c.clone());
    api.delete(name, &Default::default()).await.unwrap();
}

fn status_of(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}
