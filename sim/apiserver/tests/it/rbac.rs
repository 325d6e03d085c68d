//! Authentication (admin token, service-account token Secrets) and RBAC enforcement over
//! HTTP, with kube-rs as the client: 401 for unknown tokens, 403 with Kubernetes' message
//! for what no binding grants, and grants taking effect as soon as the objects exist.

use crate::common;

use common::{pod, start_with};
use hami_apiserver::authn::AuthConfig;
use hami_apiserver::{Config, RunningApiServer};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

async fn client_with_token(server: &RunningApiServer, token: &str) -> kube::Client {
    let kc =
        kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml_with_token(token)).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

async fn secured() -> (RunningApiServer, kube::Client) {
    let server = start_with(Config {
        auth: Some(AuthConfig::default()),
        ..Config::default()
    })
    .await;
    // The server's own kubeconfig carries the admin token.
    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let admin = kube::Client::try_from(cfg).unwrap();
    (server, admin)
}

fn api_code(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn tokens_are_authenticated_and_rbac_is_enforced() {
    let (server, admin) = secured().await;
    Api::<Pod>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &pod("p1"))
        .await
        .unwrap();
    let token = server.service_account_token("hami-system-x", "sched").err();
    assert_eq!(
        token.map(|e| e.code),
        Some(404),
        "no namespace, no service account"
    );
    let token = server
        .service_account_token("kube-system", "sched")
        .unwrap();
    assert_eq!(token.len(), 64);
    let sa = client_with_token(&server, &token).await;
    let pods: Api<Pod> = Api::namespaced(sa.clone(), "default");

    // Authenticated but granted nothing: 403, worded as Kubernetes does.
    let (code, msg) = api_code(pods.get("p1").await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        msg,
        "pods \"p1\" is forbidden: User \"system:serviceaccount:kube-system:sched\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    // Discovery works for any authenticated user.
    assert!(sa.apiserver_version().await.is_ok());

    // Grant get/list/patch on pods cluster-wide, and create on pods/binding.
    let cr: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "sched"},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]},
            {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]}
        ]
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &cr)
        .await
        .unwrap();
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "sched"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "sched"},
        "subjects": [{"kind": "ServiceAccount", "name": "sched", "namespace": "kube-system"}]
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &crb)
        .await
        .unwrap();
    assert!(pods.get("p1").await.is_ok());
    assert_eq!(
        Api::<Pod>::all(sa.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    pods.patch(
        "p1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"a": "b"}}})),
    )
    .await
    .unwrap();
    // Subresources are separate: patching pods does not grant pods/status.
    let (code, msg) = api_code(
        pods.patch_status(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        msg.contains("cannot patch resource \"pods/status\""),
        "{msg}"
    );
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p1"}, "target": {"kind": "Node", "name": "n1"}});
    pods.create_subresource::<_, serde_json::Value>(
        "binding",
        "p1",
        &PostParams::default(),
        &binding,
    )
    .await
    .unwrap();
    // Not granted: delete, nodes, watch.
    assert_eq!(
        api_code(pods.delete("p1", &Default::default()).await.unwrap_err()).0,
        403
    );
    let (code, msg) = api_code(Api::<Node>::all(sa.clone()).get("n1").await.unwrap_err());
    assert_eq!(code, 403);
    assert!(msg.ends_with("at the cluster scope"), "{msg}");

    // A Role grants in its namespace only, and resourceNames limit by name.
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "lease", "namespace": "kube-system"},
        "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "update"], "resourceNames": ["mine"]}
        ]
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let rb: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "lease", "namespace": "kube-system"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease"},
        "subjects": [{"kind": "ServiceAccount", "name": "sched"}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &rb)
        .await
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(sa.clone(), "kube-system");
    for name in ["mine", "other"] {
        let l: Lease = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        leases.create(&PostParams::default(), &l).await.unwrap();
    }
    assert!(leases.get("mine").await.is_ok());
    assert_eq!(api_code(leases.get("other").await.unwrap_err()).0, 403);
    assert_eq!(
        api_code(leases.list(&ListParams::default()).await.unwrap_err()).0,
        403
    );
    let elsewhere: Api<Lease> = Api::namespaced(sa.clone(), "default");
    let l: Lease = serde_json::from_value(json!({"metadata": {"name": "mine"}})).unwrap();
    assert_eq!(
        api_code(
            elsewhere
                .create(&PostParams::default(), &l)
                .await
                .unwrap_err()
        )
        .0,
        403
    );

    // The request log names the user of each request.
    let log = server.request_log();
    let denied: Vec<_> = log.iter().filter(|r| r.status == 403).collect();
    assert!(
        denied
            .iter()
            .all(|r| r.user.as_deref() == Some("system:serviceaccount:kube-system:sched"))
    );
    assert!(
        log.iter()
            .any(|r| r.user.as_deref() == Some("system:admin") && r.resource == "clusterroles")
    );
    let binding_req = log.iter().find(|r| r.resource == "pods/binding").unwrap();
    assert_eq!(
        (
            binding_req.verb.as_str(),
            binding_req.api_group.as_str(),
            binding_req.status
        ),
        ("create", "", 201)
    );
}

#[tokio::test]
async fn unknown_tokens_anonymous_and_deleted_service_accounts() {
    let (server, admin) = secured().await;
    // Unknown token: 401.
    let bad = client_with_token(&server, "not-a-token").await;
    let (code, msg) = api_code(
        Api::<Pod>::namespaced(bad.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((code, msg.as_str()), (401, "Unauthorized"));
    // Anonymous (no header): resources and discovery are forbidden, health is public.
    let anon = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let (code, msg) = api_code(
        Api::<Pod>::namespaced(anon.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        msg.contains("User \"system:anonymous\" cannot list resource \"pods\""),
        "{msg}"
    );
    assert!(anon.apiserver_version().await.is_ok());
    let health = hyper_get(&server, "/healthz").await;
    assert_eq!(health, 200);
    assert_eq!(hyper_get(&server, "/api/v1").await, 403);
    // A token stops working when its service account is deleted.
    let token = server.service_account_token("default", "gone").unwrap();
    let sa = client_with_token(&server, &token).await;
    assert_eq!(
        api_code(
            Api::<Pod>::namespaced(sa.clone(), "default")
                .list(&ListParams::default())
                .await
                .unwrap_err()
        )
        .0,
        403
    );
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), "default")
        .delete("gone", &Default::default())
        .await
        .unwrap();
    assert_eq!(
        api_code(
            Api::<Pod>::namespaced(sa, "default")
                .list(&ListParams::default())
                .await
                .unwrap_err()
        )
        .0,
        401
    );
    // A token Secret created by a client gets its token from the token controller.
    let s: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "t", "annotations": {"kubernetes.io/service-account.name": "default"}},
        "type": "kubernetes.io/service-account-token"
    }))
    .unwrap();
    let created = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin, "default")
        .create(&PostParams::default(), &s)
        .await
        .unwrap();
    let data = created.data.unwrap();
    assert_eq!(data["token"].0.len(), 64);
    assert_eq!(data["namespace"].0, b"default");
}

#[tokio::test]
async fn without_auth_everything_is_allowed_as_before() {
    let server = start_with(Config::default()).await;
    let anon = common::client(&server);
    Api::<Pod>::namespaced(anon, "default")
        .create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();
    assert!(server.request_log().iter().all(|r| r.user.is_none()));
}

async fn hyper_get(server: &RunningApiServer, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    buf.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn token_requests_give_a_token_of_the_service_account() {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let (server, admin) = secured().await;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let req: TokenRequest = serde_json::from_value(
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": []}}),
    )
    .unwrap();
    // No such account: 404, as in Kubernetes.
    let e = sas
        .create_token_request("robot", &PostParams::default(), &req)
        .await
        .unwrap_err();
    assert_eq!(api_code(e).0, 404);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "robot"}})).unwrap(),
    )
    .await
    .unwrap();
    let answer = sas
        .create_token_request("robot", &PostParams::default(), &req)
        .await
        .unwrap();
    let token = answer
        .status
        .unwrap()
        .token
        .expect("a token in the TokenRequest status");
    // The token is the account: what it may not do is refused in its name.
    let robot = client_with_token(&server, &token).await;
    let (code, message) = api_code(
        Api::<Pod>::namespaced(robot, "default")
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("system:serviceaccount:default:robot"),
        "{message}"
    );
    // Too short a lifetime is refused as Kubernetes does.
    let short: TokenRequest = serde_json::from_value(
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": [], "expirationSeconds": 60}}),
    )
    .unwrap();
    let e = sas
        .create_token_request("robot", &PostParams::default(), &short)
        .await
        .unwrap_err();
    assert_eq!(api_code(e).0, 422);
}
