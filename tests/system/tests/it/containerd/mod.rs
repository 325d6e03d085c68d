//! The AMD node on the REAL runtime (issue 29 item 4): kubelet-sim's containerd runtime
//! over a real containerd and runc (one per test process, `hami_containerd_host::shared`),
//! the real AMD device plugin on a captured sysfs, the real `libamvgpu.so` installed where
//! the plugin mounts it from (what the DaemonSet's init container does), and pods of the
//! test busybox image running `hami-workload` (`system-workload`) on the stand-in HIP
//! runtime under the hook, as `LD_AUDIT` in the plugin's Allocate answer loads it.
//!
//! The busybox image has no C library: the host's (`/lib/x86_64-linux-gnu`, `/lib64`)
//! comes in read-only as hostPath volumes, with `/opt/app` holding the workload and the
//! stand-in runtime (copies, so nothing in the container points back at the build tree).
//! The node's `/dev` is a directory of stand-in character devices (`--dev-root`): runc
//! makes the `/dev/kfd` and `/dev/dri/*` nodes of the answer from them.
//!
//! `nvidia.rs` does the same for a sliced NVIDIA pod: the real NVIDIA plugin on the stand-in
//! NVML, the real `libvgpu.so` preloaded through the `/etc/ld.so.preload` its Allocate
//! answer mounts, over the stand-in CUDA driver. `monitor.rs` runs the node monitor and
//! `hami status` over a pod in its real container; `podman.rs` has podman (a real CDI
//! consumer) read the CDI specs the AMD plugin and the DRA driver write. `node_agents.rs`
//! runs the chart's DaemonSets themselves (device plugin, monitor, node labeller) from the
//! node image `scripts/build-images.sh` builds, on in-cluster credentials.
//!
//! Needs root and Debian's packages; without root each test says so and returns. A test
//! takes a few seconds once containerd runs.

mod amd;
mod monitor;
mod node_agents;
mod nvidia;
mod podman;
mod restart;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hami_amd_plugin::cli::Args as PluginArgs;
use hami_amd_plugin::registration::RegisteredDevice;
use hami_apiserver::RunningApiServer;
use hami_containerd_host::shared::{Shared, TEST_BUSYBOX, TEST_PAUSE};
use hami_kubelet_sim::container_runtime::RuntimeArgs;
use hami_kubelet_sim::cri_args::{CriArgs, RuntimeKind};
use hami_kubelet_sim::{Args, KubeletSim};
use hami_plugin_harness::api_with_node;
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::names::{AMD, pod as pod_keys};
use hami_sysfs_fixtures::FixtureTree;
use serde_json::{Value, json};
use tokio::sync::watch;

/// The node's name.
const NODE: &str = "n1";
/// The longest one wait for a pod lasts.
const TIMEOUT: Duration = Duration::from_secs(60);

/// One test's AMD node on containerd.
struct AmdNode {
    server: RunningApiServer,
    client: kube::Client,
    sim: Option<KubeletSim>,
    plugin: Option<(watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
    /// What the plugin was started with (a restart takes the same).
    plugin_args: PluginArgs,
    /// The devices the plugin registered.
    devices: Vec<RegisteredDevice>,
    /// Scratch: `out/` (what containers write), `app/`, `dev/`, `hook/`.
    dir: PathBuf,
    _tree: FixtureTree,
}

/// Copies `from` to `to` (creating its directory), mode 0755.
fn install(from: &Path, to: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::copy(from, to)
        .and_then(|_| std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)))
        .map_err(|e| format!("cannot install {} as {}: {e}", from.display(), to.display()))
}

/// A library the workspace built beside this test binary (`target/<profile>/deps`).
fn built(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let path = exe.parent().ok_or("no test directory")?.join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(format!("{} was not built", path.display()))
    }
}

/// Stand-in character devices for every node of the fixture's `/dev` (a local-use major:
/// nothing serves them, runc only needs their type and numbers).
fn stand_in_dev(fixture: &Path, to: &Path) -> Result<(), String> {
    let mut minor = 0;
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let entries = std::fs::read_dir(fixture.join(&rel))
            .map_err(|e| format!("{}: {e}", fixture.display()))?;
        for entry in entries.flatten() {
            let rel = rel.join(entry.file_name());
            if entry.path().is_dir() {
                dirs.push(rel);
                continue;
            }
            let node = to.join(&rel);
            if let Some(dir) = node.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            let made = std::process::Command::new("mknod")
                .arg(&node)
                .args(["c", "240", &minor.to_string()])
                .status()
                .map_err(|e| format!("mknod: {e}"))?;
            if !made.success() {
                return Err(format!("mknod {} failed", node.display()));
            }
            minor += 1;
        }
    }
    Ok(())
}

impl AmdNode {
    /// API server with the node, kubelet-sim on `shared`'s containerd, the AMD plugin on a
    /// one-card RDNA3 capture, the real hook installed and the workload's files laid out.
    async fn start(shared: &Shared, test: &str) -> Result<Self, String> {
        Self::start_on(&shared.socket, &shared.archives, test).await
    }

    /// [`AmdNode::start`] on the containerd at `socket`, its archives in `archives`.
    async fn start_on(socket: &Path, archives: &Path, test: &str) -> Result<Self, String> {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sys-cri-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = dir.join("out");
        std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        // Containers run as uid 1000.
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| e.to_string())?;
        install(
            Path::new(env!("CARGO_BIN_EXE_system-workload")),
            &dir.join("app/hami-workload"),
        )?;
        install(
            &built("libamdhip64.so")?,
            &dir.join("app/lib/libamdhip64.so.6"),
        )?;
        let tree = hami_sysfs_fixtures::rdna_node(&[hami_sysfs_fixtures::Rdna::Gfx11])
            .map_err(|e| e.to_string())?;
        stand_in_dev(&tree.dev_root(), &dir.join("dev"))?;
        let hook_root = dir.join("hook");
        install(
            &built("libamvgpu.so")?,
            &hook_root.join("vgpu/libamvgpu.so"),
        )?;

        let (server, client) = api_with_node(NODE).await;
        let sockets = dir.join("device-plugins");
        let sim = start_kubelet_sim(&dir, socket, archives, None, client.clone()).await?;

        use clap::Parser;
        let mut args = PluginArgs::parse_from(["k8s-device-plugin"]);
        args.sysfs_root = tree.sysfs_root();
        args.dev_root = tree.dev_root();
        args.device_plugin_dir = sockets.clone();
        args.node_name = Some(NODE.into());
        args.register_interval = 1;
        args.pulse = 1;
        args.cgroup_root = tree.sysfs_root().join("fs/cgroup");
        args.host_hook_path = hook_root;
        args.exporter_socket = sockets.join("no-exporter.socket");
        let settings = args.registration_settings()?;
        let devices = hami_amd_plugin::discover_report::build_report(
            &tree.sysfs_root(),
            &tree.dev_root(),
            &settings,
        )
        .map_err(|e| e.to_string())?
        .registration
        .devices;
        let plugin = spawn_plugin(args.clone(), &client)?;
        let shares: usize = devices.iter().map(|d| d.info.count as usize).sum();
        if !sim
            .wait_for_allocatable("amd.com/gpu", shares, Duration::from_secs(20))
            .await
        {
            return Err(format!(
                "kubelet sees {} of {shares} amd.com/gpu",
                sim.allocatable("amd.com/gpu")
            ));
        }
        Ok(Self {
            server,
            client,
            sim: Some(sim),
            plugin: Some(plugin),
            plugin_args: args,
            devices,
            dir,
            _tree: tree,
        })
    }

    /// Kills the plugin as SIGKILL would (its task dropped wherever it is: no goodbye to
    /// kubelet, its socket left behind) and starts it again with the same arguments.
    async fn kill_and_restart_plugin(&mut self) -> Result<(), String> {
        if let Some((_, task)) = self.plugin.take() {
            task.abort();
            let _ = task.await;
        }
        self.plugin = Some(spawn_plugin(self.plugin_args.clone(), &self.client)?);
        Ok(())
    }

    /// The installed hook.
    fn hook(&self) -> PathBuf {
        self.dir.join("hook/vgpu/libamvgpu.so")
    }

    /// A slice of the node's card: `mem_mib` of memory, `cores` CUs.
    fn slice(&self, mem_mib: u64, cores: u32) -> ContainerDevice {
        let d = &self.devices[0];
        ContainerDevice {
            uuid: d.info.id.clone(),
            device_type: d.info.device_type.clone(),
            mem_mib,
            cores,
        }
    }

    /// Writes a pod as the HAMi scheduler leaves it at bind (node lock naming it, device
    /// lists, bind phase `allocating`, bound to the node): one container `main` of the
    /// test image running `script` with one `amd.com/gpu` of `slice`, the host's C library
    /// and `/opt/app` mounted read-only, `/out` the test's; `extra` merged into the spec.
    async fn schedule(
        &self,
        name: &str,
        slice: ContainerDevice,
        script: &str,
        extra: Value,
    ) -> Result<(), String> {
        let list = encode_pod_devices(&[vec![slice]]).map_err(|e| e.to_string())?;
        hami_plugin_harness::take_node_lock(&self.client, NODE, name).await;
        let host = |p: &Path| json!({"path": p.display().to_string()});
        let mut spec = json!({
            "nodeName": NODE, "schedulerName": "hami-scheduler",
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "volumes": [
                {"name": "out", "hostPath": host(&self.dir.join("out"))},
                {"name": "app", "hostPath": host(&self.dir.join("app"))},
                {"name": "libc", "hostPath": {"path": "/lib/x86_64-linux-gnu"}},
                {"name": "lib64", "hostPath": {"path": "/lib64"}},
            ],
            "containers": [{"name": "main", "image": TEST_BUSYBOX,
                "command": ["/bin/sh", "-c", script],
                "env": [{"name": "LD_LIBRARY_PATH", "value": "/opt/app/lib"}],
                "resources": {"limits": {"amd.com/gpu": "1"}},
                "volumeMounts": [
                    {"name": "out", "mountPath": "/out"},
                    {"name": "app", "mountPath": "/opt/app", "readOnly": true},
                    {"name": "libc", "mountPath": "/lib/x86_64-linux-gnu", "readOnly": true},
                    {"name": "lib64", "mountPath": "/lib64", "readOnly": true},
                ]}],
        });
        merge(&mut spec, extra);
        self.server
            .create_object(
                "v1",
                "pods",
                Some("default"),
                json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "annotations": {
                        AMD.devices_to_allocate: list, AMD.devices_allocated: list,
                        pod_keys::VGPU_NODE: NODE, pod_keys::BIND_PHASE: "allocating",
                        pod_keys::BIND_TIME: "1700000000"}},
                    "spec": spec}),
            )
            .map_err(|e| format!("cannot create pod {name}: {e:?}"))?;
        Ok(())
    }

    /// The pod once `done` holds for it (at most [`TIMEOUT`]).
    async fn wait_pod(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value, String> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let pod = self
                .server
                .get_object("v1", "pods", "default", name)
                .ok_or_else(|| format!("pod {name} does not exist"))?;
            if done(&pod) {
                return Ok(pod);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!("{name}: timed out waiting for {what}: {pod:#}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `out/<file>` once it holds `needle` (what a running container writes).
    async fn wait_out(&self, file: &str, needle: &str) -> Result<String, String> {
        wait_out(&self.dir, file, needle).await
    }

    async fn stop(mut self) {
        if let Some(sim) = self.sim.take() {
            sim.shutdown().await;
        }
        if let Some((tx, task)) = self.plugin.take() {
            let _ = tx.send(true);
            let _ = task.await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The workload: 3 GiB on its device, 512 MiB when that is refused; its output in
/// `/out/<name>.log`. Runs until the pod is deleted.
fn workload(name: &str) -> String {
    format!(
        "exec /opt/app/hami-workload --runtime hip --memory-mib 3072 --fallback-mib 512 \
         --busy-percent 1 > /out/{name}.log 2>&1"
    )
}

/// A program of the workspace built beside this test binary (`cargo test --workspace`
/// builds every program; alone: `cargo build -p <its package>`).
fn program(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .ok_or("no target directory")?
        .join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "{} is not built: cargo build --bin {name} (cargo test --workspace builds it)",
            path.display()
        ))
    }
}

/// A child process, killed and reaped when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The node monitor's program as its DaemonSet runs it (`hami manifests`' securityContext:
/// root with every capability dropped but SYS_PTRACE, to read other users'
/// `/proc/<pid>/fd`; no privilege escalation), serving `addr`.
fn start_monitor(
    addr: &std::net::SocketAddr,
    hook_path: &Path,
    proc_root: &Path,
    sys_root: &Path,
    kubeconfig: &Path,
) -> Result<Child, String> {
    let child = std::process::Command::new("setpriv")
        .args([
            "--bounding-set=-all,+sys_ptrace",
            "--inh-caps=-all",
            "--no-new-privs",
            "--",
        ])
        .arg(program("k8s-vgpu-monitor")?)
        .arg(format!("--metrics-bind-address={addr}"))
        .arg("--refresh-seconds=1")
        .arg("--proc-root")
        .arg(proc_root)
        .arg("--sys-root")
        .arg(sys_root)
        .env("HOOK_PATH", hook_path)
        .env("NODE_NAME", NODE)
        .env("KUBECONFIG", kubeconfig)
        .env("HAMI_NVML_LIBRARY", "")
        .spawn()
        .map_err(|e| format!("cannot start the monitor under setpriv (util-linux): {e}"))?;
    Ok(Child(child))
}

/// The AMD plugin served in a task of this process.
fn spawn_plugin(
    args: PluginArgs,
    client: &kube::Client,
) -> Result<(watch::Sender<bool>, tokio::task::JoinHandle<()>), String> {
    let settings = args.registration_settings()?;
    let (tx, rx) = watch::channel(false);
    let plugin = hami_amd_plugin::plugin::serve(args, settings, client.clone(), rx);
    let task = tokio::spawn(async move {
        if let Err(e) = plugin.await {
            eprintln!("the AMD plugin stopped: {e:#}");
        }
    });
    Ok((tx, task))
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// The shared containerd, or `None` (said why) when not root.
fn containerd() -> Option<&'static Shared> {
    hami_containerd_host::shared::containerd()
}

/// `<dir>/out/<file>` once it holds `needle` (what a running container writes into its
/// `out` hostPath), at most [`TIMEOUT`].
pub(super) async fn wait_out(dir: &Path, file: &str, needle: &str) -> Result<String, String> {
    let path = dir.join("out").join(file);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.contains(needle) {
            return Ok(text);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "{} never said {needle:?}: {text:?}",
                path.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// kubelet-sim for node [`NODE`] running pods on containerd at `socket` (images from
/// `archives`, its plugin sockets, `/dev` and state under `dir`), pods' API server address
/// `kubernetes_service` when they need one.
pub(super) async fn start_kubelet_sim(
    dir: &Path,
    socket: &Path,
    archives: &Path,
    kubernetes_service: Option<String>,
    client: kube::Client,
) -> Result<KubeletSim, String> {
    KubeletSim::start(
        Args {
            socket_dir: dir.join("device-plugins"),
            node_name: NODE.into(),
            record_dir: None,
            run_containers: true,
            runtime: RuntimeArgs {
                dev_root: dir.join("dev"),
                state_dir: Some(dir.join("state")),
                cri: CriArgs {
                    kind: RuntimeKind::Containerd,
                    containerd_socket: socket.to_owned(),
                    pause_image: TEST_PAUSE.into(),
                    image_archive_dir: Some(archives.to_owned()),
                    cni_config: None,
                    kubernetes_service,
                },
                ..Default::default()
            },
            sync_interval_ms: 50,
        },
        client,
    )
    .await
    .map_err(|e| format!("cannot start kubelet-sim on containerd: {e}"))
}
