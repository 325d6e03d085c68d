//! The simulated kubelet's Registration service over a real unix socket: bad registrations
//! are refused with a reason, a plugin that registers but is not listening leaves no
//! allocatable devices, and the Node is created with the kubelet.

use std::time::Duration;

use hami_deviceplugin_api::connect_unix;
use hami_deviceplugin_api::v1beta1::RegisterRequest;
use hami_deviceplugin_api::v1beta1::registration_client::RegistrationClient;
use hami_kubelet_sim::{Args, KubeletSim};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_bad_registrations_and_creates_its_node() {
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let dir = std::env::temp_dir().join(format!("hami-kubelet-sim-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sim = KubeletSim::start(
        Args {
            socket_dir: dir.clone(),
            node_name: "n9".into(),
            record_dir: None,
            run_containers: false,
            runtime: Default::default(),
            sync_interval_ms: 20,
        },
        client,
    )
    .await
    .unwrap();
    let mut reg = RegistrationClient::new(connect_unix(&dir.join("kubelet.sock")).await.unwrap());
    let request = |version: &str, resource: &str, endpoint: &str| RegisterRequest {
        version: version.into(),
        endpoint: endpoint.into(),
        resource_name: resource.into(),
        options: None,
    };
    let err = reg
        .register(request("v1alpha", "amd.com/gpu", "x"))
        .await
        .unwrap_err();
    assert!(err.message().contains("v1beta1"), "{}", err.message());
    let err = reg
        .register(request("v1beta1", "gpu", "x"))
        .await
        .unwrap_err();
    assert!(
        err.message().contains("<vendor domain>/<name>"),
        "{}",
        err.message()
    );
    let err = reg
        .register(request("v1beta1", "amd.com/gpu", "../x"))
        .await
        .unwrap_err();
    assert!(
        err.message().contains("socket file name"),
        "{}",
        err.message()
    );
    assert_eq!(sim.registrations(), 0);
    // Accepted, but nobody listens on the endpoint: nothing becomes allocatable.
    reg.register(request("v1beta1", "amd.com/gpu", "nobody"))
        .await
        .unwrap();
    assert_eq!(sim.registrations(), 1);
    assert!(
        !sim.wait_for_allocatable("amd.com/gpu", 1, Duration::from_millis(300))
            .await
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.get_object("v1", "nodes", "", "n9").is_none() {
        assert!(std::time::Instant::now() < deadline, "node not created");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Like a kubelet, it reports the node Ready (kubectl get nodes: STATUS Ready).
    let ready = |server: &hami_apiserver::RunningApiServer| {
        server
            .get_object("v1", "nodes", "", "n9")
            .and_then(|n| n["status"]["conditions"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .find(|c| c["type"] == "Ready")
    };
    while ready(&server).is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "node never reported Ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cond = ready(&server).unwrap();
    assert_eq!(cond["status"], "True", "{cond}");
    assert_eq!(cond["reason"], "KubeletReady", "{cond}");
    assert!(
        cond["lastHeartbeatTime"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{cond}"
    );
    sim.shutdown().await;
    assert!(!dir.join("kubelet.sock").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
