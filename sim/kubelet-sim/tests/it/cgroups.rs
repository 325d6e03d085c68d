//! Pod cgroups as kubelet and containerd make them, in a node's cgroup tree (systemd
//! driver here; both drivers' names are unit-tested in `cgroup_layout.rs`): once admitted,
//! the pod's (by QoS), also while its claims cannot be prepared (kubelet's `SyncPod` makes
//! it before `PrepareDynamicResources`), but no sandbox's until they are; then the
//! sandbox's and each app container's; controllers flow down (dmem.max where the root
//! has dmem); all removed once the pod is deleted, also by a kubelet-sim started after
//! the pod went while none ran.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hami_kubelet_sim::cgroup_layout::{CgroupDriver, SANDBOX};
use hami_kubelet_sim::container_runtime::container_id;
use hami_kubelet_sim::dra_manager::DraConfig;
use hami_kubelet_sim::pod_cgroups::CgroupConfig;
use hami_kubelet_sim::{Args, KubeletSim, NodeConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Polls `check` until it holds, at most [`TIMEOUT`].
async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kubelet-sim-cgroups-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("cgroup")).unwrap();
    std::fs::write(
        dir.join("cgroup/cgroup.controllers"),
        "cpu memory pids dmem\n",
    )
    .unwrap();
    dir
}

async fn kubelet(client: &Client, dir: &Path) -> KubeletSim {
    KubeletSim::start_node(
        Args {
            socket_dir: dir.join("device-plugins"),
            node_name: "n1".into(),
            record_dir: None,
            run_containers: false,
            runtime: Default::default(),
            sync_interval_ms: 20,
        },
        client.clone(),
        NodeConfig {
            dra: Some(DraConfig {
                registry_dir: dir.join("plugins_registry"),
                state_file: dir.join("dra_manager_state"),
                cdi_dirs: vec![dir.join("cdi")],
            }),
            cgroups: Some(CgroupConfig {
                root: dir.join("cgroup"),
                driver: CgroupDriver::Systemd,
            }),
        },
    )
    .await
    .unwrap()
}

fn pod(name: &str, resources: Value, claims: Option<Value>) -> Pod {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": "n1", "containers": [
            {"name": "main", "image": "i", "resources": resources},
            {"name": "side", "image": "i", "resources": resources}]},
    });
    if let Some(c) = claims {
        v["spec"]["resourceClaims"] = c;
    }
    serde_json::from_value(v).unwrap()
}

/// Every directory under `root`, relative.
fn dirs(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let p = e.path();
                out.insert(p.strip_prefix(root).unwrap().display().to_string());
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

async fn phase(pods: &Api<Pod>, name: &str) -> Option<String> {
    pods.get(name).await.ok()?.status?.phase
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_cgroups_appear_as_pods_start_and_go_with_them() {
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let dir = scratch();
    let root = dir.join("cgroup");
    let sim = kubelet(&client, &dir).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // kubelet's QoS levels exist from the start
    let levels = [
        "kubepods.slice",
        "kubepods.slice/kubepods-besteffort.slice",
        "kubepods.slice/kubepods-burstable.slice",
    ];
    assert_eq!(dirs(&root), levels.map(String::from).into());

    // a pod whose claim cannot be prepared (no such claim) never starts: its pod cgroup
    // only (made before the prepare, as kubelet does), no sandbox, no containers
    let stuck = pod(
        "stuck",
        json!({}),
        Some(json!([{"name": "gpu", "resourceClaimName": "absent"}])),
    );
    let stuck = pods.create(&PostParams::default(), &stuck).await.unwrap();
    let burst = pod("burst", json!({"requests": {"cpu": "100m"}}), None);
    let burst = pods.create(&PostParams::default(), &burst).await.unwrap();
    let limits = json!({"limits": {"cpu": "1", "memory": "64Mi"}});
    let guaranteed = pods
        .create(&PostParams::default(), &pod("guaranteed", limits, None))
        .await
        .unwrap();
    for name in ["burst", "guaranteed"] {
        wait_until(&format!("{name} Running"), async || {
            phase(&pods, name).await.as_deref() == Some("Running")
        })
        .await;
    }
    let u = |p: &Pod| p.uid().unwrap();
    let burst_dir = format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        u(&burst).replace('-', "_")
    );
    let guaranteed_dir = format!(
        "kubepods.slice/kubepods-pod{}.slice",
        u(&guaranteed).replace('-', "_")
    );
    let scopes = |uid: &str, dir: &str| -> Vec<String> {
        [SANDBOX, "main", "side"]
            .iter()
            .map(|c| format!("{dir}/cri-containerd-{}.scope", container_id(uid, c)))
            .collect()
    };
    let mut want: BTreeSet<String> = levels.map(String::from).into();
    for (uid, d) in [(u(&burst), &burst_dir), (u(&guaranteed), &guaranteed_dir)] {
        want.insert(d.clone());
        want.extend(scopes(&uid, d));
    }
    let stuck_dir = format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        u(&stuck).replace('-', "_")
    );
    want.insert(stuck_dir.clone());
    // the app containers' cgroups come as they start, after the pod is reported Running
    wait_until("the containers' cgroups", async || dirs(&root) == want).await;
    assert_eq!(phase(&pods, "stuck").await.as_deref(), Some("Pending"));
    assert_eq!(
        dirs(&root)
            .into_iter()
            .filter(|d| d.contains(&u(&stuck).replace('-', "_")))
            .collect::<Vec<_>>(),
        std::slice::from_ref(&stuck_dir),
        "the stuck pod's cgroup alone: no sandbox, no containers"
    );
    // controllers flow down: the pod cgroup and its containers have dmem.max
    let pod_cg = root.join(&burst_dir);
    assert_eq!(
        std::fs::read_to_string(pod_cg.join("cgroup.controllers")).unwrap(),
        "cpu memory pids dmem\n"
    );
    for d in std::iter::once(burst_dir.clone()).chain(scopes(&u(&burst), &burst_dir)) {
        assert!(root.join(&d).join("dmem.max").is_file(), "{d}");
    }

    // deleted: its cgroups go, the other pod's stay
    pods.delete("burst", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("burst's cgroups removed", async || {
        !root.join(&burst_dir).exists()
    })
    .await;
    assert!(root.join(&guaranteed_dir).is_dir());

    // deleted while no kubelet-sim runs: the next one removes its cgroups
    sim.shutdown().await;
    pods.delete("guaranteed", &DeleteParams::default())
        .await
        .unwrap();
    pods.delete("stuck", &DeleteParams::default())
        .await
        .unwrap();
    let sim = kubelet(&client, &dir).await;
    wait_until(
        "guaranteed's cgroups removed by the next kubelet-sim",
        async || !root.join(&guaranteed_dir).exists(),
    )
    .await;
    assert_eq!(dirs(&root), levels.map(String::from).into());
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
