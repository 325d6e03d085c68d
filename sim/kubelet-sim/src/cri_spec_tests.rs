//! `cri_spec.rs`'s tests: what kubelet-sim's containerd runtime sends over CRI and reads
//! back (kept apart to hold both files under the 800-line limit).

use super::*;

fn pod() -> PodRef {
    PodRef {
        uid: "u1".into(),
        namespace: "ns".into(),
        name: "p".into(),
    }
}

fn spec(v: Value) -> PodSpec {
    serde_json::from_value(v).unwrap()
}

#[test]
fn allocate_response_then_pod_env_then_mounts_devices_and_security() {
    let s = spec(json!({
        "shareProcessNamespace": true,
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
        "volumes": [{"name": "out", "hostPath": {"path": "/h/out"}},
                    {"name": "scratch", "emptyDir": {}}],
        "containers": [{"name": "c", "image": "img:1", "command": ["sh"], "args": ["-c", "x"],
            "env": [{"name": "A", "value": "pod"}],
            "securityContext": {"runAsGroup": 7, "capabilities": {"add": ["SYS_NICE"]},
                "readOnlyRootFilesystem": true},
            "volumeMounts": [{"name": "out", "mountPath": "/out"},
                             {"name": "scratch", "mountPath": "/s", "readOnly": true}]}]
    }));
    let alloc = Allocated {
        envs: BTreeMap::from([("A".into(), "plugin".into()), ("B".into(), "1".into())]),
        mounts: vec![MountSpec {
            container_path: "/usr/local/vgpu/hook.conf".into(),
            host_path: "/var/hook.conf".into(),
            read_only: true,
        }],
        devices: vec![DeviceNode {
            container_path: "/dev/kfd".into(),
            host_path: "/dev/kfd".into(),
            permissions: "rw".into(),
        }],
        cdi_devices: vec!["amd.com/gpu=0".into()],
    };
    let cfg = container_config(&pod(), &s, &s.containers[0], &alloc, false, &|n| {
        format!("/state/{n}").into()
    })
    .unwrap();
    let env: Vec<(&str, &str)> = cfg
        .envs
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.as_str()))
        .collect();
    assert_eq!(env, [("A", "plugin"), ("B", "1"), ("A", "pod")]);
    let mounts: Vec<(&str, &str, bool)> = cfg
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.readonly))
        .collect();
    assert_eq!(
        mounts,
        [
            ("/usr/local/vgpu/hook.conf", "/var/hook.conf", true),
            ("/out", "/h/out", false),
            ("/s", "/state/scratch", true)
        ]
    );
    assert_eq!(cfg.devices[0].permissions, "rw");
    assert_eq!(cfg.cdi_devices[0].name, "amd.com/gpu=0");
    assert_eq!(
        (cfg.command.clone(), cfg.args.len()),
        (vec!["sh".into()], 2)
    );
    let sc = cfg.linux.unwrap().security_context.unwrap();
    assert_eq!(sc.run_as_user.unwrap().value, 1000);
    assert_eq!(sc.run_as_group.unwrap().value, 7, "the container's wins");
    assert_eq!(sc.capabilities.unwrap().add_capabilities, ["SYS_NICE"]);
    assert!(sc.readonly_rootfs);
    let ns = sc.namespace_options.unwrap();
    assert_eq!(ns.pid, cri::NamespaceMode::Pod as i32);
    assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
}

#[test]
fn device_host_paths_move_to_the_dev_root() {
    let node = |path: &str| DeviceNode {
        container_path: "/dev/kfd".into(),
        host_path: path.into(),
        permissions: "rw".into(),
    };
    let allocated = Allocated {
        devices: vec![
            node("/dev/kfd"),
            node("/dev/dri/renderD128"),
            node("/opt/x"),
        ],
        ..Default::default()
    };
    let moved = on_dev_root(allocated.clone(), std::path::Path::new("/tmp/n1/dev"));
    let paths: Vec<&str> = moved.devices.iter().map(|d| d.host_path.as_str()).collect();
    assert_eq!(
        paths,
        ["/tmp/n1/dev/kfd", "/tmp/n1/dev/dri/renderD128", "/opt/x"]
    );
    assert_eq!(
        on_dev_root(allocated.clone(), std::path::Path::new("/dev")),
        allocated
    );
}

#[test]
fn sandbox_gets_the_pod_cgroup_and_own_network_only_with_cni() {
    let s = spec(json!({"containers": [{"name": "c", "image": "i",
        "securityContext": {"privileged": true}}]}));
    let cfg = sandbox_config(
        &pod(),
        &s,
        "/kubepods/besteffort/podu1",
        true,
        Path::new("/l"),
    );
    let linux = cfg.linux.unwrap();
    assert_eq!(linux.cgroup_parent, "/kubepods/besteffort/podu1");
    let sc = linux.security_context.unwrap();
    assert!(sc.privileged);
    let ns = sc.namespace_options.unwrap();
    assert_eq!(ns.network, cri::NamespaceMode::Pod as i32);
    assert_eq!(ns.pid, cri::NamespaceMode::Container as i32);
    assert_eq!(cfg.labels[POD_UID], "u1");
    assert_eq!(cfg.hostname, "p");
    let cfg = sandbox_config(&pod(), &s, "/x", false, Path::new("/l"));
    assert_eq!(cfg.hostname, "", "the node's UTS namespace: no hostname");
}

#[test]
fn unsupported_volumes_and_env_sources_are_refused_with_the_reason() {
    let s = spec(
        json!({"volumes": [{"name": "cm", "configMap": {"name": "x"}}],
        "containers": [{"name": "c", "image": "i",
            "volumeMounts": [{"name": "cm", "mountPath": "/cm"}]}]}),
    );
    let err = container_config(
        &pod(),
        &s,
        &s.containers[0],
        &Allocated::default(),
        false,
        &|n| n.into(),
    )
    .unwrap_err();
    assert!(
        err.contains("only hostPath, emptyDir and projected"),
        "{err}"
    );
    // A projected volume is the pod's volume directory, read-only even when the mount
    // says otherwise (its files are written before the sandbox).
    let s = spec(
        json!({"volumes": [{"name": "kube-api-access-x", "projected": {"sources": []}}],
        "containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "kube-api-access-x",
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": false}]}]}),
    );
    let config = container_config(
        &pod(),
        &s,
        &s.containers[0],
        &Allocated::default(),
        false,
        &|n| Path::new("/v").join(n),
    )
    .unwrap();
    let m = &config.mounts[0];
    assert_eq!(
        (m.host_path.as_str(), m.readonly),
        ("/v/kube-api-access-x", true)
    );
    let s = spec(json!({"containers": [{"name": "c"}]}));
    let err = container_config(
        &pod(),
        &s,
        &s.containers[0],
        &Allocated::default(),
        false,
        &|n| n.into(),
    )
    .unwrap_err();
    assert!(err.contains("no image"), "{err}");
}

#[test]
fn env_from_the_pods_fields_as_the_charts_daemonsets_take_node_name() {
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    let s = spec(json!({"nodeName": "n1", "serviceAccountName": "sa",
        "containers": [{"name": "c", "image": "i", "env": [
            {"name": "NODE_NAME", "valueFrom": field("spec.nodeName")},
            {"name": "POD", "valueFrom": field("metadata.name")},
            {"name": "NS", "valueFrom": field("metadata.namespace")},
            {"name": "UID", "valueFrom": field("metadata.uid")},
            {"name": "SA", "valueFrom": field("spec.serviceAccountName")}]}]}));
    let cfg = container_config(
        &pod(),
        &s,
        &s.containers[0],
        &Allocated::default(),
        false,
        &|n| n.into(),
    )
    .unwrap();
    let env: Vec<(&str, &str)> = cfg
        .envs
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.as_str()))
        .collect();
    assert_eq!(
        env,
        [
            ("NODE_NAME", "n1"),
            ("POD", "p"),
            ("NS", "ns"),
            ("UID", "u1"),
            ("SA", "sa")
        ]
    );
    for from in [
        field("status.podIP"),
        json!({"secretKeyRef": {"name": "s", "key": "k"}}),
    ] {
        let s = spec(json!({"containers": [{"name": "c", "image": "i",
            "env": [{"name": "X", "valueFrom": from}]}]}));
        let err = container_config(
            &pod(),
            &s,
            &s.containers[0],
            &Allocated::default(),
            false,
            &|n| n.into(),
        )
        .unwrap_err();
        assert!(
            err.contains("env X: only valueFrom.fieldRef of metadata.name"),
            "{err}"
        );
    }
}

#[test]
fn phases_follow_the_containers() {
    let st = |state: Value| json!({"state": state});
    let run = st(json!({"running": {}}));
    let ok = st(json!({"terminated": {"exitCode": 0}}));
    let bad = st(json!({"terminated": {"exitCode": 128, "reason": "StartError"}}));
    let wait = st(json!({"waiting": {"reason": "ErrImagePull"}}));
    let crashing = json!({"state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 3}}});
    let never = |apps: &[Value]| pod_phase("Never", &[], apps);
    assert_eq!(never(&[run.clone(), ok.clone()]), "Running");
    assert_eq!(never(&[ok.clone(), ok.clone()]), "Succeeded");
    assert_eq!(never(&[ok.clone(), bad.clone()]), "Failed");
    assert_eq!(never(std::slice::from_ref(&wait)), "Pending");
    assert_eq!(never(&[wait.clone(), run.clone()]), "Pending");
    assert_eq!(
        pod_phase("Always", &[], &[ok.clone(), bad.clone()]),
        "Running"
    );
    assert_eq!(
        pod_phase("Always", &[], std::slice::from_ref(&crashing)),
        "Running"
    );
    assert_eq!(
        pod_phase("OnFailure", &[], &[ok.clone(), bad.clone()]),
        "Running"
    );
    assert_eq!(
        pod_phase("OnFailure", &[], std::slice::from_ref(&ok)),
        "Succeeded"
    );
    assert_eq!(
        pod_phase(
            "Never",
            std::slice::from_ref(&bad),
            std::slice::from_ref(&wait)
        ),
        "Failed"
    );
    assert_eq!(
        pod_phase("Always", &[bad], std::slice::from_ref(&wait)),
        "Pending"
    );
    assert_eq!(pod_phase("Never", &[ok], &[run]), "Running");
    assert!(restarts("Always", 0, false) && !restarts("Always", 0, true));
    assert!(restarts("OnFailure", 1, false) && !restarts("OnFailure", 0, false));
    assert!(!restarts("Never", 1, false));
    let mut b = std::time::Duration::ZERO;
    let seq: Vec<u64> = (0..7)
        .map(|_| {
            b = next_backoff(b);
            b.as_secs()
        })
        .collect();
    assert_eq!(seq, [10, 20, 40, 80, 160, 300, 300]);
}

#[test]
fn exited_status_carries_code_reason_and_message() {
    let st = cri::ContainerStatus {
        id: "abc".into(),
        state: cri::ContainerState::ContainerExited as i32,
        exit_code: 128,
        reason: "StartError".into(),
        message: "runc create failed: x".into(),
        finished_at: 1_700_000_000_000_000_000,
        ..Default::default()
    };
    let s = k8s_state(&st);
    assert_eq!(s["terminated"]["exitCode"], 128);
    assert_eq!(s["terminated"]["reason"], "StartError");
    assert_eq!(s["terminated"]["message"], "runc create failed: x");
    assert_eq!(s["terminated"]["finishedAt"], "2023-11-14T22:13:20Z");
    let (reason, msg) = missing_image(
        "localhost/hami-rs/hami-node:dev",
        Some(Path::new("/a/node.oci.tar")),
        Path::new("/s"),
    );
    assert_eq!(reason, "ErrImagePull");
    assert!(
        msg.contains("/a/node.oci.tar")
            && msg.contains("never pulls")
            && msg.contains("scripts/build-images.sh --out /a node"),
        "{msg}"
    );
}
