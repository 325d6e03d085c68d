//! containerd restarted under a running sliced pod (issue 29 item 4): the pod keeps running
//! (same container, no restart, the workload process untouched), kubelet-sim speaks to the
//! new daemon, and the slice is not handed out again; and the AMD device plugin killed and
//! started again under a running pod (the plugin in a task of the test; `node_agents.rs`
//! kills it as its DaemonSet's container in the node image): the pod keeps running, the
//! plugin registers again, nothing is allocated twice.

use std::time::Duration;

use hami_containerd_host::images::archive_path;
use hami_containerd_host::shared::{TEST_BUSYBOX, TEST_PAUSE};
use hami_containerd_host::{Containerd, Options};
use serde_json::json;

use super::{AmdNode, containerd, workload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containerd_restart_keeps_the_pod_running_and_allocates_nothing_twice()
-> Result<(), String> {
    let _machine = crate::MACHINE.read().await;
    let Some(shared) = containerd() else {
        return Ok(());
    };
    // Its own containerd: the shared one serves the other tests meanwhile.
    let mut host = Containerd::start(Options::new(TEST_PAUSE))?;
    for image in [TEST_BUSYBOX, TEST_PAUSE] {
        host.import(&archive_path(&shared.archives, image))?;
    }
    let node = AmdNode::start_on(&host.socket(), &shared.archives, "restart").await?;
    node.schedule(
        "survivor",
        node.slice(1024, 24),
        &workload("survivor"),
        json!({}),
    )
    .await?;
    node.wait_out("survivor.log", "512 MiB").await?;
    let running = |p: &serde_json::Value| p["status"]["phase"] == "Running";
    let before = node.wait_pod("survivor", "Running", running).await?;

    tokio::task::block_in_place(|| host.restart(Duration::from_secs(60)))?;

    // A pod started after the restart: kubelet-sim speaks to the new daemon, and the
    // survivor's CUs are still its own.
    node.schedule(
        "second",
        node.slice(1024, 24),
        "echo \"$HSA_CU_MASK\" > /out/second.mask; exec sleep 600",
        json!({}),
    )
    .await?;
    let mask = node.wait_out("second.mask", "\n").await?;
    assert_eq!(
        mask, "0:24-47\n",
        "the survivor's slice is not handed out again"
    );
    let after = node.wait_pod("survivor", "Running", running).await?;
    let (b, a) = (
        &before["status"]["containerStatuses"][0],
        &after["status"]["containerStatuses"][0],
    );
    assert_eq!(a["containerID"], b["containerID"], "{after:#}");
    assert_eq!(a["restartCount"], 0, "{after:#}");
    assert!(a["state"]["running"].is_object(), "{after:#}");
    let log = std::fs::read_to_string(node.dir.join("out/survivor.log")).unwrap_or_default();
    assert_eq!(log.matches("HIP runtime").count(), 1, "started once: {log}");
    node.stop().await;
    tokio::task::block_in_place(|| host.stop())?;
    Ok(())
}

/// The AMD device plugin killed under a running sliced pod (its task dropped mid-flight, its
/// socket left behind, as SIGKILL leaves them) and started again: the pod keeps running,
/// the plugin registers with kubelet again, and the next pod's Allocate does not hand out
/// the survivor's CUs (the restarted plugin has no memory of them but what the node says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_plugin_reregisters_and_allocates_nothing_twice() -> Result<(), String> {
    let _machine = crate::MACHINE.read().await;
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let mut node = AmdNode::start(shared, "pluginkill").await?;
    node.schedule(
        "survivor",
        node.slice(1024, 24),
        &workload("survivor"),
        json!({}),
    )
    .await?;
    node.wait_out("survivor.log", "512 MiB").await?;
    let running = |p: &serde_json::Value| p["status"]["phase"] == "Running";
    let before = node.wait_pod("survivor", "Running", running).await?;
    let sim = node.sim.as_ref().ok_or("kubelet-sim stopped")?;
    let registered = sim.registrations();

    node.kill_and_restart_plugin().await?;
    let sim = node.sim.as_ref().ok_or("kubelet-sim stopped")?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while sim.registrations() <= registered {
        if tokio::time::Instant::now() > deadline {
            return Err("the restarted plugin never registered again".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let shares: usize = node.devices.iter().map(|d| d.info.count as usize).sum();
    if !sim
        .wait_for_allocatable("amd.com/gpu", shares, Duration::from_secs(20))
        .await
    {
        return Err(format!(
            "kubelet sees {} of {shares} amd.com/gpu after the restart",
            sim.allocatable("amd.com/gpu")
        ));
    }

    node.schedule(
        "second",
        node.slice(1024, 24),
        "echo \"$HSA_CU_MASK\" > /out/second.mask; exec sleep 600",
        json!({}),
    )
    .await?;
    let mask = node.wait_out("second.mask", "\n").await?;
    assert_eq!(
        mask, "0:24-47\n",
        "the survivor's slice is not handed out again"
    );
    let after = node.wait_pod("survivor", "Running", running).await?;
    let (b, a) = (
        &before["status"]["containerStatuses"][0],
        &after["status"]["containerStatuses"][0],
    );
    assert_eq!(a["containerID"], b["containerID"], "{after:#}");
    assert_eq!(a["restartCount"], 0, "{after:#}");
    let log = std::fs::read_to_string(node.dir.join("out/survivor.log")).unwrap_or_default();
    assert_eq!(log.matches("HIP runtime").count(), 1, "started once: {log}");
    node.stop().await;
    Ok(())
}
