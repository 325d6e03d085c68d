//! The chart's node agents in their images on the real runtime (issue 29 items 3 and 4):
//! the AMD device plugin's, the monitor's and the node labeller's DaemonSets exactly as
//! `hami manifests --registry localhost --tag dev` renders them (`hami_manifests::objects`,
//! never a copy of the YAML), run by kubelet-sim on containerd + runc from the node image
//! `scripts/build-images.sh` builds (`images.rs`: once per test process, from the dev build).
//!
//! Only the node's paths differ from a real node, and only as hostPath sources: `/sys` is a
//! captured sysfs (`hami_sysfs_fixtures`, one RX 7900 XTX), `/dev` the node's stand-in
//! device nodes (the numbers sysfs gives them; kubelet-sim's `--dev-root`), and
//! `/var/lib/kubelet/device-plugins` kubelet-sim's socket directory. The hook's host
//! directory is the chart's value `devicePlugin.hostHookPath`, set to a scratch directory;
//! `/sys/fs/cgroup` is the host's, as the chart mounts it.
//!
//! There is no DaemonSet controller, and the stand-in API server does not serve apps/v1:
//! the test keeps the DaemonSet and makes its pod as kube-controller-manager does
//! (`daemon_pod::pod_for`: the template, an owner reference, the node pinned by affinity,
//! the controller's tolerations), bound as the default scheduler would bind it. The API
//! server serves HTTPS with RBAC on, holds the chart's ServiceAccounts, roles and bindings,
//! and injects each pod's `kube-api-access` volume (`Config::service_accounts`); kubelet-sim
//! writes its token (TokenRequest) and CA and gives containers `KUBERNETES_SERVICE_HOST` and
//! `_PORT`: the agents run on in-cluster credentials only.
//!
//! Checked: the init container installs the hook into the host directory (the node
//! image's bytes, mode 0555); the plugin registers with kubelet-sim over the mounted
//! socket and publishes its node annotation as its ServiceAccount, nothing refused; a
//! sliced pod of the workload image as uid 1000 is allocated by the containerized plugin
//! and stops at its limit under the hook the init container installed; the monitor
//! (host PID namespace, SYS_PTRACE only) reports its device memory and limit on the
//! chart's port, the labeller labels the node; the labeller's and the monitor's containers
//! end with exit 0 on SIGTERM alone, as kubelet stops them; then the plugin's container is
//! killed (SIGKILL of its process): kubelet-sim restarts it as kubelet does, the sliced pod
//! keeps running untouched, the plugin registers again and the next pod gets the other CUs
//! (nothing allocated twice).

mod daemon_pod;
mod images;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hami_apiserver::authn::AuthConfig;
use hami_apiserver::{ApiServer, Config, RunningApiServer};
use hami_containerd_host::shared::Shared;
use hami_kubelet_sim::KubeletSim;
use hami_manifests::{Object, Settings, names, objects};
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::names::{AMD, pod as pod_keys};
use hami_sysfs_fixtures::FixtureTree;
use hami_system_tests::{
    SIM_KUBELET, client_for, cluster_admin_for, create_node, refused, requests_of,
    service_account_user, to_values,
};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

use super::{NODE, TIMEOUT, containerd};

/// One test's node: the API server, kubelet-sim on the shared containerd, the trees.
struct AgentNode {
    server: RunningApiServer,
    /// The test's own identity (the server's admin), for what a user or a controller does.
    admin: kube::Client,
    sim: Option<KubeletSim>,
    settings: Settings,
    /// Scratch: `out/` (what containers write), `dev/`, `hook/`, `device-plugins/`.
    dir: PathBuf,
    tree: FixtureTree,
}

/// The node's `/dev`: a character device for each of the capture's device files, with the
/// numbers the kernel gives them (render and card nodes DRM's 226:minor, as the plugin's
/// health check expects; `/dev/kfd` a dynamic major, 240 here).
fn node_dev(tree: &FixtureTree, to: &Path) -> Result<(), String> {
    let mut nodes = vec![(to.join("kfd"), (240, 0))];
    let dri = tree.dev_root().join("dri");
    for entry in std::fs::read_dir(&dri).map_err(|e| format!("{}: {e}", dri.display()))? {
        let name = entry.map_err(|e| e.to_string())?.file_name();
        let name = name.to_string_lossy().into_owned();
        let minor = name
            .strip_prefix("renderD")
            .or_else(|| name.strip_prefix("card"))
            .and_then(|n| n.parse::<u32>().ok())
            .ok_or_else(|| format!("unexpected /dev/dri/{name} in the capture"))?;
        nodes.push((to.join("dri").join(&name), (226, minor)));
    }
    for (node, (major, minor)) in nodes {
        if let Some(dir) = node.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let made = std::process::Command::new("mknod")
            .args(["-m", "0666"])
            .arg(&node)
            .args(["c", &major.to_string(), &minor.to_string()])
            .status()
            .map_err(|e| format!("mknod: {e}"))?;
        if !made.success() {
            return Err(format!("mknod {} failed", node.display()));
        }
    }
    Ok(())
}

/// The chart's values for this node: the images `build-images.sh` names, the hook's host
/// directory in the scratch tree.
fn settings(hook_root: &Path) -> Settings {
    let mut s = Settings::default();
    s.values.images.registry = images::REGISTRY.into();
    s.values.images.tag = images::TAG.into();
    let hook = hook_root.display().to_string();
    s.values.device_plugin.host_hook_path = hook.clone();
    s.values.nvidia_device_plugin.host_hook_path = hook;
    s
}

impl AgentNode {
    async fn start(shared: &Shared, test: &str) -> Result<Self, String> {
        use std::os::unix::fs::PermissionsExt;
        // The script runs for half a minute: off this runtime's worker.
        tokio::task::block_in_place(|| images::node_and_workload(shared))?;
        let dir = std::env::temp_dir().join(format!("sys-agents-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = dir.join("out");
        std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        // Containers run as uid 1000.
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| e.to_string())?;
        let tree = hami_sysfs_fixtures::rdna_node(&[hami_sysfs_fixtures::Rdna::Gfx11])
            .map_err(|e| e.to_string())?;
        // A booted node's /sys has fs/cgroup (the chart mounts the host's cgroups there; a
        // read-only /sys mount cannot get the mount point made in it).
        std::fs::create_dir_all(tree.sysfs_root().join("fs/cgroup")).map_err(|e| e.to_string())?;
        node_dev(&tree, &dir.join("dev"))?;
        let settings = settings(&dir.join("hook"));

        let _ = rustls::crypto::ring::default_provider().install_default();
        let server = ApiServer::start(Config {
            auth: Some(AuthConfig::default()),
            tls: true,
            service_accounts: true,
            ..Config::default()
        })
        .await
        .map_err(|e| format!("cannot start the API server: {e}"))?;
        for ns in [settings.namespace.as_str(), "default", "kube-system"] {
            let _ = server.create_object(
                "v1",
                "namespaces",
                None,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            );
        }
        let mut rbac = to_values(&objects::rbac_objects(&settings));
        rbac.extend(cluster_admin_for(SIM_KUBELET));
        for v in rbac {
            server
                .create_object(
                    v["apiVersion"].as_str().unwrap_or_default(),
                    hami_system_tests::plural(v["kind"].as_str().unwrap_or_default()),
                    v["metadata"]["namespace"].as_str(),
                    v.clone(),
                )
                .map_err(|e| format!("cannot create {}: {e:?}", v["metadata"]["name"]))?;
        }
        create_node(&server, NODE);
        let admin = hami_system_tests::admin_client(&server).await;
        let kubelet = client_for(&server, "kube-system", SIM_KUBELET).await;

        let sim = super::start_kubelet_sim(
            &dir,
            &shared.socket,
            &shared.archives.join("node-agents"),
            Some(server.url()),
            kubelet,
        )
        .await?;
        Ok(Self {
            server,
            admin,
            sim: Some(sim),
            settings,
            dir,
            tree,
        })
    }

    fn sim(&self) -> Result<&KubeletSim, String> {
        self.sim
            .as_ref()
            .ok_or_else(|| "kubelet-sim stopped".into())
    }

    /// Applies a DaemonSet of `hami manifests` with its node paths pointed at this node's
    /// trees, and creates its pod as the DaemonSet controller would: the pod's name.
    async fn run_daemon_set(&self, rendered: Object) -> Result<String, String> {
        let mut ds = rendered.to_value().map_err(|e| e.to_string())?;
        let paths = [
            ("sys", self.tree.sysfs_root()),
            ("dev", self.dir.join("dev")),
            ("device-plugins", self.dir.join("device-plugins")),
        ];
        for (volume, path) in &paths {
            if ds["spec"]["template"]["spec"]["volumes"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v["name"] == *volume))
            {
                daemon_pod::redirect(&mut ds, volume, path)?;
            }
        }
        let ns = ds["metadata"]["namespace"]
            .as_str()
            .ok_or("the DaemonSet has no namespace")?
            .to_owned();
        // The stand-in API server does not serve apps/v1: the DaemonSet stays the test's,
        // with a uid and the generation the server would have given it.
        static DAEMON_SETS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = DAEMON_SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ds["metadata"]["uid"] = json!(format!(
            "{:08x}-0000-4000-8000-{n:012x}",
            std::process::id()
        ));
        ds["metadata"]["generation"] = json!(1);
        let pod = daemon_pod::pod_for(&ds, NODE)?;
        let pod: Pod = serde_json::from_value(pod).map_err(|e| e.to_string())?;
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), &ns);
        let pod = pods
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| format!("cannot create the DaemonSet's pod: {e}"))?;
        pod.metadata
            .name
            .ok_or_else(|| "the pod has no name".into())
    }

    /// The pod `ns/name` once `done` holds for it (at most [`TIMEOUT`]).
    async fn wait_pod(
        &self,
        ns: &str,
        name: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value, String> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let pod = self
                .server
                .get_object("v1", "pods", ns, name)
                .ok_or_else(|| format!("pod {ns}/{name} does not exist"))?;
            if done(&pod) {
                return Ok(pod);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "{ns}/{name}: timed out waiting for {what}: {pod:#}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `out/<file>` once it holds `needle` (what a running container writes).
    async fn wait_out(&self, file: &str, needle: &str) -> Result<String, String> {
        super::wait_out(&self.dir, file, needle).await
    }

    /// Writes a pod as the HAMi scheduler leaves it at bind (node lock naming it, device
    /// lists, bind phase `allocating`, bound to the node): one container `main` of the
    /// workload image as uid 1000 running `script` with one `amd.com/gpu` of `slice`,
    /// `/out` the test's.
    async fn schedule(
        &self,
        name: &str,
        slice: ContainerDevice,
        script: &str,
    ) -> Result<(), String> {
        let list = encode_pod_devices(&[vec![slice]]).map_err(|e| e.to_string())?;
        hami_plugin_harness::take_node_lock(&self.admin, NODE, name).await;
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": {
                AMD.devices_to_allocate: list, AMD.devices_allocated: list,
                pod_keys::VGPU_NODE: NODE, pod_keys::BIND_PHASE: "allocating",
                pod_keys::BIND_TIME: "1700000000"}},
            "spec": {
                "nodeName": NODE, "schedulerName": "hami-scheduler",
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
                "volumes": [{"name": "out", "hostPath": {"path": self.dir.join("out").display().to_string()}}],
                "containers": [{"name": "main", "image": images::WORKLOAD_IMAGE,
                    "command": ["/bin/sh", "-c", script],
                    "resources": {"limits": {"amd.com/gpu": "1"}},
                    "volumeMounts": [{"name": "out", "mountPath": "/out"}]}]}});
        let pod: Pod = serde_json::from_value(pod).map_err(|e| e.to_string())?;
        Api::<Pod>::namespaced(self.admin.clone(), "default")
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| format!("cannot create pod {name}: {e}"))?;
        Ok(())
    }

    /// Sends `signal` (`kill -<signal>`) to the process of container `container` of pod
    /// `pod` (its pid 1), as kubelet's runtime or the kernel would; waits (bounded) for
    /// kubelet-sim to know that pid.
    async fn signal(&self, pod: &str, container: &str, signal: &str) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let pid = loop {
            let pid = self
                .sim()?
                .containers()
                .into_iter()
                .find(|c| c.pod == pod && c.container == container)
                .and_then(|c| c.init_pid);
            if let Some(pid) = pid {
                break pid;
            }
            if tokio::time::Instant::now() > deadline {
                let status = self
                    .server
                    .get_object("v1", "pods", &self.settings.namespace, pod)
                    .map(|p| p["status"].clone());
                return Err(format!(
                    "no running container {container} of {pod}: {status:#?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .map_err(|e| e.to_string())?;
        if !sent.success() {
            return Err(format!("kill -{signal} {pid} failed"));
        }
        Ok(())
    }

    /// kubelet stops a container with SIGTERM and kills it only after the pod's grace
    /// period (30 s by default): the agent's container must end on SIGTERM alone, with
    /// exit code 0, well within it. (As pid 1 of its PID namespace a program without a
    /// handler does not even see SIGTERM.) kubelet-sim then starts it again.
    async fn stops_on_sigterm(&self, ns: &str, pod: &str, container: &str) -> Result<(), String> {
        const LIMIT: Duration = Duration::from_secs(20);
        self.signal(pod, container, "TERM").await?;
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let p = self
                .server
                .get_object("v1", "pods", ns, pod)
                .unwrap_or_default();
            let status = p["status"]["containerStatuses"]
                .as_array()
                .and_then(|s| s.iter().find(|c| c["name"] == container))
                .cloned()
                .unwrap_or_default();
            let ended = &status["lastState"]["terminated"];
            if ended.is_object() {
                if ended["exitCode"] != 0 {
                    return Err(format!(
                        "{container} of {pod} did not shut down cleanly on SIGTERM: {status:#}"
                    ));
                }
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "{container} of {pod} still runs {LIMIT:?} after SIGTERM (kubelet would \
                     SIGKILL it after the grace period): {status:#}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn stop(mut self) {
        if let Some(sim) = self.sim.take() {
            sim.shutdown().await;
        }
        self.server.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The workload: 3 GiB on its device, 512 MiB when that is refused; its output in
/// `/out/<name>.log`. Runs until the pod is deleted.
fn workload(name: &str) -> String {
    format!(
        "id -u > /out/{name}.uid; echo \"$LD_AUDIT\" > /out/{name}.audit; \
         echo \"$HSA_CU_MASK\" > /out/{name}.mask; \
         exec hami-workload --runtime hip --memory-mib 3072 --fallback-mib 512 \
         --busy-percent 1 > /out/{name}.log 2>&1"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_node_agents_run_in_their_images_and_the_plugin_survives_its_container_killed()
-> Result<(), String> {
    let _machine = crate::MACHINE.read().await;
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let started = std::time::Instant::now();
    let node = AgentNode::start(shared, "plugin").await?;
    let result = device_plugin(&node).await;
    if result.is_err() {
        for c in node
            .sim
            .as_ref()
            .map(|s| s.containers())
            .unwrap_or_default()
        {
            eprintln!("container {c:?}");
        }
    }
    node.stop().await;
    eprintln!("node agents: the test took {:?}", started.elapsed());
    result
}

async fn device_plugin(node: &AgentNode) -> Result<(), String> {
    let ns = node.settings.namespace.clone();
    let name = node
        .run_daemon_set(objects::device_plugin_daemon_set(&node.settings))
        .await?;
    let running = |p: &Value| {
        p["status"]["phase"] == "Running"
            && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
    };
    let plugin_pod = node.wait_pod(&ns, &name, "Running", running).await?;
    // The node labeller's DaemonSet starts meanwhile (uid 65532, the host's /sys at
    // /host/sys); its labels are looked at below.
    let labeller = node
        .run_daemon_set(objects::node_labeller_daemon_set(&node.settings))
        .await?;

    // The init container installed the node image's hook, whole, mode 0555.
    let init = &plugin_pod["status"]["initContainerStatuses"][0];
    assert_eq!(init["name"], "install-hook", "{plugin_pod:#}");
    assert_eq!(init["state"]["terminated"]["exitCode"], 0, "{plugin_pod:#}");
    let hook = node.dir.join("hook/vgpu/libamvgpu.so");
    let built = images::dev_build_file("libamvgpu.so")?;
    let installed = std::fs::read(&hook).map_err(|e| format!("{}: {e}", hook.display()))?;
    assert!(
        installed == std::fs::read(&built).map_err(|e| format!("{}: {e}", built.display()))?,
        "{} is not the node image's hook",
        hook.display()
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&hook)
            .map_err(|e| e.to_string())?
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o555);
    }

    // The plugin registered with kubelet-sim over the mounted socket, and published its
    // node as its ServiceAccount, nothing refused.
    let sim = node.sim()?;
    let card = discovered_card(node)?;
    if !sim
        .wait_for_allocatable("amd.com/gpu", card.shares, TIMEOUT)
        .await
    {
        return Err(format!(
            "kubelet sees {} of {} amd.com/gpu",
            sim.allocatable("amd.com/gpu"),
            card.shares
        ));
    }
    let published = node
        .server
        .get_object("v1", "nodes", "", NODE)
        .and_then(|n| {
            n["metadata"]["annotations"][AMD.node_register]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_default();
    assert!(published.contains(&card.id), "{published}");
    let log = node.server.request_log();
    let plugin_user = service_account_user(&ns, names::DEVICE_PLUGIN);
    let made = requests_of(&log, &plugin_user);
    assert!(
        made.iter()
            .any(|r| r.verb == "patch" && r.resource == "nodes"),
        "the plugin never patched its node as {plugin_user}"
    );
    assert_eq!(refused(&made), Vec::<String>::new());

    // A sliced pod as uid 1000 under the hook the init container installed.
    let slice = |mem_mib, cores| ContainerDevice {
        uuid: card.id.clone(),
        device_type: card.device_type.clone(),
        mem_mib,
        cores,
    };
    node.schedule("survivor", slice(1024, 24), &workload("survivor"))
        .await?;
    let log = node.wait_out("survivor.log", "512 MiB").await?;
    let out = |f: &str| std::fs::read_to_string(node.dir.join("out").join(f)).unwrap_or_default();
    assert_eq!(out("survivor.uid"), "1000\n");
    assert_eq!(out("survivor.audit"), "/usr/local/vgpu/libamvgpu.so\n");
    assert_eq!(out("survivor.mask"), "0:0-23\n");
    assert!(
        log.contains("device 0: hipMalloc of 3072 MiB refused: out of memory")
            && log.contains("device 0: allocated 512 MiB instead"),
        "{log}"
    );
    let survivor_running = |p: &Value| p["status"]["phase"] == "Running";
    let before = node
        .wait_pod("default", "survivor", "Running", survivor_running)
        .await?;

    let monitor_pod = monitor(node, &card.id).await?;
    let labelled = |n: &Value| n["metadata"]["labels"]["amd.com/gpu.cu-count"] == "96";
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !node
        .server
        .get_object("v1", "nodes", "", NODE)
        .is_some_and(|n| labelled(&n))
    {
        if tokio::time::Instant::now() > deadline {
            let pod = node.server.get_object("v1", "pods", &ns, &labeller);
            return Err(format!(
                "the node labeller never labelled {NODE}: its pod {pod:#?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    node.stops_on_sigterm(&ns, &labeller, "node-labeller")
        .await?;
    node.stops_on_sigterm(&ns, &monitor_pod, "monitor").await?;

    // The plugin's container killed as the kernel kills it (SIGKILL: no goodbye to
    // kubelet, its socket left behind); kubelet-sim starts it again.
    let registered = sim.registrations();
    node.signal(&name, "device-plugin", "KILL").await?;
    let restarted = |p: &Value| {
        let c = &p["status"]["containerStatuses"][0];
        c["restartCount"] == 1 && c["state"]["running"].is_object()
    };
    let after_kill = node
        .wait_pod(&ns, &name, "the plugin container restarted", restarted)
        .await?;
    let last = &after_kill["status"]["containerStatuses"][0]["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 137, "{after_kill:#}");
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while sim.registrations() <= registered {
        if tokio::time::Instant::now() > deadline {
            return Err("the restarted plugin never registered again".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !sim
        .wait_for_allocatable("amd.com/gpu", card.shares, TIMEOUT)
        .await
    {
        return Err(format!(
            "kubelet sees {} of {} amd.com/gpu after the restart",
            sim.allocatable("amd.com/gpu"),
            card.shares
        ));
    }

    // The next pod gets the other CUs; the survivor kept running, untouched.
    node.schedule("second", slice(1024, 24), &workload("second"))
        .await?;
    let mask = node.wait_out("second.mask", "\n").await?;
    assert_eq!(
        mask, "0:24-47\n",
        "the survivor's slice is not handed out again"
    );
    let after = node
        .wait_pod("default", "survivor", "Running", survivor_running)
        .await?;
    let (b, a) = (
        &before["status"]["containerStatuses"][0],
        &after["status"]["containerStatuses"][0],
    );
    assert_eq!(a["containerID"], b["containerID"], "{after:#}");
    assert_eq!(a["restartCount"], 0, "{after:#}");
    assert!(a["state"]["running"].is_object(), "{after:#}");
    let log = out("survivor.log");
    assert_eq!(log.matches("HIP runtime").count(), 1, "started once: {log}");
    Ok(())
}

/// The monitor's DaemonSet (host PID namespace, the host's `/sys` at `/host/sys`, the hook
/// directory): it reports the survivor's device memory from the region the hook keeps
/// there, and its limit, on the chart's metrics port.
async fn monitor(node: &AgentNode, card: &str) -> Result<String, String> {
    let ns = node.settings.namespace.clone();
    let name = node
        .run_daemon_set(objects::monitor_daemon_set(&node.settings))
        .await?;
    let running = |p: &Value| p["status"]["containerStatuses"][0]["state"]["running"].is_object();
    node.wait_pod(&ns, &name, "Running", running).await?;
    let url = format!("http://127.0.0.1:{}/metrics", names::MONITOR_METRICS_PORT);
    let key: hami_webui::live::DeviceKey = (
        "default".into(),
        "survivor".into(),
        "main".into(),
        "0".into(),
    );
    const MIB: f64 = 1024.0 * 1024.0;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let u = url.clone();
        let live = tokio::task::spawn_blocking(move || hami_webui::live::fetch(&u))
            .await
            .map_err(|e| e.to_string())?;
        if let Ok(live) = &live
            && live.memory.get(&key) == Some(&(512.0 * MIB))
        {
            assert_eq!(live.limit.get(&key), Some(&(1024.0 * MIB)), "{live:?}");
            assert_eq!(
                live.device.get(&key).map(String::as_str),
                Some(card),
                "{live:?}"
            );
            break;
        }
        if tokio::time::Instant::now() > deadline {
            let pod = node.server.get_object("v1", "pods", &ns, &name);
            return Err(format!(
                "the monitor never reported 512 MiB for {key:?}: {live:?}; its pod {pod:#?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let log = node.server.request_log();
    let made = requests_of(&log, &service_account_user(&ns, names::MONITOR));
    assert!(!made.is_empty(), "the monitor never reached the API server");
    assert_eq!(refused(&made), Vec::<String>::new());
    Ok(name)
}

/// The card the plugin reports, as its own discovery finds it on the capture with the
/// DaemonSet's flags.
struct Card {
    id: String,
    device_type: String,
    shares: usize,
}

fn discovered_card(node: &AgentNode) -> Result<Card, String> {
    use clap::Parser;
    let argv = std::iter::once("k8s-device-plugin".to_owned())
        .chain(objects::device_plugin_args(&node.settings));
    let args =
        hami_amd_plugin::cli::Args::parse_from(hami_amd_plugin::cli::normalize_go_flags(argv));
    let settings = args.registration_settings()?;
    let report = hami_amd_plugin::discover_report::build_report(
        &node.tree.sysfs_root(),
        &node.dir.join("dev"),
        &settings,
    )
    .map_err(|e| e.to_string())?;
    let devices = report.registration.devices;
    let d = devices.first().ok_or("the capture has no GPU")?;
    Ok(Card {
        id: d.info.id.clone(),
        device_type: d.info.device_type.clone(),
        shares: devices.iter().map(|d| d.info.count as usize).sum(),
    })
}
