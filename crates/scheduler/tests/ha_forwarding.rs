//! Two and three replicas of the real `hami-scheduler` wiring (`server::run`, each on its
//! own loopback address, as pods have their own IPs), leader election on the embedded API
//! server, and one simulated kube-scheduler that calls a *follower's* extender, as the
//! sidecar beside a follower does when its kube-scheduler wins its own election (issue 13
//! items 5, 6, 8). The follower forwards to the leader over mutual TLS; pods get bound.
//! Every replica is Ready and answers the webhook. The leader is killed: another replica
//! takes over and scheduling continues, without double-booking the GPU. A caller without
//! a client certificate cannot bind, and the webhook listener refuses `/bind`. Callers are
//! authenticated by a client CA (`--client-ca-file`) or by pinning the replicas' own
//! serving certificate, issued for server authentication only as kube-webhook-certgen
//! does (`--client-cert-pin-file`).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use hami_kube_scheduler_sim::SimKubeScheduler;
use hami_protocol::names::{node as node_keys, pod as pod_keys};
use hami_protocol::node_lock::NodeLock;
use hami_scheduler::config::SchedulerArgs;
use hami_scheduler::extender_client::{ClientIdentity, ExtenderClient, Trust};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use serde_json::json;
use tokio::task::JoinHandle;

const SERVER_NAME: &str = "hami-scheduler.kube-system.svc";

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SchedulerArgs,
}

struct Pki {
    dir: PathBuf,
    ca_pem: String,
    /// A client certificate from the CA (clientAuth).
    client: ClientIdentity,
    /// The serving certificate and key (serverAuth only, as kube-webhook-certgen issues).
    server: ClientIdentity,
}

/// How the extender listener authenticates its callers in a scenario.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// `--client-ca-file`: client certificates from the CA (cert-manager can issue them).
    Ca,
    /// `--client-cert-pin-file`: the serving certificate itself, presented by everyone.
    Pin,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn pki(tag: &str) -> Pki {
    let dir = std::env::temp_dir().join(format!("hami-ha-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "hami test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |sans: Vec<String>, usage: ExtendedKeyUsagePurpose, name: &str| {
        let mut p = CertificateParams::new(sans).unwrap();
        p.extended_key_usages = vec![usage];
        p.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &ca).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server, server_key) = leaf(
        vec![SERVER_NAME.into()],
        ExtendedKeyUsagePurpose::ServerAuth,
        "hami-scheduler",
    );
    let (client, client_key) = leaf(
        vec![],
        ExtendedKeyUsagePurpose::ClientAuth,
        "system:kube-scheduler",
    );
    for (name, text) in [
        ("ca.crt", ca.pem()),
        ("tls.crt", server.clone()),
        ("tls.key", server_key.clone()),
        ("client.crt", client.clone()),
        ("client.key", client_key.clone()),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    Pki {
        dir,
        ca_pem: ca.pem(),
        client: ClientIdentity {
            cert_pem: client.into_bytes(),
            key_pem: client_key.into_bytes(),
        },
        server: ClientIdentity {
            cert_pem: server.into_bytes(),
            key_pem: server_key.into_bytes(),
        },
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Ports {
    main: u16,
    extender: u16,
    metrics: u16,
}

fn replica_args(
    i: usize,
    ip: &str,
    ports: &Ports,
    dir: &Path,
    kubeconfig: &Path,
    mode: Mode,
) -> SchedulerArgs {
    let f = |name: &str| dir.join(name).display().to_string();
    let auth = match mode {
        Mode::Ca => vec![
            format!("--client-ca-file={}", f("ca.crt")),
            format!("--forward-client-cert-file={}", f("client.crt")),
            format!("--forward-client-key-file={}", f("client.key")),
            format!("--forward-server-name={SERVER_NAME}"),
        ],
        Mode::Pin => vec![
            format!("--client-cert-pin-file={}", f("tls.crt")),
            format!("--forward-client-cert-file={}", f("tls.crt")),
            format!("--forward-client-key-file={}", f("tls.key")),
        ],
    };
    let mut flags = vec![
        "hami-scheduler".to_string(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--http-bind={ip}:{}", ports.main),
        format!("--cert-file={}", f("tls.crt")),
        format!("--key-file={}", f("tls.key")),
        format!("--metrics-bind-address={ip}:{}", ports.metrics),
        format!("--extender-bind={ip}:{}", ports.extender),
        "--leader-elect".into(),
        "--lease-namespace=kube-system".into(),
        format!("--identity=hami-scheduler-{i}"),
        "--leader-elect-lease-duration-seconds=2".into(),
        "--leader-elect-retry-period-millis=200".into(),
    ];
    flags.extend(auth);
    Cli::try_parse_from(flags).unwrap().args
}

async fn until<F: Future<Output = bool>>(what: &str, limit: Duration, mut f: impl FnMut() -> F) {
    let deadline = Instant::now() + limit;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn holder(client: &Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get_opt("hami-scheduler")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

async fn gpu_pod(client: &Client, name: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": "30"}}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

async fn node_of(client: &Client, name: &str) -> Option<String> {
    Api::<Pod>::namespaced(client.clone(), "default")
        .get(name)
        .await
        .ok()
        .and_then(|p| p.spec)
        .and_then(|s| s.node_name)
}

/// The device plugin's last step: bind-phase=success, then the lock released.
async fn plugin_stand_in(client: Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    loop {
        if let Ok(node) = nodes.get("n").await
            && let Some(value) = node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(node_keys::MUTEX_LOCK))
            && let Ok(NodeLock {
                owner: Some(owner), ..
            }) = NodeLock::parse(value)
            && node_of(&client, &owner.name).await.is_some()
        {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &owner.namespace);
            let _ = pods
                .patch(
                    &owner.name,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {pod_keys::BIND_PHASE: "success"}}}),
                    ),
                )
                .await;
            let _ = nodes
                .patch(
                    "n",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {node_keys::MUTEX_LOCK: null}}}),
                    ),
                )
                .await;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

async fn scenario(replicas: usize, subnet: u8, mode: Mode) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (api, client) = common::cluster().await;
    let pki = pki(&format!("{replicas}"));
    let kubeconfig = pki.dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let ports = Ports {
        main: free_port(),
        extender: free_port(),
        metrics: free_port(),
    };
    let ip = |i: usize| format!("127.0.0.{}", usize::from(subnet) + i);
    // The replicas' pods: followers find the leader's IP through them.
    let kube_system: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    for i in 0..replicas {
        let name = format!("hami-scheduler-{i}");
        let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "kube-system"},
            "spec": {"containers": [{"name": "extender", "image": "x"}]}}))
        .unwrap();
        kube_system
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        kube_system
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"podIP": ip(i), "phase": "Running"}})),
            )
            .await
            .unwrap();
    }
    let mut tasks: Vec<Option<JoinHandle<anyhow::Result<()>>>> = (0..replicas)
        .map(|i| {
            Some(tokio::spawn(hami_scheduler::server::run(replica_args(
                i,
                &ip(i),
                &ports,
                &pki.dir,
                &kubeconfig,
                mode,
            ))))
        })
        .collect();
    let trust = || Trust::Ca(pki.ca_pem.clone().into_bytes());
    let https = |identity: Option<ClientIdentity>| {
        ExtenderClient::with_tls(
            "https://unused",
            trust(),
            identity,
            Some(SERVER_NAME.into()),
        )
        .unwrap()
    };
    let probe = https(None);
    let ready = |i: usize| {
        let probe = probe.clone();
        let url = format!("https://{}:{}/readyz", ip(i), ports.main);
        async move { probe.get(&url).await.is_ok_and(|(s, _)| s == 200) }
    };
    until("a leader", Duration::from_secs(10), || async {
        holder(&client).await.is_some()
    })
    .await;
    for i in 0..replicas {
        until(
            &format!("replica {i} Ready"),
            Duration::from_secs(10),
            || ready(i),
        )
        .await;
    }
    let leader: usize = holder(&client).await.unwrap()["hami-scheduler-".len()..]
        .parse()
        .unwrap();
    let follower = (leader + 1) % replicas;

    // Every replica, follower or not, answers the webhook (its endpoints survive a
    // handover).
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
        "userInfo": {"username": "alice"},
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
    let (status, body) = probe
        .post(
            &format!("https://{}:{}/webhook", ip(follower), ports.main),
            "webhook",
            serde_json::to_vec(&review).unwrap(),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");

    // Unauthenticated binds are refused: no client certificate on the extender listener,
    // and the webhook listener (reachable through the Service) does not serve /bind.
    gpu_pod(&client, "p0").await;
    let bind = serde_json::to_vec(
        &json!({"podName": "p0", "podNamespace": "default", "podUID": "", "node": "n"}),
    )
    .unwrap();
    for i in 0..replicas {
        let refused = probe
            .post(
                &format!("https://{}:{}/bind", ip(i), ports.extender),
                "bind",
                bind.clone(),
                &[],
            )
            .await;
        assert!(
            refused.is_err(),
            "no client certificate, no bind: {refused:?}"
        );
        let (status, body) = probe
            .post(
                &format!("https://{}:{}/bind", ip(i), ports.main),
                "bind",
                bind.clone(),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));
    }
    if mode == Mode::Pin {
        // A certificate from the same CA that is not the pinned one is refused too.
        let other = https(Some(pki.client.clone()));
        let refused = other
            .post(
                &format!("https://{}:{}/bind", ip(follower), ports.extender),
                "bind",
                bind.clone(),
                &[],
            )
            .await;
        assert!(refused.is_err(), "not the pinned certificate: {refused:?}");
    }
    assert_eq!(node_of(&client, "p0").await, None, "p0 was not bound");
    Api::<Pod>::namespaced(client.clone(), "default")
        .delete("p0", &Default::default())
        .await
        .unwrap();

    // The active kube-scheduler sits beside a follower: it calls that follower only, with
    // the client certificate its extender tlsConfig names.
    let identity = match mode {
        Mode::Ca => pki.client.clone(),
        Mode::Pin => pki.server.clone(),
    };
    let extender = ExtenderClient::with_tls(
        &format!("https://{}:{}", ip(follower), ports.extender),
        trust(),
        Some(identity),
        Some(SERVER_NAME.into()),
    )
    .unwrap();
    let sim = tokio::spawn(SimKubeScheduler::new(client.clone(), "hami-scheduler", extender).run());
    let stand_in = tokio::spawn(plugin_stand_in(client.clone()));
    for name in ["p1", "p2"] {
        gpu_pod(&client, name).await;
    }
    for name in ["p1", "p2"] {
        until(
            &format!("{name} bound through the follower"),
            Duration::from_secs(20),
            || async { node_of(&client, name).await.is_some() },
        )
        .await;
    }

    // Kill the leader.
    tasks[leader].take().unwrap().abort();
    until(
        "another replica takes over",
        Duration::from_secs(10),
        || async {
            holder(&client)
                .await
                .is_some_and(|h| h != format!("hami-scheduler-{leader}"))
        },
    )
    .await;
    for i in (0..replicas).filter(|&i| i != leader) {
        until(
            &format!("replica {i} Ready after the handover"),
            Duration::from_secs(10),
            || ready(i),
        )
        .await;
    }
    gpu_pod(&client, "p3").await;
    until(
        "p3 bound after the handover",
        Duration::from_secs(20),
        || async { node_of(&client, "p3").await.is_some() },
    )
    .await;
    // 3 × 30 % of the GPU's cores are taken: the new leader counts the old leader's
    // decisions, so a fourth pod does not fit.
    gpu_pod(&client, "p4").await;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    until(
        "p4 refused for lack of cores",
        Duration::from_secs(20),
        || async {
            events
                .list(&ListParams::default())
                .await
                .map(|l| {
                    l.items.iter().any(|e| {
                        e.reason.as_deref() == Some("FailedScheduling")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("p4")
                            && e.note
                                .as_deref()
                                .unwrap_or("")
                                .contains("CardInsufficientCore")
                    })
                })
                .unwrap_or(false)
        },
    )
    .await;
    assert_eq!(node_of(&client, "p4").await, None);
    sim.abort();
    stand_in.abort();
    for t in tasks.iter_mut().filter_map(Option::take) {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_follower_forwards_and_leader_kill() {
    scenario(2, 10, Mode::Ca).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_follower_forwards_and_leader_kill() {
    scenario(3, 20, Mode::Pin).await;
}

/// Pinning with two replicas too, so both sizes run in both modes between the tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_pinned_certificate() {
    scenario(2, 30, Mode::Pin).await;
}
