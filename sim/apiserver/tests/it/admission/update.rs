//! UPDATE admission (PUT and every patch type, the status subresource where a rule names
//! it), and the user a webhook sees under impersonation.

use super::*;

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
