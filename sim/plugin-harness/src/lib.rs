//! The device plugins' end-to-end harness (`crates/amd-plugin/tests/it/e2e/`,
//! `crates/nvidia-plugin/tests/it/e2e.rs`, their `allocate_latency` benches and the NVIDIA
//! full-stack test), written once for both vendors. A stand-in (`sim/`): the product crates
//! take it as a dev-dependency only.
//!
//! - [`api_with_node`], [`start_kubelet`]: the embedded API server holding the node, and the
//!   simulated kubelet over real unix sockets;
//! - [`schedule`]: the scheduler's decision as the HAMi scheduler writes it at filter + bind
//!   (device lists, bind phase, node lock), then [`wait_phase`] for kubelet's verdict;
//! - [`wait_registered_again`]: the plugin's re-registration after a kubelet or plugin
//!   restart;
//! - [`nvml_driver_dir`]: the stand-in NVML laid out as the driver's library directory;
//! - [`allocate_latency`]: the benches' loop of Allocate calls on the plugin's socket.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config, RunningApiServer};
use hami_deviceplugin_api::connect_unix;
use hami_deviceplugin_api::v1beta1::device_plugin_client::DevicePluginClient;
use hami_deviceplugin_api::v1beta1::{AllocateRequest, ContainerAllocateRequest};
use hami_kubelet_sim::KubeletSim;
use hami_kubelet_sim::records::{RECORD_ANNOTATION, envs_of};
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::names::{VendorNames, node as node_keys, pod as pod_keys};
use hami_protocol::node_lock::{NodeLock, PodRef};
use serde_json::{Map, Value, json};

/// The embedded API server (no authentication) holding the empty Node `node`, and a client
/// of it.
///
/// # Panics
/// If the server does not start.
pub async fn api_with_node(node: &str) -> (RunningApiServer, kube::Client) {
    let server = ApiServer::start(Config::default()).await.unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    server
        .create_object(
            "v1",
            "nodes",
            None,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
        )
        .unwrap();
    (server, client)
}

/// Starts the simulated kubelet for `node` with its device-plugin sockets in `socket_dir`
/// (no containers run; pods synced every 50 ms).
///
/// # Panics
/// If it does not start.
pub async fn start_kubelet(socket_dir: PathBuf, node: &str, client: kube::Client) -> KubeletSim {
    KubeletSim::start(
        hami_kubelet_sim::Args {
            socket_dir,
            node_name: node.into(),
            record_dir: None,
            run_containers: false,
            runtime: Default::default(),
            sync_interval_ms: 50,
        },
        client,
    )
    .await
    .unwrap()
}

/// What the HAMi scheduler decided for one pod: its name, containers, init containers and
/// the devices of each run (init containers first, as `encode_pod_devices` takes them).
pub struct Decision<'a> {
    /// The pod's name (namespace `default`).
    pub name: &'a str,
    /// `spec.containers`.
    pub containers: Value,
    /// `spec.initContainers`.
    pub init: Value,
    /// The devices of each run.
    pub runs: &'a [Vec<ContainerDevice>],
}

/// Writes what the HAMi scheduler writes at filter + bind for `decision` on `node` (the
/// vendor's device lists, bind phase `allocating`, the pod bound), after, if `take_lock`, the
/// node lock naming the pod, as bind takes it (before binding).
///
/// # Panics
/// If the server refuses a write.
pub async fn schedule(
    server: &RunningApiServer,
    client: &kube::Client,
    vendor: &VendorNames,
    node: &str,
    decision: Decision<'_>,
    take_lock: bool,
) {
    let Decision {
        name,
        containers,
        init,
        runs,
    } = decision;
    let list = encode_pod_devices(runs).unwrap();
    // Lock first, then the bound pod, as bind does: kubelet can call Allocate as soon as
    // the pod is bound, and a plugin that finds no lock yet rightly treats the pod as one
    // HAMi did not place (a loaded machine showed that order flake).
    if take_lock {
        take_node_lock(client, node, name).await;
    }
    server
        .create_object(
            "v1",
            "pods",
            Some("default"),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "annotations": {
                    vendor.devices_to_allocate: list, vendor.devices_allocated: list,
                    pod_keys::VGPU_NODE: node, pod_keys::BIND_PHASE: "allocating",
                    pod_keys::BIND_TIME: "1700000000",
                }},
                "spec": {"nodeName": node, "schedulerName": "hami-scheduler", "initContainers": init, "containers": containers},
            }),
        )
        .unwrap();
}

/// Writes the node lock on `node` naming the pod `default/<pod>` (stamped 1700000000), as
/// bind takes it.
///
/// # Panics
/// If the patch is refused.
pub async fn take_node_lock(client: &kube::Client, node: &str, pod: &str) {
    let lock = NodeLock::new(1_700_000_000, PodRef::new("default", pod))
        .encode()
        .unwrap();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    nodes
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {node_keys::MUTEX_LOCK: lock}}}),
            ),
        )
        .await
        .unwrap();
}

/// The pod `default/<name>` once its phase is no longer `Pending` (at most 20 s).
///
/// # Panics
/// If the pod is absent or still pending after 20 s.
pub async fn wait_phase(server: &RunningApiServer, name: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pod = server.get_object("v1", "pods", "default", name).unwrap();
        if let Some(phase) = pod["status"]["phase"].as_str()
            && phase != "Pending"
        {
            return pod;
        }
        assert!(
            Instant::now() < deadline,
            "pod {name} never left Pending: {pod}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The annotation `key` of the Node `node`, if set.
///
/// # Panics
/// If the node is absent.
pub fn node_annotation(server: &RunningApiServer, node: &str, key: &str) -> Option<String> {
    server.get_object("v1", "nodes", "", node).unwrap()["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_owned)
}

/// The annotation `key` of the Node `node` once it is set (the plugin's registration), at
/// most `limit` later.
///
/// # Panics
/// If it is still unset after `limit`.
pub async fn wait_node_annotation(
    server: &RunningApiServer,
    node: &str,
    key: &str,
    limit: Duration,
) -> String {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = node_annotation(server, node, key) {
            return value;
        }
        assert!(Instant::now() < deadline, "node {node} never got {key}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (at most 20 s) until the plugin has registered with `sim` again after a restart
/// (more registrations than `before`) and kubelet sees `count` of `resource` again.
///
/// # Panics
/// With `what` when that does not happen in time.
pub async fn wait_registered_again(
    sim: &KubeletSim,
    before: u64,
    resource: &str,
    count: usize,
    what: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while sim.registrations() <= before || sim.allocatable(resource) != count {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The environment kubelet recorded for `container` of `pod` (the simulated kubelet's record
/// annotation).
///
/// # Panics
/// If the pod has no record for that container.
pub fn env_of(pod: &Value, container: &str) -> Map<String, Value> {
    envs_of(
        pod["metadata"]["annotations"][RECORD_ANNOTATION]
            .as_str()
            .unwrap(),
        container,
    )
    .unwrap_or_else(|| panic!("no record for {container}: {pod}"))
}

/// The annotation `key` of a pod (as JSON), if set.
pub fn annotation<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod["metadata"]["annotations"][key].as_str()
}

/// The stand-in NVML built beside the running test or bench (Rust names the file
/// `libnvidia_ml.so`; its SONAME is the real one).
///
/// # Panics
/// If it was not built (the crate lacks the `hami-nvml-stand-in` dev-dependency).
pub fn built_stand_in_nvml() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let built = exe.parent().unwrap().join("libnvidia_ml.so");
    assert!(built.exists(), "{} was not built", built.display());
    built
}

/// A directory `<scratch>/driver` laid out like the driver's library directory:
/// `libnvidia-ml.so.1` → [`built_stand_in_nvml`].
///
/// # Panics
/// If the stand-in was not built or the directory cannot be written.
pub fn nvml_driver_dir(scratch: &Path) -> PathBuf {
    let built = built_stand_in_nvml();
    let dir = scratch.join("driver");
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libnvidia-ml.so.1");
    if !link.exists() {
        std::os::unix::fs::symlink(&built, link).unwrap();
    }
    dir
}

/// One Allocate of the bench: the pod's device (as the scheduler wrote it) and the device
/// ID kubelet asks for.
pub struct BenchAllocation {
    /// The device in the pod's device list.
    pub device: ContainerDevice,
    /// The ID in kubelet's AllocateRequest.
    pub device_id: String,
}

/// The number of pods of the Allocate-latency benches: `PODS` from the environment, else 240.
pub fn bench_pods() -> usize {
    std::env::var("PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(240)
}

/// The Allocate-latency bench on `node`, whose plugin serves `socket`: once the socket is
/// there and the plugin has published the node (`vendor.node_register`, waited for, 20 s at
/// most), [`bench_pods`] times a pod with the scheduler's decision (`pick(i)`), the node
/// lock naming it, and kubelet's Allocate for it, timed; each answer must set the variable
/// `expect_env`. Pods accumulate on the node. Prints and returns the sorted latencies.
///
/// # Panics
/// If a write or a call fails, or the plugin never comes up.
pub async fn allocate_latency(
    server: &RunningApiServer,
    client: &kube::Client,
    vendor: &VendorNames,
    node: &str,
    socket: &Path,
    expect_env: &str,
    pick: impl Fn(usize) -> BenchAllocation,
) -> Vec<Duration> {
    let pods = bench_pods();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            socket.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The plugin answers Allocate once it has published its devices.
    wait_node_annotation(server, node, vendor.node_register, Duration::from_secs(20)).await;
    let mut grpc = DevicePluginClient::new(connect_unix(socket).await.unwrap());
    let mut samples = Vec::with_capacity(pods);
    for i in 0..pods {
        let BenchAllocation { device, device_id } = pick(i);
        let list = encode_pod_devices(&[vec![device]]).unwrap();
        let name = format!("p{i}");
        server
            .create_object(
                "v1",
                "pods",
                Some("default"),
                json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "uid": format!("uid-{i}"), "annotations": {vendor.devices_to_allocate: list, vendor.devices_allocated: list,
                        pod_keys::BIND_PHASE: "allocating", pod_keys::VGPU_NODE: node}},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                    "status": {"phase": "Pending"}}),
            )
            .unwrap();
        take_node_lock(client, node, &name).await;
        let start = Instant::now();
        let resp = grpc
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec![device_id],
                }],
            })
            .await
            .unwrap()
            .into_inner();
        samples.push(start.elapsed());
        let envs = &resp.container_responses[0].envs;
        assert!(envs.contains_key(expect_env), "no {expect_env}: {envs:?}");
    }
    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    println!(
        "allocate_latency: {} Allocate calls (pods on the node grow 1..{}), p50 {:?}, p99 {:?}, max {:?}",
        samples.len(),
        pods,
        pct(0.50),
        pct(0.99),
        samples[samples.len() - 1]
    );
    samples
}

/// The NVIDIA plugin's program `binary` (a test's `env!("CARGO_BIN_EXE_nvidia-device-plugin")`)
/// as a node runs it: the stand-in NVML found through `LD_LIBRARY_PATH` ([`nvml_driver_dir`]
/// under `scratch`), modelling `gpus` GPUs of 16 GiB whose state is shared through a file in
/// `scratch`.
///
/// # Panics
/// If the stand-in was not built.
pub fn nvidia_plugin_command(binary: &str, scratch: &Path, gpus: u32) -> std::process::Command {
    let mut cmd = std::process::Command::new(binary);
    cmd.env("LD_LIBRARY_PATH", nvml_driver_dir(scratch))
        .env("FAKE_CUDA_DEVICE_COUNT", gpus.to_string())
        .env("FAKE_CUDA_DEVICE_MEMORY", "16g")
        .env("FAKE_CUDA_SHARED_STATE", scratch.join("fake-cuda.state"))
        .env_remove("NVML_LIBRARY");
    cmd
}

/// Runs a bench's `main` body on a two-worker multi-threaded runtime (the size the benches
/// are measured with).
///
/// # Panics
/// If the runtime cannot be built.
pub fn run_bench(bench: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench);
}

/// Starts the NVIDIA plugin's program `binary` ([`nvidia_plugin_command`]) serving `node`:
/// `KUBECONFIG` for `server` (written in `scratch`), `NODE_NAME`, `HOOK_PATH` under
/// `scratch` (a stub hook installed there), kubelet's sockets in `<scratch>/device-plugins`, registration and health
/// pulse every second; stderr to `<scratch>/plugin.log`.
///
/// # Panics
/// If the files cannot be written or the program does not start.
pub fn spawn_nvidia_plugin(
    binary: &str,
    server: &RunningApiServer,
    node: &str,
    scratch: &Path,
    gpus: u32,
) -> std::process::Child {
    spawn_nvidia_plugin_as(binary, server, node, scratch, gpus, None)
}

/// [`spawn_nvidia_plugin`] acting as `user` (impersonation, with authentication off): its
/// ServiceAccount, where a webhook must tell its annotation writes from a user's.
///
/// # Panics
/// As [`spawn_nvidia_plugin`].
pub fn spawn_nvidia_plugin_as(
    binary: &str,
    server: &RunningApiServer,
    node: &str,
    scratch: &Path,
    gpus: u32,
    user: Option<&str>,
) -> std::process::Child {
    let kubeconfig = scratch.join("kubeconfig");
    match user {
        Some(u) => server.write_kubeconfig_as(&kubeconfig, u).unwrap(),
        None => server.write_kubeconfig(&kubeconfig).unwrap(),
    }
    let sockets = scratch.join("device-plugins");
    let log = std::fs::File::create(scratch.join("plugin.log")).unwrap();
    install_stub_hook(&scratch.join("hook"), "libvgpu.so");
    nvidia_plugin_command(binary, scratch, gpus)
        .env("KUBECONFIG", &kubeconfig)
        .env("NODE_NAME", node)
        .env("HOOK_PATH", scratch.join("hook"))
        .args(["--device-plugin-dir".as_ref(), sockets.as_os_str()])
        .args(["--register-interval", "1", "--pulse", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// The pod's `status.message` (why kubelet failed it), empty when it has none.
pub fn status_message(pod: &Value) -> &str {
    pod["status"]["message"].as_str().unwrap_or("")
}

/// Checks the plugin's register heartbeat on `node` (issue 17 item 13): written, announcing
/// the 1 s refresh period the harnesses start the plugins with, and a new value at a
/// refresh (within 10 s).
///
/// # Panics
/// When one of those does not hold.
pub async fn assert_heartbeat_refreshes(
    server: &RunningApiServer,
    node: &str,
    vendor: hami_protocol::names::Vendor,
) {
    let beat_key = hami_protocol::handshake::key(vendor);
    let first = node_annotation(server, node, beat_key).expect("no heartbeat annotation");
    let report = hami_protocol::handshake::parse(&first).unwrap().unwrap();
    assert_eq!(report.period_secs, 1, "{first}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while node_annotation(server, node, beat_key).as_deref() == Some(first.as_str()) {
        assert!(
            Instant::now() < deadline,
            "heartbeat never changed: {first}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Installs a stub hook at `<hook_root>/vgpu/<library>` (`libamvgpu.so`, `libvgpu.so`), as
/// the device plugin's init container installs the real one: a plugin refuses an Allocate
/// whose mount source is missing on the host. Returns its path.
///
/// # Panics
/// If the file cannot be written.
pub fn install_stub_hook(hook_root: &Path, library: &str) -> PathBuf {
    let hook = hook_root.join("vgpu").join(library);
    std::fs::create_dir_all(hook_root.join("vgpu")).unwrap();
    std::fs::write(&hook, "stub hook: the tests load no hook from here").unwrap();
    hook
}
