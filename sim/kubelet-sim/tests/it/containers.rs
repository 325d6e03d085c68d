//! Containers as the simulated kubelet starts them: own PID and mount namespaces, exactly
//! the mounts and device nodes asked for (nothing created on the host), the container env
//! alone, and killed with their pod or with kubelet-sim (no orphans). Needs root and
//! util-linux's `unshare`, as the hooks' namespace tests do.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hami_kubelet_sim::container_runtime::{
    ContainerSpec, MountSpec, RunningContainer, container_id,
};
use hami_kubelet_sim::{Args, KubeletSim};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ks-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pid_alive(pid: i32) -> bool {
    // A zombie is dead for our purpose: its namespace is gone.
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        !s.lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'))
    })
}

#[test]
fn a_container_sees_exactly_its_mounts_and_devices() {
    let dir = scratch("mounts");
    let cache = dir.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(dir.join("hook.conf"), "limits\n").unwrap();
    let dev_root = dir.join("dev");
    std::fs::create_dir_all(dev_root.join("dri")).unwrap();
    std::fs::write(dev_root.join("dri/renderD128"), "").unwrap();
    // A path that exists nowhere on the host: made inside the container's layer only.
    let root = format!("/usr/local/hami-ks-test-{}", std::process::id());
    let script = format!(
        "cat {root}/hook.conf; echo written > {root}/cache/out; \
         (echo x > {root}/hook.conf) 2>/dev/null || echo read-only; ls /dev/dri; \
         echo pid $$; echo env $FOO/$HOME; [ -e /dev/null ] && echo null-ok"
    );
    let spec = ContainerSpec {
        pod_uid: "uid".into(),
        namespace: "default".into(),
        pod: "p".into(),
        container: "c".into(),
        container_id: container_id("uid", "c"),
        cgroup: format!("/kubepods/besteffort/poduid/{}", container_id("uid", "c")),
        argv: vec!["sh".into(), "-c".into(), script],
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("FOO".into(), "bar".into()),
        ],
        mounts: vec![
            MountSpec {
                container_path: format!("{root}/hook.conf"),
                host_path: dir.join("hook.conf").display().to_string(),
                read_only: true,
            },
            MountSpec {
                container_path: format!("{root}/cache"),
                host_path: cache.display().to_string(),
                read_only: false,
            },
        ],
        devices: vec![("/dev/dri/renderD128".into(), "/dev/dri/renderD128".into())],
        log: Some(dir.join("log")),
    };
    let mut c = RunningContainer::start(&spec, &dev_root, &dir.join("state")).unwrap();
    wait_for("the container to exit", Duration::from_secs(20), || {
        c.poll().is_some()
    });
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    assert_eq!(
        log, "limits\nread-only\nrenderD128\npid 1\nenv bar/\nnull-ok\n",
        "container log"
    );
    assert_eq!(
        std::fs::read_to_string(cache.join("out")).unwrap(),
        "written\n"
    );
    assert!(!Path::new(&root).exists(), "{root} was created on the host");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_device_fails_the_container_with_a_reason() {
    let dir = scratch("nodev");
    let spec = ContainerSpec {
        pod_uid: "uid".into(),
        namespace: "default".into(),
        pod: "p".into(),
        container: "c".into(),
        container_id: container_id("uid", "c"),
        cgroup: format!("/kubepods/besteffort/poduid/{}", container_id("uid", "c")),
        argv: vec!["true".into()],
        env: Vec::new(),
        mounts: Vec::new(),
        devices: vec![("/dev/kfd".into(), "/dev/kfd".into())],
        log: Some(dir.join("log")),
    };
    let mut c = RunningContainer::start(&spec, &dir, &dir.join("state")).unwrap();
    let mut status = None;
    wait_for("the container to fail", Duration::from_secs(20), || {
        status = c.poll();
        status.is_some()
    });
    assert!(!status.unwrap().success());
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    assert!(
        log.contains("device /dev/kfd does not exist on this node"),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_die_with_their_pod_and_with_kubelet_sim() {
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let dir = scratch("lifecycle");
    let runtime = hami_kubelet_sim::container_runtime::RuntimeArgs {
        image_env: vec!["PATH=/usr/bin:/bin".into(), "IMAGE=1".into()],
        state_dir: Some(dir.join("state")),
        ..Default::default()
    };
    let sim = KubeletSim::start(
        Args {
            socket_dir: dir.join("sockets"),
            node_name: "n1".into(),
            record_dir: Some(dir.join("records")),
            run_containers: true,
            runtime,
            sync_interval_ms: 20,
        },
        client.clone(),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    for name in ["one", "two"] {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "x",
                "command": ["sh", "-c", "echo started; exec sleep 1000"],
                "env": [{"name": "OWN", "value": name}]}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let running = loop {
        let c = sim.containers();
        if c.len() == 2 && c.iter().all(|c| c.init_pid.is_some()) {
            break c;
        }
        assert!(Instant::now() < deadline, "containers never started: {c:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let own_ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let pid_of = |pod: &str| {
        running
            .iter()
            .find(|c| c.pod == pod)
            .and_then(|c| c.init_pid)
            .unwrap()
    };
    for pod in ["one", "two"] {
        let pid = pid_of(pod);
        assert_ne!(
            std::fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap(),
            own_ns,
            "{pod}: not in its own PID namespace"
        );
        assert_ne!(
            std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap(),
            std::fs::read_link("/proc/self/ns/mnt").unwrap(),
            "{pod}: not in its own mount namespace"
        );
        // pid 1 is the namespace-preparing shell until it execs the command.
        let deadline = Instant::now() + Duration::from_secs(10);
        let environ = loop {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
            if environ.windows(4).any(|w| w == b"OWN=") {
                break environ;
            }
            assert!(Instant::now() < deadline, "{pod}: never exec'd its command");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // The command is a shell, which adds PWD and may reorder.
        let mut environ: Vec<&[u8]> = environ
            .split(|b| *b == 0)
            .filter(|e| !e.is_empty() && !e.starts_with(b"PWD="))
            .collect();
        environ.sort();
        let own = format!("OWN={pod}");
        let expected = [
            b"IMAGE=1".as_slice(),
            own.as_bytes(),
            b"PATH=/usr/bin:/bin".as_slice(),
        ];
        assert_eq!(environ, expected, "{pod}: env");
    }
    // The pod's status names the container id its cgroup would carry.
    let status = pods.get("one").await.unwrap().status.unwrap();
    let cs = &status.container_statuses.unwrap()[0];
    let one_id = &running
        .iter()
        .find(|c| c.pod == "one")
        .unwrap()
        .container_id;
    assert_eq!(
        cs.container_id.as_deref(),
        Some(format!("containerd://{one_id}").as_str())
    );
    // ...and the record its cgroup by the pod's QoS (BestEffort: no requests), cgroupfs
    let one = running.iter().find(|c| c.pod == "one").unwrap();
    assert_eq!(
        one.cgroup_path(),
        format!("/kubepods/besteffort/pod{}/{one_id}", one.pod_uid)
    );
    let (one, two) = (pid_of("one"), pid_of("two"));
    pods.delete("one", &DeleteParams::default()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while pid_alive(one) {
        assert!(
            Instant::now() < deadline,
            "pod one deleted, its process lives"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(pid_alive(two), "the other pod's process was killed too");
    sim.shutdown().await;
    assert!(!pid_alive(two), "kubelet-sim stopped, a container lives on");
    let log = std::fs::read_to_string(dir.join("records/default_two_main.log")).unwrap();
    assert_eq!(log, "started\n");
    let _ = std::fs::remove_dir_all(&dir);
}
