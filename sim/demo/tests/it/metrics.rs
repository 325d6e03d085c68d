//! Every `/metrics` endpoint of a running demo (the scheduler's and each node's monitor),
//! checked by the real `promtool check metrics` (Debian's `prometheus` package; CI installs
//! it) in the Prometheus text format 0.0.4 — what a client gets unless it names
//! OpenMetrics in `Accept`: no `Accept` at all and `*/*` (plain `curl`) included; `zone="vGPU"` on every series; one GPU has one `device_type` in the
//! scheduler and the monitor; `container_index` is the container's device-list position.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{get_metrics as get, once_args, scratch, start_running_workloads};
use hami_demo::Progress;

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: three
  annotations:
    amd.com/use-gputype: MI210
spec:
  initContainers:
  - name: prepare
    image: busybox
    resources:
      limits: {amd.com/gpu: 1, amd.com/gpumem: 2048, amd.com/gpucores: 50}
  containers:
  - name: trainer
    image: rocm/pytorch
    # A GPU-busy process where the demo can run one: its live series are checked too.
    command: ["hami-workload", "--runtime", "hip", "--memory-mib", "1024", "--busy-percent", "20"]
    resources:
      limits: {amd.com/gpu: 2, amd.com/gpumem: 8192, amd.com/gpucores: 25}
  - name: evaluator
    image: rocm/pytorch
    resources:
      limits: {amd.com/gpu: 1, amd.com/gpumem: 4096, amd.com/gpucores: 10}
"#;

/// What Prometheus sends with OpenMetrics disabled (and what promtool reads).
const ACCEPT_TEXT: &str = "text/plain;version=0.0.4;q=1,*/*;q=0.1";
/// Prometheus 2.x's default.
const ACCEPT_PROMETHEUS: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// The one lint promtool reports that we keep on purpose: `hami_gpu_shared_count` is the
/// reference scheduler's name (SPEC §3), which dashboards and alerts query by name.
const KEPT_LINT: &str =
    "hami_gpu_shared_count non-histogram and non-summary metrics should not have \"_count\" suffix";

/// `promtool check metrics` on `body`; Err with promtool's words when it objects.
fn promtool(body: &str) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install Debian's prometheus package (apt-get install prometheus); CI installs it"
            )
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let problems: Vec<&str> = said
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != KEPT_LINT)
        .collect();
    // Exit 1: the body does not parse; 3: lint problems only.
    match out.status.code() {
        Some(0) => Ok(()),
        Some(3) if problems.is_empty() => Ok(()),
        code => Err(format!("promtool exit {code:?}: {said}")),
    }
}

/// Sample lines → (name, labels).
fn samples(body: &str) -> Vec<(String, BTreeMap<String, String>)> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (name, rest) = line.split_once('{').unwrap_or((line, ""));
            let labels = rest
                .split_once('}')
                .map(|(l, _)| l)
                .unwrap_or("")
                .split("\",")
                .filter_map(|kv| {
                    let (k, v) = kv.split_once("=\"")?;
                    Some((k.to_owned(), v.trim_end_matches('"').to_owned()))
                })
                .collect();
            (name.split(' ').next().unwrap_or(name).to_owned(), labels)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_passes_promtool_and_agrees_on_device_types() {
    let _one_cluster = common::ONE_CLUSTER.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Fail early and clearly when the real peer is missing.
    let found = Command::new("promtool").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "promtool is not on PATH: install Debian's prometheus package (apt-get install prometheus); CI installs it"
    );
    let dir = scratch("metrics");
    std::fs::write(dir.join("three.yaml"), POD).unwrap();
    let args = once_args(dir.clone(), &dir);
    let mut sink = Vec::new();
    let mut progress = Progress::new(&mut sink);
    let cluster = start_running_workloads(&args, &mut progress).await;
    // Live host counters, so the monitors emit their per-GPU series with device_type.
    for node in &cluster.nodes {
        let Ok(gpus) = hami_monitor::host_gpus::amd_host_gpus(&node.tree.sysfs_root()) else {
            continue;
        };
        for gpu in gpus {
            let dir = format!("bus/pci/drivers/amdgpu/{}", gpu.pci_bdf);
            node.tree
                .write(&format!("{dir}/mem_info_vram_used"), "1073741824\n")
                .unwrap();
            node.tree
                .write(&format!("{dir}/gpu_busy_percent"), "7\n")
                .unwrap();
        }
    }
    let submitted = cluster.submit_examples(&dir, &mut progress).await.unwrap();
    cluster
        .settle(&submitted, Duration::from_secs(20), &mut progress)
        .await;
    let log = || String::from_utf8_lossy(&sink).into_owned();

    // Poll until the monitors have refreshed with the counters (every 2 s).
    let monitors: Vec<(String, SocketAddr)> = cluster
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.monitor_addr))
        .collect();
    let amd_monitors: Vec<&(String, SocketAddr)> = monitors
        .iter()
        .filter(|(n, _)| n != "nvidia-node")
        .collect();
    // Where the demo runs processes, the trainer's live series are among those checked.
    let processes = log().contains("app containers run hami-workload");
    let deadline = Instant::now() + Duration::from_secs(15);
    let host_types = loop {
        let mut types: BTreeMap<String, String> = BTreeMap::new();
        let mut trainer_live = false;
        for (_, addr) in &amd_monitors {
            let addr = *addr;
            let (_, body) = tokio::task::spawn_blocking(move || get(addr, ACCEPT_TEXT))
                .await
                .unwrap();
            for (name, labels) in samples(&body) {
                if name == "hami_host_gpu_utilization_ratio" {
                    types.insert(labels["device_uuid"].clone(), labels["device_type"].clone());
                }
                if name == "hami_container_device_utilization_ratio"
                    && labels.get("container").map(String::as_str) == Some("trainer")
                {
                    trainer_live = true;
                }
            }
        }
        let seen_nodes = amd_monitors.len();
        if types.len() >= 2 * seen_nodes && (trainer_live || !processes) {
            break types;
        }
        assert!(
            Instant::now() < deadline,
            "the monitors never reported host GPUs (or the trainer's utilization: {trainer_live}, processes: {processes}): {types:?}\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let mut endpoints = vec![("scheduler".to_string(), cluster.scheduler_metrics)];
    endpoints.extend(
        monitors
            .iter()
            .map(|(n, a)| (format!("monitor of {n}"), *a)),
    );
    let mut scheduler_text = String::new();
    for (who, addr) in &endpoints {
        let addr = *addr;
        let (text_type, text) = tokio::task::spawn_blocking(move || get(addr, ACCEPT_TEXT))
            .await
            .unwrap();
        assert_eq!(
            text_type, "text/plain; version=0.0.4; charset=utf-8",
            "{who}"
        );
        promtool(&text).unwrap_or_else(|e| panic!("{who}: {e}\n{text}"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.contains("zone=\"vGPU\""), "{who}: no zone: {line}");
        }
        let (om_type, om) = tokio::task::spawn_blocking(move || get(addr, ACCEPT_PROMETHEUS))
            .await
            .unwrap();
        assert!(
            om_type.starts_with("application/openmetrics-text; version=1.0.0"),
            "{who}: {om_type}"
        );
        assert!(om.ends_with("# EOF\n"), "{who}: {om}");
        // `curl … | promtool check metrics` (no Accept, or `*/*`): the 0.0.4 text, clean.
        for accept in ["", "*/*"] {
            let (plain_type, plain) = tokio::task::spawn_blocking(move || get(addr, accept))
                .await
                .unwrap();
            assert_eq!(plain_type, text_type, "{who}, Accept {accept:?}");
            promtool(&plain).unwrap_or_else(|e| panic!("{who}, Accept {accept:?}: {e}\n{plain}"));
        }
        if who == "scheduler" {
            scheduler_text = text;
        }
    }

    // One GPU, one device_type: the scheduler's label equals the monitor's for every GPU
    // the monitor reports.
    let scheduler = samples(&scheduler_text);
    let scheduler_types: BTreeMap<&str, &str> = scheduler
        .iter()
        .filter(|(n, _)| n == "hami_gpu_memory_limit_bytes")
        .map(|(_, l)| (l["device_uuid"].as_str(), l["device_type"].as_str()))
        .collect();
    for (uuid, monitor_type) in &host_types {
        assert_eq!(
            scheduler_types.get(uuid.as_str()).copied(),
            Some(monitor_type.as_str()),
            "device {uuid}: monitor says {monitor_type:?}"
        );
    }
    assert!(
        host_types.values().any(|t| t == "AMD Instinct MI210"),
        "{host_types:?}"
    );

    // container_index: init container 0, trainer 1 (two GPUs), evaluator 2.
    let indexes: BTreeSet<(String, String)> = scheduler
        .iter()
        .filter(|(n, l)| n == "hami_vgpu_memory_allocated_bytes" && l["pod"] == "three")
        .map(|(_, l)| (l["container_index"].clone(), l["device_uuid"].clone()))
        .collect();
    let per_container: BTreeMap<&str, usize> =
        indexes.iter().fold(BTreeMap::new(), |mut m, (i, _)| {
            *m.entry(i.as_str()).or_default() += 1;
            m
        });
    assert_eq!(
        per_container,
        BTreeMap::from([("0", 1), ("1", 2), ("2", 1)]),
        "{scheduler_text}\n{}",
        log()
    );
    cluster.shutdown().await;
}
