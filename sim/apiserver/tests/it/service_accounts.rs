//! `Config::service_accounts` over the wire, with TLS and authentication on as in a real
//! cluster: the controllers give a new namespace its `default` account and `kube-root-ca.crt`
//! (the server's CA), the admission plugin shapes pods as upstream's does, and a token
//! bound to a pod authenticates in-cluster style as its account under RBAC until the pod
//! is deleted.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::common;
use crate::tls::{in_cluster_client, temp_dir, tls_config};
use hami_apiserver::Config;

fn config() -> Config {
    Config {
        service_accounts: true,
        ..tls_config()
    }
}

fn admin(server: &hami_apiserver::RunningApiServer) -> kube::Client {
    let mut cfg = kube::Config::new(server.url().parse().unwrap());
    cfg.root_cert = Some(vec![
        rustls::pki_types::pem::PemObject::from_pem_slice(server.ca_pem().unwrap().as_bytes())
            .map(|c: rustls::pki_types::CertificateDer| c.to_vec())
            .unwrap(),
    ]);
    cfg.auth_info.token = Some(
        hami_apiserver::kubeconfig::PLACEHOLDER_TOKEN
            .to_string()
            .into(),
    );
    kube::Client::try_from(cfg).unwrap()
}

fn api_error(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("not an API error: {other}"),
    }
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

fn pod(name: &str, extra_spec: serde_json::Value) -> Pod {
    let mut p = json!({"metadata": {"name": name},
        "spec": {"initContainers": [{"name": "init", "image": "i"}],
                 "containers": [{"name": "main", "image": "i"}]}});
    for (k, v) in extra_spec.as_object().unwrap() {
        p["spec"][k] = v.clone();
    }
    serde_json::from_value(p).unwrap()
}

#[tokio::test]
async fn namespaces_get_their_account_and_ca_and_pods_the_token_volume() {
    let server = common::start_with(config()).await;
    let client = admin(&server);
    // The namespaces that exist at start, and one created now (in the same write).
    for ns in ["default", "kube-system"] {
        assert!(
            server
                .get_object("v1", "serviceaccounts", ns, "default")
                .is_some()
        );
    }
    create_namespace(&client, "team").await;
    let sa = Api::<ServiceAccount>::namespaced(client.clone(), "team");
    assert!(sa.get("default").await.is_ok());
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "team")
        .get("kube-root-ca.crt")
        .await
        .unwrap();
    assert_eq!(
        cm.data.unwrap()["ca.crt"],
        server.ca_pem().unwrap(),
        "kube-root-ca.crt holds the server's CA"
    );

    let pods = Api::<Pod>::namespaced(client.clone(), "team");
    let created = pods
        .create(&PostParams::default(), &pod("p", json!({})))
        .await
        .unwrap();
    let v = serde_json::to_value(&created).unwrap();
    assert_eq!(v["spec"]["serviceAccountName"], "default");
    let volume = &v["spec"]["volumes"][0];
    let name = volume["name"].as_str().unwrap();
    assert!(
        name.starts_with("kube-api-access-") && name.len() == 21,
        "{name}"
    );
    assert_eq!(
        volume["projected"],
        json!({"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]})
    );
    let mount = json!([{"name": name, "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]);
    assert_eq!(v["spec"]["containers"][0]["volumeMounts"], mount);
    assert_eq!(v["spec"]["initContainers"][0]["volumeMounts"], mount);

    // automountServiceAccountToken: false on the pod, or on its account.
    let quiet = pods
        .create(
            &PostParams::default(),
            &pod("quiet", json!({"automountServiceAccountToken": false})),
        )
        .await
        .unwrap();
    assert!(quiet.spec.unwrap().volumes.is_none());
    let account: ServiceAccount = serde_json::from_value(
        json!({"metadata": {"name": "noauto"}, "automountServiceAccountToken": false}),
    )
    .unwrap();
    sa.create(&PostParams::default(), &account).await.unwrap();
    let by_account = pods
        .create(
            &PostParams::default(),
            &pod("by-account", json!({"serviceAccountName": "noauto"})),
        )
        .await
        .unwrap();
    assert!(by_account.spec.unwrap().volumes.is_none());

    // A missing account: refused with upstream's message, nothing stored.
    let err = pods
        .create(
            &PostParams::default(),
            &pod("orphan", json!({"serviceAccountName": "ghost"})),
        )
        .await
        .unwrap_err();
    assert_eq!(
        api_error(err),
        (
            403,
            "pods \"orphan\" is forbidden: error looking up service account team/ghost: serviceaccount \"ghost\" not found".into()
        )
    );
    assert!(server.get_object("v1", "pods", "team", "orphan").is_none());

    // A mirror pod is stored as sent.
    let mut mirror = serde_json::to_value(pod("mirror", json!({}))).unwrap();
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "hash"});
    let mirror: Pod = serde_json::from_value(mirror).unwrap();
    let stored = pods.create(&PostParams::default(), &mirror).await.unwrap();
    let spec = stored.spec.unwrap();
    assert!(spec.volumes.is_none() && spec.service_account_name.is_none());
}

#[tokio::test]
async fn a_pod_bound_token_authenticates_under_rbac_until_the_pod_is_deleted() {
    let server = common::start_with(config()).await;
    let client = admin(&server);
    create_namespace(&client, "team").await;
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "agent"}})).unwrap();
    let sa = Api::<ServiceAccount>::namespaced(client.clone(), "team");
    sa.create(&PostParams::default(), &account).await.unwrap();
    let role: Role = serde_json::from_value(json!({"metadata": {"name": "read-pods"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), "team")
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let rb: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "read-pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": "team"}]}))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), "team")
        .create(&PostParams::default(), &rb)
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), "team");
    let p = pods
        .create(
            &PostParams::default(),
            &pod("agent-pod", json!({"serviceAccountName": "agent"})),
        )
        .await
        .unwrap();
    let uid = p.metadata.uid.clone().unwrap();
    let request = |name: &str, uid: &str| TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![]),
            expiration_seconds: Some(3607),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
            }),
        }),
        ..Default::default()
    };
    let answer = sa
        .create_token_request("agent", &PostParams::default(), &request("agent-pod", &uid))
        .await
        .unwrap();
    let token = answer.status.unwrap().token.unwrap();
    let user = server.token_user(&token).expect("the token authenticates");
    assert_eq!(user.name, "system:serviceaccount:team:agent");
    assert_eq!(
        user.groups,
        [
            "system:serviceaccounts",
            "system:serviceaccounts:team",
            "system:authenticated"
        ]
    );

    // Bad bindings are refused clearly.
    let bad = |e: kube::Error| api_error(e);
    let (code, msg) = bad(sa
        .create_token_request("agent", &PostParams::default(), &request("nope", ""))
        .await
        .unwrap_err());
    assert_eq!((code, msg.as_str()), (404, "pods \"nope\" not found"));
    let (code, msg) = bad(sa
        .create_token_request(
            "agent",
            &PostParams::default(),
            &request("agent-pod", "other-uid"),
        )
        .await
        .unwrap_err());
    assert!(
        code == 409 && msg.contains("does not match the UID in record"),
        "{msg}"
    );
    let (code, msg) = bad(sa
        .create_token_request(
            "default",
            &PostParams::default(),
            &request("agent-pod", &uid),
        )
        .await
        .unwrap_err());
    assert!(
        code == 400 && msg.contains("different serviceaccount name"),
        "{msg}"
    );

    // In-cluster style: token file + ca.crt + https://127.0.0.1:port.
    let dir = temp_dir("bound-token");
    let agent = in_cluster_client(&server, &dir, &token, server.ca_pem().unwrap());
    let team: Api<Pod> = Api::namespaced(agent.clone(), "team");
    assert_eq!(
        team.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let (code, msg) = api_error(
        Api::<Pod>::namespaced(agent.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        msg.contains("User \"system:serviceaccount:team:agent\" cannot list resource \"pods\""),
        "{msg}"
    );
    let (code, _) = api_error(
        team.delete("agent-pod", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403, "the Role grants no delete");

    // The pod goes: its token stops authenticating.
    pods.delete("agent-pod", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    common::eventually("the pod is gone", async || {
        server
            .get_object("v1", "pods", "team", "agent-pod")
            .is_none()
    })
    .await;
    let (code, _) = api_error(team.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(code, 401);
    assert!(server.token_user(&token).is_none());
    let _ = std::fs::remove_dir_all(&dir);
}
