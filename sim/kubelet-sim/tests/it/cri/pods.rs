//! Pods on a real containerd through kubelet-sim's CRI runtime (see `mod.rs`).

use hami_deviceplugin_api::v1beta1::{ContainerAllocateResponse, DeviceSpec, Mount};
use serde_json::json;

use super::plugin::{FakePlugin, RESOURCE};
use super::{BUSYBOX, Node, containerd, envs, out, pod, scratch};

fn gpu() -> serde_json::Value {
    json!({"limits": {RESOURCE: "1"}})
}

/// The Allocate response as kubelet applies it: env, a read-only mount at a path the image
/// lacks, a device node with its permissions; the pod's own env after the plugin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_response_reaches_the_real_container() -> Result<(), String> {
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let dir = scratch("allocate")?;
    std::fs::write(dir.join("hook.conf"), "limits 1g\n").unwrap();
    // A device node no driver serves (a local-use major): opening it gives ENXIO where the
    // device cgroup lets it through, EPERM where it does not.
    let device = dir.join("gpu0");
    let made = std::process::Command::new("mknod")
        .arg(&device)
        .args(["c", "240", "0"])
        .status()
        .unwrap();
    assert!(made.success(), "mknod");
    let node = Node::start(shared, &dir).await?;
    let _plugin = FakePlugin::start(
        &dir.join("device-plugins"),
        1,
        ContainerAllocateResponse {
            envs: envs(&[("HAMI_TEST", "plugin"), ("OVERRIDDEN", "plugin")]),
            mounts: vec![Mount {
                container_path: "/usr/local/vgpu/hook.conf".into(),
                host_path: dir.join("hook.conf").display().to_string(),
                read_only: true,
            }],
            devices: vec![DeviceSpec {
                container_path: "/dev/hami-test0".into(),
                host_path: device.display().to_string(),
                permissions: "r".into(),
            }],
            ..Default::default()
        },
    )
    .await;
    assert!(
        node.sim
            .wait_for_allocatable(RESOURCE, 1, super::TIMEOUT)
            .await
    );
    let script = "echo $HAMI_TEST/$OVERRIDDEN > /out/env; cat /usr/local/vgpu/hook.conf > /out/conf; \
        (echo x > /usr/local/vgpu/hook.conf) 2>/dev/null && echo rw > /out/ro || echo ro > /out/ro; \
        [ -c /dev/hami-test0 ] && echo char > /out/dev; \
        cat /dev/hami-test0 2>> /out/dev; (echo x > /dev/hami-test0) 2>> /out/dev; true";
    node.create(pod(
        "alloc",
        &dir,
        script,
        json!({"containers": [{"name": "main", "image": BUSYBOX,
            "command": ["/bin/sh", "-c", script],
            "env": [{"name": "OVERRIDDEN", "value": "pod"}],
            "resources": gpu(),
            "volumeMounts": [{"name": "out", "mountPath": "/out"}]}]}),
    ))
    .await?;
    let status = node.wait_phase("alloc", "Succeeded").await?;
    let cs = &status["containerStatuses"][0];
    assert_eq!(cs["state"]["terminated"]["exitCode"], 0, "{status:#}");
    assert!(
        cs["containerID"]
            .as_str()
            .unwrap()
            .starts_with("containerd://"),
        "{status:#}"
    );
    assert_eq!(
        out(&dir, "env"),
        "plugin/pod\n",
        "pod env after the plugin's"
    );
    assert_eq!(out(&dir, "conf"), "limits 1g\n");
    assert_eq!(out(&dir, "ro"), "ro\n", "Allocate's read-only mount");
    let dev = out(&dir, "dev");
    let lines: Vec<&str> = dev.lines().collect();
    assert_eq!(lines.len(), 3, "{dev}");
    assert_eq!(lines[0], "char", "the device node is there: {dev}");
    assert!(
        lines[1].contains("No such device or address"),
        "read: let through by the device cgroup: {dev}"
    );
    assert!(
        lines[2].contains("Operation not permitted"),
        "write: refused by permissions \"r\": {dev}"
    );
    assert!(
        !std::path::Path::new("/usr/local/vgpu/hook.conf").exists(),
        "made on the host"
    );
    node.stop().await;
    Ok(())
}

/// `runAsUser: 1000` (and runAsGroup) apply inside the container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_as_user_applies() -> Result<(), String> {
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let dir = scratch("uid")?;
    let node = Node::start(shared, &dir).await?;
    node.create(pod(
        "uid",
        &dir,
        "id -u > /out/uid; id -g >> /out/uid",
        json!({"securityContext": {"runAsUser": 1000, "runAsGroup": 2000}}),
    ))
    .await?;
    node.wait_phase("uid", "Succeeded").await?;
    assert_eq!(out(&dir, "uid"), "1000\n2000\n");
    node.stop().await;
    Ok(())
}

/// `readOnlyRootFilesystem` (the chart's node agents set it): the image's files cannot be
/// written, the volumes still can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_root_filesystem_applies() -> Result<(), String> {
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let dir = scratch("rofs")?;
    let node = Node::start(shared, &dir).await?;
    let script = "(touch /tmp/x 2>/dev/null && echo rw || echo ro) > /out/rofs";
    node.create(pod(
        "rofs",
        &dir,
        script,
        json!({"containers": [{"name": "main", "image": BUSYBOX,
            "command": ["/bin/sh", "-c", script],
            "securityContext": {"readOnlyRootFilesystem": true},
            "volumeMounts": [{"name": "out", "mountPath": "/out"}]}]}),
    ))
    .await?;
    node.wait_phase("rofs", "Succeeded").await?;
    assert_eq!(out(&dir, "rofs"), "ro\n");
    node.stop().await;
    Ok(())
}

/// With `shareProcessNamespace`, pid 1 is the sandbox's pause process; without, the
/// container's own command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_process_namespace_makes_pause_pid_1() -> Result<(), String> {
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let dir = scratch("sharepid")?;
    let node = Node::start(shared, &dir).await?;
    let script = "tr '\\0' ' ' < /proc/1/cmdline > /out/$POD; echo >> /out/$POD";
    for (name, share) in [("shared", true), ("own", false)] {
        node.create(pod(
            name,
            &dir,
            script,
            json!({"shareProcessNamespace": share, "containers": [{"name": "main", "image": BUSYBOX,
                "command": ["/bin/sh", "-c", script],
                "env": [{"name": "POD", "value": name}],
                "volumeMounts": [{"name": "out", "mountPath": "/out"}]}]}),
        ))
        .await?;
    }
    node.wait_phase("shared", "Succeeded").await?;
    node.wait_phase("own", "Succeeded").await?;
    assert_eq!(out(&dir, "shared"), "/bin/sleep 2147483647 \n");
    assert!(
        out(&dir, "own").starts_with("/bin/sh -c "),
        "{}",
        out(&dir, "own")
    );
    node.stop().await;
    Ok(())
}

/// An image containerd does not have: the pod waits with kubelet's `ErrImagePull`, naming
/// the archive to build and import, while other pods run; a corrupt archive is refused by the
/// import naming it and the pod goes on waiting; once a good one is imported, it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_waits_naming_its_archive() -> Result<(), String> {
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let dir = scratch("noimage")?;
    let node = Node::start(shared, &dir).await?;
    let image = format!("localhost/hami-test-late-{}:1", std::process::id());
    let archive = hami_containerd_host::images::archive_path(&shared.archives, &image);
    node.create(pod(
        "late",
        &dir,
        "echo started > /out/late",
        json!({"containers": [{"name": "main", "image": image,
            "command": ["/bin/sh", "-c", "echo started > /out/late"],
            "volumeMounts": [{"name": "out", "mountPath": "/out"}]}]}),
    ))
    .await?;
    let status = node
        .wait_status("late", "ErrImagePull", |s| {
            s["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"
        })
        .await?;
    assert_eq!(status["phase"], "Pending", "{status:#}");
    let message = status["containerStatuses"][0]["state"]["waiting"]["message"]
        .as_str()
        .unwrap();
    assert!(
        message.contains(&archive.display().to_string()) && message.contains(&image),
        "{message}"
    );
    // Nothing else stops: another pod runs meanwhile.
    node.create(pod("other", &dir, "echo ran > /out/other", json!({})))
        .await?;
    node.wait_phase("other", "Succeeded").await?;
    assert_eq!(out(&dir, "other"), "ran\n");
    assert_eq!(
        node.pods()
            .get("late")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Pending")
    );
    // A corrupt archive (truncated, as a build cut short leaves it) is refused by the import,
    // naming the archive, and changes nothing: the pod still waits, naming it.
    std::fs::write(&archive, b"not an OCI archive: truncated").map_err(|e| e.to_string())?;
    let refused = shared.import(&archive).unwrap_err();
    assert!(
        refused.contains(&archive.display().to_string()),
        "{refused}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let status = node
        .wait_status("late", "ErrImagePull", |s| {
            s["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"
        })
        .await?;
    assert_eq!(status["phase"], "Pending", "{status:#}");
    // Built and imported as the message says: it starts (retried every 2 s).
    hami_containerd_host::images::BusyboxImage {
        name: image.clone(),
        cmd: vec!["/bin/sh".into()],
    }
    .build(&dir.join("build"), &archive)
    .unwrap();
    shared.import(&archive).unwrap();
    node.wait_phase("late", "Succeeded").await?;
    assert_eq!(out(&dir, "late"), "started\n");
    let _ = std::fs::remove_file(&archive);
    node.stop().await;
    Ok(())
}

/// A mount runc cannot make (Allocate's host file over a directory of the image) fails
/// the pod with runc's error in its status, and the plugin's device is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_runc_refuses_fails_the_pod_and_frees_the_device() -> Result<(), String> {
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let dir = scratch("badmount")?;
    std::fs::write(dir.join("file"), "x").unwrap();
    let node = Node::start(shared, &dir).await?;
    let plugin = FakePlugin::start(
        &dir.join("device-plugins"),
        1,
        ContainerAllocateResponse {
            mounts: vec![Mount {
                container_path: "/bin/busybox/x".into(),
                host_path: dir.join("file").display().to_string(),
                read_only: true,
            }],
            ..Default::default()
        },
    )
    .await;
    assert!(
        node.sim
            .wait_for_allocatable(RESOURCE, 1, super::TIMEOUT)
            .await
    );
    let spec = |name: &str| {
        json!({"containers": [{"name": "main", "image": BUSYBOX,
            "command": ["/bin/sh", "-c", format!("echo {name} > /out/{name}")],
            "resources": gpu(),
            "volumeMounts": [{"name": "out", "mountPath": "/out"}]}]})
    };
    node.create(pod("bad", &dir, "", spec("bad"))).await?;
    let status = node.wait_phase("bad", "Failed").await?;
    let t = &status["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["reason"], "StartError", "{status:#}");
    let message = t["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("runc") && message.contains("/bin/busybox/x"),
        "runc's error: {message}"
    );
    assert_eq!(status["message"], t["message"], "the pod says why");
    // The one device is free: a second pod gets it (and fails the same way).
    node.create(pod("again", &dir, "", spec("again"))).await?;
    node.wait_phase("again", "Failed").await?;
    assert_eq!(plugin.allocated.lock().unwrap().len(), 2);
    node.stop().await;
    Ok(())
}

/// A socket nobody serves: kubelet-sim refuses to start, naming the socket and the
/// command that starts containerd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_containerd_is_named_with_its_start_command() -> Result<(), String> {
    let dir = scratch("nosocket")?;
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let mut args = hami_kubelet_sim::Args {
        socket_dir: dir.join("device-plugins"),
        node_name: "n1".into(),
        record_dir: None,
        run_containers: true,
        runtime: Default::default(),
        sync_interval_ms: 50,
    };
    args.runtime.cri.kind = hami_kubelet_sim::cri_args::RuntimeKind::Containerd;
    args.runtime.cri.containerd_socket = dir.join("nobody.sock");
    let err = args.runtime.cri.check(true).unwrap_err();
    let socket = dir.join("nobody.sock").display().to_string();
    assert!(err.contains(&socket), "{err}");
    assert!(
        err.contains(&format!("sudo containerd --address {socket}")),
        "{err}"
    );
    let err = match hami_kubelet_sim::KubeletSim::start(args, client).await {
        Ok(_) => panic!("started without containerd"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&socket) && err.contains("sudo containerd --address"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// What a real node does with an Allocate mount whose host path is missing (a hook not
/// installed yet): containerd 1.6's CRI plugin makes the path as a DIRECTORY on the host
/// (`mkdir -p`, Docker's old habit) and the container sees an empty directory there; no
/// error reaches the pod. So a device plugin must check its mount sources before it
/// answers Allocate: nothing below it will.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_mount_source_becomes_a_directory_on_the_host() -> Result<(), String> {
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let dir = scratch("nosource")?;
    let node = Node::start(shared, &dir).await?;
    let source = dir.join("not-installed/libvgpu.so");
    let _plugin = FakePlugin::start(
        &dir.join("device-plugins"),
        1,
        ContainerAllocateResponse {
            mounts: vec![Mount {
                container_path: "/usr/local/vgpu/libvgpu.so".into(),
                host_path: source.display().to_string(),
                read_only: true,
            }],
            ..Default::default()
        },
    )
    .await;
    assert!(
        node.sim
            .wait_for_allocatable(RESOURCE, 1, super::TIMEOUT)
            .await
    );
    let script = "[ -d /usr/local/vgpu/libvgpu.so ] && echo dir > /out/seen";
    node.create(pod(
        "nosource",
        &dir,
        script,
        json!({"containers": [{"name": "main", "image": BUSYBOX,
            "command": ["/bin/sh", "-c", script],
            "resources": gpu(),
            "volumeMounts": [{"name": "out", "mountPath": "/out"}]}]}),
    ))
    .await?;
    node.wait_phase("nosource", "Succeeded").await?;
    assert_eq!(out(&dir, "seen"), "dir\n");
    assert!(
        source.is_dir(),
        "containerd made {} a directory",
        source.display()
    );
    node.stop().await;
    Ok(())
}

/// The pod runs in its pod cgroup as kubelet names it (`kubepods/besteffort/pod<uid>`,
/// made by runc as the sandbox's cgroup parent, in the host's real cgroup tree, v1 or v2).
/// Deleted, its containers are stopped and removed, then its sandbox, as kubelet does
/// (asked of containerd over CRI, by the pod-uid label kubelet puts on both), and the pod
/// cgroup goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_is_stopped_and_removed() -> Result<(), String> {
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let dir = scratch("delete")?;
    let node = Node::start(shared, &dir).await?;
    node.create(pod(
        "long",
        &dir,
        "echo up > /out/up; exec sleep 3600",
        json!({}),
    ))
    .await?;
    let status = node.wait_phase("long", "Running").await?;
    assert!(
        status["containerStatuses"][0]["state"]["running"].is_object(),
        "{status:#}"
    );
    let uid = node.pods().get("long").await.unwrap().metadata.uid.unwrap();
    let pod_cgroup = |root: &str| format!("{root}/kubepods/besteffort/pod{uid}");
    let cgroup_dirs = || {
        ["/sys/fs/cgroup", "/sys/fs/cgroup/pids"]
            .into_iter()
            .map(pod_cgroup)
            .filter(|d| std::path::Path::new(d).is_dir())
            .collect::<Vec<_>>()
    };
    assert!(
        !cgroup_dirs().is_empty(),
        "no pod cgroup {}",
        pod_cgroup("…")
    );
    // The node knows the container's process, as with the unshare runtime (node models
    // map a process to its container with it).
    let id = status["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    let deadline = tokio::time::Instant::now() + super::TIMEOUT;
    let record = loop {
        if let Some(r) = node.sim.containers().into_iter().find(|c| c.pod == "long") {
            break r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no container record"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(record.container_id, id);
    assert_eq!(record.cgroup, format!("/kubepods/besteffort/pod{uid}/{id}"));
    let pid = record.init_pid.unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert_eq!(cmdline, b"sleep\x003600\x00", "the init's host pid");
    // runc put it there: the kernel says so (read from the host's cgroup namespace).
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        cgroups
            .lines()
            .any(|l| l.ends_with(&format!(":{}", record.cgroup))),
        "{cgroups}"
    );
    let records = node.sim.containers();
    let found = hami_kubelet_sim::container_runtime::container_of_pid(&records, pid);
    assert_eq!(found.map(|c| c.pod.as_str()), Some("long"));
    let cri = hami_cri_api::Cri::connect(&shared.socket, super::TIMEOUT)
        .await
        .unwrap();
    let by_pod = std::collections::BTreeMap::from([(
        hami_kubelet_sim::cri_spec::POD_UID.to_owned(),
        uid.clone(),
    )]);
    let count = |mut cri: hami_cri_api::Cri| {
        let by_pod = by_pod.clone();
        async move {
            let sandboxes = cri
                .runtime
                .list_pod_sandbox(hami_cri_api::v1::ListPodSandboxRequest {
                    filter: Some(hami_cri_api::v1::PodSandboxFilter {
                        label_selector: by_pod.clone(),
                        ..Default::default()
                    }),
                })
                .await
                .unwrap()
                .into_inner()
                .items
                .len();
            let containers = cri
                .runtime
                .list_containers(hami_cri_api::v1::ListContainersRequest {
                    filter: Some(hami_cri_api::v1::ContainerFilter {
                        label_selector: by_pod,
                        ..Default::default()
                    }),
                })
                .await
                .unwrap()
                .into_inner()
                .containers
                .len();
            (sandboxes, containers)
        }
    };
    assert_eq!(count(cri.clone()).await, (1, 1));
    node.pods()
        .delete("long", &Default::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + super::TIMEOUT;
    while count(cri.clone()).await != (0, 0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod deleted, its sandbox or container is still in containerd"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(out(&dir, "up"), "up\n");
    assert!(
        node.sim.containers().is_empty(),
        "a record of a removed container"
    );
    let deadline = tokio::time::Instant::now() + super::TIMEOUT;
    while !cgroup_dirs().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod cgroup left: {:?}",
            cgroup_dirs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    node.stop().await;
    Ok(())
}

/// Init containers run first, one at a time, each to a clean exit; then the app
/// containers (what the chart's device-plugin DaemonSet needs: its init container
/// installs the hook before the plugin starts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_first_in_order() -> Result<(), String> {
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let dir = scratch("init")?;
    let node = Node::start(shared, &dir).await?;
    let step = |name: &str, script: &str| {
        json!({"name": name, "image": BUSYBOX, "command": ["/bin/sh", "-c", script],
            "volumeMounts": [{"name": "out", "mountPath": "/out"}]})
    };
    node.create(pod(
        "init",
        &dir,
        "",
        json!({
            "initContainers": [step("one", "echo one >> /out/order"),
                               step("two", "sleep 1; echo two >> /out/order")],
            "containers": [step("main", "echo main >> /out/order")],
        }),
    ))
    .await?;
    let status = node.wait_phase("init", "Succeeded").await?;
    assert_eq!(out(&dir, "order"), "one\ntwo\nmain\n");
    let inits = status["initContainerStatuses"].as_array().unwrap();
    assert_eq!(inits.len(), 2, "{status:#}");
    assert!(
        inits
            .iter()
            .all(|s| s["state"]["terminated"]["exitCode"] == 0),
        "{status:#}"
    );
    node.stop().await;
    Ok(())
}

/// `restartPolicy: Always`: an exited container is started again (attempt + 1) at once,
/// then after kubelet's back-off (10 s, doubling), shown meanwhile as `CrashLoopBackOff`
/// with the exit as `lastState`; the pod stays Running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exited_container_restarts_with_back_off() -> Result<(), String> {
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let dir = scratch("restart")?;
    let node = Node::start(shared, &dir).await?;
    node.create(pod(
        "crash",
        &dir,
        "echo ran >> /out/runs; exit 3",
        json!({"restartPolicy": "Always"}),
    ))
    .await?;
    let status = node
        .wait_status("crash", "CrashLoopBackOff after a restart", |s| {
            let c = &s["containerStatuses"][0];
            c["restartCount"] == 1 && c["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        })
        .await?;
    let c = &status["containerStatuses"][0];
    assert_eq!(status["phase"], "Running", "{status:#}");
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 3, "{status:#}");
    assert!(
        c["state"]["waiting"]["message"]
            .as_str()
            .unwrap()
            .starts_with("back-off 10s restarting failed container=main pod=crash_default("),
        "{status:#}"
    );
    assert_eq!(out(&dir, "runs"), "ran\nran\n", "started twice so far");
    node.stop().await;
    Ok(())
}
