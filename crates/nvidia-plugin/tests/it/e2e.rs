//! End to end on the embedded API server: the `nvidia-device-plugin` binary (a real
//! process, loading the stand-in `libnvidia-ml.so.1` through `LD_LIBRARY_PATH` as on a node)
//! and the simulated kubelet over real unix sockets, with the scheduler's decision written
//! as the HAMi scheduler writes it (device lists, bind phase, node lock).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use hami_apiserver::RunningApiServer;
use hami_kubelet_sim::KubeletSim;
use hami_kubelet_sim::records::RECORD_ANNOTATION;
use hami_plugin_harness::{
    Decision, annotation as ann, api_with_node, built_stand_in_nvml, env_of, nvidia_plugin_command,
    spawn_nvidia_plugin, start_kubelet, status_message,
};
use hami_protocol::device_list::ContainerDevice;
use hami_protocol::names::{NVIDIA, node as node_keys, pod as pod_keys};
use hami_protocol::node_register::{DeviceInfo, decode_node_devices};
use serde_json::{Value, json};

const NODE: &str = "node-nv";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nv-e2e-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The plugin binary with the stand-in NVML modelling `gpus` GPUs of 16 GiB.
fn plugin_command(scratch: &Path, gpus: u32) -> Command {
    nvidia_plugin_command(env!("CARGO_BIN_EXE_nvidia-device-plugin"), scratch, gpus)
}

struct Harness {
    server: RunningApiServer,
    client: kube::Client,
    scratch: PathBuf,
    sim: KubeletSim,
    plugin: Child,
    gpus: Vec<DeviceInfo>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.plugin.kill();
        let _ = self.plugin.wait();
    }
}

impl Harness {
    async fn start(name: &str, gpus: u32) -> Self {
        let (server, client) = api_with_node(NODE).await;
        let scratch = scratch(name);
        let sockets = scratch.join("device-plugins");
        std::fs::create_dir_all(&sockets).unwrap();
        let sim = start_kubelet(sockets.clone(), NODE, client.clone()).await;
        let plugin = spawn_nvidia_plugin(
            env!("CARGO_BIN_EXE_nvidia-device-plugin"),
            &server,
            NODE,
            &scratch,
            gpus,
        );
        let mut h = Self {
            server,
            client,
            scratch,
            sim,
            plugin,
            gpus: Vec::new(),
        };
        let shares = 10 * gpus as usize;
        assert!(
            h.sim
                .wait_for_allocatable("nvidia.com/gpu", shares, Duration::from_secs(30))
                .await,
            "kubelet sees {} of {shares} devices; plugin log:\n{}",
            h.sim.allocatable("nvidia.com/gpu"),
            std::fs::read_to_string(h.scratch.join("plugin.log")).unwrap_or_default()
        );
        h.gpus = decode_node_devices(&h.node_annotation(NVIDIA.node_register).unwrap()).unwrap();
        h
    }

    /// Writes what the HAMi scheduler writes at filter + bind, with the node lock.
    async fn schedule(
        &self,
        name: &str,
        containers: Value,
        init: Value,
        runs: &[Vec<ContainerDevice>],
        take_lock: bool,
    ) {
        let decision = Decision {
            name,
            containers,
            init,
            runs,
        };
        hami_plugin_harness::schedule(
            &self.server,
            &self.client,
            &NVIDIA,
            NODE,
            decision,
            take_lock,
        )
        .await;
    }

    async fn wait_phase(&self, name: &str) -> Value {
        hami_plugin_harness::wait_phase(&self.server, name).await
    }

    fn node_annotation(&self, key: &str) -> Option<String> {
        hami_plugin_harness::node_annotation(&self.server, NODE, key)
    }

    fn hook_dir(&self) -> PathBuf {
        self.scratch.join("hook/vgpu")
    }
}

fn gpu_container(name: &str, gpus: u32) -> Value {
    json!({"name": name, "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}})
}

fn dev(d: &DeviceInfo, mem: u64, cores: u32) -> ContainerDevice {
    ContainerDevice {
        uuid: d.id.clone(),
        device_type: "NVIDIA".into(),
        mem_mib: mem,
        cores,
    }
}

fn record(pod: &Value) -> Value {
    serde_json::from_str(
        pod["metadata"]["annotations"][RECORD_ANNOTATION]
            .as_str()
            .unwrap_or_else(|| panic!("no kubelet record: {pod}")),
    )
    .unwrap()
}

/// `container path → (host path, read only)` of a container's mounts.
fn mounts_of(pod: &Value, container: &str) -> std::collections::BTreeMap<String, (String, bool)> {
    record(pod)[container]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| e["mounts"].as_array().unwrap().clone())
        .map(|m| {
            (
                m["containerPath"].as_str().unwrap().to_owned(),
                (
                    m["hostPath"].as_str().unwrap().to_owned(),
                    m["readOnly"].as_bool().unwrap(),
                ),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_and_two_app_containers_then_two_30_percent_pods_share_a_gpu() {
    let h = Harness::start("slices", 2).await;
    assert_eq!(h.gpus.len(), 2);
    let (g0, g1) = (h.gpus[0].clone(), h.gpus[1].clone());
    assert_eq!(g0.device_type, "NVIDIA-Stand-in NVIDIA GPU 0");
    assert_eq!((g0.count, g0.devmem, g0.devcore), (10, 16384, 100));
    assert!(g0.health);
    // The register heartbeat (issue 17 item 13): announced period 1 s, a new value at
    // every refresh.
    hami_plugin_harness::assert_heartbeat_refreshes(
        &h.server,
        NODE,
        hami_protocol::names::Vendor::Nvidia,
    )
    .await;
    let preload = h.hook_dir().join("ld.so.preload");
    assert_eq!(
        std::fs::read_to_string(&preload).unwrap(),
        "/usr/local/vgpu/libvgpu.so\n"
    );

    // Init container on g0, app1 on g0, app2 on g1 then g0 (allocation order kept).
    h.schedule(
        "p1",
        json!([gpu_container("app1", 1), gpu_container("app2", 2)]),
        json!([gpu_container("init", 1)]),
        &[
            vec![dev(&g0, 1024, 30)],
            vec![dev(&g0, 2048, 40)],
            vec![dev(&g1, 3000, 50), dev(&g0, 4000, 60)],
        ],
        true,
    )
    .await;
    let pod = h.wait_phase("p1").await;
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    let init = env_of(&pod, "init");
    let app1 = env_of(&pod, "app1");
    let app2 = env_of(&pod, "app2");
    assert_eq!(init["NVIDIA_VISIBLE_DEVICES"], g0.id.as_str());
    assert_eq!(init["CUDA_DEVICE_MEMORY_LIMIT_0"], "1024m");
    assert_eq!(init["CUDA_DEVICE_SM_LIMIT"], "30");
    assert_eq!(app1["CUDA_DEVICE_MEMORY_LIMIT_0"], "2048m");
    assert_eq!(app1["CUDA_DEVICE_SM_LIMIT"], "40");
    assert_eq!(
        app2["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", g1.id, g0.id)
    );
    assert_eq!(app2["CUDA_DEVICE_MEMORY_LIMIT_0"], "3000m");
    assert_eq!(app2["CUDA_DEVICE_MEMORY_LIMIT_1"], "4000m");
    assert_eq!(app2["CUDA_DEVICE_SM_LIMIT"], "50");
    assert!(!app2.contains_key("CUDA_OVERSUBSCRIBE"));
    for (name, env) in [("init", &init), ("app1", &app1), ("app2", &app2)] {
        assert_eq!(
            env["CUDA_DEVICE_MEMORY_SHARED_CACHE"], "/usr/local/vgpu/cache/cudevshr.cache",
            "{name}"
        );
        let mounts = mounts_of(&pod, name);
        let host_dir = h.hook_dir().join(format!("containers/{uid}_{name}"));
        assert_eq!(
            mounts["/usr/local/vgpu/cache"],
            (host_dir.display().to_string(), false),
            "{name}"
        );
        assert_eq!(
            std::fs::metadata(&host_dir).unwrap().permissions().mode() & 0o777,
            0o777,
            "{name}: the accounting directory is writable by any container user"
        );
        assert_eq!(
            mounts["/usr/local/vgpu/libvgpu.so"],
            (h.hook_dir().join("libvgpu.so").display().to_string(), true)
        );
        assert_eq!(
            mounts["/etc/ld.so.preload"],
            (preload.display().to_string(), true)
        );
        // The hook's read-only config (issue 14 item 7), written before the answer.
        let conf = h.hook_dir().join(format!("configs/{uid}_{name}.conf"));
        assert_eq!(
            mounts["/usr/local/vgpu/hook.conf"],
            (conf.display().to_string(), true),
            "{name}"
        );
        let config = hami_protocol::hook_config::decode(&std::fs::read(&conf).unwrap()).unwrap();
        // It names the region file the plugin created in the accounting directory.
        use std::os::unix::fs::MetadataExt;
        let region = std::fs::metadata(host_dir.join("cudevshr.cache")).unwrap();
        assert_eq!(config.shared_cache_inode, Some(region.ino()), "{name}");
        assert_eq!(region.len(), 2_008_953);
        let limit = env["CUDA_DEVICE_MEMORY_LIMIT_0"]
            .as_str()
            .unwrap()
            .trim_end_matches('m');
        assert_eq!(
            config.memory_limit(0),
            Some(limit.parse::<u64>().unwrap() << 20),
            "{name}"
        );
    }
    assert_eq!(ann(&pod, pod_keys::BIND_PHASE), Some("success"));
    assert_eq!(ann(&pod, NVIDIA.devices_to_allocate), Some(";;;"));
    assert_eq!(
        h.node_annotation(node_keys::MUTEX_LOCK),
        None,
        "lock released after the last container"
    );

    // Two 30 % pods share g1 (no lock: found as the oldest allocating pod).
    for name in ["q1", "q2"] {
        h.schedule(
            name,
            json!([gpu_container("main", 1)]),
            json!([]),
            &[vec![dev(&g1, 4096, 30)]],
            false,
        )
        .await;
        let pod = h.wait_phase(name).await;
        assert_eq!(pod["status"]["phase"], "Running", "{pod}");
        let env = env_of(&pod, "main");
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], g1.id.as_str());
        assert_eq!(env["CUDA_DEVICE_SM_LIMIT"], "30");
        assert_eq!(env["CUDA_DEVICE_MEMORY_LIMIT_0"], "4096m");
        assert_eq!(ann(&pod, pod_keys::BIND_PHASE), Some("success"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_set_failed_and_release_the_lock_and_foreign_pods_get_whole_cards() {
    let h = Harness::start("failures", 1).await;
    let g = h.gpus[0].clone();
    // The run holds 2 devices, the container asks for 1.
    h.schedule(
        "mismatch",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&g, 10, 20), dev(&g, 10, 20)]],
        true,
    )
    .await;
    let pod = h.wait_phase("mismatch").await;
    assert_eq!(pod["status"]["phase"], "Failed");
    assert!(
        status_message(&pod).contains("holds 2 device(s) but kubelet asked for 1"),
        "{pod}"
    );
    assert_eq!(ann(&pod, pod_keys::BIND_PHASE), Some("failed"));
    assert_eq!(h.node_annotation(node_keys::MUTEX_LOCK), None);

    // A GPU this node does not have.
    let ghost = DeviceInfo {
        id: "GPU-00000000-dead-beef-0000-000000000000".into(),
        ..g.clone()
    };
    h.schedule(
        "ghost",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&ghost, 10, 20)]],
        true,
    )
    .await;
    let pod = h.wait_phase("ghost").await;
    assert_eq!(pod["status"]["phase"], "Failed");
    assert!(
        status_message(&pod).contains("is not offered on this node"),
        "{pod}"
    );
    assert_eq!(ann(&pod, pod_keys::BIND_PHASE), Some("failed"));
    assert_eq!(h.node_annotation(node_keys::MUTEX_LOCK), None);

    // Malformed device list.
    h.server
        .create_object("v1", "pods", Some("default"), json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "garbled", "annotations": {NVIDIA.devices_to_allocate: "x,y:;", pod_keys::BIND_PHASE: "allocating", pod_keys::VGPU_NODE: NODE}},
            "spec": {"nodeName": NODE, "containers": [gpu_container("main", 1)]},
        }))
        .unwrap();
    let pod = h.wait_phase("garbled").await;
    assert!(status_message(&pod).contains("malformed"), "{pod}");
    assert_eq!(ann(&pod, pod_keys::BIND_PHASE), Some("failed"));

    // The API server fails the pod patch mid-Allocate: failed, lock released, list kept.
    h.server
        .faults()
        .fail_next(Some("patch"), Some("pods"), 1, 500);
    h.schedule(
        "apifail",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&g, 1000, 20)]],
        true,
    )
    .await;
    let pod = h.wait_phase("apifail").await;
    assert_eq!(pod["status"]["phase"], "Failed");
    assert!(
        status_message(&pod).contains("cannot record the allocation"),
        "{pod}"
    );
    assert_eq!(ann(&pod, pod_keys::BIND_PHASE), Some("failed"));
    assert_ne!(ann(&pod, NVIDIA.devices_to_allocate), Some(";"));
    assert_eq!(h.node_annotation(node_keys::MUTEX_LOCK), None);

    // A container with CUDA_DISABLE_CONTROL=true gets no /etc/ld.so.preload.
    h.schedule(
        "nocontrol",
        json!([{"name": "main", "image": "cuda:12", "env": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
        json!([]),
        &[vec![dev(&g, 1000, 20)]],
        true,
    )
    .await;
    let pod = h.wait_phase("nocontrol").await;
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    let mounts = mounts_of(&pod, "main");
    assert!(!mounts.contains_key("/etc/ld.so.preload"), "{mounts:?}");
    assert!(mounts.contains_key("/usr/local/vgpu/libvgpu.so"));

    // A pod the scheduler did not place while the only GPU holds a slice: refused, never
    // handed the slice's card (issue 26 item 1).
    let plain = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": NODE, "containers": [gpu_container("main", 1)]}})
    };
    h.server
        .create_object("v1", "pods", Some("default"), plain("shared"))
        .unwrap();
    let pod = h.wait_phase("shared").await;
    assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
    assert!(
        status_message(&pod).contains("holds slices of HAMi pods"),
        "{pod}"
    );
    assert!(ann(&pod, "hami.io/nvidia-whole-cards").is_none(), "{pod}");

    // Once the slice is gone: whole-card hand-over, no hook, recorded on the pod.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(h.client.clone(), "default");
    pods.delete("nocontrol", &Default::default()).await.unwrap();
    h.server
        .create_object("v1", "pods", Some("default"), plain("plain"))
        .unwrap();
    let pod = h.wait_phase("plain").await;
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    assert_eq!(ann(&pod, "hami.io/nvidia-whole-cards"), Some(g.id.as_str()));
    let env = env_of(&pod, "main");
    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], g.id.as_str());
    assert!(!env.contains_key("CUDA_DEVICE_MEMORY_LIMIT_0"), "{env:?}");
    assert!(mounts_of(&pod, "main").is_empty());
}

/// A plain pod's whole-card Allocate while the scheduler holds the node's lock for a HAMi
/// pod whose decision names the only GPU but which is not bound yet (bind locks, writes
/// the decision, then binds): the GPU is busy, so the plain pod is refused and the GPU is
/// never handed over. It was: the NVIDIA shell took the lock's owner as the pod of any
/// request (the AMD shell had verified the request against the pod since issue 26) and
/// answered the plain pod with the unbound pod's slice, consuming its run; the shared
/// Allocate shell verifies the request, and counts the owner's reserved GPU busy although
/// the node's pods do not show it yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_card_allocate_refuses_the_gpu_reserved_for_the_unbound_lock_owner() {
    let h = Harness::start("reserved", 1).await;
    let g = h.gpus[0].clone();
    let list = hami_protocol::device_list::encode_pod_devices(&[vec![dev(&g, 1000, 20)]]).unwrap();
    hami_plugin_harness::take_node_lock(&h.client, NODE, "reserved").await;
    h.server
        .create_object("v1", "pods", Some("default"), json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "reserved", "annotations": {
                NVIDIA.devices_to_allocate: list, NVIDIA.devices_allocated: list,
                pod_keys::VGPU_NODE: NODE, pod_keys::BIND_PHASE: "allocating",
                pod_keys::BIND_TIME: "1700000000"}},
            "spec": {"schedulerName": "hami-scheduler", "containers": [gpu_container("main", 1)]},
        }))
        .unwrap();
    h.server
        .create_object(
            "v1",
            "pods",
            Some("default"),
            json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
                "spec": {"nodeName": NODE, "containers": [gpu_container("main", 1)]},
            }),
        )
        .unwrap();
    let pod = h.wait_phase("plain").await;
    assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
    assert!(
        status_message(&pod).contains("holds slices of HAMi pods"),
        "{pod}"
    );
    assert!(ann(&pod, "hami.io/nvidia-whole-cards").is_none(), "{pod}");
}

#[test]
fn discover_prints_the_annotation_and_absent_nvml_is_a_clear_error() {
    let dir = scratch("discover");
    let out = plugin_command(&dir, 3)
        .args(["--device-split-count", "4", "discover"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("hami.io/node-nvidia-register: "))
        .unwrap_or_else(|| panic!("{text}"));
    let devices = decode_node_devices(line).unwrap();
    assert_eq!(devices.len(), 3);
    assert!(devices.iter().all(|d| d.count == 4 && d.devmem == 16384));

    let out = plugin_command(&dir, 1)
        .args([
            "--nvml-library",
            "/nonexistent/libnvidia-ml.so.1",
            "discover",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("cannot load NVML"), "{err}");
    assert!(err.contains("--nvml-library"), "{err}");

    // A library that is not NVML.
    let not_nvml = built_stand_in_nvml();
    let libc_path = "libc.so.6";
    let out = plugin_command(&dir, 1)
        .args(["--nvml-library", libc_path, "discover"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("is not NVML"), "{err}");
    assert!(not_nvml.exists());

    let out = plugin_command(&dir, 1)
        .args(["--device-split-count", "0", "discover"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("at least 1")
    );

    // Serving without NODE_NAME says what to set.
    let out = plugin_command(&dir, 1)
        .env_remove("NODE_NAME")
        .env("KUBECONFIG", dir.join("missing-kubeconfig"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("NODE_NAME is not set")
    );
    let _ = std::fs::remove_dir_all(dir);
}
