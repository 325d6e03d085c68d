//! Starting one simulated node of the demo's cluster: the Node object, the kubelet's
//! device-plugin directory and simulated kubelet, the host hook directory and the monitor
//! (what every node has), then its vendor's part — the AMD device plugin on a KFD capture,
//! the AMD DRA driver (`--dra`), or the NVIDIA device plugin on the stand-in NVML.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use hami_apiserver::RunningApiServer;
use hami_kubelet_sim::KubeletSim;
use hami_kubelet_sim::cri_args::{CriArgs, RuntimeKind};
use hami_sysfs_fixtures::FixtureTree;
use kube::Client;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster::{Cluster, component_client};
use crate::images::{Images, install_hook};

/// A simulated GPU node: its sysfs tree, kubelet, plugin, monitor and (with containers)
/// the kernel side of its stand-in driver.
pub struct SimNode {
    /// The Node object's name.
    pub name: String,
    /// What the tables say about its GPUs.
    pub description: String,
    /// Its sysfs/dev tree (and, on the DRA node, its cgroup tree).
    pub tree: FixtureTree,
    /// Its simulated kubelet.
    pub kubelet: KubeletSim,
    /// Whether the AMD DRA driver serves this node (`--dra`) instead of a device plugin.
    pub dra: bool,
    /// Container logs (`<ns>_<pod>_<container>.log`) and allocation records.
    pub record_dir: PathBuf,
    pub(crate) driver: Option<NodeDriver>,
    pub(crate) plugin_stop: watch::Sender<bool>,
    pub(crate) plugin: JoinHandle<anyhow::Result<()>>,
    /// Where its monitor serves `/metrics`.
    pub monitor_addr: SocketAddr,
    pub(crate) monitor: JoinHandle<anyhow::Result<()>>,
}

/// The kernel side of a node's stand-in driver.
pub(crate) enum NodeDriver {
    Amd(crate::amdgpu_driver::AmdgpuDriver),
    Cuda(crate::cuda_driver::CudaDriver),
}

/// How a node's containers run: the "image" (the host's files plus the stand-in runtime's
/// library directory, the workload program on PATH, the stand-in hardware's settings).
pub(crate) struct NodeContainers {
    pub(crate) image_env: Vec<String>,
    pub(crate) dev_root: PathBuf,
    /// Which runtime: kubelet-sim's own, or containerd (`--runtime containerd`).
    pub(crate) cri: CriArgs,
}

/// Whether `images` run the pods on containerd (`--runtime containerd`).
fn on_containerd(images: Option<&Images>) -> bool {
    images.is_some_and(|i| i.cri.kind == RuntimeKind::Containerd)
}

/// The node's `/dev` as the kubelet hands it to the runtime: the fixture's, or on
/// containerd stand-in character devices made from it under the node's directory.
fn kubelet_dev_root(images: &Images, fixture: &Path, node_dir: &Path) -> anyhow::Result<PathBuf> {
    if images.cri.kind == RuntimeKind::Containerd {
        crate::real_runtime::stand_in_dev(fixture, &node_dir.join("dev"))
            .map_err(anyhow::Error::msg)
    } else {
        Ok(fixture.to_path_buf())
    }
}

/// The vendor-independent parts of a simulated node, before its plugin starts.
pub(crate) struct NodePlumbing {
    pub(crate) sockets: PathBuf,
    pub(crate) hook_path: PathBuf,
    pub(crate) record_dir: PathBuf,
    pub(crate) kubelet: KubeletSim,
    pub(crate) monitor_addr: SocketAddr,
    pub(crate) monitor: JoinHandle<anyhow::Result<()>>,
}

impl NodePlumbing {
    pub(crate) fn into_node(
        self,
        name: &str,
        description: &str,
        tree: FixtureTree,
        plugin_stop: watch::Sender<bool>,
        plugin: JoinHandle<anyhow::Result<()>>,
    ) -> SimNode {
        SimNode {
            name: name.into(),
            description: description.into(),
            tree,
            kubelet: self.kubelet,
            dra: false,
            record_dir: self.record_dir,
            driver: None,
            plugin_stop,
            plugin,
            monitor_addr: self.monitor_addr,
            monitor: self.monitor,
        }
    }
}

/// What a node's monitor reads of its host.
pub(crate) struct MonitorHost {
    pub(crate) sys_root: PathBuf,
    pub(crate) proc_root: PathBuf,
    /// NVML for the NVIDIA host metrics (`hami_host_gpu_*`); None on AMD nodes.
    pub(crate) nvml_library: Option<String>,
}

impl Cluster {
    /// What every simulated node has whatever its vendor: the Node object, the kubelet's
    /// device-plugin directory and simulated kubelet, the host hook directory, the monitor.
    pub(crate) async fn node_plumbing(
        api: &RunningApiServer,
        client: &Client,
        name: &str,
        workdir: &Path,
        host: MonitorHost,
        containers: Option<NodeContainers>,
        dra: Option<hami_kubelet_sim::dra_manager::DraConfig>,
    ) -> anyhow::Result<NodePlumbing> {
        let MonitorHost {
            sys_root,
            proc_root,
            nvml_library,
        } = host;
        let mut labels = json!({"kubernetes.io/hostname": name});
        if dra.is_some() {
            // One mode per node (KEP-5004): the chart runs the DRA driver only here.
            labels[hami_manifests::names::AMD_MODE_LABEL] =
                json!(hami_manifests::names::AMD_MODE_DRA);
        }
        api.create_object("v1", "nodes", None, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}))
            .map_err(|e| anyhow::anyhow!("cannot create node {name}: {e:?}"))?;
        let sockets = workdir.join(name).join("device-plugins");
        let hook_path = workdir.join(name).join("hook");
        let record_dir = workdir.join(name).join("pods");
        std::fs::create_dir_all(&sockets)?;
        std::fs::create_dir_all(hook_path.join("vgpu/containers"))?;
        // Stub hooks where a node's init container installs the real ones (copied over them
        // when there are images): the plugins refuse to mount a hook that is missing.
        for hook in ["libamvgpu.so", "libvgpu.so"] {
            std::fs::write(hook_path.join("vgpu").join(hook), "stub hook")?;
        }
        std::fs::create_dir_all(&proc_root)?;
        let run_containers = containers.is_some();
        let runtime = containers
            .map(|c| hami_kubelet_sim::container_runtime::RuntimeArgs {
                dev_root: c.dev_root,
                image_env: c.image_env,
                state_dir: Some(workdir.join(name).join("containers")),
                cri: c.cri,
            })
            .unwrap_or_default();
        let kubelet_args = hami_kubelet_sim::Args {
            socket_dir: sockets.clone(),
            node_name: name.into(),
            record_dir: Some(record_dir.clone()),
            run_containers,
            runtime,
            sync_interval_ms: 100,
        };
        // The DRA node's kubelet makes its pods' cgroups, in which the driver sets dmem.
        let cgroups = match &dra {
            Some(_) => Some(crate::dra_node::node_cgroups(&sys_root)?),
            None => None,
        };
        let kubelet = KubeletSim::start_node(
            kubelet_args,
            client.clone(),
            hami_kubelet_sim::NodeConfig { dra, cgroups },
        )
        .await?;
        let monitor_addr = hami_local_ports::free_local_addr();
        let config = hami_monitor::server::ServeConfig {
            monitor: hami_monitor::node_monitor::MonitorConfig {
                // The plugin's `$HOST_HOOK_PATH/vgpu` is the monitor's `$HOOK_PATH`.
                hook_path: hook_path.join("vgpu"),
                proc_root,
                sys_root,
                node_name: name.into(),
                gc_grace: Duration::from_secs(60),
                nvml_library,
            },
            bind: monitor_addr,
            legacy_metrics: hami_monitor::metrics::LegacyMetrics::Seed,
            scheduler_name: hami_protocol::names::DEFAULT_SCHEDULER_NAME.into(),
            refresh_interval: Duration::from_secs(2),
        };
        let monitor = tokio::spawn(hami_monitor::server::serve(
            config,
            client.clone(),
            std::future::pending(),
        ));
        Ok(NodePlumbing {
            sockets,
            hook_path,
            record_dir,
            kubelet,
            monitor_addr,
            monitor,
        })
    }

    /// An AMD node's plumbing (kubelet-sim with `dra` when given, monitor) and, with
    /// containers, its stand-in driver's kernel side with the hook installed.
    pub(crate) async fn amd_plumbing(
        api: &RunningApiServer,
        client: &Client,
        name: &str,
        tree: &FixtureTree,
        workdir: &Path,
        images: Option<&Images>,
        dra: Option<hami_kubelet_sim::dra_manager::DraConfig>,
    ) -> anyhow::Result<(NodePlumbing, Option<NodeDriver>)> {
        let node_dir = workdir.join(name);
        // The monitor reads the driver model's proc-shaped tree (amdgpu_driver.rs).
        let proc_root = node_dir.join("proc");
        let socket = node_dir.join("amdgpu.sock");
        let containers = match images {
            Some(images) => {
                let first = crate::amdgpu_driver::first_device(&tree.sysfs_root());
                let mut image_env = vec![
                    images.path(),
                    format!("LD_LIBRARY_PATH={}", images.amd_lib.display()),
                    format!("FAKE_AMDGPU_DRIVER_SOCKET={}", socket.display()),
                ];
                if let Some((mem, cus)) = first {
                    image_env.push(format!("FAKE_HIP_DEVICE_MEMORY={mem}"));
                    image_env.push(format!("FAKE_HIP_CU_COUNT={cus}"));
                }
                Some(NodeContainers {
                    image_env,
                    dev_root: kubelet_dev_root(images, &tree.dev_root(), &node_dir)?,
                    cri: images.cri.clone(),
                })
            }
            None => None,
        };
        let base = Self::node_plumbing(
            api,
            client,
            name,
            workdir,
            MonitorHost {
                sys_root: tree.sysfs_root(),
                proc_root: proc_root.clone(),
                nvml_library: None,
            },
            containers,
            dra,
        )
        .await?;
        let driver = match images {
            // A container cannot reach the driver's socket: no kernel side on containerd.
            Some(images) if on_containerd(Some(images)) => {
                install_hook(&images.amd_hook, &base.hook_path, "libamvgpu.so")?;
                None
            }
            Some(images) => {
                install_hook(&images.amd_hook, &base.hook_path, "libamvgpu.so")?;
                Some(NodeDriver::Amd(crate::amdgpu_driver::AmdgpuDriver::start(
                    &socket,
                    &proc_root,
                    &tree.sysfs_root(),
                    base.kubelet.containers_handle(),
                )?))
            }
            None => None,
        };
        Ok((base, driver))
    }

    /// An AMD node from a sysfs tree served by the real AMD DRA driver (no device plugin):
    /// kubelet-sim with its DRA side, the driver's registration and DRA sockets, its
    /// ResourceSlices, CDI specs and checkpoint under the node's directory.
    pub(crate) async fn start_dra_node(
        api: &RunningApiServer,
        client: &Client,
        name: &str,
        description: &str,
        tree: FixtureTree,
        workdir: &Path,
        images: Option<&Images>,
    ) -> anyhow::Result<SimNode> {
        let paths = crate::dra_node::DraPaths::new(&workdir.join(name));
        let (base, driver) = Self::amd_plumbing(
            api,
            client,
            name,
            &tree,
            workdir,
            images,
            Some(paths.kubelet()),
        )
        .await?;
        let (plugin_stop, stop_rx) = watch::channel(false);
        let plugin = crate::dra_node::spawn_driver(
            client.clone(),
            name,
            &tree,
            &base.hook_path,
            &paths,
            stop_rx,
        )?;
        let mut node = base.into_node(name, description, tree, plugin_stop, plugin);
        node.driver = driver;
        node.dra = true;
        Ok(node)
    }

    /// An AMD node from a sysfs tree, with the real AMD device plugin.
    pub(crate) async fn start_node(
        api: &RunningApiServer,
        client: &Client,
        name: &str,
        description: &str,
        tree: FixtureTree,
        workdir: &Path,
        images: Option<&Images>,
    ) -> anyhow::Result<SimNode> {
        let (base, driver) =
            Self::amd_plumbing(api, client, name, &tree, workdir, images, None).await?;
        let mut args = hami_amd_plugin::cli::Args::parse_from(["k8s-device-plugin"]);
        args.sysfs_root = tree.sysfs_root();
        args.dev_root = tree.dev_root();
        args.device_plugin_dir = base.sockets.clone();
        args.node_name = Some(name.into());
        args.register_interval = 2;
        args.pulse = 5;
        args.host_hook_path = base.hook_path.clone();
        args.cgroup_root = tree.sysfs_root().join("fs/cgroup");
        let settings = args
            .registration_settings()
            .map_err(|e| anyhow::anyhow!(e))?;
        let (plugin_stop, stop_rx) = watch::channel(false);
        let plugin = tokio::spawn(hami_amd_plugin::plugin::serve(
            args,
            settings,
            component_client(api, hami_manifests::names::DEVICE_PLUGIN)?,
            stop_rx,
        ));
        let mut node = base.into_node(name, description, tree, plugin_stop, plugin);
        node.driver = driver;
        Ok(node)
    }

    /// An NVIDIA node whose driver is the workspace's stand-in NVML (one 16 GiB GPU).
    pub(crate) async fn start_nvidia_node(
        api: &RunningApiServer,
        client: &Client,
        workdir: &Path,
        driver_dir: &Path,
        images: Option<&Images>,
    ) -> anyhow::Result<SimNode> {
        let name = "nvidia-node";
        let tree = FixtureTree::empty()?;
        let node_dir = workdir.join(name);
        let socket = node_dir.join("nvidia.sock");
        let containers = match images {
            Some(images) => Some(NodeContainers {
                dev_root: kubelet_dev_root(images, &tree.dev_root(), &node_dir)?,
                cri: images.cri.clone(),
                image_env: vec![
                    images.path(),
                    format!("LD_LIBRARY_PATH={}", images.nvidia_lib.display()),
                    "FAKE_CUDA_DEVICE_COUNT=1".into(),
                    "FAKE_CUDA_DEVICE_MEMORY=16g".into(),
                    format!(
                        "FAKE_CUDA_SHARED_STATE={}",
                        node_dir.join("cuda-devices.state").display()
                    ),
                    format!("FAKE_CUDA_DRIVER_SOCKET={}", socket.display()),
                ],
            }),
            None => None,
        };
        // kubelet-sim's own runtime: the driver model's proc-shaped tree (cuda_driver.rs),
        // which says which container each of its processes is in. On containerd, the
        // host's /proc: runc put each process in its pod's cgroup.
        let proc_root = match images {
            Some(images) if !on_containerd(Some(images)) => node_dir.join("proc"),
            _ => PathBuf::from("/proc"),
        };
        let base = Self::node_plumbing(
            api,
            client,
            name,
            workdir,
            MonitorHost {
                sys_root: tree.sysfs_root(),
                proc_root: proc_root.clone(),
                // The stand-in driver's NVML, as the plugin loads it: hami_host_gpu_* for
                // the NVIDIA GPU, which the dashboard's host panels show.
                nvml_library: Some(driver_dir.join("libnvidia-ml.so.1").display().to_string()),
            },
            containers,
            None,
        )
        .await?;
        let driver = match images {
            Some(images) if on_containerd(Some(images)) => {
                install_hook(&images.nvidia_hook, &base.hook_path, "libvgpu.so")?;
                None
            }
            Some(images) => {
                install_hook(&images.nvidia_hook, &base.hook_path, "libvgpu.so")?;
                Some(NodeDriver::Cuda(
                    crate::cuda_driver::CudaDriver::start_with_tree(
                        &socket,
                        &proc_root,
                        base.kubelet.containers_handle(),
                    )?,
                ))
            }
            None => None,
        };
        let mut args = hami_nvidia_plugin::cli::Args::parse_from(["nvidia-device-plugin"]);
        args.nvml_library = driver_dir.join("libnvidia-ml.so.1").display().to_string();
        args.device_plugin_dir = base.sockets.clone();
        args.node_name = Some(name.into());
        args.hook_path = base.hook_path.clone();
        args.register_interval = 2;
        args.pulse = 5;
        let settings = args.settings().map_err(|e| anyhow::anyhow!(e))?;
        let (plugin_stop, stop_rx) = watch::channel(false);
        let plugin = tokio::spawn(hami_nvidia_plugin::plugin::serve(
            args,
            settings,
            component_client(api, hami_manifests::names::NVIDIA_DEVICE_PLUGIN)?,
            stop_rx,
        ));
        let description = "1 × NVIDIA GPU from the stand-in driver (16 GiB)";
        let mut node = base.into_node(name, description, tree, plugin_stop, plugin);
        node.driver = driver;
        Ok(node)
    }
}
