//! NVIDIA GPU health from NVML XID events (issue 26 item 11): the real plugin binary on the
//! stand-in NVML (`FAKE_NVML_XID_FILE` injects XIDs), the simulated kubelet and the embedded
//! API server. A critical XID (79) re-advertises the GPU Unhealthy through ListAndWatch,
//! marks it unhealthy in the register annotation and records a Node Event; an application
//! XID (13) changes nothing; with `--xid-recovery-seconds` the GPU comes back.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use hami_apiserver::RunningApiServer;
use hami_kubelet_sim::KubeletSim;
use hami_nvidia_plugin::xid_health::{REASON_RECOVERED, REASON_UNHEALTHY};
use hami_plugin_harness::{api_with_node, node_annotation, nvidia_plugin_command, start_kubelet};
use hami_protocol::names::NVIDIA;
use hami_protocol::node_register::{DeviceInfo, decode_node_devices};
use k8s_openapi::api::core::v1::Event;

const NODE: &str = "node-x";
const GPUS: u32 = 2;
const SHARES: usize = 10;

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

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nv-xid-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Harness {
    async fn start(name: &str, extra: &[&str]) -> Self {
        let (server, client) = api_with_node(NODE).await;
        let scratch = scratch(name);
        let sockets = scratch.join("device-plugins");
        std::fs::create_dir_all(&sockets).unwrap();
        let sim = start_kubelet(sockets.clone(), NODE, client.clone()).await;
        let kubeconfig = scratch.join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        std::fs::write(scratch.join("xids"), "").unwrap();
        hami_plugin_harness::install_stub_hook(&scratch.join("hook"), "libvgpu.so");
        let log = std::fs::File::create(scratch.join("plugin.log")).unwrap();
        let plugin =
            nvidia_plugin_command(env!("CARGO_BIN_EXE_nvidia-device-plugin"), &scratch, GPUS)
                .env("KUBECONFIG", &kubeconfig)
                .env("NODE_NAME", NODE)
                .env("HOOK_PATH", scratch.join("hook"))
                .env("FAKE_NVML_XID_FILE", scratch.join("xids"))
                .args(["--device-plugin-dir".as_ref(), sockets.as_os_str()])
                .args(["--register-interval", "1", "--pulse", "1"])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap();
        let mut h = Self {
            server,
            client,
            scratch,
            sim,
            plugin,
            gpus: Vec::new(),
        };
        h.wait_allocatable(GPUS as usize * SHARES).await;
        h.gpus =
            decode_node_devices(&node_annotation(&h.server, NODE, NVIDIA.node_register).unwrap())
                .unwrap();
        h.wait_log("watching NVML XID events").await;
        h
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.scratch.join("plugin.log")).unwrap_or_default()
    }

    /// Appends `<device index> <xid>` to the stand-in's XID file.
    fn inject(&self, device: u32, xid: u64) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.scratch.join("xids"))
            .unwrap();
        f.write_all(format!("{device} {xid}\n").as_bytes()).unwrap();
    }

    async fn wait_allocatable(&self, count: usize) {
        assert!(
            self.sim
                .wait_for_allocatable("nvidia.com/gpu", count, Duration::from_secs(30))
                .await,
            "kubelet sees {} healthy devices, not {count}; plugin log:\n{}",
            self.sim.allocatable("nvidia.com/gpu"),
            self.log()
        );
    }

    async fn wait_log(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.log().contains(text) {
            assert!(
                Instant::now() < deadline,
                "plugin never logged {text:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The node's Events with `reason`: their (type, message).
    async fn events(&self, reason: &str) -> Vec<(String, String)> {
        let api: kube::Api<Event> = kube::Api::namespaced(self.client.clone(), "default");
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.involved_object.name.as_deref() == Some(NODE)
            })
            .map(|e| (e.type_.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    async fn wait_event(&self, reason: &str) -> (String, String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(e) = self.events(reason).await.into_iter().next() {
                return e;
            }
            assert!(
                Instant::now() < deadline,
                "no {reason} event; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The register annotation's health of GPU `uuid`, once it equals `want`.
    async fn wait_registered_health(&self, uuid: &str, want: bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = node_annotation(&self.server, NODE, NVIDIA.node_register)
                .and_then(|t| decode_node_devices(&t).ok())
                .and_then(|d| d.into_iter().find(|g| g.id == uuid))
                .map(|g| g.health);
            if now == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{uuid} registered health {now:?}, not {want}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn uuid_of(gpus: &[DeviceInfo], index: u32) -> String {
    gpus.iter().find(|g| g.index == index).unwrap().id.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critical_xid_makes_the_gpu_unhealthy_and_an_application_xid_does_not() {
    let h = Harness::start("critical", &[]).await;
    let gpu1 = uuid_of(&h.gpus, 1);
    // XID 13 (an application's graphics engine exception): the GPU stays healthy.
    h.inject(1, 13);
    h.wait_log(&format!("XID 13 on {gpu1} is an application error"))
        .await;
    assert_eq!(h.sim.allocatable("nvidia.com/gpu"), GPUS as usize * SHARES);
    assert!(h.events(REASON_UNHEALTHY).await.is_empty());
    // XID 79 (fallen off the bus): its 10 shares go Unhealthy in ListAndWatch.
    h.inject(1, 79);
    h.wait_allocatable(SHARES).await;
    let state = h.sim.state();
    {
        let state = state.lock().unwrap();
        let healthy: Vec<String> = state.resources["nvidia.com/gpu"]
            .healthy()
            .map(|id| id.to_string())
            .collect();
        assert!(
            healthy.iter().all(|id| !id.starts_with(&gpu1)),
            "{gpu1} still healthy: {healthy:?}"
        );
    }
    let (kind, message) = h.wait_event(REASON_UNHEALTHY).await;
    assert_eq!(kind, "Warning");
    assert!(
        message.contains(&gpu1) && message.contains("XID 79"),
        "{message}"
    );
    h.wait_registered_health(&gpu1, false).await;
    // It stays so across publications (no recovery time): still 10 after a few.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(h.sim.allocatable("nvidia.com/gpu"), SHARES);
    assert_eq!(h.events(REASON_UNHEALTHY).await.len(), 1);
    assert!(h.events(REASON_RECOVERED).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_recovery_time_the_gpu_comes_back() {
    let h = Harness::start("recovery", &["--xid-recovery-seconds", "2"]).await;
    let gpu0 = uuid_of(&h.gpus, 0);
    h.inject(0, 48);
    h.wait_allocatable(SHARES).await;
    h.wait_event(REASON_UNHEALTHY).await;
    h.wait_allocatable(GPUS as usize * SHARES).await;
    let (kind, message) = h.wait_event(REASON_RECOVERED).await;
    assert_eq!(kind, "Normal");
    assert!(message.contains(&gpu0), "{message}");
    h.wait_registered_health(&gpu0, true).await;
}
