//! Embedded API server benchmark (plain main, run in release):
//! `CARGO_TARGET_DIR=target-apiserver cargo bench -p hami-apiserver --bench apiserver_bench`
//!
//! Seeds 5,000 nodes and 50,000 pods through kube-rs, then measures merge-patch writes/s,
//! list latency, watch fan-out to 100 watchers and the server's memory. Client and server
//! share the process (and the machine's 2 cores), as in the integration tests.

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

const NODES: usize = 5_000;
const PODS: usize = 50_000;
const PATCHES: usize = 20_000;
const WATCHERS: usize = 100;
const FANOUT_WRITES: usize = 1_000;
const CONCURRENCY: usize = 32;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn pod(i: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{i:05}"), "labels": {"app": format!("app-{}", i % 50), "tier": if i.is_multiple_of(2) { "gpu" } else { "cpu" }},
                     "annotations": {"hami.io/vgpu-devices-to-allocate": "GPU-0,NVIDIA,4096,30:;"}},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "main", "image": "registry.local/train:1.0",
                 "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}}}]}
    }))
    .expect("pod")
}

fn node(i: usize) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": format!("node-{i:04}"), "labels": {"gpu": "on"}, "annotations": {"hami.io/node-nvidia-register": "GPU-0,10,81920,100,NVIDIA-A100,0,true:"}},
        "status": {"capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .expect("node")
}

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

async fn timed<F: std::future::Future>(f: F) -> (F::Output, Duration) {
    let t = Instant::now();
    let out = f.await;
    (out, t.elapsed())
}

/// Child-process mode: seeds a server directly (no HTTP, no client) and prints the RSS it
/// takes, so the figure is the store's own.
async fn memory_only() -> anyhow::Result<()> {
    let before = rss_mib();
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default()).await?;
    for i in 0..NODES {
        server.create_object("v1", "nodes", None, serde_json::to_value(node(i))?)?;
    }
    for i in 0..PODS {
        server.create_object("v1", "pods", Some("default"), serde_json::to_value(pod(i))?)?;
    }
    let after = rss_mib();
    let sample = server
        .get_object("v1", "pods", "default", "pod-00000")
        .expect("seeded");
    println!(
        "memory (server only, separate process): +{:.0} MiB RSS for {NODES} nodes + {PODS} pods ({:.1} KiB per object; a stored pod is {} bytes of JSON; includes the 10,000 kept watch events)",
        after - before,
        (after - before) * 1024.0 / (NODES + PODS) as f64,
        serde_json::to_vec(&sample)?.len()
    );
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    if std::env::var_os("HAMI_APISERVER_BENCH_MEMORY").is_some() {
        return memory_only().await;
    }
    let rss_start = rss_mib();
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config {
        request_log_capacity: 1_000,
        ..Default::default()
    })
    .await?;
    let client = kube::Client::try_from(kube::Config::new(server.url().parse()?))?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();

    let (_, t_nodes) = timed(
        stream::iter(0..NODES).for_each_concurrent(CONCURRENCY, |i| {
            let (nodes, pp) = (nodes.clone(), pp.clone());
            async move {
                nodes.create(&pp, &node(i)).await.expect("create node");
            }
        }),
    )
    .await;
    let (_, t_pods) = timed(stream::iter(0..PODS).for_each_concurrent(CONCURRENCY, |i| {
        let (pods, pp) = (pods.clone(), pp.clone());
        async move {
            pods.create(&pp, &pod(i)).await.expect("create pod");
        }
    }))
    .await;
    let rss_seeded = rss_mib();
    println!(
        "seed: {NODES} nodes in {:.2}s ({:.0}/s), {PODS} pods in {:.2}s ({:.0}/s)",
        t_nodes.as_secs_f64(),
        NODES as f64 / t_nodes.as_secs_f64(),
        t_pods.as_secs_f64(),
        PODS as f64 / t_pods.as_secs_f64()
    );

    // merge patches (annotation + label), 32 in flight
    let (_, t_patch) = timed(stream::iter(0..PATCHES).for_each_concurrent(CONCURRENCY, |i| {
        let pods = pods.clone();
        async move {
            let p = json!({"metadata": {"annotations": {"hami.io/bind-time": i.to_string()}, "labels": {"round": "1"}}});
            pods.patch(&format!("pod-{:05}", i % PODS), &PatchParams::default(), &Patch::Merge(&p)).await.expect("patch");
        }
    }))
    .await;
    println!(
        "merge patches: {PATCHES} in {:.2}s = {:.0} writes/s ({CONCURRENCY} in flight)",
        t_patch.as_secs_f64(),
        PATCHES as f64 / t_patch.as_secs_f64()
    );
    let (_, t_serial) = timed(async {
        for i in 0..2_000 {
            let p = json!({"metadata": {"annotations": {"hami.io/serial": i.to_string()}}});
            pods.patch(
                &format!("pod-{i:05}"),
                &PatchParams::default(),
                &Patch::Merge(&p),
            )
            .await
            .expect("patch");
        }
    })
    .await;
    println!(
        "merge patches, one at a time: 2000 in {:.2}s = {:.0} writes/s, {:.3} ms each",
        t_serial.as_secs_f64(),
        2000.0 / t_serial.as_secs_f64(),
        t_serial.as_secs_f64() * 1000.0 / 2000.0
    );

    // list latency
    let all_pods: Api<Pod> = Api::all(client.clone());
    let mut full = Vec::new();
    for _ in 0..5 {
        let (l, t) = timed(all_pods.list(&ListParams::default())).await;
        assert_eq!(l?.items.len(), PODS);
        full.push(t);
    }
    let mut page = Vec::new();
    let mut by_node = Vec::new();
    let mut by_label = Vec::new();
    let mut node_list = Vec::new();
    for i in 0..20 {
        let (l, t) = timed(all_pods.list(&ListParams::default().limit(500))).await;
        assert_eq!(l?.items.len(), 500);
        page.push(t);
        let (l, t) =
            timed(all_pods.list(&ListParams::default().labels(&format!("app=app-{i}")))).await;
        assert_eq!(l?.items.len(), PODS / 50);
        by_label.push(t);
        let (l, t) =
            timed(all_pods.list(&ListParams::default().fields("spec.nodeName=node-0001"))).await;
        assert_eq!(l?.items.len(), 0);
        by_node.push(t);
        if i < 5 {
            let (l, t) = timed(nodes.list(&ListParams::default())).await;
            assert_eq!(l?.items.len(), NODES);
            node_list.push(t);
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "list all 50,000 pods (kube-rs, decoded): p50 {:.0} ms, max {:.0} ms",
        ms(pct(full.clone(), 0.5)),
        ms(pct(full, 1.0))
    );
    println!(
        "list 500-pod page: p50 {:.1} ms, p95 {:.1} ms",
        ms(pct(page.clone(), 0.5)),
        ms(pct(page, 0.95))
    );
    println!(
        "list by label (1,000 of 50,000): p50 {:.1} ms",
        ms(pct(by_label, 0.5))
    );
    println!(
        "list by spec.nodeName (scan of 50,000): p50 {:.1} ms",
        ms(pct(by_node, 0.5))
    );
    println!(
        "list all 5,000 nodes: p50 {:.0} ms",
        ms(pct(node_list, 0.5))
    );

    // watch fan-out: 100 watchers on all pods, then FANOUT_WRITES patches
    let rv = server.resource_version().to_string();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(WATCHERS);
    let mut handles = Vec::new();
    for _ in 0..WATCHERS {
        let api = all_pods.clone();
        let rv = rv.clone();
        let ready = ready_tx.clone();
        handles.push(tokio::spawn(async move {
            let mut s = api
                .watch(&WatchParams::default().timeout(290), &rv)
                .await
                .expect("watch")
                .boxed();
            ready.send(()).await.ok();
            let mut n = 0;
            while n < FANOUT_WRITES {
                match s.next().await {
                    Some(Ok(WatchEvent::Modified(_))) => n += 1,
                    Some(Ok(_)) => {}
                    other => panic!("watch ended early: {other:?}"),
                }
            }
            Instant::now()
        }));
    }
    for _ in 0..WATCHERS {
        ready_rx.recv().await;
    }
    let t0 = Instant::now();
    stream::iter(0..FANOUT_WRITES)
        .for_each_concurrent(8, |i| {
            let pods = pods.clone();
            async move {
                let p = json!({"metadata": {"annotations": {"hami.io/fanout": i.to_string()}}});
                pods.patch(
                    &format!("pod-{i:05}"),
                    &PatchParams::default(),
                    &Patch::Merge(&p),
                )
                .await
                .expect("patch");
            }
        })
        .await;
    let t_writes = t0.elapsed();
    let mut last = t0;
    for h in handles {
        last = last.max(h.await?);
    }
    let t_all = last - t0;
    let delivered = (WATCHERS * FANOUT_WRITES) as f64;
    println!(
        "watch fan-out: {FANOUT_WRITES} writes to {WATCHERS} watchers: writes done in {:.2}s, all {} events delivered (and decoded by kube-rs) in {:.2}s = {:.0} events/s",
        t_writes.as_secs_f64(),
        delivered,
        t_all.as_secs_f64(),
        delivered / t_all.as_secs_f64()
    );
    let rss_end = rss_mib();
    println!(
        "memory (whole bench process, client included): start {rss_start:.0} MiB, after seeding {rss_seeded:.0} MiB, end {rss_end:.0} MiB"
    );
    server.shutdown().await;
    let me = std::env::current_exe()?;
    let out = std::process::Command::new(me)
        .env("HAMI_APISERVER_BENCH_MEMORY", "1")
        .output()?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    anyhow::ensure!(
        out.status.success(),
        "memory run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
