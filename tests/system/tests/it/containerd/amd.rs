//! Sliced AMD pods in real containers (see `mod.rs`).

use serde_json::json;

use super::{AmdNode, containerd, workload};

/// A pod as uid 1000 whose container loads the real hook from the read-only host mount
/// (`LD_AUDIT` from Allocate): the slice's 1 GiB holds, the smaller fallback fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliced_pod_as_uid_1000_stops_at_its_limit_under_the_real_hook() -> Result<(), String> {
    let _machine = crate::MACHINE.read().await;
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let node = AmdNode::start(shared, "limit").await?;
    let script = format!(
        "id -u > /out/uid; echo \"$LD_AUDIT\" > /out/audit; {}",
        workload("limit")
    );
    node.schedule(
        "limit",
        node.slice(1024, 24),
        &script,
        json!({"securityContext": {"runAsUser": 1000, "runAsGroup": 1000}}),
    )
    .await?;
    let log = node.wait_out("limit.log", "512 MiB").await;
    let pod = node
        .server
        .get_object("v1", "pods", "default", "limit")
        .unwrap_or_default();
    let log = log.map_err(|e| format!("{e}; pod {pod:#}"))?;
    let out = |f: &str| std::fs::read_to_string(node.dir.join("out").join(f)).unwrap_or_default();
    assert_eq!(out("uid"), "1000\n");
    assert_eq!(out("audit"), "/usr/local/vgpu/libamvgpu.so\n");
    assert!(
        log.contains("device 0: hipMalloc of 3072 MiB refused: out of memory")
            && log.contains("device 0: allocated 512 MiB instead"),
        "{log}"
    );
    node.stop().await;
    Ok(())
}

/// With `shareProcessNamespace`, pid 1 is the pause process (another user's, its
/// environment unreadable): the limit still comes from the plugin's read-only config, and
/// a container that raises its own limit variable gets nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_process_namespace_keeps_the_pinned_limit() -> Result<(), String> {
    let _machine = crate::MACHINE.read().await;
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let node = AmdNode::start(shared, "sharepid").await?;
    let script = format!(
        "cat /proc/1/cmdline > /out/pid1; export HIP_DEVICE_MEMORY_LIMIT_0=16g; {}",
        workload("shared")
    );
    node.schedule(
        "shared",
        node.slice(1024, 24),
        &script,
        json!({"shareProcessNamespace": true,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000}}),
    )
    .await?;
    let log = node.wait_out("shared.log", "512 MiB").await?;
    let pid1 = std::fs::read_to_string(node.dir.join("out/pid1")).unwrap_or_default();
    assert!(
        pid1.starts_with("/bin/sleep\0"),
        "pid 1 is the pause process: {pid1:?}"
    );
    assert!(
        log.contains("hipMalloc of 3072 MiB refused") && log.contains("allocated 512 MiB instead"),
        "{log}"
    );
    node.stop().await;
    Ok(())
}

/// Two slices of one card: each container sees its own CUs, none shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_slices_of_one_card_get_disjoint_cu_masks_in_their_containers() -> Result<(), String> {
    let _machine = crate::MACHINE.read().await;
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let node = AmdNode::start(shared, "masks").await?;
    // Both running at once (a finished pod's CUs are free again); the second is placed
    // once the first has its CUs, as the node lock orders them.
    let mut masks = Vec::new();
    for name in ["a", "b"] {
        let script = format!("echo \"$HSA_CU_MASK\" > /out/{name}.mask; exec sleep 600");
        node.schedule(name, node.slice(1024, 24), &script, json!({}))
            .await?;
        masks.push(node.wait_out(&format!("{name}.mask"), "\n").await?);
    }
    let (a, b) = (&masks[0], &masks[1]);
    assert_eq!((a.as_str(), b.as_str()), ("0:0-23\n", "0:24-47\n"));
    node.stop().await;
    Ok(())
}

/// The hook is not installed on the host: the plugin refuses the Allocate (containerd
/// would have mounted an empty directory in its place and run the pod unlimited), the pod
/// fails with the path and what to install in its status, and the slice is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_hook_fails_the_pod_naming_it_and_frees_the_slice() -> Result<(), String> {
    let _machine = crate::MACHINE.read().await;
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let node = AmdNode::start(shared, "nohook").await?;
    let hook = node.hook();
    std::fs::rename(&hook, hook.with_extension("away")).map_err(|e| e.to_string())?;
    node.schedule("nohook", node.slice(1024, 24), "true", json!({}))
        .await?;
    let pod = node
        .wait_pod("nohook", "Failed", |p| p["status"]["phase"] == "Failed")
        .await?;
    let message = pod["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("{} does not exist", hook.display()))
            && message.contains("install the HAMi hook"),
        "{pod:#}"
    );
    assert!(!hook.exists(), "nothing made in the hook's place");
    // Installed: the same CUs go to the next pod.
    std::fs::rename(hook.with_extension("away"), &hook).map_err(|e| e.to_string())?;
    node.schedule(
        "after",
        node.slice(1024, 24),
        "echo \"$HSA_CU_MASK\" > /out/after.mask",
        json!({}),
    )
    .await?;
    node.wait_pod("after", "Succeeded", |p| {
        p["status"]["phase"] == "Succeeded"
    })
    .await?;
    let mask = std::fs::read_to_string(node.dir.join("out/after.mask")).unwrap_or_default();
    assert_eq!(mask, "0:0-23\n");
    node.stop().await;
    Ok(())
}
