//! The chaos stack's GPU nodes, each part restartable: the Node object, kubelet-sim (with
//! the containers' runtime where pods run processes), the monitor, and the device plugin
//! (AMD on the MI210 XGMI capture, NVIDIA on the stand-in NVML) started and stopped on its
//! own; the DRA node's AMD plumbing shared with `dra_node.rs`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use hami_kubelet_sim::KubeletSim;
use hami_kubelet_sim::container_runtime::{ContainerRecord, RuntimeArgs};
use hami_sysfs_fixtures::FixtureTree;
use kube::Client;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::dra_node::DraNode;

use crate::stack::*;

pub(crate) enum PluginKind {
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
    pub(crate) driver: Option<NodeDriver>,
    pub(crate) plugin_kind: PluginKind,
    pub(crate) plugin: Option<(watch::Sender<bool>, JoinHandle<anyhow::Result<()>>)>,
    /// The plugin's client: its own ServiceAccount (`component_client`).
    pub(crate) plugin_client: Client,
    pub(crate) monitor: JoinHandle<anyhow::Result<()>>,
}

/// A client of the stack's API server acting as the ServiceAccount `sa` of the shipped
/// install: the scheduler and the plugins write under their own identities, so that D-4's
/// guard (applied to UPDATEs too) lets their annotation patches through and refuses a
/// user's, who is the admin here (`hami_kube_scheduler_sim::front::client_as` says why).
pub(crate) fn component_client(api_addr: SocketAddr, sa: &str) -> anyhow::Result<Client> {
    hami_kube_scheduler_sim::front::component_client(&format!("http://{api_addr}"), sa)
}

impl SimNode {
    pub(crate) fn start_plugin(&mut self) {
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
pub(crate) struct AmdPlumbing {
    pub(crate) sockets: PathBuf,
    pub(crate) hook: PathBuf,
    pub(crate) kubelet: KubeletSim,
    pub(crate) monitor_addr: SocketAddr,
    pub(crate) monitor: JoinHandle<anyhow::Result<()>>,
    pub(crate) driver: Option<NodeDriver>,
}

/// The stand-in NVML built with the workspace, linked as `libnvidia-ml.so.1`.
pub(crate) fn nvml_stand_in(workdir: &Path) -> Option<PathBuf> {
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

impl Stack {
    pub(crate) async fn kubelet(
        &self,
        name: &str,
        image_env: Option<(Vec<String>, PathBuf)>,
        node: hami_kubelet_sim::NodeConfig,
    ) -> anyhow::Result<(PathBuf, PathBuf, KubeletSim)> {
        let sockets = self.workdir.join(name).join("device-plugins");
        let hook = self.workdir.join(name).join("hook");
        std::fs::create_dir_all(&sockets)?;
        std::fs::create_dir_all(hook.join("vgpu/containers"))?;
        // Stub hooks where a node's init container installs the real ones (copied over them
        // when there are images): the plugins refuse to mount a hook that is missing. Only
        // where none is yet: a restarted kubelet-sim (the DRA node's restart fault) must not
        // put a stub over the installed hook, which ld.so would then skip in every later pod.
        for library in ["libamvgpu.so", "libvgpu.so"] {
            let path = hook.join("vgpu").join(library);
            if !path.exists() {
                std::fs::write(path, "stub hook")?;
            }
        }
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
                    cri: Default::default(),
                })
                .unwrap_or_default(),
            sync_interval_ms: 100,
        };
        let kubelet = KubeletSim::start_node(args, self.client.clone(), node).await?;
        Ok((sockets, hook, kubelet))
    }

    pub(crate) fn monitor(
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
    pub(crate) async fn amd_kubelet(
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
    pub(crate) fn amd_model(
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
    pub(crate) async fn amd_plumbing(
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

    pub(crate) async fn amd_node(&self, name: &str, tree: FixtureTree) -> anyhow::Result<SimNode> {
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
    pub(crate) async fn dra_node(&self, name: &str, tree: FixtureTree) -> anyhow::Result<DraNode> {
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

    pub(crate) async fn nvidia_node(&self, name: &str, nvml: &Path) -> anyhow::Result<SimNode> {
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
        // The monitor reads the driver model's proc-shaped tree (cuda_driver.rs): kubelet-sim's
        // own runtime makes no pod cgroups, so only the tree says which container a host pid
        // is in (the host's /proc matched no process to a pod: no hook check, issue 29).
        let proc_root = node_dir.join("proc");
        let (sockets, hook, kubelet) = self.kubelet(name, containers, Default::default()).await?;
        let (monitor_addr, monitor) =
            self.monitor(name, &hook, tree.sysfs_root(), proc_root.clone())?;
        let driver = match &self.images {
            Some(images) => {
                hami_demo::install_hook(&images.nvidia_hook, &hook, "libvgpu.so")?;
                Some(NodeDriver::Cuda(
                    hami_demo::cuda_driver::CudaDriver::start_with_tree(
                        &socket,
                        &proc_root,
                        kubelet.containers_handle(),
                    )?,
                ))
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

    pub(crate) fn create_node(
        &self,
        name: &str,
        label: Option<(&str, &str)>,
    ) -> anyhow::Result<()> {
        let mut labels = json!({"kubernetes.io/hostname": name});
        if let Some((k, v)) = label {
            labels[k] = json!(v);
        }
        self.api()
            .create_object("v1", "nodes", None, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}))
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("cannot create node {name}: {e:?}"))
    }
}
