//! The demo's pods run GPU-busy processes (issue 15): kubelet-sim starts each app container
//! in its own PID and mount namespace with Allocate's env and mounts, on the stand-in
//! HIP/CUDA runtime under the real hook; the monitors then report non-zero memory used and
//! utilization for an AMD and an NVIDIA pod; a pod that asks for more than its slice logs
//! the out-of-memory refusal; the monitors find each sliced process's hook loaded (issue
//! 29: 0 unhooked, 0 unknown, no `SliceNotEnforced` Event); deleting a pod kills its
//! process. Needs root and util-linux (`unshare`), as the hooks' namespace tests do.

use crate::common;

use std::time::{Duration, Instant};

use common::{once_args, scratch, start_running_workloads};
use hami_demo::{Progress, scrape};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: amd-busy
  annotations: {amd.com/use-gputype: MI210}
spec:
  containers:
  - name: main
    image: rocm/pytorch
    command: ["hami-workload", "--runtime", "hip", "--memory-mib", "3072", "--busy-percent", "40"]
    resources:
      limits: {amd.com/gpu: 1, amd.com/gpumem: 8192, amd.com/gpucores: 25}
---
apiVersion: v1
kind: Pod
metadata:
  name: amd-greedy
  annotations: {amd.com/use-gputype: MI210}
spec:
  containers:
  - name: main
    image: rocm/pytorch
    command: ["hami-workload", "--runtime", "hip", "--memory-mib", "12288", "--fallback-mib", "1024", "--busy-percent", "10"]
    resources:
      limits: {amd.com/gpu: 1, amd.com/gpumem: 8192, amd.com/gpucores: 25}
---
apiVersion: v1
kind: Pod
metadata:
  name: nvidia-busy
spec:
  containers:
  - name: main
    image: nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04
    command: ["hami-workload", "--runtime", "cuda", "--memory-mib", "2048", "--busy-percent", "25"]
    resources:
      limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 4096, nvidia.com/gpucores: 50}
"#;

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_gpu_busy_processes_the_monitors_see() {
    let _one_cluster = common::ONE_CLUSTER.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = scratch("workloads");
    for (i, doc) in PODS.split("\n---\n").enumerate() {
        std::fs::write(dir.join(format!("{i:02}.yaml")), doc).unwrap();
    }
    let args = once_args(dir.clone(), &dir);
    let mut sink = Vec::new();
    let mut progress = Progress::new(&mut sink);
    let cluster = start_running_workloads(&args, &mut progress).await;
    let log = |sink: &Vec<u8>| String::from_utf8_lossy(sink).into_owned();
    assert!(
        log(&sink).contains("app containers run hami-workload"),
        "the demo runs no processes here:\n{}",
        log(&sink)
    );
    let mut progress = Progress::new(&mut sink);
    let submitted = cluster.submit_examples(&dir, &mut progress).await.unwrap();
    cluster
        .settle(&submitted, Duration::from_secs(20), &mut progress)
        .await;

    let node = |name: &str| cluster.nodes.iter().find(|n| n.name == name).unwrap();
    let (amd, nvidia) = (node("mi210-node"), node("nvidia-node"));
    // Each pod's process: found, in its own PID namespace.
    let own_ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid_of = |pod: &str| {
        loop {
            let found = cluster
                .nodes
                .iter()
                .flat_map(|n| n.kubelet.containers())
                .find(|c| c.pod == pod)
                .and_then(|c| c.init_pid);
            if let Some(pid) = found {
                return pid;
            }
            assert!(Instant::now() < deadline, "{pod}: no process started");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    for pod in ["amd-busy", "amd-greedy", "nvidia-busy"] {
        let pid = pid_of(pod);
        assert_ne!(
            std::fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap(),
            own_ns,
            "{pod}: its process is not in its own PID namespace"
        );
    }

    // Live memory used and utilization from both vendors' monitors.
    let key = |pod: &str| {
        (
            "default".to_owned(),
            pod.to_owned(),
            "main".to_owned(),
            "0".to_owned(),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (amd_live, nvidia_live) = loop {
        let (a, n) = (amd.monitor_addr, nvidia.monitor_addr);
        let (amd_live, nvidia_live) = tokio::task::spawn_blocking(move || (scrape(a), scrape(n)))
            .await
            .unwrap();
        let seen = |live: &hami_demo::Live, pod: &str| {
            live.memory.get(&key(pod)).is_some_and(|b| *b > 0.0)
                && live.util.get(&key(pod)).is_some_and(|u| *u > 0.0)
        };
        if seen(&amd_live, "amd-busy") && seen(&nvidia_live, "nvidia-busy") {
            break (amd_live, nvidia_live);
        }
        let logs: Vec<String> = ["default_amd-busy_main.log", "default_nvidia-busy_main.log"]
            .iter()
            .map(|f| {
                let d = if f.contains("amd") { amd } else { nvidia };
                std::fs::read_to_string(d.record_dir.join(f)).unwrap_or_default()
            })
            .collect();
        assert!(
            Instant::now() < deadline,
            "no live memory and utilization for both pods:\nAMD {amd_live:?}\nNVIDIA {nvidia_live:?}\nlogs: {logs:#?}\n{}",
            log(&sink)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // The memory the processes hold, as the hooks account it.
    assert_eq!(amd_live.memory[&key("amd-busy")], (3072u64 << 20) as f64);
    assert_eq!(
        nvidia_live.memory[&key("nvidia-busy")],
        (2048u64 << 20) as f64
    );
    // Utilization settles at the share each process keeps its GPU busy (the first window
    // may hold only part of a process's life): AMD from the driver's engine time (fdinfo),
    // NVIDIA from the hook's NVML sampler.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (a, n) = (amd.monitor_addr, nvidia.monitor_addr);
        let (amd_live, nvidia_live) = tokio::task::spawn_blocking(move || (scrape(a), scrape(n)))
            .await
            .unwrap();
        let last = (
            amd_live.util.get(&key("amd-busy")).copied().unwrap_or(0.0),
            nvidia_live
                .util
                .get(&key("nvidia-busy"))
                .copied()
                .unwrap_or(0.0),
        );
        if (last.0 - 40.0_f64).abs() <= 8.0 && (last.1 - 25.0_f64).abs() <= 8.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "utilization never near the true shares (AMD 40 %, NVIDIA 25 %): {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Issue 29: every sliced process the monitors see on a GPU is checked for its memory
    // hook; the demo's load the real hooks (each pod's processes found through its driver
    // model's proc tree: amdgpu_driver.rs, cuda_driver.rs).
    common::wait_all_hooked(
        &[amd.monitor_addr, nvidia.monitor_addr],
        &[
            ("amd-busy", "libamvgpu.so"),
            ("amd-greedy", "libamvgpu.so"),
            ("nvidia-busy", "libvgpu.so"),
        ],
    )
    .await;
    common::assert_no_slice_not_enforced(&cluster.client).await;

    // The pod that asked for more than its slice: refused by the hook, its log says so.
    let greedy = amd.record_dir.join("default_amd-greedy_main.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&greedy).unwrap_or_default();
        if text.contains("allocated 1024 MiB instead") {
            break text;
        }
        assert!(Instant::now() < deadline, "{}: {text}", greedy.display());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        text.contains("hipMalloc of 12288 MiB refused: out of memory (hipErrorOutOfMemory)"),
        "{text}"
    );

    // Deleting a pod kills its process; the others keep running.
    let (busy, greedy_pid, nv) = (
        pid_of("amd-busy"),
        pid_of("amd-greedy"),
        pid_of("nvidia-busy"),
    );
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    pods.delete("amd-busy", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(busy) {
        assert!(
            Instant::now() < deadline,
            "amd-busy deleted, its process lives"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(alive(greedy_pid) && alive(nv), "other pods' processes died");
    cluster.shutdown().await;
    assert!(
        !alive(greedy_pid) && !alive(nv),
        "the demo stopped, its pods' processes live on"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
