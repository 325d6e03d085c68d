//! The stack's DRA node: an MI210 XGMI node (the KFD capture) served by the real AMD DRA
//! driver as `hami demo --dra` runs it (`hami_demo::dra_node::spawn_driver`: registration and
//! DRA sockets, NodePrepareResources, CDI specs, checkpoint, ResourceSlices, dmem), with
//! kubelet-sim's DRA side and a monitor.
//!
//! The driver runs on a tokio runtime of its own, so that it can be killed as a process is:
//! [`DraNode::kill_driver`] drops the runtime with every task of the driver in it (the gRPC
//! servers, the slice publisher, the dmem writer, its API connections) at their next await,
//! and none of its shutdown code runs: its sockets stay behind as stale files and what it
//! prepared is what its checkpoint on disk says. A restart builds a new driver from that
//! checkpoint, as a new process would.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hami_amdgpu_dra_plugin::checkpoint::Checkpoint;
use hami_demo::dra_node::{DraPaths, spawn_driver};
use hami_kubelet_sim::KubeletSim;
use hami_kubelet_sim::container_runtime::ContainerRecord;
use hami_kubelet_sim::dra_state::DraState;
use hami_sysfs_fixtures::FixtureTree;
use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::sim_node::NodeDriver;

/// The two checkpoints of the DRA node, readable while the node runs: kubelet-sim's is
/// replaced by rename (a reader sees a whole old or a whole new one); the driver's is a
/// snapshot and its journal, which `Checkpoint::load` reads as a restart would (a torn last
/// record dropped, read again across a compaction).
#[derive(Debug, Clone)]
pub struct DraFiles {
    /// The driver's `checkpoint.json` (its journal beside it).
    pub driver: PathBuf,
    /// kubelet-sim's `dra_manager_state`.
    pub kubelet: PathBuf,
}

impl DraFiles {
    /// What the driver has prepared (what a restart resumes from).
    pub fn driver_checkpoint(&self) -> Result<Checkpoint, String> {
        Checkpoint::load(&self.driver).map_err(|e| e.to_string())
    }

    /// What kubelet-sim has prepared (none yet = empty).
    pub fn kubelet_checkpoint(&self) -> Result<DraState, String> {
        match std::fs::read_to_string(&self.kubelet) {
            Ok(text) => DraState::decode(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DraState::default()),
            Err(e) => Err(format!("{}: {e}", self.kubelet.display())),
        }
    }
}

/// The driver's own runtime and its stop signal (a SIGTERM).
struct DriverProcess {
    runtime: tokio::runtime::Runtime,
    stop: watch::Sender<bool>,
    task: JoinHandle<anyhow::Result<()>>,
}

/// The DRA node of the stack (see the module doc).
pub struct DraNode {
    /// The node's name in the cluster (also its ResourceSlice pool).
    pub name: String,
    /// The node's fixture sysfs tree.
    pub tree: FixtureTree,
    /// The node's kubelet stand-in, with its DRA side (`None` while its restart fault has
    /// it down).
    pub kubelet: Option<KubeletSim>,
    /// Where the node's monitor serves its metrics.
    pub monitor_addr: SocketAddr,
    /// The driver's and kubelet-sim's sockets, checkpoints and CDI directory.
    pub paths: DraPaths,
    pub(crate) hook: PathBuf,
    pub(crate) monitor: JoinHandle<anyhow::Result<()>>,
    pub(crate) model: Option<NodeDriver>,
    pub(crate) api_url: String,
    driver: Option<DriverProcess>,
}

impl DraNode {
    pub(crate) fn new(
        name: String,
        tree: FixtureTree,
        kubelet: Option<KubeletSim>,
        parts: (SocketAddr, JoinHandle<anyhow::Result<()>>, PathBuf),
        paths: DraPaths,
        model: Option<NodeDriver>,
        api_url: String,
    ) -> Self {
        let (monitor_addr, monitor, hook) = parts;
        Self {
            name,
            tree,
            kubelet,
            monitor_addr,
            paths,
            hook,
            monitor,
            model,
            api_url,
            driver: None,
        }
    }

    /// Starts the driver (first start, or after a kill) from the checkpoint on disk.
    pub fn start_driver(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.driver.is_none(), "the DRA driver already runs");
        let config = kube::Config::new(self.api_url.parse()?);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dra-driver")
            .enable_all()
            .build()?;
        let (stop, rx) = watch::channel(false);
        let spawned = {
            let _inside = runtime.enter();
            // Its own client: connections made on the caller's runtime would outlive a kill.
            config
                .try_into()
                .map_err(anyhow::Error::from)
                .and_then(|client: Client| {
                    spawn_driver(client, &self.name, &self.tree, &self.hook, &self.paths, rx)
                })
        };
        let task = match spawned {
            Ok(t) => t,
            Err(e) => {
                // Dropping a runtime would block this async caller.
                runtime.shutdown_background();
                return Err(e);
            }
        };
        self.driver = Some(DriverProcess {
            runtime,
            stop,
            task,
        });
        Ok(())
    }

    /// Kills the driver (see the module doc); false if it was not running.
    pub fn kill_driver(&mut self) -> bool {
        match self.driver.take() {
            Some(d) => {
                d.runtime.shutdown_background();
                true
            }
            None => false,
        }
    }

    /// Whether the driver runs and its task has not ended (it ends only on an error).
    pub fn driver_running(&self) -> bool {
        self.driver.as_ref().is_some_and(|d| !d.task.is_finished())
    }

    /// The node's checkpoint files.
    pub fn files(&self) -> DraFiles {
        DraFiles {
            // Where `spawn_driver` keeps it.
            driver: self.paths.plugin_dir.join("checkpoint.json"),
            kubelet: self.paths.kubelet_state.clone(),
        }
    }

    /// The node's containers as kubelet-sim last published them.
    pub fn containers(&self) -> Vec<ContainerRecord> {
        self.kubelet
            .as_ref()
            .map_or_else(Vec::new, KubeletSim::containers)
    }

    /// Stops the driver as a SIGTERM would (it unregisters), then the rest of the node.
    pub async fn shutdown(mut self) {
        if let Some(d) = self.driver.take() {
            let _ = d.stop.send(true);
            let mut task = d.task;
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut task).await;
            d.runtime.shutdown_background();
        }
        self.monitor.abort();
        if let Some(k) = self.kubelet.take() {
            k.shutdown().await;
        }
        if let Some(m) = &self.model {
            m.stop();
        }
    }
}
