//! hostPath volume types on the real runtime (see `mod.rs`), as the chart's DaemonSets name
//! them: a `Directory` that is not there leaves the pod Pending with kubelet's
//! `MountVolume.SetUp failed` message (containerd alone would have made an empty directory
//! and run it), a `DirectoryOrCreate` is made; once the directory exists the pod runs.

use serde_json::json;

use super::{BUSYBOX, Node, containerd, out, pod, scratch};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_directory_host_path_waits_and_or_create_ones_are_made() -> Result<(), String> {
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let dir = scratch("hostpath")?;
    let node = Node::start(shared, &dir).await?;
    let (sys, hook) = (dir.join("sys"), dir.join("hook/vgpu"));
    let path = |p: &std::path::Path| p.display().to_string();
    node.create(pod(
        "typed",
        &dir,
        "",
        json!({
            "volumes": [
                {"name": "out", "hostPath": {"path": path(&dir.join("out"))}},
                {"name": "sys", "hostPath": {"path": path(&sys), "type": "Directory"}},
                {"name": "hook", "hostPath": {"path": path(&hook), "type": "DirectoryOrCreate"}},
            ],
            "containers": [{"name": "main", "image": BUSYBOX,
                "command": ["/bin/sh", "-c", "ls /sys-here > /out/typed && test -d /hook && echo ok >> /out/typed"],
                "volumeMounts": [
                    {"name": "out", "mountPath": "/out"},
                    {"name": "sys", "mountPath": "/sys-here", "readOnly": true},
                    {"name": "hook", "mountPath": "/hook"},
                ]}],
        }),
    ))
    .await?;
    let status = node
        .wait_status("typed", "a waiting reason", |s| {
            s["containerStatuses"][0]["state"]["waiting"]["message"].is_string()
        })
        .await?;
    assert_eq!(status["phase"], "Pending", "{status:#}");
    let waiting = &status["containerStatuses"][0]["state"]["waiting"];
    assert_eq!(waiting["reason"], "ContainerCreating", "{status:#}");
    assert_eq!(
        waiting["message"],
        format!(
            "MountVolume.SetUp failed for volume \"sys\" : hostPath type check failed: {} is not a directory",
            sys.display()
        ),
        "{status:#}"
    );
    assert!(!sys.exists(), "nothing made for a plain Directory");
    // Made as kubelet would find it: the pod starts at the next try (every 2 s).
    std::fs::create_dir(&sys).map_err(|e| e.to_string())?;
    std::fs::write(sys.join("present"), "").map_err(|e| e.to_string())?;
    node.wait_phase("typed", "Succeeded").await?;
    assert_eq!(out(&dir, "typed"), "present\nok\n");
    assert!(hook.is_dir(), "DirectoryOrCreate made {}", hook.display());
    node.stop().await;
    Ok(())
}
