//! Mutating admission end to end: a real HTTPS webhook (rustls, a test CA from rcgen) is
//! registered with a MutatingWebhookConfiguration and called on pod CREATE, and on UPDATE
//! (PUT and every patch type; the status subresource only where a rule names it).

mod common;

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

#[tokio::test]
async fn webhooks_mutate_deny_and_fail_per_policy() {
    let ca = test_ca();
    let hook = start_webhook(&ca).await;
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");

    register(
        &c,
        "hami",
        vec![
            webhook(
                "v1.hami.io",
                format!("https://{hook}/v1"),
                &ca.ca_pem,
                &["v1"],
                "Fail",
                5,
            ),
            webhook(
                "beta.hami.io",
                format!("https://{hook}/v1beta1"),
                &ca.ca_pem,
                &["v1beta1"],
                "Fail",
                5,
            ),
        ],
    )
    .await;
    let created = pods
        .create(&PostParams::default(), &pod("gpu"))
        .await
        .unwrap();
    assert_eq!(
        created.metadata.labels.as_ref().unwrap()["hami.io/mutated"],
        "v1"
    );
    assert_eq!(
        created.metadata.annotations.as_ref().unwrap()["beta"],
        "yes"
    );
    assert_eq!(
        created.spec.as_ref().unwrap().scheduler_name.as_deref(),
        Some("hami-scheduler")
    );

    // a denial is 403 with the webhook's message; nothing is stored
    let mut denied = pod("denied");
    denied
        .metadata
        .labels
        .get_or_insert_default()
        .insert("deny".into(), "1".into());
    let (code, msg) = status_of(
        pods.create(&PostParams::default(), &denied)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        msg,
        "admission webhook \"v1.hami.io\" denied the request: no GPU memory left on any node"
    );
    assert!(
        server
            .get_object("v1", "pods", "default", "denied")
            .is_none()
    );

    // objectSelector excludes pods labelled skip-webhooks
    let mut skip = pod("skipped");
    skip.metadata
        .labels
        .get_or_insert_default()
        .insert("skip-webhooks".into(), "1".into());
    let s = pods.create(&PostParams::default(), &skip).await.unwrap();
    assert!(!s.metadata.labels.unwrap().contains_key("hami.io/mutated"));
    delete_config(&c, "hami").await;

    // an unreachable webhook: Fail refuses the pod, Ignore lets it through
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    register(
        &c,
        "dead-fail",
        vec![webhook(
            "dead.hami.io",
            format!("https://{dead}/v1"),
            &ca.ca_pem,
            &["v1"],
            "Fail",
            2,
        )],
    )
    .await;
    let (code, msg) = status_of(
        pods.create(&PostParams::default(), &pod("x1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 500);
    assert!(
        msg.contains("failed calling webhook \"dead.hami.io\""),
        "{msg}"
    );
    delete_config(&c, "dead-fail").await;
    register(
        &c,
        "dead-ignore",
        vec![webhook(
            "dead.hami.io",
            format!("https://{dead}/v1"),
            &ca.ca_pem,
            &["v1"],
            "Ignore",
            2,
        )],
    )
    .await;
    pods.create(&PostParams::default(), &pod("x2"))
        .await
        .unwrap();
    delete_config(&c, "dead-ignore").await;

    // a slow webhook hits its timeout
    register(
        &c,
        "slow",
        vec![webhook(
            "slow.hami.io",
            format!("https://{hook}/slow"),
            &ca.ca_pem,
            &["v1"],
            "Fail",
            1,
        )],
    )
    .await;
    let t = Instant::now();
    let (code, _) = status_of(
        pods.create(&PostParams::default(), &pod("x3"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 500);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "timeoutSeconds=1 took {:?}",
        t.elapsed()
    );
    delete_config(&c, "slow").await;

    // a caBundle that did not sign the webhook's certificate fails TLS verification
    let other = test_ca();
    register(
        &c,
        "wrong-ca",
        vec![webhook(
            "v1.hami.io",
            format!("https://{hook}/v1"),
            &other.ca_pem,
            &["v1"],
            "Fail",
            2,
        )],
    )
    .await;
    let (code, msg) = status_of(
        pods.create(&PostParams::default(), &pod("x4"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 500);
    assert!(msg.to_lowercase().contains("certificate"), "{msg}");
}

#[tokio::test]
async fn webhook_configuration_validation() {
    let server = start().await;
    let c = client(&server);
    let api: Api<MutatingWebhookConfiguration> = Api::all(c.clone());
    let bad = serde_json::from_value(json!({"metadata": {"name": "bad"}, "webhooks": [{"name": "w.hami.io", "clientConfig": {"url": "http://127.0.0.1:1/x"}, "sideEffects": "None", "admissionReviewVersions": ["v1"]}]})).unwrap();
    let (code, msg) = status_of(api.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!(code, 422);
    assert!(msg.contains("https"), "{msg}");
}

/// `matchConditions` decide whether the webhook is called (all true), skip it (one false),
/// or apply the failure policy (errors): 403 naming the expression under Fail, skipped under
/// Ignore; an expression that does not compile is refused when the configuration is written.
#[tokio::test]
async fn match_conditions_gate_the_call() {
    let ca = test_ca();
    let hook = start_webhook(&ca).await;
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let with = |conds: Value, url: String, policy: &str| {
        let mut h = webhook("mc.hami.io", url, &ca.ca_pem, &["v1"], policy, 2);
        h["matchConditions"] = conds;
        h
    };
    let labelled = |name: &str, labels: Value| -> Pod {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}))
        .unwrap()
    };
    register(
        &c,
        "gpu-only",
        vec![with(
            json!([
                {"name": "gpu", "expression": "has(object.metadata.labels) && 'gpu' in object.metadata.labels"},
                {"name": "not-nobody", "expression": "request.userInfo.username != 'nobody' && request.operation == 'CREATE'"}
            ]),
            format!("https://{hook}/v1"),
            "Fail",
        )],
    )
    .await;
    let plain = pods
        .create(
            &PostParams::default(),
            &labelled("plain", json!({"app": "a"})),
        )
        .await
        .unwrap();
    assert!(
        !plain.labels().contains_key("hami.io/mutated"),
        "called although a condition is false"
    );
    let gpu = pods
        .create(
            &PostParams::default(),
            &labelled("gpu", json!({"gpu": "1"})),
        )
        .await
        .unwrap();
    assert_eq!(gpu.labels()["hami.io/mutated"], "v1");
    delete_config(&c, "gpu-only").await;

    // An evaluation error and no false condition: the policy decides; nothing listens at the
    // URL, so a call would fail with another message.
    let erring = json!([{"name": "ann", "expression": "object.metadata.annotations['x'] == 'y'"}]);
    register(
        &c,
        "erring",
        vec![with(erring.clone(), "https://127.0.0.1:9/x".into(), "Fail")],
    )
    .await;
    let (code, msg) = status_of(
        pods.create(&PostParams::default(), &labelled("e1", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        msg,
        "pods \"e1\" is forbidden: expression 'object.metadata.annotations['x'] == 'y'' resulted in error: no such key: annotations"
    );
    delete_config(&c, "erring").await;
    register(
        &c,
        "erring",
        vec![with(erring, "https://127.0.0.1:9/x".into(), "Ignore")],
    )
    .await;
    pods.create(&PostParams::default(), &labelled("e2", json!({})))
        .await
        .expect("Ignore skips a webhook whose conditions fail");
    delete_config(&c, "erring").await;

    // Compiled at create: unsupported or ill-typed CEL is refused, naming the expression.
    let api: Api<MutatingWebhookConfiguration> = Api::all(c.clone());
    for (expression, why) in [
        (
            "object.metadata.name.matches('^gpu')",
            "the function 'matches' is not supported",
        ),
        ("object.metadata.name", "must evaluate to bool but got dyn"),
        ("request.nope == 'x'", "undefined field 'nope'"),
        ("object.spec.containers.exists(c,", "Syntax error"),
    ] {
        let cfg = serde_json::from_value(json!({"metadata": {"name": "bad-cel"}, "webhooks": [
            with(json!([{"name": "c", "expression": expression}]), format!("https://{hook}/v1"), "Fail")
        ]}))
        .unwrap();
        let (code, msg) = status_of(api.create(&PostParams::default(), &cfg).await.unwrap_err());
        assert_eq!(code, 422, "{msg}");
        assert!(
            msg.contains(&format!(
                "webhooks[].matchConditions[].expression: Invalid value: {expression:?}"
            )) && msg.contains(why),
            "{msg}"
        );
    }
}

/// A dry-run create is admitted as a real server admits it: the webhook is called with
/// `dryRun: true` and its mutation answered, nothing is stored; a matchCondition on
/// `request.dryRun` sees it. v1 allows only sideEffects None or NoneOnDryRun.
#[tokio::test]
async fn dry_run_creates_are_admitted() {
    let ca = test_ca();
    let hook = start_webhook(&ca).await;
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let mut h = webhook(
        "dry.hami.io",
        format!("https://{hook}/v1"),
        &ca.ca_pem,
        &["v1"],
        "Fail",
        2,
    );
    h["sideEffects"] = json!("NoneOnDryRun");
    register(&c, "dry", vec![h.clone()]).await;
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let answered = pods.create(&dry, &pod("dry1")).await.unwrap();
    assert_eq!(answered.labels()["hami.io/mutated"], "v1");
    assert!(
        pods.get_opt("dry1").await.unwrap().is_none(),
        "a dry run stored the pod"
    );
    let (code, msg) = status_of(
        pods.create(&dry, &{
            let mut p = pod("dry2");
            p.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert("deny".into(), "1".into());
            p
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(code, 403, "{msg}");
    delete_config(&c, "dry").await;
    // A condition skipping dry runs: the webhook is not called for one, called otherwise.
    h["matchConditions"] = json!([{"name": "not-dry", "expression": "!request.dryRun"}]);
    register(&c, "dry", vec![h.clone()]).await;
    let answered = pods.create(&dry, &pod("dry3")).await.unwrap();
    assert!(!answered.labels().contains_key("hami.io/mutated"));
    let stored = pods
        .create(&PostParams::default(), &pod("wet"))
        .await
        .unwrap();
    assert_eq!(stored.labels()["hami.io/mutated"], "v1");
    delete_config(&c, "dry").await;
    let api: Api<MutatingWebhookConfiguration> = Api::all(c.clone());
    h["sideEffects"] = json!("Some");
    let cfg =
        serde_json::from_value(json!({"metadata": {"name": "some"}, "webhooks": [h]})).unwrap();
    let (code, msg) = status_of(api.create(&PostParams::default(), &cfg).await.unwrap_err());
    assert_eq!(code, 422);
    assert!(msg.contains("Unsupported value: \"Some\""), "{msg}");
}

fn update_hook(url: String, ca_pem: &str, resources: &[&str]) -> Value {
    json!({
        "name": "update.hami.io",
        "clientConfig": {"url": url, "caBundle": serde_json::to_value(k8s_openapi::ByteString(ca_pem.as_bytes().to_vec())).unwrap()},
        "rules": [{"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": resources, "scope": "*"}],
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": 5
    })
}

fn reviews_for(pod: &str) -> Vec<Value> {
    UPDATE_REVIEWS
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r["request"]["name"] == pod)
        .cloned()
        .collect()
}

async fn client_as(server: &hami_apiserver::RunningApiServer, token: &str) -> kube::Client {
    impersonating(server, token, None).await
}

async fn impersonating(
    server: &hami_apiserver::RunningApiServer,
    token: &str,
    user: Option<&str>,
) -> kube::Client {
    let kc =
        kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml_with_token(token)).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.auth_info.impersonate = user.map(str::to_string);
    kube::Client::try_from(cfg).unwrap()
}

/// UPDATE admission as upstream runs it, authentication on: PUT and every patch type reach
/// the webhook as operation UPDATE with `oldObject` the stored pod, `object` the result of
/// the change and UpdateOptions; the webhook's patch lands in what is stored; an ordinary
/// user's patch adding a scheduler-owned annotation is refused with the webhook's message,
/// the scheduler's own is not; a `pods/status` patch is not sent to a rule naming `pods`
/// (it is to one naming `pods/status`, with `subResource: status`).
#[tokio::test]
async fn updates_are_admitted_as_upstream_does() {
    use kube::api::{Patch, PatchParams};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = test_ca();
    let hook = start_webhook(&ca).await;
    let server = common::start_with(hami_apiserver::Config {
        auth: Some(hami_apiserver::authn::AuthConfig::default()),
        ..hami_apiserver::Config::default()
    })
    .await;
    // alice may get, update and patch pods (and their status) in default: an ordinary user.
    for v in [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "pod-editor"},
               "rules": [{"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": ["get", "update", "patch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "pod-editors"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pod-editor"},
               "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": "default"},
                            {"kind": "ServiceAccount", "name": "hami-scheduler", "namespace": "kube-system"}]}),
    ] {
        let plural = if v["kind"] == "ClusterRole" {
            "clusterroles"
        } else {
            "clusterrolebindings"
        };
        server
            .create_object("rbac.authorization.k8s.io/v1", plural, None, v)
            .unwrap();
    }
    let admin = client_as(&server, hami_apiserver::kubeconfig::PLACEHOLDER_TOKEN).await;
    let alice = client_as(
        &server,
        &server.service_account_token("default", "alice").unwrap(),
    )
    .await;
    let sched = client_as(
        &server,
        &server
            .service_account_token("kube-system", "hami-scheduler")
            .unwrap(),
    )
    .await;
    let url = format!("https://{hook}/update");
    register(
        &admin,
        "update",
        vec![update_hook(url.clone(), &ca.ca_pem, &["pods"])],
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    pods.create(&PostParams::default(), &pod("u1"))
        .await
        .unwrap();
    assert!(
        reviews_for("u1").is_empty(),
        "a CREATE reached an UPDATE-only rule"
    );

    // Every patch type, and a PUT: the webhook sees the change applied, and its patch is stored.
    let as_alice: Api<Pod> = Api::namespaced(alice.clone(), "default");
    let pp = PatchParams::default();
    let changes: Vec<(&str, Patch<Value>)> = vec![
        (
            "merge",
            Patch::Merge(json!({"metadata": {"labels": {"step": "merge"}}})),
        ),
        (
            "json",
            Patch::Json(
                serde_json::from_value(json!([
            {"op": "add", "path": "/metadata/labels/step", "value": "json"}]))
                .unwrap(),
            ),
        ),
        (
            "strategic",
            Patch::Strategic(json!({"metadata": {"labels": {"step": "strategic"}}})),
        ),
    ];
    for (step, change) in changes {
        let before = as_alice.get("u1").await.unwrap();
        let out = as_alice.patch("u1", &pp, &change).await.unwrap();
        assert_eq!(out.labels()["step"], step);
        assert_eq!(out.labels()["webhook-saw"], "update", "{step}");
        let review = reviews_for("u1").pop().unwrap();
        let req = &review["request"];
        assert_eq!(req["operation"], "UPDATE", "{step}");
        assert_eq!(
            req["userInfo"]["username"],
            "system:serviceaccount:default:alice"
        );
        assert_eq!(req["object"]["metadata"]["labels"]["step"], step);
        assert_eq!(
            req["oldObject"]["metadata"]["resourceVersion"].as_str(),
            before.metadata.resource_version.as_deref()
        );
        assert_eq!(req["options"]["kind"], "UpdateOptions");
        assert!(req.get("subResource").is_none(), "{req}");
    }
    let apply = PatchParams::apply("tester");
    let out = as_alice
        .patch(
            "u1",
            &apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "u1", "labels": {"applied": "yes"}}})),
        )
        .await
        .unwrap();
    assert_eq!(out.labels()["applied"], "yes");
    let review = reviews_for("u1").pop().unwrap();
    assert_eq!(review["request"]["options"]["fieldManager"], "tester");
    let mut current = as_alice.get("u1").await.unwrap();
    current.labels_mut().insert("step".into(), "put".into());
    current.labels_mut().remove("webhook-saw");
    let out = as_alice
        .replace("u1", &PostParams::default(), &current)
        .await
        .unwrap();
    assert_eq!(out.labels()["webhook-saw"], "update", "PUT");
    assert_eq!(
        reviews_for("u1").pop().unwrap()["request"]["object"]["metadata"]["labels"]["step"],
        "put"
    );

    // D-4's shape: alice may not add the owned annotation; the scheduler may.
    let forge = Patch::Merge(json!({"metadata": {"annotations": {OWNED: "gpu-node-1"}}}));
    let (code, msg) = status_of(as_alice.patch("u1", &pp, &forge).await.unwrap_err());
    assert_eq!(code, 403, "{msg}");
    assert_eq!(
        msg,
        format!(
            "admission webhook \"update.hami.io\" denied the request: metadata.annotations[{OWNED}] is written by the scheduler only; system:serviceaccount:default:alice may not set, change or remove it"
        )
    );
    assert!(
        pods.get("u1")
            .await
            .unwrap()
            .annotations()
            .get(OWNED)
            .is_none()
    );
    let as_sched: Api<Pod> = Api::namespaced(sched.clone(), "default");
    // Nor by impersonating the scheduler, which she is not granted.
    let alice_token = server.service_account_token("default", "alice").unwrap();
    let alice_as_sched: Api<Pod> = Api::namespaced(
        impersonating(&server, &alice_token, Some(WRITER)).await,
        "default",
    );
    let (code, msg) = status_of(alice_as_sched.patch("u1", &pp, &forge).await.unwrap_err());
    assert!(code == 403 && msg.contains("impersonate"), "{code} {msg}");
    let out = as_sched.patch("u1", &pp, &forge).await.unwrap();
    assert_eq!(out.annotations()[OWNED], "gpu-node-1");
    // A dry-run patch is admitted (the denial answered) and stores nothing.
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let unset = Patch::Merge(json!({"metadata": {"annotations": {OWNED: null}}}));
    assert_eq!(
        status_of(as_alice.patch("u1", &dry, &unset).await.unwrap_err()).0,
        403
    );
    assert!(reviews_for("u1").pop().unwrap()["request"]["dryRun"] == true);

    // pods/status: not sent to a rule naming `pods` only.
    let sent = reviews_for("u1").len();
    let status = Patch::Merge(json!({"status": {"phase": "Running"}}));
    as_alice.patch_status("u1", &pp, &status).await.unwrap();
    assert_eq!(
        reviews_for("u1").len(),
        sent,
        "a status patch reached a `pods` rule"
    );
    // ... and sent, with its subresource, to one naming `pods/status`; spec changes the
    // webhook makes there are dropped as the status strategy drops them.
    delete_config(&admin, "update").await;
    register(
        &admin,
        "update",
        vec![update_hook(url, &ca.ca_pem, &["pods/status"])],
    )
    .await;
    let status = Patch::Merge(json!({"status": {"phase": "Succeeded"}}));
    let out = as_alice.patch_status("u1", &pp, &status).await.unwrap();
    assert_eq!(out.status.unwrap().phase.as_deref(), Some("Succeeded"));
    let review = reviews_for("u1").pop().unwrap();
    assert_eq!(review["request"]["subResource"], "status");
    assert_eq!(review["request"]["oldObject"]["status"]["phase"], "Running");
    assert_eq!(review["request"]["object"]["status"]["phase"], "Succeeded");
    assert_eq!(reviews_for("u1").len(), sent + 1);
    // ... and a main-resource patch is not sent to the `pods/status` rule.
    as_alice
        .patch(
            "u1",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(reviews_for("u1").len(), sent + 1);
}

/// With authentication off every caller is the admin, who may impersonate: a client whose
/// kubeconfig says `as:` a service account is that account to RBAC and to webhooks (how
/// the stacks give their components their own identity). With authentication on, only a
/// user granted `impersonate` may.
#[tokio::test]
async fn impersonation_sets_the_reviewed_user() {
    let ca = test_ca();
    let hook = start_webhook(&ca).await;
    let server = start().await;
    let c = client(&server);
    register(
        &c,
        "imp",
        vec![update_hook(
            format!("https://{hook}/update"),
            &ca.ca_pem,
            &["pods"],
        )],
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(&PostParams::default(), &pod("imp1"))
        .await
        .unwrap();
    let mut cfg = kube::Config::new(server.url().parse().unwrap());
    cfg.auth_info.impersonate = Some(WRITER.into());
    let sched: Api<Pod> = Api::namespaced(kube::Client::try_from(cfg).unwrap(), "default");
    let forge = kube::api::Patch::Merge(json!({"metadata": {"annotations": {OWNED: "n"}}}));
    let pp = kube::api::PatchParams::default();
    assert_eq!(
        status_of(pods.patch("imp1", &pp, &forge).await.unwrap_err()).0,
        403
    );
    sched.patch("imp1", &pp, &forge).await.unwrap();
    let review = reviews_for("imp1").pop().unwrap();
    assert_eq!(review["request"]["userInfo"]["username"], WRITER);
    assert_eq!(
        review["request"]["userInfo"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
            "system:authenticated"
        ])
    );
    let log = server.request_log();
    assert_eq!(log.last().unwrap().user.as_deref(), Some(WRITER));
    delete_config(&c, "imp").await;
}
