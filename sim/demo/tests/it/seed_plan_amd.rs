//! Seed 004's test plan, AMD side, on the demo cluster (issue 15): several GPU-busy pods
//! share one MI210, each process in its own PID namespace, each busy a known share of the
//! time; the AMD monitor's utilization (engine time from the DRM clients, D-7) equals each
//! pod's true share within ±3 points, summed on a device never above 100, a killed
//! process's share is gone within one refresh, and a two-GPU pod whose process reorders
//! its devices (`HIP_VISIBLE_DEVICES=1,0`) has each share on the right GPU (the driver
//! knows the render node, whatever index the runtime gave it). (The NVIDIA side is
//! `crates/cuda-hook/tests/it/seed_plan.rs`.) Needs root and util-linux, as the demo's
//! containers do.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{once_args, scratch, start_running_workloads};
use hami_demo::{Progress, scrape};

const SHARES: [(&str, f64); 3] = [("train-20", 20.0), ("infer-30", 30.0), ("tune-35", 35.0)];
/// The demo monitors' refresh interval.
const REFRESH: Duration = Duration::from_secs(2);

fn pod(name: &str, share: f64) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {{amd.com/use-gputype: MI210, hami.io/gpu-scheduler-policy: binpack}}
spec:
  containers:
  - name: main
    image: rocm/pytorch
    command: ["hami-workload", "--runtime", "hip", "--memory-mib", "1024", "--busy-percent", "{share}"]
    resources:
      limits: {{amd.com/gpu: 1, amd.com/gpumem: 4096, amd.com/gpucores: 25}}
"#
    )
}

/// Two GPUs; the process sees them reordered and keeps its device 0 busy 12 %, its device 1
/// 4 %. The stand-in runtime numbers a container's GPUs by render minor, so after
/// `HIP_VISIBLE_DEVICES=1,0` its device 0 is the pod's GPU with the higher minor.
const PAIR: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: pair
  annotations: {amd.com/use-gputype: MI210}
spec:
  containers:
  - name: main
    image: rocm/pytorch
    command: ["env", "HIP_VISIBLE_DEVICES=1,0", "hami-workload", "--runtime", "hip", "--memory-mib", "512", "--busy-percent", "12,4"]
    resources:
      limits: {amd.com/gpu: 2, amd.com/gpumem: 4096, amd.com/gpucores: 25}
"#;

/// (pod, vdevice index) → true share; the pair's two entries are settled once its GPUs'
/// render minors are known.
const EXPECTED: [(&str, &str, f64); 5] = [
    ("train-20", "0", 20.0),
    ("infer-30", "0", 30.0),
    ("tune-35", "0", 35.0),
    ("pair", "0", f64::NAN),
    ("pair", "1", f64::NAN),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_amd_pod_reports_its_true_share() {
    let _one_cluster = common::ONE_CLUSTER.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = scratch("seed-amd");
    for (i, (name, share)) in SHARES.iter().enumerate() {
        std::fs::write(dir.join(format!("{i}.yaml")), pod(name, *share)).unwrap();
    }
    std::fs::write(dir.join("9-pair.yaml"), PAIR).unwrap();
    let args = once_args(dir.clone(), &dir);
    let mut sink = Vec::new();
    let mut progress = Progress::new(&mut sink);
    let cluster = start_running_workloads(&args, &mut progress).await;
    let submitted = cluster.submit_examples(&dir, &mut progress).await.unwrap();
    cluster
        .settle(&submitted, Duration::from_secs(20), &mut progress)
        .await;
    let log = String::from_utf8_lossy(&sink).into_owned();
    assert!(log.contains("app containers run hami-workload"), "{log}");
    let node = cluster
        .nodes
        .iter()
        .find(|n| n.name == "mi210-node")
        .unwrap();
    let addr = node.monitor_addr;
    let key = |pod: &str, index: &str| {
        (
            "default".to_owned(),
            pod.to_owned(),
            "main".to_owned(),
            index.to_owned(),
        )
    };
    // (utilization, device) per (pod, vdevice index) from one scrape.
    let read = || async move {
        let live = tokio::task::spawn_blocking(move || scrape(addr))
            .await
            .unwrap();
        EXPECTED
            .iter()
            .map(|(pod, index, _)| {
                let k = key(pod, index);
                (
                    (*pod, *index),
                    (
                        live.util.get(&k).copied(),
                        live.device.get(&k).cloned().unwrap_or_default(),
                    ),
                )
            })
            .collect::<BTreeMap<_, _>>()
    };
    // Warm-up: every pod seen, then two more refreshes (the first window holds only part
    // of a process's life).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = read().await;
        if now.values().all(|(u, _)| u.is_some_and(|u| u > 0.0)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pods never showed utilization: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(2 * REFRESH).await;
    let first = read().await;
    let devices: std::collections::BTreeSet<&String> = first
        .iter()
        .filter(|((pod, _), _)| *pod != "pair")
        .map(|(_, (_, d))| d)
        .collect();
    assert_eq!(
        devices.len(),
        1,
        "binpack puts the pods on one GPU: {first:?}"
    );
    assert_ne!(
        first[&("pair", "0")].1,
        first[&("pair", "1")].1,
        "the pair has two GPUs: {first:?}"
    );

    // The truth for the pair: its process's device 0 (12 %) is the GPU with the higher
    // render minor, whichever vdevice index the pod's device list gave it.
    let minor_of: BTreeMap<String, u32> =
        hami_monitor::host_gpus::amd_host(&node.tree.sysfs_root())
            .unwrap()
            .1
            .into_iter()
            .map(|d| (d.info.id, d.render))
            .collect();
    let (m0, m1) = (
        minor_of[&first[&("pair", "0")].1],
        minor_of[&first[&("pair", "1")].1],
    );
    let pair_share = |index: &str| match (index, m0 > m1) {
        ("0", true) | ("1", false) => 12.0,
        _ => 4.0,
    };

    // Measure: one reading per refresh window over five windows.
    let mut sums: BTreeMap<(&str, &str), f64> = BTreeMap::new();
    let windows = 5;
    for _ in 0..windows {
        let now = read().await;
        let mut per_device: BTreeMap<&String, f64> = BTreeMap::new();
        for (at, (u, device)) in &now {
            *per_device.entry(device).or_default() += u.unwrap_or(0.0);
            *sums.entry(*at).or_default() += u.unwrap_or(0.0);
        }
        for (device, total) in per_device {
            assert!(total <= 100.0, "{device}: its pods sum to {total}: {now:?}");
        }
        tokio::time::sleep(REFRESH).await;
    }
    for (pod, index, share) in EXPECTED {
        let share = if pod == "pair" {
            pair_share(index)
        } else {
            share
        };
        let mean = sums[&(pod, index)] / windows as f64;
        assert!(
            (mean - share).abs() <= 3.0,
            "{pod} device {index} busy {share}% of the time reported {mean:.1}% (mean of {windows} windows)"
        );
    }

    // Kill one pod's process (pid 1 of its namespace, by host pid): its share is gone
    // within one refresh; the others stay.
    let victim = node
        .kubelet
        .containers()
        .into_iter()
        .find(|c| c.pod == "infer-30")
        .and_then(|c| c.init_pid)
        .unwrap();
    // SAFETY: kill(2) on a process this test's kubelet-sim started.
    assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
    let killed = Instant::now();
    loop {
        let now = read().await;
        if now[&("infer-30", "0")].0.unwrap_or(0.0) == 0.0 {
            assert!(
                now[&("train-20", "0")].0.unwrap_or(0.0) > 0.0,
                "the others stay: {now:?}"
            );
            break;
        }
        // One refresh to notice, plus the scrape's own delay.
        assert!(
            killed.elapsed() < REFRESH + Duration::from_millis(1500),
            "a killed process's share still reported {:?} after {:?}",
            now[&("infer-30", "0")],
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
