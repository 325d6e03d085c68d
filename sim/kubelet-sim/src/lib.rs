//! A simulated kubelet for tests and the demo (see README.md). It speaks the real
//! device-plugin gRPC API over unix sockets and the real Kubernetes API, so the plugin and
//! scheduler code under test run unchanged:
//!
//! - serves `Registration` on `<socket dir>/kubelet.sock`, dials back each registered
//!   plugin and keeps allocatable per resource from ListAndWatch;
//! - publishes capacity/allocatable of those resources on its Node;
//! - watches the pods bound to its node (field selector `spec.nodeName`) and, for each,
//!   calls Allocate once per container that requests a
//!   plugin resource (init containers first, in order, then app containers), marks the pod
//!   Running (or Failed with `UnexpectedAdmissionError`) and records what each container
//!   got in the annotation `kubelet-sim.hami.io/allocations` (and optionally a file);
//! - can start app containers as local processes with the returned env, or (`--runtime
//!   containerd`) have a real containerd run the pod over CRI (`cri_runtime/`);
//! - [`KubeletSim::restart`] behaves like a kubelet restart: the socket directory is wiped
//!   and `kubelet.sock` re-created; device assignments (kubelet's checkpoint) survive;
//! - started with [`KubeletSim::start_with_dra`], it also registers DRA plugins from the
//!   plugin-registry directory, prepares a pod's ResourceClaims before its containers start
//!   (their CDI edits go into the containers and the record) and unprepares them once the
//!   pod is gone, from a checkpoint file that outlives the process (`dra_manager.rs`);
//! - started with [`KubeletSim::start_node`] and a [`pod_cgroups::CgroupConfig`], it makes
//!   the pods' cgroups as kubelet and containerd do, when they do: the pod's once it is
//!   admitted (before its claims are prepared, as kubelet's `SyncPod` does), its sandbox's
//!   once they are, each app container's as it starts, all removed once the pod is
//!   finished or gone (`pod_cgroups.rs`).

pub mod admission;
pub mod cdi;
pub mod cgroup_args;
pub mod cgroup_layout;
pub mod container_runtime;
pub mod cri_args;
pub mod cri_runtime;
pub mod cri_spec;
pub mod device_state;
pub mod dra_manager;
pub mod dra_state;
pub mod pod_cgroups;
pub mod records;
pub mod registration_service;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use hami_deviceplugin_api::v1beta1::registration_server::RegistrationServer;
use hami_deviceplugin_api::{DEVICE_PLUGIN_PATH, KUBELET_SOCKET, bind_unix};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use tokio::sync::{Notify, watch};

use crate::admission::{Admission, AdmissionConfig};
use crate::device_state::DeviceState;
use crate::registration_service::RegistrationService;

/// Command-line arguments (`hami kubelet-sim`).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Device-plugin socket directory (kubelet.sock is served here).
    #[arg(long, default_value = DEVICE_PLUGIN_PATH)]
    pub socket_dir: PathBuf,
    /// The node this kubelet runs.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Also write `<namespace>_<pod>.json` allocation records (and container logs) here.
    #[arg(long)]
    pub record_dir: Option<PathBuf>,
    /// Start app containers that have a command as containers (own PID and mount
    /// namespaces) with the returned env, mounts and devices (needs root and util-linux).
    #[arg(long)]
    pub run_containers: bool,
    /// How containers are started (only with `--run-containers`).
    #[command(flatten)]
    pub runtime: container_runtime::RuntimeArgs,
    /// Milliseconds between passes when no pod changed (retries, container exits, DRA
    /// plugin registrations); a change to one of the node's pods starts a pass at once.
    #[arg(long, default_value_t = 200)]
    pub sync_interval_ms: u64,
}

/// Runs until Ctrl-C, with the kubeconfig from the environment, making the pods' cgroups
/// when `cgroups` says where (checked by [`cgroup_args::CgroupArgs::config`]).
pub async fn run(args: Args, cgroups: Option<pod_cgroups::CgroupConfig>) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| anyhow::anyhow!("cannot build a Kubernetes client (set KUBECONFIG): {e}"))?;
    let sim = KubeletSim::start_node(args, client, NodeConfig { dra: None, cgroups }).await?;
    tokio::signal::ctrl_c().await?;
    sim.shutdown().await;
    Ok(())
}

/// The parts of a node [`KubeletSim::start_node`] takes beyond [`Args`].
#[derive(Debug, Clone, Default)]
pub struct NodeConfig {
    /// Do DRA (see [`KubeletSim::start_with_dra`]).
    pub dra: Option<dra_manager::DraConfig>,
    /// Make the pods' cgroups in this tree.
    pub cgroups: Option<pod_cgroups::CgroupConfig>,
}

/// A running simulated kubelet.
pub struct KubeletSim {
    args: Args,
    state: Arc<Mutex<DeviceState>>,
    changed: Arc<Notify>,
    registration_stop: watch::Sender<bool>,
    registration_task: tokio::task::JoinHandle<()>,
    worker_stop: watch::Sender<bool>,
    worker_task: tokio::task::JoinHandle<()>,
    running: Arc<Mutex<Vec<container_runtime::ContainerRecord>>>,
    forget_dra_plugins: Arc<std::sync::atomic::AtomicBool>,
}

fn start_registration(
    args: &Args,
    state: Arc<Mutex<DeviceState>>,
    changed: Arc<Notify>,
) -> anyhow::Result<(watch::Sender<bool>, tokio::task::JoinHandle<()>)> {
    let socket = args.socket_dir.join(KUBELET_SOCKET);
    let incoming = bind_unix(&socket)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", socket.display()))?;
    let service = RegistrationService {
        dir: args.socket_dir.clone(),
        state,
        changed,
    };
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            })
            .await;
        if let Err(e) = result {
            tracing::error!("kubelet registration server stopped: {e}");
        }
    });
    Ok((stop_tx, task))
}

impl KubeletSim {
    /// Starts serving `kubelet.sock` and admitting pods.
    pub async fn start(args: Args, client: kube::Client) -> anyhow::Result<Self> {
        Self::start_inner(args, client, None, None).await
    }

    /// Like [`KubeletSim::start`], also doing DRA (see the module doc): plugins from
    /// `dra.registry_dir`, the checkpoint in `dra.state_file` (resumed when present).
    pub async fn start_with_dra(
        args: Args,
        client: kube::Client,
        dra: dra_manager::DraConfig,
    ) -> anyhow::Result<Self> {
        Self::start_node(
            args,
            client,
            NodeConfig {
                dra: Some(dra),
                cgroups: None,
            },
        )
        .await
    }

    /// Like [`KubeletSim::start`], with the parts of a node beyond `Args`: DRA and the pod
    /// cgroups (see the module doc).
    pub async fn start_node(
        args: Args,
        client: kube::Client,
        node: NodeConfig,
    ) -> anyhow::Result<Self> {
        let cgroups = node
            .cgroups
            .as_ref()
            .map(pod_cgroups::PodCgroups::new)
            .transpose()
            .map_err(anyhow::Error::msg)?;
        let dra = match node.dra {
            Some(dra) => {
                std::fs::create_dir_all(&dra.registry_dir)?;
                Some(dra_manager::DraManager::load(dra, client.clone())?)
            }
            None => None,
        };
        Self::start_inner(args, client, dra, cgroups).await
    }

    async fn start_inner(
        args: Args,
        client: kube::Client,
        dra: Option<dra_manager::DraManager>,
        cgroups: Option<pod_cgroups::PodCgroups>,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&args.socket_dir)?;
        let state = Arc::new(Mutex::new(DeviceState::default()));
        let changed = Arc::new(Notify::new());
        let (registration_stop, registration_task) =
            start_registration(&args, state.clone(), changed.clone())?;
        let (worker_stop, mut stop_rx) = watch::channel(false);
        let mut admission = Admission::new(
            AdmissionConfig {
                node: args.node_name.clone(),
                dir: args.socket_dir.clone(),
                record_dir: args.record_dir.clone(),
                run_containers: args.run_containers,
                runtime: args.runtime.clone(),
            },
            client.clone(),
            state.clone(),
        );
        admission.dra = dra;
        admission.cgroups = cgroups;
        admission.cri =
            match cri_runtime::CriRuntime::for_node(&args, &client, &state, &admission.running)
                .await
            {
                Ok(cri) => cri,
                Err(e) => {
                    let _ = registration_stop.send(true);
                    return Err(anyhow::Error::msg(e));
                }
            };
        let forget_dra_plugins = admission.forget_dra_plugins.clone();
        let running = admission.running.clone();
        let interval = Duration::from_millis(args.sync_interval_ms.max(10));
        let node_name = args.node_name.clone();
        let worker_changed = changed.clone();
        // The node's pods, kept by a watch (kubelet's own pod source is a watch on
        // spec.nodeName too); every event starts a pass.
        let (pods, pod_writer) = reflector::store::<Pod>();
        let pods_changed = Arc::new(Notify::new());
        let pod_watch = {
            let api: Api<Pod> = Api::all(client.clone());
            let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
            let pods_changed = pods_changed.clone();
            tokio::spawn(
                reflector::reflector(pod_writer, watcher(api, config).default_backoff()).for_each(
                    move |_| {
                        pods_changed.notify_one();
                        async {}
                    },
                ),
            )
        };
        let worker_task = tokio::spawn(async move {
            let mut published: Option<BTreeMap<String, usize>> = None;
            // The first pass waits for the first list: an empty store would read as "every
            // pod gone" and release the checkpointed assignments.
            let stopped = tokio::select! {
                ready = pods.wait_until_ready() => {
                    if ready.is_err() {
                        tracing::warn!("the pod watch ended before its first list");
                    }
                    false
                },
                _ = stop_rx.wait_for(|s| *s) => true,
            };
            if stopped {
                pod_watch.abort();
                admission.stop_containers();
                if let Some(cri) = admission.cri.as_mut() {
                    cri.shutdown().await;
                }
                return;
            }
            loop {
                let counts: BTreeMap<String, usize> = {
                    let s = admission.state.lock().unwrap_or_else(|p| p.into_inner());
                    s.resources
                        .keys()
                        .map(|r| (r.clone(), s.allocatable(r)))
                        .collect()
                };
                if published.as_ref() != Some(&counts) {
                    match publish_node(&client, &node_name, &counts).await {
                        Ok(()) => published = Some(counts),
                        Err(e) => tracing::warn!("cannot publish node capacity: {e}"),
                    }
                }
                if let Err(e) = admission.sync(&pods.state()).await {
                    tracing::warn!("pod sync failed: {e}");
                }
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = worker_changed.notified() => {}
                    _ = pods_changed.notified() => {}
                    _ = stop_rx.wait_for(|s| *s) => break,
                }
            }
            pod_watch.abort();
            admission.stop_containers();
            if let Some(cri) = admission.cri.as_mut() {
                cri.shutdown().await;
            }
        });
        Ok(Self {
            args,
            state,
            changed,
            registration_stop,
            registration_task,
            worker_stop,
            worker_task,
            running,
            forget_dra_plugins,
        })
    }

    /// The containers running now (with the host pid of each one's pid 1).
    pub fn containers(&self) -> Vec<container_runtime::ContainerRecord> {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A handle on the running containers that outlives borrows of `self` (a node's
    /// driver model asks it which container a process is in).
    pub fn containers_handle(&self) -> Arc<Mutex<Vec<container_runtime::ContainerRecord>>> {
        self.running.clone()
    }

    /// The shared device state (registrations, device lists, assignments).
    pub fn state(&self) -> Arc<Mutex<DeviceState>> {
        self.state.clone()
    }

    /// Healthy devices of `resource` known from ListAndWatch.
    pub fn allocatable(&self, resource: &str) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allocatable(resource)
    }

    /// Registrations accepted so far.
    pub fn registrations(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .registrations
    }

    /// Waits until `resource` has `count` allocatable devices (false on timeout).
    pub async fn wait_for_allocatable(
        &self,
        resource: &str,
        count: usize,
        timeout: Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.allocatable(resource) == count {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::select! {
                _ = self.changed.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    }

    /// A kubelet restart: stop serving, wipe the socket directory (kubelet removes every
    /// plugin socket), re-create `kubelet.sock`. Assignments survive (checkpoint); DRA
    /// registrations are forgotten and found again from the registry directory.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.forget_dra_plugins
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.registration_stop.send(true);
        let task = std::mem::replace(&mut self.registration_task, tokio::spawn(async {}));
        let _ = task.await;
        for entry in std::fs::read_dir(&self.args.socket_dir)?.flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
        let (stop, task) =
            start_registration(&self.args, self.state.clone(), self.changed.clone())?;
        self.registration_stop = stop;
        self.registration_task = task;
        Ok(())
    }

    /// Stops everything (started container processes are killed).
    pub async fn shutdown(self) {
        let _ = self.registration_stop.send(true);
        let _ = self.worker_stop.send(true);
        let _ = self.registration_task.await;
        let _ = self.worker_task.await;
        let _ = std::fs::remove_file(self.args.socket_dir.join(KUBELET_SOCKET));
    }
}

/// Creates the Node if needed and publishes capacity/allocatable of plugin resources.
async fn publish_node(
    client: &kube::Client,
    name: &str,
    counts: &BTreeMap<String, usize>,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes.get_opt(name).await?.is_none() {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        }))
        .map_err(kube::Error::SerdeError)?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    let values: serde_json::Map<String, serde_json::Value> = counts
        .iter()
        .map(|(k, v)| (k.clone(), json!(v.to_string())))
        .collect();
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            // Strategic: conditions merge by type, so conditions others set survive.
            &Patch::Strategic(node_status(&values, &now_rfc3339())),
        )
        .await?;
    Ok(())
}

/// The status a kubelet posts: capacity/allocatable of plugin resources and the `Ready`
/// condition (a kubelet that can post its status is ready; the node controller, not the
/// kubelet, marks a silent node NotReady/Unknown).
fn node_status(
    resources: &serde_json::Map<String, serde_json::Value>,
    now: &str,
) -> serde_json::Value {
    json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }],
    }})
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}
