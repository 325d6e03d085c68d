use super::*;

fn store_with(namespace: &str, accounts: &[Value]) -> Store {
    let mut s = Store::default();
    s.create(
        served("namespaces"),
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
    )
    .unwrap();
    for sa in accounts {
        s.create(served("serviceaccounts"), Some(namespace), sa.clone())
            .unwrap();
    }
    s
}

fn account(name: &str, automount: Option<bool>) -> Value {
    let mut sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}});
    if let Some(a) = automount {
        sa["automountServiceAccountToken"] = json!(a);
    }
    sa
}

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
    "spec": {
        "initContainers": [{"name": "init", "image": "i"}],
        "containers": [
            {"name": "a", "image": "i", "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
            {"name": "b", "image": "i", "volumeMounts": [{"name": "own", "mountPath": TOKEN_MOUNT_PATH}]},
        ],
        "volumes": [{"name": "data", "emptyDir": {}}, {"name": "own", "emptyDir": {}}],
    }})
}

#[test]
fn injects_upstreams_volume_and_mounts() {
    let s = store_with("ns", &[account("default", None)]);
    let mut p = pod();
    admit_pod(&s, "ns", &mut p).unwrap();
    assert_eq!(p["spec"]["serviceAccountName"], "default");
    let volumes = p["spec"]["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 3);
    let v = &volumes[2];
    let name = v["name"].as_str().unwrap();
    let suffix = name.strip_prefix(TOKEN_VOLUME_PREFIX).unwrap();
    assert_eq!(suffix.len(), 5, "{name}");
    assert_eq!(
        v["projected"],
        json!({"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]})
    );
    let mount = json!({"name": name, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
    assert_eq!(
        p["spec"]["initContainers"][0]["volumeMounts"],
        json!([mount.clone()])
    );
    assert_eq!(
        p["spec"]["containers"][0]["volumeMounts"],
        json!([{"name": "data", "mountPath": "/data"}, mount])
    );
    // A container that mounts the path itself keeps its own mount only.
    assert_eq!(
        p["spec"]["containers"][1]["volumeMounts"],
        json!([{"name": "own", "mountPath": TOKEN_MOUNT_PATH}])
    );
}

#[test]
fn automount_false_on_the_pod_or_else_the_account_is_honoured() {
    let s = store_with(
        "ns",
        &[account("default", None), account("quiet", Some(false))],
    );
    let volumes = |p: &Value| p["spec"]["volumes"].as_array().unwrap().len();
    let mut p = pod();
    p["spec"]["automountServiceAccountToken"] = json!(false);
    admit_pod(&s, "ns", &mut p).unwrap();
    assert_eq!(volumes(&p), 2);
    assert_eq!(
        p["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let mut p = pod();
    p["spec"]["serviceAccountName"] = json!("quiet");
    admit_pod(&s, "ns", &mut p).unwrap();
    assert_eq!(volumes(&p), 2);
    // The pod's own choice wins over the account's.
    let mut p = pod();
    p["spec"]["serviceAccountName"] = json!("quiet");
    p["spec"]["automountServiceAccountToken"] = json!(true);
    admit_pod(&s, "ns", &mut p).unwrap();
    assert_eq!(volumes(&p), 3);
}

#[test]
fn a_missing_account_is_refused_with_upstreams_message() {
    let s = store_with("ns", &[]);
    let mut p = pod();
    let e = admit_pod(&s, "ns", &mut p).unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        "pods \"p\" is forbidden: error looking up service account ns/default: serviceaccount \"default\" not found"
    );
    let mut p = pod();
    p["spec"]["serviceAccountName"] = json!("builder");
    let e = admit_pod(&s, "ns", &mut p).unwrap_err();
    assert!(
        e.message
            .ends_with("service account ns/builder: serviceaccount \"builder\" not found"),
        "{}",
        e.message
    );
}

#[test]
fn mirror_pods_are_left_alone_but_may_not_reference_accounts() {
    let s = store_with("ns", &[]);
    let mut p = pod();
    p["metadata"]["annotations"] = json!({MIRROR_POD_ANNOTATION: "abc"});
    let before = p.clone();
    admit_pod(&s, "ns", &mut p).unwrap();
    assert_eq!(p, before);
    p["spec"]["serviceAccountName"] = json!("default");
    let e = admit_pod(&s, "ns", &mut p).unwrap_err();
    assert!(
        e.message
            .ends_with("a mirror pod may not reference service accounts"),
        "{}",
        e.message
    );
    let mut p = before.clone();
    p["spec"]["volumes"] = json!([{"name": "s", "secret": {"secretName": "x"}}]);
    assert!(
        admit_pod(&s, "ns", &mut p)
            .unwrap_err()
            .message
            .ends_with("may not reference secrets")
    );
    let mut p = before;
    p["spec"]["volumes"] = json!([{"name": "t", "projected": token_volume_source()}]);
    assert!(
        admit_pod(&s, "ns", &mut p)
            .unwrap_err()
            .message
            .ends_with("may not use ServiceAccountToken volume projections")
    );
}

#[test]
fn account_image_pull_secrets_are_copied_when_the_pod_has_none() {
    let mut sa = account("default", None);
    sa["imagePullSecrets"] = json!([{"name": "registry"}]);
    let s = store_with("ns", &[sa]);
    let mut p = pod();
    admit_pod(&s, "ns", &mut p).unwrap();
    assert_eq!(p["spec"]["imagePullSecrets"], json!([{"name": "registry"}]));
}

#[test]
fn controllers_keep_the_default_account_and_the_root_ca_in_every_live_namespace() {
    let mut s = store_with("ns", &[]);
    let c = ServiceAccounts {
        ca_pem: Some("CA-PEM".into()),
    };
    c.reconcile(&mut s);
    assert!(s.get(served("serviceaccounts"), "ns", "default").is_ok());
    let cm = s
        .get(served("configmaps"), "ns", ROOT_CA_CONFIGMAP)
        .unwrap();
    assert_eq!(cm["data"], json!({"ca.crt": "CA-PEM"}));
    // An edited CA is put back; a deleted account comes back.
    let mut edited = (*cm).clone();
    edited["data"]["ca.crt"] = json!("forged");
    edited["data"]["extra"] = json!("x");
    s.update(
        served("configmaps"),
        "ns",
        ROOT_CA_CONFIGMAP,
        edited,
        Subresource::Main,
    )
    .unwrap();
    s.delete(
        served("serviceaccounts"),
        "ns",
        "default",
        &Default::default(),
    )
    .unwrap();
    c.reconcile(&mut s);
    assert_eq!(
        s.get(served("configmaps"), "ns", ROOT_CA_CONFIGMAP)
            .unwrap()["data"],
        json!({"ca.crt": "CA-PEM"})
    );
    assert!(s.get(served("serviceaccounts"), "ns", "default").is_ok());
    // Without a CA nothing is published.
    let mut s = store_with("other", &[]);
    ServiceAccounts { ca_pem: None }.reconcile(&mut s);
    assert!(s.get(served("serviceaccounts"), "other", "default").is_ok());
    assert!(
        s.get(served("configmaps"), "other", ROOT_CA_CONFIGMAP)
            .is_err()
    );
}
