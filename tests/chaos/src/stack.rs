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

use hami_apiserver::{ApiServer, Config, RunningApiServer};
use hami_demo::Images;
use hami_kube_scheduler_sim::SimKubeScheduler;
use hami_scheduler::config::Settings;
use hami_scheduler::extender_client::{ExtenderClient, Trust};
use hami_scheduler::leader::{ElectionConfig, Leadership, SkewedClock};
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::jiff::SignedDuration;
use kube::Client;
use tokio::task::JoinHandle;

use crate::dra_node::DraNode;
use crate::proxy::{self, Backends};

use crate::sim_node::*;

pub use crate::sim_node::SimNode;

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
    pub(crate) backends: Backends,
    pub(crate) cert_paths: (PathBuf, PathBuf),
    pub(crate) background: Vec<JoinHandle<()>>,
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
