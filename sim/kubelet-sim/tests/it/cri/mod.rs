//! kubelet-sim's containerd runtime (`--runtime containerd`) against a REAL containerd and
//! runc (`hami-containerd-host`): one containerd per test process, started by the first
//! test that needs it and torn down at process exit (containers, shims, mounts, its
//! directory; `hami_containerd_host::shared`); every test has its own API server,
//! kubelet-sim, device plugin and pod names. The images are built once per process from the host's static busybox with
//! buildah: a workload image (`busybox`) and a pause image whose process is busybox
//! `sleep` (see `hami_containerd_host::images::busybox_pause`). Needs root and Debian's
//! `containerd runc buildah busybox-static`; without root each test says so and returns.
//!
//! Bounds: containerd start ≤ 60 s, image builds ≤ a few seconds, each wait for a pod's
//! status ≤ [`TIMEOUT`]; on this machine a test takes 1–4 s once containerd runs.

mod host_paths;
mod plugin;
mod pods;
mod service_account;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hami_kubelet_sim::container_runtime::RuntimeArgs;
use hami_kubelet_sim::cri_args::{CriArgs, RuntimeKind};
use hami_kubelet_sim::{Args, KubeletSim};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::Value;

/// The longest any one wait of these tests lasts.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(60);
/// The workload image.
pub(crate) const BUSYBOX: &str = hami_containerd_host::shared::TEST_BUSYBOX;
/// The pause image containerd runs sandboxes from.
pub(crate) const PAUSE: &str = hami_containerd_host::shared::TEST_PAUSE;

pub(crate) use hami_containerd_host::shared::{Shared, containerd};

/// One test's node: API server, kubelet-sim on containerd, scratch directory.
pub(crate) struct Node {
    /// Kept for the test's life (dropping it stops the API server).
    pub(crate) server: hami_apiserver::RunningApiServer,
    pub(crate) client: kube::Client,
    pub(crate) sim: KubeletSim,
    pub(crate) dir: PathBuf,
}

/// A scratch directory for `test` (world-writable: containers may run as uid 1000).
pub(crate) fn scratch(test: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("ks-cri-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777))
        .map_err(|e| format!("cannot make {} world-writable: {e}", out.display()))?;
    Ok(dir)
}

/// The kubelet-sim flags of a node on `shared`.
pub(crate) fn args(shared: &Shared, dir: &Path) -> Args {
    Args {
        socket_dir: dir.join("device-plugins"),
        node_name: "n1".into(),
        record_dir: None,
        run_containers: true,
        runtime: RuntimeArgs {
            state_dir: Some(dir.join("state")),
            cri: CriArgs {
                kind: RuntimeKind::Containerd,
                containerd_socket: shared.socket.clone(),
                pause_image: PAUSE.into(),
                image_archive_dir: Some(shared.archives.clone()),
                cni_config: None,
                kubernetes_service: None,
            },
            ..Default::default()
        },
        sync_interval_ms: 50,
    }
}

impl Node {
    pub(crate) async fn start(shared: &Shared, dir: &Path) -> Result<Self, String> {
        let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
            .await
            .map_err(|e| format!("cannot start the API server: {e}"))?;
        let url = server
            .url()
            .parse()
            .map_err(|e| format!("the API server's URL {}: {e}", server.url()))?;
        let client = kube::Client::try_from(kube::Config::new(url))
            .map_err(|e| format!("cannot make a client of the API server: {e}"))?;
        let mut args = args(shared, dir);
        args.runtime.cri.kubernetes_service = Some(server.url());
        let sim = KubeletSim::start(args, client.clone())
            .await
            .map_err(|e| format!("cannot start kubelet-sim on containerd: {e}"))?;
        Ok(Self {
            server,
            client,
            sim,
            dir: dir.to_owned(),
        })
    }

    pub(crate) fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    pub(crate) async fn create(&self, pod: Value) -> Result<(), String> {
        let pod: Pod = serde_json::from_value(pod).map_err(|e| format!("not a pod: {e}"))?;
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| format!("cannot create pod {:?}: {e}", pod.metadata.name))?;
        Ok(())
    }

    /// Waits until the pod's status satisfies `done`; returns it.
    pub(crate) async fn wait_status(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value, String> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let status = self
                .pods()
                .get_opt(name)
                .await
                .map_err(|e| format!("cannot read pod {name}: {e}"))?
                .and_then(|p| p.status)
                .map(serde_json::to_value)
                .transpose()
                .map_err(|e| format!("pod {name}'s status as JSON: {e}"))?
                .unwrap_or(Value::Null);
            if done(&status) {
                return Ok(status);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}: timed out waiting for {what}; status {status:#}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the pod's phase is `phase`.
    pub(crate) async fn wait_phase(&self, name: &str, phase: &str) -> Result<Value, String> {
        self.wait_status(name, &format!("phase {phase}"), |s| s["phase"] == phase)
            .await
    }

    pub(crate) async fn stop(self) {
        self.sim.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A pod on node n1 with one busybox container running `script`, its `out` volume the
/// test's `<dir>/out` (hostPath), plus `extra` merged into the spec.
pub(crate) fn pod(name: &str, dir: &Path, script: &str, extra: Value) -> Value {
    let mut spec = serde_json::json!({
        "nodeName": "n1",
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "volumes": [{"name": "out", "hostPath": {"path": dir.join("out").display().to_string()}}],
        "containers": [{"name": "main", "image": BUSYBOX,
            "command": ["/bin/sh", "-c", script],
            "volumeMounts": [{"name": "out", "mountPath": "/out"}]}],
    });
    merge(&mut spec, extra);
    serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"}, "spec": spec})
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

/// Reads `<dir>/out/<file>` (what the container wrote).
pub(crate) fn out(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join("out").join(file)).unwrap_or_else(|e| format!("<{file}: {e}>"))
}

/// Env of an Allocate response.
pub(crate) fn envs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
