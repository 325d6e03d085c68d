//! Whole-system tests of hami-rs: the shipped manifests' ServiceAccounts, RBAC and settings
//! driving every component, each under its own account, against the embedded API server
//! with authentication and RBAC on and the simulated kubelets (`tests/least_privilege*.rs`).
//! Kept out of the product crates so that what ships (`crates/`) never depends on the
//! stand-ins (`sim/`).
//!
//! This library is the tests' shared setup, written once: an authenticating API server
//! holding the shipped RBAC objects, clients under a service account's token or as admin,
//! bounded waits, and the reading of the request log; [`grants`] replays that log to find
//! grants nobody needed. The simulated kubelet, the node lock and the stand-in NVML's files
//! come from the plugins' harness (`hami_plugin_harness`).

pub mod grants;

use std::time::{Duration, Instant};

use hami_apiserver::authn::AuthConfig;
use hami_apiserver::{ApiServer, Config, RequestRecord, RunningApiServer};
use hami_manifests::Object;
use serde_json::{Value, json};

/// The simulated kubelet's service account (in `kube-system`): in a cluster the kubelet has
/// the Node authorizer's rights, here [`cluster_admin_for`] gives it an admin role.
pub const SIM_KUBELET: &str = "sim-kubelet";

/// The resource (plural) of an RBAC object's kind, for creating it on the server.
///
/// # Panics
/// On a kind that is not an RBAC object (a test's own mistake).
pub fn plural(kind: &str) -> &'static str {
    match kind {
        "ServiceAccount" => "serviceaccounts",
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        other => panic!("unexpected RBAC kind {other}"),
    }
}

/// The JSON form of shipped objects (`hami_manifests::objects::rbac_objects`), to install
/// with [`start_authed_server`].
///
/// # Panics
/// If an object does not serialise.
pub fn to_values(objects: &[Object]) -> Vec<Value> {
    objects.iter().map(|o| o.to_value().unwrap()).collect()
}

/// A `cluster-admin` ClusterRole (all verbs on everything) bound to the service account
/// `kube-system/<account>`: the rights a stand-in for a built-in component (kubelet) has in
/// a cluster, as test-only objects.
pub fn cluster_admin_for(account: &str) -> [Value; 2] {
    [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "cluster-admin"},
               "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": account},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
               "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "kube-system"}]}),
    ]
}

/// Starts the embedded API server with authentication and RBAC on, creates `namespaces`
/// and then the RBAC objects `rbac` (JSON, each in its own namespace if it names one).
///
/// # Panics
/// If the server does not start or an object is refused (named in the message).
pub async fn start_authed_server(namespaces: &[&str], rbac: &[Value]) -> RunningApiServer {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = ApiServer::start(Config {
        auth: Some(AuthConfig::default()),
        ..Config::default()
    })
    .await
    .unwrap();
    for ns in namespaces {
        server
            .create_object(
                "v1",
                "namespaces",
                None,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )
            .unwrap();
    }
    for v in rbac {
        server
            .create_object(
                v["apiVersion"].as_str().unwrap(),
                plural(v["kind"].as_str().unwrap()),
                v["metadata"]["namespace"].as_str(),
                v.clone(),
            )
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", v["metadata"]["name"]));
    }
    server
}

/// Creates an empty Node `name` (as admin, straight in the store).
///
/// # Panics
/// If the server refuses it.
pub fn create_node(server: &RunningApiServer, name: &str) {
    server
        .create_object(
            "v1",
            "nodes",
            None,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
        )
        .unwrap();
}

async fn client_from(kubeconfig: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// A client authenticated with a token of the service account `ns/sa` (created if absent).
///
/// # Panics
/// If the server issues no token or the kubeconfig does not load.
pub async fn client_for(server: &RunningApiServer, ns: &str, sa: &str) -> kube::Client {
    let token = server.service_account_token(ns, sa).unwrap();
    client_from(&server.kubeconfig_yaml_with_token(&token)).await
}

/// A client with the server's admin identity (a user, not a component).
///
/// # Panics
/// If the kubeconfig does not load.
pub async fn admin_client(server: &RunningApiServer) -> kube::Client {
    client_from(&server.kubeconfig_yaml()).await
}

/// The user name the API server gives the service account `ns/sa`.
pub fn service_account_user(ns: &str, sa: &str) -> String {
    format!("system:serviceaccount:{ns}:{sa}")
}

/// Polls `f` every 50 ms until it holds or `limit` has passed (then once more): whether it
/// held.
pub async fn wait_until(limit: Duration, mut f: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f().await
}

/// The requests `user` made, in order.
pub fn requests_of<'a>(log: &'a [RequestRecord], user: &str) -> Vec<&'a RequestRecord> {
    log.iter()
        .filter(|r| r.user.as_deref() == Some(user))
        .collect()
}

/// Each of `requests` that was refused (401 or 403), as `verb resource path`.
pub fn refused(requests: &[&RequestRecord]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.status == 401 || r.status == 403)
        .map(|r| format!("{} {} {}", r.verb, r.resource, r.path))
        .collect()
}

/// Runs the test `name` (its path in the calling test binary, e.g.
/// `least_privilege_nvidia::some_test`) again in a child process of that binary with `env`
/// set, and returns `true` there, where the body runs; in the parent it waits for the
/// child, fails with its output if it failed, and returns `false`. Why: a stand-in library
/// loaded into the process (the NVML) reads its settings with `getenv`, and setting the
/// environment while other tests' threads run is undefined behaviour; a child started with
/// `Command::env` has them from its first instruction.
pub fn in_child_with_env(name: &str, env: &[(&str, &std::ffi::OsStr)]) -> bool {
    const MARKER: &str = "HAMI_IT_CHILD_TEST";
    if std::env::var(MARKER).as_deref() == Ok(name) {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .env(MARKER, name)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{name} in its child process failed:\n{text}"
    );
    // The child's harness says how many tests it ran: exactly this one, not a filter miss.
    assert!(
        text.contains("1 passed"),
        "{name} did not run in the child:\n{text}"
    );
    false
}
