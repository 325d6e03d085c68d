//! End to end on the embedded API server: plugin + simulated kubelet over real unix
//! sockets, with the scheduler's decision written as the HAMi scheduler writes it
//! (device lists, bind phase, node lock).

use std::path::PathBuf;
use std::time::Duration;

use hami_amd_plugin::cli::Args;
use hami_amd_plugin::registration::RegisteredDevice;
use hami_apiserver::RunningApiServer;
use hami_apiserver::lagging_watch::LaggingPodWatch;
use hami_kubelet_sim::KubeletSim;
use hami_kubelet_sim::records::RECORD_ANNOTATION;
use hami_plugin_harness::{
    Decision, annotation as ann, api_with_node, env_of, install_stub_hook, start_kubelet,
    status_message, wait_registered_again,
};
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::names::{AMD, node as node_keys, pod as pod_keys};
use hami_sysfs_fixtures::FixtureTree;
use serde_json::{Value, json};
use tokio::sync::watch;

const NODE: &str = "node-a";

struct Harness {
    server: RunningApiServer,
    client: kube::Client,
    tree: FixtureTree,
    sockets: PathBuf,
    sim: Option<KubeletSim>,
    plugin: Option<(
        watch::Sender<bool>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
    devices: Vec<RegisteredDevice>,
    /// `--slice-partitions` (the explicit opt-in to CU-slice hard partitions).
    slice_partitions: bool,
    /// `--cdi` with the spec in this directory.
    cdi: Option<PathBuf>,
    /// `--exporter-socket`.
    exporter: Option<PathBuf>,
    /// The client the plugin reads and writes with (through `lag` when there is one).
    plugin_client: kube::Client,
    /// A proxy between the plugin and the API server that can freeze its pod watch.
    lag: Option<LaggingPodWatch>,
}

/// Plugin options of a harness.
#[derive(Default)]
struct Opts {
    slice_partitions: bool,
    cdi: Option<PathBuf>,
    exporter: Option<PathBuf>,
    /// The plugin talks to the API server through a [`LaggingPodWatch`].
    lagging_watch: bool,
}

impl Harness {
    async fn start(tree: FixtureTree) -> Self {
        Self::start_with(tree, Opts::default()).await
    }

    async fn start_with(tree: FixtureTree, opts: Opts) -> Self {
        let Opts {
            slice_partitions,
            cdi,
            exporter,
            lagging_watch,
        } = opts;
        let (server, client) = api_with_node(NODE).await;
        let lag = match lagging_watch {
            true => Some(LaggingPodWatch::start(server.addr()).await.unwrap()),
            false => None,
        };
        let plugin_client = match &lag {
            Some(lag) => {
                kube::Client::try_from(kube::Config::new(lag.url.parse().unwrap())).unwrap()
            }
            None => client.clone(),
        };
        let sockets = tree.sysfs_root().parent().unwrap().join("device-plugins");
        let devices = hami_amd_plugin::discover_report::build_report(
            &tree.sysfs_root(),
            &tree.dev_root(),
            &hami_amd_plugin::registration::RegistrationSettings {
                slice_partitions,
                ..Default::default()
            },
        )
        .unwrap()
        .registration
        .devices;
        let sim = start_kubelet(sockets.clone(), NODE, client.clone()).await;
        let mut h = Self {
            server,
            client,
            tree,
            sockets,
            sim: Some(sim),
            plugin: None,
            devices,
            slice_partitions,
            cdi,
            exporter,
            plugin_client,
            lag,
        };
        h.start_plugin();
        let shares: usize = h.devices.iter().map(|d| d.info.count as usize).sum();
        assert!(
            h.sim()
                .wait_for_allocatable("amd.com/gpu", shares, Duration::from_secs(20))
                .await,
            "kubelet sees {} of {shares} devices",
            h.sim().allocatable("amd.com/gpu")
        );
        h
    }

    fn sim(&self) -> &KubeletSim {
        self.sim.as_ref().unwrap()
    }

    /// The plugin's `--host-hook-path`.
    fn hook_root(&self) -> PathBuf {
        self.tree.sysfs_root().parent().unwrap().join("hook")
    }

    /// The installed hook (a stub file) every sliced container mounts.
    fn hook_file(&self) -> PathBuf {
        self.hook_root().join("vgpu/libamvgpu.so")
    }

    fn start_plugin(&mut self) {
        use clap::Parser;
        let mut args = Args::parse_from(["k8s-device-plugin"]);
        args.sysfs_root = self.tree.sysfs_root();
        args.dev_root = self.tree.dev_root();
        args.device_plugin_dir = self.sockets.clone();
        args.node_name = Some(NODE.into());
        args.register_interval = 1;
        args.pulse = 1;
        args.cgroup_root = self.tree.sysfs_root().join("fs/cgroup");
        // An installed hook (a stub file): Allocate refuses a mount source that is missing.
        args.host_hook_path = self.hook_root();
        install_stub_hook(&args.host_hook_path, "libamvgpu.so");
        args.slice_partitions = self.slice_partitions;
        args.exporter_socket = self
            .exporter
            .clone()
            .unwrap_or_else(|| self.sockets.join("no-exporter.socket"));
        if let Some(dir) = &self.cdi {
            args.cdi = true;
            args.cdi_spec_dir = dir.clone();
        }
        let settings = args.registration_settings().unwrap();
        let (tx, rx) = watch::channel(false);
        let client = self.plugin_client.clone();
        let task = tokio::spawn(hami_amd_plugin::plugin::serve(args, settings, client, rx));
        self.plugin = Some((tx, task));
    }

    async fn stop_plugin(&mut self) {
        if let Some((tx, task)) = self.plugin.take() {
            tx.send(true).unwrap();
            task.await.unwrap().unwrap();
        }
    }

    /// Writes what the HAMi scheduler writes at filter + bind, with the node lock.
    fn schedule(
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
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(hami_plugin_harness::schedule(
                &self.server,
                &self.client,
                &AMD,
                NODE,
                decision,
                take_lock,
            ))
        });
    }

    async fn wait_phase(&self, name: &str) -> Value {
        hami_plugin_harness::wait_phase(&self.server, name).await
    }

    fn node_annotation(&self, key: &str) -> Option<String> {
        hami_plugin_harness::node_annotation(&self.server, NODE, key)
    }
}

fn gpu_container(name: &str, gpus: u32) -> Value {
    json!({"name": name, "image": "rocm/dev:latest", "resources": {"limits": {"amd.com/gpu": gpus.to_string()}}})
}

fn dev(d: &RegisteredDevice, mem: u64, cores: u32) -> ContainerDevice {
    ContainerDevice {
        uuid: d.info.id.clone(),
        device_type: d.info.device_type.clone(),
        mem_mib: mem,
        cores,
    }
}

mod allocation;
mod cdi_option;
mod dmem_delegation;
mod exporter_health;
mod node_events;
mod restarts_and_failures;
mod watch_lag;
mod whole_card_holdings;
