//! Starting every component in-process and submitting the example workloads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config, RunningApiServer};
use hami_kube_scheduler_sim::SimKubeScheduler;
use hami_kubelet_sim::cri_args::RuntimeKind;
use hami_scheduler::config::Settings;
use hami_scheduler::extender_client::{ExtenderClient, Trust};
use hami_scheduler::leader::Leadership;
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use tokio::task::JoinHandle;

use crate::images::{nvml_stand_in, workload_program};
use crate::node_start::NodeDriver;
use crate::{DemoArgs, Progress};

pub use crate::images::{Images, install_hook, namespaces_work};
pub use crate::node_start::SimNode;

/// A client acting as the ServiceAccount `sa` of the shipped install: the scheduler and the
/// device plugins write under their own identities, so that the D-4 guard (which the API
/// server applies to UPDATEs as well) lets their annotation patches through and refuses a
/// user's, who is the admin here (`hami_kube_scheduler_sim::front::client_as` says why).
pub(crate) fn component_client(api: &RunningApiServer, sa: &str) -> anyhow::Result<Client> {
    hami_kube_scheduler_sim::front::component_client(&api.url(), sa)
}

/// The demo's cluster: the embedded API server and the scheduler, and per node a
/// kubelet-sim, device plugin, monitor and stand-in driver.
pub struct Cluster {
    /// The embedded API server.
    pub api: RunningApiServer,
    /// A client of it.
    pub client: Client,
    /// The scheduler behind the extender; its state feeds the readiness wait and the tables.
    pub scheduler: Arc<Scheduler>,
    /// Base URL (HTTPS, the demo's own CA) of the scheduler extender and its webhook.
    pub extender_url: String,
    /// Where the scheduler serves `/metrics`.
    pub scheduler_metrics: SocketAddr,
    /// The simulated nodes, in start order.
    pub nodes: Vec<SimNode>,
    /// The kubeconfig written for kubectl (`--kubeconfig-out`).
    pub kubeconfig: PathBuf,
    /// `--dra`: the DRA node runs and the DRA examples are submitted.
    pub dra: bool,
    pub(crate) workdir: PathBuf,
    pub(crate) background: Vec<JoinHandle<()>>,
    /// `--runtime containerd`: the private containerd the kubelets run the pods on.
    pub(crate) real: Option<crate::real_runtime::RealRuntime>,
}

/// What happened to one example file.
#[derive(Debug, Clone)]
pub enum Submitted {
    /// Created; the pod's name.
    Created { file: String, pod: String },
    /// The API server (the webhook) refused it.
    Rejected {
        file: String,
        pod: String,
        message: String,
    },
}

/// Creates one example pod through the API (so the webhook sees it as a user's pod).
async fn submit_pod(
    pods: &Api<Pod>,
    file: String,
    pod: &Pod,
    progress: &mut Progress<'_>,
) -> anyhow::Result<Submitted> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    match pods.create(&PostParams::default(), pod).await {
        Ok(_) => {
            progress.step(format!("submitted {file} (pod {name})"));
            Ok(Submitted::Created { file, pod: name })
        }
        Err(kube::Error::Api(status)) => {
            progress.step(format!(
                "{file}: rejected by the API server: {}",
                status.message
            ));
            Ok(Submitted::Rejected {
                file,
                pod: name,
                message: status.message,
            })
        }
        Err(e) => Err(anyhow::anyhow!("{file}: cannot create pod {name}: {e}")),
    }
}

impl Cluster {
    /// Starts the cluster; its pods run processes when [`workload_program`] finds one.
    pub async fn start(args: &DemoArgs, progress: &mut Progress<'_>) -> anyhow::Result<Cluster> {
        Self::start_with(args, workload_program(), progress).await
    }

    /// Starts the cluster; with `workload` (the `hami-workload` program) app containers
    /// that have a command run as processes where namespaces can be made.
    pub async fn start_with(
        args: &DemoArgs,
        workload: Option<PathBuf>,
        progress: &mut Progress<'_>,
    ) -> anyhow::Result<Cluster> {
        Self::start_on(args, workload, RuntimeKind::Unshare, progress).await
    }

    /// [`Cluster::start_with`] on `runtime`: with `containerd` a private containerd is
    /// started and the pods run in real containers (`real_runtime.rs`; the caller checked
    /// the host with [`crate::real_runtime::check`]), which needs `workload`.
    pub async fn start_on(
        args: &DemoArgs,
        workload: Option<PathBuf>,
        runtime: RuntimeKind,
        progress: &mut Progress<'_>,
    ) -> anyhow::Result<Cluster> {
        // One directory per cluster, not per process: a test binary starts several clusters, and
        // one left behind by a panicked test must not hand its sockets to the next.
        static NEXT_WORKDIR: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let workdir = std::env::temp_dir().join(format!(
            "hami-demo-{}-{}",
            std::process::id(),
            NEXT_WORKDIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&workdir)?;

        let api = match ApiServer::start(Config {
            listen: args.api_listen,
            ..Config::default()
        })
        .await
        {
            Ok(api) => api,
            Err(e) => {
                progress.step(format!(
                    "{} is busy ({e}); using a free port",
                    args.api_listen
                ));
                ApiServer::start(Config::default()).await?
            }
        };
        api.write_kubeconfig(&args.kubeconfig_out)?;
        let client = Client::try_from(kube::Config::new(api.url().parse()?))?;
        progress.step(format!(
            "embedded API server at {} (kubeconfig: {})",
            api.url(),
            args.kubeconfig_out.display()
        ));

        // The scheduler serves the extender and the webhook over TLS, as in a cluster.
        let cert = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
        ])?;
        let (cert_path, key_path) = (workdir.join("tls.crt"), workdir.join("tls.key"));
        std::fs::write(&cert_path, cert.cert.pem())?;
        std::fs::write(&key_path, cert.signing_key.serialize_pem())?;
        let settings = Settings::default();
        let scheduler = Scheduler::start(
            component_client(&api, hami_manifests::names::SCHEDULER)?,
            settings.clone(),
            Arc::new(Leadership::always()),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let extender_url = format!("https://{}", listener.local_addr()?);
        let mut background = Vec::new();
        let router = hami_scheduler::http::router(scheduler.clone());
        background.push(tokio::spawn(async move {
            if let Err(e) =
                hami_scheduler::http::serve_on(router, listener, Some((cert_path, key_path))).await
            {
                eprintln!("scheduler listener stopped: {e}");
            }
        }));
        let metrics_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let scheduler_metrics = metrics_listener.local_addr()?;
        let metrics_router = hami_scheduler::http::metrics_router(scheduler.clone());
        background.push(tokio::spawn(async move {
            let _ = hami_scheduler::http::serve_on(metrics_router, metrics_listener, None).await;
        }));
        // The webhook configuration that ships, pointed at this process.
        let webhook = crate::webhook::configuration(&extender_url, cert.cert.pem().as_bytes())?;
        api.create_object(
            "admissionregistration.k8s.io/v1",
            "mutatingwebhookconfigurations",
            None,
            webhook,
        )
        .map_err(|e| anyhow::anyhow!("cannot register the webhook: {e:?}"))?;
        progress.step(format!("scheduler extender + webhook at {extender_url} (TLS), metrics at http://{scheduler_metrics}/metrics"));
        let extender = ExtenderClient::new(&extender_url, Trust::Ca(cert.cert.pem().into_bytes()))?;
        let kube_scheduler =
            SimKubeScheduler::new(client.clone(), settings.scheduler_name.clone(), extender);
        let kube_scheduler = if args.dra {
            // Pods with ResourceClaims: kube-scheduler's own allocator (structured
            // parameters), no extender and no node lock.
            kube_scheduler.with_dra(hami_kube_scheduler_sim::dra::DraOptions::default())
        } else {
            kube_scheduler
        };
        background.push(tokio::spawn(kube_scheduler.run()));
        progress.step(if args.dra {
            "simulated kube-scheduler watching pending pods (DRA allocation on)"
        } else {
            "simulated kube-scheduler watching pending pods"
        });

        let has_workload = workload.is_some();
        let mut real = None;
        let images = if runtime == RuntimeKind::Containerd {
            let workload = workload.ok_or_else(|| {
                anyhow::anyhow!("--runtime containerd: no hami-workload program beside hami-demo (cargo build -p hami-demo builds both)")
            })?;
            let mut images = Images::prepare(&workdir, &workload)
                .map_err(|e| anyhow::anyhow!("--runtime containerd: {e}"))?;
            progress.step("building the demo's images (buildah) and starting a private containerd");
            let started = crate::real_runtime::RealRuntime::start(&workdir, &images, &workload)
                .map_err(|e| anyhow::anyhow!("--runtime containerd: {e}"))?;
            progress.step(format!(
                "containerd at {}: app containers run hami-workload in real containers (runc) from {}, the hooks mounted from the nodes' host paths",
                started.socket().display(),
                crate::real_runtime::WORKLOAD_IMAGE
            ));
            images.cri = started.cri_args();
            images.cri.kubernetes_service = Some(api.url());
            real = Some(started);
            Some(images)
        } else if let Some(workload) = workload.filter(|_| namespaces_work()) {
            match Images::prepare(&workdir, &workload) {
                Ok(images) => {
                    progress.step("app containers run hami-workload in their own PID and mount namespaces, on the stand-in HIP/CUDA runtimes under the real hooks");
                    Some(images)
                }
                Err(e) => {
                    progress.step(format!("{e}: pods run no processes"));
                    None
                }
            }
        } else if !has_workload {
            progress.step("no hami-workload program: pods run no processes");
            None
        } else {
            progress.step("cannot create PID and mount namespaces here (run as root, with util-linux's unshare): pods run no processes");
            None
        };
        let mut nodes = Vec::new();
        match nvml_stand_in(&workdir) {
            Some(driver_dir) => {
                let node = Self::start_nvidia_node(&api, &client, &workdir, &driver_dir, images.as_ref()).await?;
                progress.step(format!("node {}: {}: device plugin, kubelet and monitor running", node.name, node.description));
                nodes.push(node);
            }
            None => progress.step("no stand-in NVML library next to this binary (build the workspace to get one): skipping the NVIDIA node"),
        }
        for (name, description, tree) in [
            (
                "mi300x-node",
                "8 × AMD Instinct MI300X in CPX mode (capture topo-mi300-cpx)",
                hami_sysfs_fixtures::mi300x_cpx()?,
            ),
            (
                "mi210-node",
                "8 × AMD Instinct MI210 in two XGMI hives (capture topo-mi210-xgmi-pcie)",
                hami_sysfs_fixtures::mi210_xgmi()?,
            ),
        ] {
            nodes.push(
                Self::start_node(
                    &api,
                    &client,
                    name,
                    description,
                    tree,
                    &workdir,
                    images.as_ref(),
                )
                .await?,
            );
            progress.step(format!(
                "node {name}: {description}: device plugin, kubelet and monitor running"
            ));
        }
        if args.dra {
            crate::dra_node::create_device_class(&api)?;
            progress.step(format!(
                "DeviceClass {} created as the chart renders it",
                hami_dra_core::DRIVER
            ));
            // The cluster's default stays as configured (device-plugin): only pods that
            // ask for DRA mode are converted, so both modes run side by side.
            progress.step(format!(
                "webhook AMD mode {} by default; pods annotated {}: {} get claims from ResourceClaimTemplates the webhook makes ({}*)",
                settings.webhook.amd_mode.as_str(),
                hami_protocol::dra::AMD_MODE_ANNOTATION,
                hami_protocol::dra::AMD_MODE_DRA,
                hami_protocol::dra::CLAIM_PREFIX,
            ));
            let (name, description) = (
                "mi210-dra-node",
                "8 × AMD Instinct MI210 in two XGMI hives (capture topo-mi210-xgmi-pcie), DRA mode",
            );
            nodes.push(
                Self::start_dra_node(
                    &api,
                    &client,
                    name,
                    description,
                    hami_sysfs_fixtures::mi210_xgmi()?,
                    &workdir,
                    images.as_ref(),
                )
                .await?,
            );
            progress.step(format!(
                "node {name}: {description}: AMD DRA driver (ResourceSlices, NodePrepareResources), kubelet and monitor running"
            ));
        }
        let cluster = Cluster {
            api,
            client,
            scheduler,
            extender_url,
            scheduler_metrics,
            nodes,
            kubeconfig: args.kubeconfig_out.clone(),
            dra: args.dra,
            workdir,
            background,
            real,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let registered = {
                let state = cluster.scheduler.state();
                cluster.nodes.iter().filter(|n| !n.dra).all(|n| {
                    state
                        .node(&n.name)
                        .is_some_and(|s| !s.devices.gpus.is_empty())
                })
            };
            // A DRA node registers nothing with the scheduler: it publishes ResourceSlices.
            let mut published = true;
            for n in cluster.nodes.iter().filter(|n| n.dra) {
                published &= crate::dra_node::slices_published(&cluster.client, &n.name).await;
            }
            let registered = registered && published;
            if registered && cluster.scheduler.ready() {
                break;
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "the nodes did not register their GPUs (or publish their ResourceSlices) within 20 s"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let gpus: usize = cluster
            .nodes
            .iter()
            .map(|n| {
                cluster
                    .scheduler
                    .state()
                    .node(&n.name)
                    .map_or(0, |s| s.devices.gpus.len())
            })
            .sum();
        progress.step(format!(
            "scheduler sees {} nodes with {gpus} registered GPUs / partitions",
            cluster.nodes.iter().filter(|n| !n.dra).count()
        ));
        Ok(cluster)
    }

    /// Creates every pod of `dir` (YAML, file-name order) through the API, so the webhook
    /// sees them as a user's pods.
    pub async fn submit_examples(
        &self,
        dir: &Path,
        progress: &mut Progress<'_>,
    ) -> anyhow::Result<Vec<Submitted>> {
        // No directory: the built-in examples, written out so the hints can point at them.
        let built_in = crate::examples::is_built_in(dir);
        let dir = if built_in {
            let out = self.examples_dir(dir);
            std::fs::create_dir_all(&out)?;
            for (file, text) in crate::examples::BUILT_IN {
                std::fs::write(out.join(file), text)?;
            }
            out
        } else {
            dir.to_path_buf()
        };
        let dir = dir.as_path();
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| {
                anyhow::anyhow!("cannot read the examples directory {}: {e}", dir.display())
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            .collect();
        files.sort();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let mut submitted = Vec::new();
        for path in files {
            let file = path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            let text = std::fs::read_to_string(&path)?;
            let docs = crate::dra_node::example_documents(&file, &text)?;
            if crate::dra_examples::is_dra_example(&docs) && !self.dra {
                progress.step(if docs.templates.is_some() {
                    format!("skipped {file}: a DRA example (ResourceClaimTemplate); run with --dra")
                } else {
                    format!(
                        "skipped {file}: a DRA example ({}: {}); run with --dra",
                        hami_protocol::dra::AMD_MODE_ANNOTATION,
                        hami_protocol::dra::AMD_MODE_DRA
                    )
                });
                continue;
            }
            if let Some(templates) = docs.templates {
                crate::dra_node::create_templates(&self.client, &file, templates, progress).await?;
            }
            // With --dra some built-in examples run twice: as written (device plugin, the
            // cluster's default mode) and annotated for the webhook's DRA mode.
            let twin =
                (self.dra && built_in && crate::dra_examples::TWINS.contains(&file.as_str()))
                    .then(|| crate::dra_examples::twin(&docs.pod));
            self.provide_images(&docs.pod)?;
            submitted.push(submit_pod(&pods, file.clone(), &docs.pod, progress).await?);
            if let Some(twin) = twin {
                let file = format!("{file} (DRA mode)");
                submitted.push(submit_pod(&pods, file, &twin, progress).await?);
            }
        }
        Ok(submitted)
    }

    /// On containerd: every image `pod` names is the demo's workload image under that name.
    fn provide_images(&self, pod: &Pod) -> anyhow::Result<()> {
        let Some(real) = &self.real else {
            return Ok(());
        };
        let Some(spec) = &pod.spec else {
            return Ok(());
        };
        let init = spec.init_containers.iter().flatten();
        for c in spec.containers.iter().chain(init) {
            if let Some(image) = &c.image {
                real.provide(image).map_err(anyhow::Error::msg)?;
            }
        }
        Ok(())
    }

    /// Waits until each created pod runs or the scheduler has said why it cannot.
    pub async fn settle(
        &self,
        submitted: &[Submitted],
        limit: Duration,
        progress: &mut Progress<'_>,
    ) {
        let deadline = Instant::now() + limit;
        let names: Vec<&str> = submitted
            .iter()
            .filter_map(|s| match s {
                Submitted::Created { pod, .. } => Some(pod.as_str()),
                Submitted::Rejected { .. } => None,
            })
            .collect();
        let mut reported: BTreeMap<String, &'static str> = BTreeMap::new();
        loop {
            let (running, unschedulable) = self.pod_states(&names).await;
            for name in &running {
                if reported.insert(name.clone(), "running").is_none() {
                    progress.step(format!("pod {name} is Running"));
                }
            }
            for (name, why) in &unschedulable {
                if reported.insert(name.clone(), "unschedulable").is_none() {
                    progress.step(format!("pod {name} cannot be scheduled: {why}"));
                }
            }
            if running.len() + unschedulable.len() >= names.len() {
                return;
            }
            if Instant::now() > deadline {
                progress.step("some pods have not settled yet; showing the current state");
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Running pods, and pods the scheduler refused with its reason.
    pub async fn pod_states(&self, names: &[&str]) -> (Vec<String>, BTreeMap<String, String>) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let list = pods
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let running = list
            .iter()
            .filter(|p| names.contains(&p.metadata.name.as_deref().unwrap_or("")))
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        (running, self.scheduling_failures(names).await)
    }

    /// The scheduler's `FilteringFailed` reasons, per pod.
    pub async fn scheduling_failures(&self, names: &[&str]) -> BTreeMap<String, String> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        let list = events
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let mut out = BTreeMap::new();
        for e in list {
            let pod = e
                .regarding
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_default();
            if e.reason.as_deref() == Some("FilteringFailed") && names.contains(&pod.as_str()) {
                out.insert(pod, e.note.unwrap_or_default());
            }
        }
        out
    }

    /// Where the submitted examples are: `--examples DIR`, else the built-in ones written
    /// into the demo's work directory.
    pub fn examples_dir(&self, given: &Path) -> PathBuf {
        if crate::examples::is_built_in(given) {
            self.workdir.join("examples")
        } else {
            given.to_path_buf()
        }
    }

    /// The "Try it" text printed once the demo is up: kubectl commands and every endpoint.
    pub fn hints(&self, args: &DemoArgs) -> String {
        let kc = self.kubeconfig.display();
        let mut text = String::new();
        text.push_str("\nTry it:\n");
        text.push_str(&format!("  export KUBECONFIG={kc}\n"));
        text.push_str("  kubectl get nodes,pods -o wide\n");
        text.push_str("  kubectl get pod share-a -o yaml | hami inspect pod -      # what each container asked for and got\n");
        text.push_str("  kubectl get node mi210-node -o yaml | hami inspect node -  # the GPUs a node registered\n");
        text.push_str("  kubectl describe pod cannot-fit                          # the scheduler's events say why it waits\n");
        text.push_str(&format!(
            "  sed 's/share-a/share-c/' {}/01-share-a.yaml | kubectl create -f -   # submit your own pods\n",
            self.examples_dir(&args.examples).display()
        ));
        if self.dra {
            text.push_str("  kubectl get resourceslices,resourceclaims -o wide         # the DRA node's devices and the claims allocated from them\n");
            text.push_str("  kubectl get resourceclaims -o yaml                        # status.devices: the CU ranges the driver chose\n");
            text.push_str(&format!(
                "  kubectl get resourceclaimtemplates -l {}={} -o yaml   # what the webhook made of dra-hami-api's amd.com/* limits\n",
                hami_protocol::dra::MANAGED_BY_LABEL,
                hami_protocol::dra::MANAGED_BY_WEBHOOK
            ));
        }
        text.push_str(&format!("API server: {}\n", self.api.url()));
        text.push_str(&format!(
            "Scheduler metrics: http://{}/metrics\n",
            self.scheduler_metrics
        ));
        for node in &self.nodes {
            text.push_str(&format!(
                "Monitor of {}: http://{}/metrics   container logs: {}\n",
                node.name,
                node.monitor_addr,
                node.record_dir.display()
            ));
        }
        let monitors: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("--monitor http://{}/metrics", n.monitor_addr))
            .collect();
        text.push_str(&format!(
            "Live per-pod memory and utilization: hami status --kubeconfig {kc} {}\n",
            monitors.join(" ")
        ));
        text
    }

    /// Stops every node's plugin, monitor, kubelet and driver, then the background tasks and
    /// the API server, and removes the work directory.
    pub async fn shutdown(self) {
        for node in self.nodes {
            let _ = node.plugin_stop.send(true);
            let _ = node.plugin.await;
            node.monitor.abort();
            node.kubelet.shutdown().await;
            match &node.driver {
                Some(NodeDriver::Amd(d)) => d.stop(),
                Some(NodeDriver::Cuda(d)) => d.stop(),
                None => {}
            }
        }
        if let Some(real) = &self.real {
            real.stop();
        }
        for task in self.background {
            task.abort();
        }
        self.api.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}
