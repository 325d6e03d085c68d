//! The whole system in one process, with every part restartable on its own: the embedded
//! API server (with `--data-dir`), two scheduler replicas with leader election behind a
//! Service-like forwarder, the simulated kube-scheduler, and GPU nodes (an MI210 XGMI node
//! from the KFD capture with the real AMD plugin, an NVIDIA node on the stand-in NVML),
//! each with its simulated kubelet and monitor, and optionally a DRA node (`dra_node.rs`:
//! the real AMD DRA driver, kubelet-sim's DRA side, the simulated kube-scheduler's DRA
//! allocation). Same wiring as `hami demo` (`--dra`), but the harness holds every handle so
//! it can kill and restart parts.
//!
//! Given the `hami-workload` program (and where namespaces can be made), the kubelets run
//! the pods' containers as processes on the stand-in runtimes under the real hooks, with
//! the demo's images and driver models (`hami_demo::Images`, `amdgpu_driver`,
//! `cuda_driver`), so the monitors read real regions of live (and killed) processes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use hami_apiserver::{ApiServer, Config, RunningApiServer};
use hami_demo::Images;
use hami_kube_scheduler_sim::SimKubeScheduler;
use hami_kubelet_sim::KubeletSim;
use hami_kubelet_sim::container_runtime::{ContainerRecord, RuntimeArgs};
use hami_scheduler::config::Settings;
use hami_scheduler::extender_client::{ExtenderClient, Trust};
use hami_scheduler::leader::{ElectionConfig, Leadership, SkewedClock};
use hami_scheduler::runtime::Scheduler;
use hami_sysfs_fixtures::FixtureTree;
use k8s_openapi::jiff::SignedDuration;
use kube::Client;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::dra_node::DraNode;
use crate::proxy::{self, Backends};

/// Lease and lock timings of the harness: short, so a killed leader or a stale lock is
/// recovered within the settle time (the defaults are 15 s leases and a 60 s lock expiry).
pub const LEASE: Duration = Duration::from_secs(3);
/// How long a node's scheduling lock holds before it counts as stale and may be taken over.
pub const NODE_LOCK_EXPIRY: Duration = Duration::from_secs(5);
/// How long a monitor keeps a deleted pod's accounting directory (and its open region
/// file) before cleaning it up; the demo uses 60 s, the harness less so that a one-minute
/// soak sees the clean-up happen.
pub const MONITOR_GC_GRACE: Duration = Duration::from_secs(10);

/// A running scheduler replica of the stack.
pub struct Replica {
    /// Its leader-election identity.
    pub identity: String,
    /// The replica itself, for its leadership and state.
    pub scheduler: Arc<Scheduler>,
    /// How far its wall clock is set off from the real one.
    pub skew: SignedDuration,
    tasks: Vec<JoinHandle<()>>,
}

impl Replica {
    fn kill(self) {
        for t in &self.tasks {
            t.abort();
        }
        // Dropping the last handle ends its informers (Scheduler's Drop).
    }
}

enum PluginKind {
    Amd(
        Box<hami_amd_plugin::cli::Args>,
        hami_amd_plugin::registration::RegistrationSettings,
    ),
    Nvidia(
        Box<hami_nvidia_plugin::cli::Args>,
        hami_nvidia_plugin::registration::NvidiaSettings,
    ),
}

/// The kernel side of a node's stand-in driver (with workload containers).
pub(crate) enum NodeDriver {
    Amd(hami_demo::amdgpu_driver::AmdgpuDriver),
    Cuda(hami_demo::cuda_driver::CudaDriver),
}

impl NodeDriver {
    pub(crate) fn stop(&self) {
        match self {
            NodeDriver::Amd(d) => d.stop(),
            NodeDriver::Cuda(d) => d.stop(),
        }
    }
}

/// A simulated node: its fixture sysfs, kubelet-sim, monitor, driver and device plugin.
pub struct SimNode {
    /// The node's name in the cluster.
    pub name: String,
    /// The node's fixture sysfs tree.
    pub tree: FixtureTree,
    /// The node's kubelet stand-in.
    pub kubelet: KubeletSim,
    /// Where the node's monitor serves its metrics.
    pub monitor_addr: SocketAddr,
    driver: Option<NodeDriver>,
    plugin_kind: PluginKind,
    plugin: Option<(watch::Sender<bool>, JoinHandle<anyhow::Result<()>>)>,
    /// The plugin's client: its own ServiceAccount (`component_client`).
    plugin_client: Client,
    monitor: JoinHandle<anyhow::Result<()>>,
}

/// A client of the stack's API server acting as the ServiceAccount `sa` of the shipped
/// install: the scheduler and the plugins write under their own identities, so that D-4's
/// guard (applied to UPDATEs too) lets their annotation patches through and refuses a
/// user's, who is the admin here (`hami_kube_scheduler_sim::front::client_as` says why).
fn component_client(api_addr: SocketAddr, sa: &str) -> anyhow::Result<Client> {
    hami_kube_scheduler_sim::front::component_client(&format!("http://{api_addr}"), sa)
}

impl SimNode {
    fn start_plugin(&mut self) {
        let (stop, rx) = watch::channel(false);
        let client = &self.plugin_client;
        let task = match &self.plugin_kind {
            PluginKind::Amd(args, settings) => tokio::spawn(hami_amd_plugin::plugin::serve(
                (**args).clone(),
                settings.clone(),
                client.clone(),
                rx,
            )),
            PluginKind::Nvidia(args, settings) => tokio::spawn(hami_nvidia_plugin::plugin::serve(
                (**args).clone(),
                settings.clone(),
                client.clone(),
                rx,
            )),
        };
        self.plugin = Some((stop, task));
    }

    /// Stops the plugin (as a SIGTERM would); false if it did not stop within 5 s and was
    /// aborted instead.
    pub async fn stop_plugin(&mut self) -> bool {
        let Some((stop, mut task)) = self.plugin.take() else {
            return true;
        };
        let _ = stop.send(true);
        match tokio::time::timeout(Duration::from_secs(5), &mut task).await {
            Ok(_) => true,
            Err(_) => {
                task.abort();
                false
            }
        }
    }

    /// Whether the node's device plugin task is alive (it is stopped by the plugin-restart fault).
    pub fn plugin_running(&self) -> bool {
        self.plugin.as_ref().is_some_and(|(_, t)| !t.is_finished())
    }

    /// The node's containers as kubelet-sim last published them.
    pub fn containers(&self) -> Vec<ContainerRecord> {
        self.kubelet
            .containers_handle()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// What every AMD node has, device plugin or DRA.
struct AmdPlumbing {
    sockets: PathBuf,
    hook: PathBuf,
    kubelet: KubeletSim,
    monitor_addr: SocketAddr,
    monitor: JoinHandle<anyhow::Result<()>>,
    driver: Option<NodeDriver>,
}

/// The whole system under test: API server, scheduler replicas behind a forwarder, and the nodes.
pub struct Stack {
    /// The run's scratch directory, removed and recreated at start.
    pub workdir: PathBuf,
    /// Where the API server persists its store, so a restart keeps the objects.
    pub data_dir: PathBuf,
    /// The API server; `None` only while the restart fault has it down.
    pub api: Option<RunningApiServer>,
    /// The API server's address, kept across restarts.
    pub api_addr: SocketAddr,
    /// A client of the API server for the harness.
    pub client: Client,
    /// The scheduler settings every replica starts with.
    pub settings: Settings,
    /// Replica slots; `None` while that replica is killed.
    pub replicas: Vec<Option<Replica>>,
    /// HTTPS URL of the forwarder standing in for the scheduler's Service.
    pub service_url: String,
    /// The simulated device-plugin nodes.
    pub nodes: Vec<SimNode>,
    /// The DRA node, when the stack was started with one.
    pub dra: Option<DraNode>,
    /// Each replica's metrics endpoint, by replica index.
    pub scheduler_metrics: Vec<SocketAddr>,
    /// The containers' images: Some when pods run processes.
    pub images: Option<Images>,
    backends: Backends,
    cert_paths: (PathBuf, PathBuf),
    background: Vec<JoinHandle<()>>,
}

/// The stand-in NVML built with the workspace, linked as `libnvidia-ml.so.1`.
fn nvml_stand_in(workdir: &Path) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let built = [
        dir.join("deps/libnvidia_ml.so"),
        dir.join("libnvidia_ml.so"),
        dir.join("../libnvidia_ml.so"),
    ]
    .into_iter()
    .find(|p| p.exists())?;
    let driver = workdir.join("nvidia-driver");
    std::fs::create_dir_all(&driver).ok()?;
    let link = driver.join("libnvidia-ml.so.1");
    if !link.exists() {
        std::os::unix::fs::symlink(&built, &link).ok()?;
    }
    Some(driver.join("libnvidia-ml.so.1"))
}

async fn start_api(addr: SocketAddr, data_dir: &Path) -> anyhow::Result<RunningApiServer> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ApiServer::start(Config {
            listen: addr,
            data_dir: Some(data_dir.to_path_buf()),
            ..Config::default()
        })
        .await
        {
            Ok(api) => return Ok(api),
            // The old listener's port can take a moment to be free again.
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

impl Stack {
    /// Starts everything; `skews` are the replicas' first wall-clock offsets. With
    /// `workload` (the `hami-workload` program) containers run as processes; an error if
    /// they cannot (no root or unshare, runtimes or hooks not built), rather than a run
    /// that silently tests less. With `dra`, also the DRA node (and the chart's DeviceClass,
    /// and DRA allocation in the simulated kube-scheduler).
    pub async fn start(
        tag: &str,
        skews: [SignedDuration; 2],
        workload: Option<&Path>,
        dra: bool,
    ) -> anyhow::Result<Stack> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let workdir = std::env::temp_dir().join(format!("hami-chaos-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&workdir);
        std::fs::create_dir_all(&workdir)?;
        let images = match workload {
            Some(program) => {
                anyhow::ensure!(
                    hami_demo::namespaces_work(),
                    "workload containers need PID and mount namespaces (root, util-linux unshare)"
                );
                Some(Images::prepare(&workdir, program).map_err(|e| anyhow::anyhow!(e))?)
            }
            None => None,
        };
        let data_dir = workdir.join("apiserver-data");
        let api = start_api(SocketAddr::from(([127, 0, 0, 1], 0)), &data_dir).await?;
        let api_addr = api.addr();
        let client = Client::try_from(kube::Config::new(api.url().parse()?))?;

        let cert = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
        ])?;
        let cert_paths = (workdir.join("tls.crt"), workdir.join("tls.key"));
        std::fs::write(&cert_paths.0, cert.cert.pem())?;
        std::fs::write(&cert_paths.1, cert.signing_key.serialize_pem())?;
        let settings = Settings {
            node_lock_expiry: NODE_LOCK_EXPIRY,
            bind_lock_wait: Duration::from_secs(10),
            ..Settings::default()
        };

        let service = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let service_url = format!("https://{}", service.local_addr()?);
        let backends = Backends::default();
        let mut background = vec![proxy::spawn(service, backends.clone())];
        // The webhook configuration that ships, pointed at the stack's Service stand-in.
        let webhook = hami_demo::webhook::configuration(&service_url, cert.cert.pem().as_bytes())?;
        api.create_object(
            "admissionregistration.k8s.io/v1",
            "mutatingwebhookconfigurations",
            None,
            webhook,
        )
        .map_err(|e| anyhow::anyhow!("cannot register the webhook: {e:?}"))?;
        let extender = ExtenderClient::new(&service_url, Trust::Ca(cert.cert.pem().into_bytes()))?;
        let kube_scheduler =
            SimKubeScheduler::new(client.clone(), settings.scheduler_name.clone(), extender);
        let kube_scheduler = if dra {
            hami_demo::dra_node::create_device_class(&api)?;
            kube_scheduler.with_dra(hami_kube_scheduler_sim::dra::DraOptions::default())
        } else {
            kube_scheduler
        };
        background.push(tokio::spawn(kube_scheduler.run()));

        let mut stack = Stack {
            workdir,
            data_dir,
            api: Some(api),
            api_addr,
            client,
            settings,
            replicas: vec![None, None],
            service_url,
            nodes: Vec::new(),
            dra: None,
            scheduler_metrics: Vec::new(),
            images,
            backends,
            cert_paths,
            background,
        };
        for (i, skew) in skews.into_iter().enumerate() {
            stack.start_replica(i, skew)?;
        }
        let mi210 = hami_sysfs_fixtures::mi210_xgmi()?;
        let node = stack.amd_node("mi210-node", mi210).await?;
        stack.nodes.push(node);
        if let Some(nvml) = nvml_stand_in(&stack.workdir) {
            let node = stack.nvidia_node("nvidia-node", &nvml).await?;
            stack.nodes.push(node);
        }
        if dra {
            let node = stack
                .dra_node("mi210-dra-node", hami_sysfs_fixtures::mi210_xgmi()?)
                .await?;
            stack.dra = Some(node);
        }
        stack.wait_registered(Duration::from_secs(30)).await?;
        Ok(stack)
    }

    /// Starts (or restarts) replica `i` with a wall clock `skew` off.
    pub fn start_replica(&mut self, i: usize, skew: SignedDuration) -> anyhow::Result<()> {
        if let Some(old) = self.replicas[i].take() {
            self.backends.set(&old.identity, None);
            old.kill();
        }
        let identity = format!("hami-scheduler-{i}");
        let leadership = Arc::new(Leadership::elected());
        let config = ElectionConfig {
            namespace: "kube-system".into(),
            name: "hami-scheduler".into(),
            identity: identity.clone(),
            lease_duration: LEASE,
            renew_interval: Duration::from_millis(300),
        };
        let mut tasks = vec![tokio::spawn(hami_scheduler::leader::run_with_clock(
            self.client.clone(),
            config,
            leadership.clone(),
            SkewedClock(skew),
        ))];
        let scheduler = Scheduler::start(
            component_client(
                self.api_addr,
                hami_kube_scheduler_sim::front::accounts::SCHEDULER,
            )?,
            self.settings.clone(),
            leadership.clone(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let router = hami_scheduler::http::router(scheduler.clone());
        let tls = Some(self.cert_paths.clone());
        tasks.push(tokio::spawn(async move {
            let _ = hami_scheduler::http::serve_on(router, listener, tls).await;
        }));
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")?;
        let metrics_addr = metrics.local_addr()?;
        let metrics_router = hami_scheduler::http::metrics_router(scheduler.clone());
        tasks.push(tokio::spawn(async move {
            let _ = hami_scheduler::http::serve_on(metrics_router, metrics, None).await;
        }));
        if self.scheduler_metrics.len() <= i {
            self.scheduler_metrics.resize(i + 1, metrics_addr);
        }
        self.scheduler_metrics[i] = metrics_addr;
        self.backends.set(&identity, Some((addr, leadership)));
        self.replicas[i] = Some(Replica {
            identity,
            scheduler,
            skew,
            tasks,
        });
        Ok(())
    }

    /// Kills replica `i` (nothing graceful: its lease is left to expire).
    pub fn kill_replica(&mut self, i: usize) -> Option<String> {
        let old = self.replicas[i].take()?;
        self.backends.set(&old.identity, None);
        let id = old.identity.clone();
        old.kill();
        Some(id)
    }

    /// Index of the replica that currently leads, if one does.
    pub fn leader(&self) -> Option<usize> {
        self.replicas
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.scheduler.leader.is_leader()))
    }

    /// Stops the API server and starts it again on the same address and data directory.
    pub async fn restart_api(&mut self, down_for: Duration) -> anyhow::Result<()> {
        if let Some(api) = self.api.take() {
            api.shutdown().await;
        }
        tokio::time::sleep(down_for).await;
        self.api = Some(start_api(self.api_addr, &self.data_dir).await?);
        Ok(())
    }

    /// The running API server; panics if called while it is down.
    pub fn api(&self) -> &RunningApiServer {
        self.api
            .as_ref()
            .expect("the API server runs between faults")
    }

    async fn kubelet(
        &self,
        name: &str,
        image_env: Option<(Vec<String>, PathBuf)>,
        node: hami_kubelet_sim::NodeConfig,
    ) -> anyhow::Result<(PathBuf, PathBuf, KubeletSim)> {
        let sockets = self.workdir.join(name).join("device-plugins");
        let hook = self.workdir.join(name).join("hook");
        std::fs::create_dir_all(&sockets)?;
        std::fs::create_dir_all(hook.join("vgpu/containers"))?;
        let args = hami_kubelet_sim::Args {
            socket_dir: sockets.clone(),
            node_name: name.into(),
            record_dir: Some(self.workdir.join(name).join("pods")),
            run_containers: image_env.is_some(),
            runtime: image_env
                .map(|(image_env, dev_root)| RuntimeArgs {
                    dev_root,
                    image_env,
                    state_dir: Some(self.workdir.join(name).join("containers")),
                })
                .unwrap_or_default(),
            sync_interval_ms: 100,
        };
        let kubelet = KubeletSim::start_node(args, self.client.clone(), node).await?;
        Ok((sockets, hook, kubelet))
    }

    fn monitor(
        &self,
        name: &str,
        hook: &Path,
        sys_root: PathBuf,
        proc_root: PathBuf,
    ) -> anyhow::Result<(SocketAddr, JoinHandle<anyhow::Result<()>>)> {
        std::fs::create_dir_all(&proc_root)?;
        let addr = hami_local_ports::free_local_addr();
        let config = hami_monitor::server::ServeConfig {
            monitor: hami_monitor::node_monitor::MonitorConfig {
                hook_path: hook.join("vgpu"),
                proc_root,
                sys_root,
                node_name: name.into(),
                gc_grace: MONITOR_GC_GRACE,
                nvml_library: None,
            },
            bind: addr,
            legacy_metrics: hami_monitor::metrics::LegacyMetrics::Seed,
            scheduler_name: hami_protocol::names::DEFAULT_SCHEDULER_NAME.into(),
            refresh_interval: Duration::from_secs(2),
        };
        let task = tokio::spawn(hami_monitor::server::serve(
            config,
            self.client.clone(),
            std::future::pending(),
        ));
        Ok((addr, task))
    }

    /// An AMD node's kubelet-sim (with `dra` when given; its containers on the node's
    /// driver model): (sockets, hook path, kubelet).
    async fn amd_kubelet(
        &self,
        name: &str,
        tree: &FixtureTree,
        dra: Option<hami_kubelet_sim::dra_manager::DraConfig>,
    ) -> anyhow::Result<(PathBuf, PathBuf, KubeletSim)> {
        let socket = self.workdir.join(name).join("amdgpu.sock");
        let containers = self.images.as_ref().map(|images| {
            let mut env = vec![
                images.path(),
                format!("LD_LIBRARY_PATH={}", images.amd_lib.display()),
                format!("FAKE_AMDGPU_DRIVER_SOCKET={}", socket.display()),
            ];
            if let Some((mem, cus)) = hami_demo::amdgpu_driver::first_device(&tree.sysfs_root()) {
                env.push(format!("FAKE_HIP_DEVICE_MEMORY={mem}"));
                env.push(format!("FAKE_HIP_CU_COUNT={cus}"));
            }
            (env, tree.dev_root())
        });
        // The DRA node's kubelet makes its pods' cgroups, in which the driver sets dmem
        // (as the demo's DRA node).
        let node = hami_kubelet_sim::NodeConfig {
            cgroups: match &dra {
                Some(_) => Some(hami_demo::dra_node::node_cgroups(&tree.sysfs_root())?),
                None => None,
            },
            dra,
        };
        self.kubelet(name, containers, node).await
    }

    /// With containers, the AMD node's stand-in driver (kernel side) for `kubelet`'s
    /// containers.
    fn amd_model(
        &self,
        name: &str,
        tree: &FixtureTree,
        kubelet: &KubeletSim,
    ) -> anyhow::Result<Option<NodeDriver>> {
        if self.images.is_none() {
            return Ok(None);
        }
        let node_dir = self.workdir.join(name);
        Ok(Some(NodeDriver::Amd(
            hami_demo::amdgpu_driver::AmdgpuDriver::start(
                &node_dir.join("amdgpu.sock"),
                &node_dir.join("proc"),
                &tree.sysfs_root(),
                kubelet.containers_handle(),
            )?,
        )))
    }

    /// An AMD node's kubelet-sim (with `dra` when given), monitor and, with containers,
    /// the stand-in driver's kernel side with the hook installed.
    async fn amd_plumbing(
        &self,
        name: &str,
        tree: &FixtureTree,
        dra: Option<hami_kubelet_sim::dra_manager::DraConfig>,
    ) -> anyhow::Result<AmdPlumbing> {
        // The monitor reads the driver model's proc-shaped tree (amdgpu_driver.rs).
        let proc_root = self.workdir.join(name).join("proc");
        let (sockets, hook, kubelet) = self.amd_kubelet(name, tree, dra).await?;
        let (monitor_addr, monitor) = self.monitor(name, &hook, tree.sysfs_root(), proc_root)?;
        if let Some(images) = &self.images {
            hami_demo::install_hook(&images.amd_hook, &hook, "libamvgpu.so")?;
        }
        let driver = self.amd_model(name, tree, &kubelet)?;
        Ok(AmdPlumbing {
            sockets,
            hook,
            kubelet,
            monitor_addr,
            monitor,
            driver,
        })
    }

    async fn amd_node(&self, name: &str, tree: FixtureTree) -> anyhow::Result<SimNode> {
        self.create_node(name, None)?;
        let AmdPlumbing {
            sockets,
            hook,
            kubelet,
            monitor_addr,
            monitor,
            driver,
        } = self.amd_plumbing(name, &tree, None).await?;
        let mut args = hami_amd_plugin::cli::Args::parse_from(["k8s-device-plugin"]);
        args.sysfs_root = tree.sysfs_root();
        args.dev_root = tree.dev_root();
        args.device_plugin_dir = sockets;
        args.node_name = Some(name.into());
        args.register_interval = 2;
        args.pulse = 5;
        args.host_hook_path = hook;
        args.cgroup_root = tree.sysfs_root().join("fs/cgroup");
        let settings = args
            .registration_settings()
            .map_err(|e| anyhow::anyhow!(e))?;
        let mut node = SimNode {
            name: name.into(),
            tree,
            kubelet,
            monitor_addr,
            driver,
            plugin_kind: PluginKind::Amd(Box::new(args), settings),
            plugin: None,
            plugin_client: component_client(
                self.api_addr,
                hami_kube_scheduler_sim::front::accounts::DEVICE_PLUGIN,
            )?,
            monitor,
        };
        node.start_plugin();
        Ok(node)
    }

    /// The DRA node (`dra_node.rs`), labelled for DRA as the chart's node selector wants it,
    /// its driver started.
    async fn dra_node(&self, name: &str, tree: FixtureTree) -> anyhow::Result<DraNode> {
        self.create_node(
            name,
            Some((
                hami_protocol::dra::AMD_MODE_LABEL,
                hami_protocol::dra::AMD_MODE_DRA,
            )),
        )?;
        let paths = hami_demo::dra_node::DraPaths::new(&self.workdir.join(name));
        let p = self
            .amd_plumbing(name, &tree, Some(paths.kubelet()))
            .await?;
        let mut node = DraNode::new(
            name.into(),
            tree,
            Some(p.kubelet),
            (p.monitor_addr, p.monitor, p.hook),
            paths,
            p.driver,
            format!("http://{}", self.api_addr),
        );
        node.start_driver()?;
        Ok(node)
    }

    async fn nvidia_node(&self, name: &str, nvml: &Path) -> anyhow::Result<SimNode> {
        self.create_node(name, None)?;
        let tree = FixtureTree::empty()?;
        let node_dir = self.workdir.join(name);
        let socket = node_dir.join("nvidia.sock");
        let containers = self.images.as_ref().map(|images| {
            let env = vec![
                images.path(),
                format!("LD_LIBRARY_PATH={}", images.nvidia_lib.display()),
                "FAKE_CUDA_DEVICE_COUNT=1".into(),
                "FAKE_CUDA_DEVICE_MEMORY=16g".into(),
                format!(
                    "FAKE_CUDA_SHARED_STATE={}",
                    node_dir.join("cuda-devices.state").display()
                ),
                format!("FAKE_CUDA_DRIVER_SOCKET={}", socket.display()),
            ];
            (env, tree.dev_root())
        });
        // With processes, the host's /proc: the monitor resolves the pods' host pids from it.
        let proc_root = if containers.is_some() {
            PathBuf::from("/proc")
        } else {
            node_dir.join("proc")
        };
        let (sockets, hook, kubelet) = self.kubelet(name, containers, Default::default()).await?;
        let (monitor_addr, monitor) = self.monitor(name, &hook, tree.sysfs_root(), proc_root)?;
        let driver = match &self.images {
            Some(images) => {
                hami_demo::install_hook(&images.nvidia_hook, &hook, "libvgpu.so")?;
                Some(NodeDriver::Cuda(hami_demo::cuda_driver::CudaDriver::start(
                    &socket,
                )?))
            }
            None => None,
        };
        let mut args = hami_nvidia_plugin::cli::Args::parse_from(["nvidia-device-plugin"]);
        args.nvml_library = nvml.display().to_string();
        args.device_plugin_dir = sockets;
        args.node_name = Some(name.into());
        args.hook_path = hook;
        args.register_interval = 2;
        args.pulse = 5;
        let settings = args.settings().map_err(|e| anyhow::anyhow!(e))?;
        let mut node = SimNode {
            name: name.into(),
            tree,
            kubelet,
            monitor_addr,
            driver,
            plugin_kind: PluginKind::Nvidia(Box::new(args), settings),
            plugin: None,
            plugin_client: component_client(
                self.api_addr,
                hami_kube_scheduler_sim::front::accounts::NVIDIA_DEVICE_PLUGIN,
            )?,
            monitor,
        };
        node.start_plugin();
        Ok(node)
    }

    fn create_node(&self, name: &str, label: Option<(&str, &str)>) -> anyhow::Result<()> {
        let mut labels = json!({"kubernetes.io/hostname": name});
        if let Some((k, v)) = label {
            labels[k] = json!(v);
        }
        self.api()
            .create_object("v1", "nodes", None, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}))
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("cannot create node {name}: {e:?}"))
    }

    /// Stops the DRA node's kubelet-sim as its process would die (its containers, its
    /// children, with it); what survives is its checkpoint file. False without one running.
    pub async fn stop_dra_kubelet(&mut self) -> bool {
        let Some(node) = self.dra.as_mut() else {
            return false;
        };
        if let Some(m) = node.model.take() {
            m.stop();
        }
        match node.kubelet.take() {
            Some(k) => {
                k.shutdown().await;
                true
            }
            None => false,
        }
    }

    /// Starts the DRA node's kubelet-sim again, resuming from its checkpoint file.
    pub async fn start_dra_kubelet(&mut self) -> anyhow::Result<()> {
        let Some(node) = self.dra.take() else {
            anyhow::bail!("no DRA node");
        };
        let started = async {
            let (_, _, kubelet) = self
                .amd_kubelet(&node.name, &node.tree, Some(node.paths.kubelet()))
                .await?;
            let model = self.amd_model(&node.name, &node.tree, &kubelet)?;
            anyhow::Ok((kubelet, model))
        }
        .await;
        let mut node = node;
        let result = started.map(|(kubelet, model)| {
            node.kubelet = Some(kubelet);
            node.model = model;
        });
        self.dra = Some(node);
        result
    }

    /// Starts node `i`'s plugin again.
    pub fn start_plugin(&mut self, i: usize) {
        self.nodes[i].start_plugin();
    }

    /// Waits until a replica leads and sees every device-plugin node's GPUs, and the DRA
    /// node (if any) has published its ResourceSlices.
    pub async fn wait_registered(&self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let published = match &self.dra {
                Some(n) => hami_demo::dra_node::slices_published(&self.client, &n.name).await,
                None => true,
            };
            if let Some(l) = self.leader()
                && let Some(r) = &self.replicas[l]
            {
                let state = r.scheduler.state();
                if published
                    && r.scheduler.ready()
                    && self.nodes.iter().all(|n| {
                        state
                            .node(&n.name)
                            .is_some_and(|s| !s.devices.gpus.is_empty())
                    })
                {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "no leader saw every node's GPUs (or the DRA node's slices: {published}) within {limit:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every component and removes the scratch directory.
    pub async fn shutdown(mut self) {
        if let Some(node) = self.dra.take() {
            node.shutdown().await;
        }
        for node in std::mem::take(&mut self.nodes) {
            let mut node = node;
            node.stop_plugin().await;
            node.monitor.abort();
            node.kubelet.shutdown().await;
            if let Some(d) = &node.driver {
                d.stop();
            }
        }
        for i in 0..self.replicas.len() {
            self.kill_replica(i);
        }
        for t in &self.background {
            t.abort();
        }
        if let Some(api) = self.api.take() {
            api.shutdown().await;
        }
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}
