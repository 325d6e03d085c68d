//! Issue 31: every number on the web UI's overview, cards and pods pages is the number
//! `hami status -o json --monitor` gives, and the monitors' `/metrics`, for the same moment
//! of the demo's cluster (plain and `--dra`).
//!
//! One moment: the report as the CLI builds it (the same library calls on the same lists:
//! `hami_report::status_report`, `hami_report::dra_status::build`, the monitors read by
//! `hami_webui::live::fetch`), the monitors' raw `/metrics`, and the three pages from the
//! UI's router over HTTP. The figures are fixed once the demo settles (the node's sysfs
//! card counters and a stand-in monitor's container samples are constants), but the UI
//! watches and scrapes on its own clock: the comparison is retried until it holds, and
//! fails with the last differences when it never does. A page figure computed any other
//! way than from those numbers differs on every try.
//!
//! Where each figure comes from:
//! - cards: free MiB = status's `memory_mib − memory_used_mib` (a DRA device:
//!   `(memory_bytes − memory_used_bytes) >> 20`, as `hami status` prints it), free CUs or %
//!   = `cores − cores_used`, shares `shares_used/shares`;
//! - pods: asked = `hami_report::pod_report`'s asks (`hami inspect`), or the pod's claims;
//!   granted = its allocations' MiB plus its DRA claims' (status's DRA holders); used = the
//!   sum of `hami_container_device_memory_bytes` (status's `usage[].memory_used_bytes`)
//!   over its containers on the devices it was granted; used % = used over what was
//!   granted on the devices with a sample;
//! - overview: GPUs = status's GPUs plus its DRA devices; allocated = Σ granted MiB over
//!   Σ MiB; used = per card the larger of `hami_host_gpu_memory_used_bytes` and its pods'
//!   `hami_container_device_memory_bytes`, over the memory of the cards with either;
//!   pending = status's `pending`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::time::Duration;

use hami_demo::{Cluster, DemoArgs, Progress};
use hami_webui::live::Live;
use hami_webui::report::dra_status::DraNode;
use hami_webui::report::{StatusReport, pod_report, status_report};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::ListParams;

const MIB: f64 = 1048576.0;

/// The repository's root.
fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What was compared, and what differed.
#[derive(Default)]
struct Tally {
    bad: Vec<String>,
    seen: String,
}

impl Tally {
    fn check(&mut self, what: String, page: f64, expected: f64) {
        self.seen.push_str(&format!("{what} = {expected}\n"));
        if !same(page, expected) {
            self.bad
                .push(format!("{what}: the page says {page}, expected {expected}"));
        }
    }
}

#[test]
fn console_numbers_equal_hami_status_and_the_monitors() {
    numbers_agree(false);
}

#[test]
fn console_numbers_equal_hami_status_and_the_monitors_dra() {
    numbers_agree(true);
}

/// What `hami status -o json --monitor` holds, and the monitors' raw series.
struct Moment {
    report: StatusReport,
    dra: Vec<DraNode>,
    pods: Vec<Pod>,
    /// `hami status --monitor`'s `usage`: per (namespace, pod, container, vdevice).
    live: Live,
    /// `hami_host_gpu_memory_used_bytes` by (node, device_uuid).
    host_memory: BTreeMap<(String, String), f64>,
    /// The pages' HTML: `/`, `/cards`, `/pods`.
    overview: String,
    cards: String,
    pods_page: String,
}

fn numbers_agree(dra: bool) {
    let _machine = crate::MACHINE.blocking_write();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir =
        std::env::temp_dir().join(format!("hami-console-numbers-{}-{dra}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args = DemoArgs {
        once: true,
        api_listen: "127.0.0.1:0".parse().unwrap(),
        examples: repo().join("examples"),
        kubeconfig_out: dir.join("kubeconfig"),
        settle_seconds: 25,
        scenario: None,
        ui_listen: "127.0.0.1:0".parse().unwrap(),
        dra,
    };
    let (cluster, ui, monitors) = runtime.block_on(async {
        let mut sink = Vec::new();
        let mut progress = Progress::new(&mut sink);
        let cluster = Cluster::start(&args, &mut progress).await.unwrap();
        let submitted = cluster
            .submit_examples(&args.examples, &mut progress)
            .await
            .unwrap();
        cluster
            .settle(&submitted, Duration::from_secs(25), &mut progress)
            .await;
        // Card-level counters as amdgpu exposes them, different per card: the monitors
        // report host memory per card.
        for node in &cluster.nodes {
            let Ok(gpus) = hami_monitor::host_gpus::amd_host_gpus(&node.tree.sysfs_root()) else {
                continue;
            };
            for (i, gpu) in gpus.iter().enumerate() {
                let d = format!("bus/pci/drivers/amdgpu/{}", gpu.pci_bdf);
                let used = (1u64 << 30) + ((i as u64) << 26);
                node.tree
                    .write(&format!("{d}/mem_info_vram_used"), &format!("{used}\n"))
                    .unwrap();
                node.tree
                    .write(&format!("{d}/gpu_busy_percent"), &format!("{}\n", 10 + i))
                    .unwrap();
            }
        }
        // Container samples (the demo's pods run no GPU processes here): fixed, one per
        // container and granted device, in the monitor's exposition.
        let pods = Api::<Pod>::all(cluster.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let mut monitors: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("http://{}/metrics", n.monitor_addr))
            .collect();
        let slices = Api::<ResourceSlice>::all(cluster.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let claims = Api::<ResourceClaim>::all(cluster.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let dra_nodes = hami_webui::report::dra_status::build(
            hami_manifests::names::DRA_DRIVER,
            &slices,
            &claims,
        );
        monitors.push(fixed_monitor(container_series(&pods, &dra_nodes)).await);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ui = hami_webui::start(
            cluster.client.clone(),
            listener,
            monitors.clone(),
            Duration::from_millis(300),
        )
        .unwrap();
        (cluster, ui, monitors)
    });

    let mut last = Vec::new();
    let mut checked = String::new();
    for _ in 0..60 {
        std::thread::sleep(Duration::from_millis(500));
        let moment = read_moment(&runtime, &cluster, ui.addr, &monitors);
        let (problems, what) = compare(&moment);
        if problems.is_empty() {
            checked = what;
            last.clear();
            break;
        }
        last = problems;
    }
    assert!(
        last.is_empty(),
        "the pages differ from hami status / the monitors (dra: {dra}):\n{}",
        last.join("\n")
    );
    // The comparison covered figures of every kind (not an empty demo).
    for needle in ["card ", "pod-granted ", "pod-used ", "tiles "] {
        assert!(
            checked.contains(needle),
            "nothing compared for {needle:?}: {checked}"
        );
    }
    if dra {
        assert!(checked.contains("dra-card "), "{checked}");
        assert!(checked.contains("dra-granted "), "{checked}");
    }
    ui.shutdown();
    runtime.block_on(cluster.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `(namespace, pod, container, device uuid)` of each container's granted devices, from
/// its allocation annotations (`pod_report`), and of each DRA pod's first container on the
/// devices its claims hold (the monitor reports a claim's region under the device's uuid).
fn container_series(pods: &[Pod], dra: &[DraNode]) -> Vec<(String, String, String, String)> {
    let mut out = Vec::new();
    for d in dra.iter().flat_map(|n| &n.devices) {
        for key in d.holders.iter().flat_map(|h| &h.pods) {
            let (ns, name) = key.split_once('/').unwrap();
            let pod = pods.iter().find(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && p.metadata.name.as_deref() == Some(name)
            });
            let Some(first) = pod
                .and_then(|p| p.spec.as_ref())
                .and_then(|s| s.containers.first())
            else {
                continue;
            };
            out.push((ns.into(), name.into(), first.name.clone(), d.uuid.clone()));
        }
    }
    for pod in pods {
        let Ok(r) = pod_report(pod) else { continue };
        // A pod's second device has no sample: its used % is over the sampled grant only.
        let mut devices: Vec<&str> = Vec::new();
        for c in &r.containers {
            for g in &c.got {
                if !devices.contains(&g.uuid.as_str()) {
                    devices.push(&g.uuid);
                }
                if devices.get(1) == Some(&g.uuid.as_str()) {
                    continue;
                }
                out.push((
                    r.namespace.clone(),
                    r.name.clone(),
                    c.name.clone(),
                    g.uuid.clone(),
                ));
            }
        }
    }
    out
}

/// A monitor stand-in serving fixed container samples (distinct per series).
async fn fixed_monitor(series: Vec<(String, String, String, String)>) -> String {
    let mut body = String::from("# TYPE hami_container_device_memory_bytes gauge\n");
    for (i, (ns, pod, ctr, uuid)) in series.iter().enumerate() {
        let labels = format!(
            "zone=\"vGPU\",namespace=\"{ns}\",pod=\"{pod}\",container=\"{ctr}\",vdevice_index=\"{i}\",device_uuid=\"{uuid}\""
        );
        body.push_str(&format!(
            "hami_container_device_memory_bytes{{{labels}}} {}\n",
            (300 + 37 * i as u64) << 20
        ));
        body.push_str(&format!(
            "hami_container_device_utilization_ratio{{{labels}}} {}\n",
            20 + i
        ));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let body = body.clone();
            async move { body }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/metrics")
}

/// Lists as `hami status` does, reads the monitors as `--monitor` does and their raw
/// series, and fetches the three pages.
fn read_moment(
    runtime: &tokio::runtime::Runtime,
    cluster: &Cluster,
    ui: std::net::SocketAddr,
    monitors: &[String],
) -> Moment {
    let client = cluster.client.clone();
    let (report, dra, pods) = runtime.block_on(async move {
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let pods = Api::<Pod>::all(client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let slices = Api::<ResourceSlice>::all(client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let claims = Api::<ResourceClaim>::all(client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let dra = hami_webui::report::dra_status::build(
            hami_manifests::names::DRA_DRIVER,
            &slices,
            &claims,
        );
        // The pending count does not depend on the scheduler's events (only its reasons).
        (status_report(&nodes, &pods, &[]), dra, pods)
    });
    let mut live = Live::default();
    let mut host_memory = BTreeMap::new();
    for url in monitors {
        live.extend(hami_webui::live::fetch(url).unwrap_or_else(|e| panic!("{url}: {e}")));
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches("/metrics");
        let body = get(addr.parse().unwrap(), "/metrics");
        for s in hami_protocol::scrape::parse_samples(&body).0 {
            if s.name == "hami_host_gpu_memory_used_bytes" {
                let label = |k: &str| s.label(k).unwrap_or_default().to_owned();
                host_memory.insert((label("node"), label("device_uuid")), s.value);
            }
        }
    }
    Moment {
        report,
        dra,
        pods,
        live,
        host_memory,
        overview: get(ui, "/"),
        cards: get(ui, "/cards?per=1000"),
        pods_page: get(ui, "/pods?per=1000"),
    }
}

/// `GET path` (HTTP/1.1, no TLS): the body of a 200 answer, de-chunked.
fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_owned();
    }
    let mut out = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// Text without tags.
fn text(html: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for c in html.chars() {
        match c {
            '<' => inside = true,
            '>' => inside = false,
            c if !inside => out.push(c),
            _ => {}
        }
    }
    unescape(&out)
}

/// The cells of each row of the first table after `marker`.
fn rows(page: &str, marker: &str) -> Vec<Vec<String>> {
    let at = page.find(marker).unwrap_or_else(|| panic!("no {marker:?}"));
    let body = &page[at..];
    let body = &body[body.find("<tbody>").unwrap()..body.find("</tbody>").unwrap()];
    body.split("<tr>")
        .skip(1)
        .map(|row| {
            row.split("<td>")
                .skip(1)
                .map(|c| c[..c.find("</td>").unwrap()].to_owned())
                .collect()
        })
        .collect()
}

/// The `<data value>` of class `class` in a cell.
fn data(cell: &str, class: &str) -> Option<f64> {
    let tag = format!("<data class=\"{class}\" value=\"");
    let v = &cell[cell.find(&tag)? + tag.len()..];
    Some(v[..v.find('"').unwrap()].parse().unwrap())
}

/// The attribute `name` on the page.
fn attr(page: &str, name: &str) -> Option<f64> {
    let tag = format!("{name}=\"");
    let v = &page[page.find(&tag)? + tag.len()..];
    Some(v[..v.find('"').unwrap()].parse().unwrap())
}

/// `a of b …` as two integers.
fn of(cell: &str) -> (u64, u64) {
    let t = text(cell);
    let mut words = t.split_whitespace();
    let a = words.next().unwrap().parse().unwrap();
    assert_eq!(words.next(), Some("of"), "{t}");
    (a, words.next().unwrap().parse().unwrap())
}

fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

/// Every figure of the three pages against the moment's numbers: the differences, and
/// what was compared (one line per figure).
fn compare(m: &Moment) -> (Vec<String>, String) {
    let mut t = Tally::default();

    // Cards, per (node, uuid): free MiB, its total, free compute, its total, shares.
    let mut expected: BTreeMap<(String, String), ([u64; 6], &str)> = BTreeMap::new();
    for n in &m.report.nodes {
        for g in &n.gpus {
            let figures = [
                g.memory_mib.saturating_sub(g.memory_used_mib),
                g.memory_mib,
                u64::from(g.cores).saturating_sub(g.cores_used),
                u64::from(g.cores),
                u64::from(g.shares_used),
                u64::from(g.shares),
            ];
            expected.insert((n.name.clone(), g.id.clone()), (figures, "card"));
        }
    }
    let plugin_ids: BTreeSet<(String, String)> = expected.keys().cloned().collect();
    let dra_devices: Vec<(&str, &hami_webui::report::dra_status::DraDevice)> = m
        .dra
        .iter()
        .flat_map(|n| n.devices.iter().map(move |d| (n.name.as_str(), d)))
        .filter(|(n, d)| !plugin_ids.contains(&((*n).to_owned(), d.uuid.clone())))
        .collect();
    for (node, d) in &dra_devices {
        let figures = [
            d.memory_bytes.saturating_sub(d.memory_used_bytes) >> 20,
            d.memory_bytes >> 20,
            d.compute_units.saturating_sub(d.compute_units_used),
            d.compute_units,
            d.shares_used,
            d.shares,
        ];
        expected.insert(((*node).to_owned(), d.uuid.clone()), (figures, "dra-card"));
    }
    let mut listed = BTreeSet::new();
    for row in rows(&m.cards, "cards and partitions") {
        let key = (text(&row[0]), text(&row[1]));
        listed.insert(key.clone());
        let Some((want, kind)) = expected.get(&key) else {
            t.bad.push(format!("cards: {key:?} is not in hami status"));
            continue;
        };
        let (free_mem, mem) = of(&row[4]);
        let (free_cores, cores) = of(&row[5]);
        let shares = text(&row[6]);
        let (used, count) = shares.split_once('/').unwrap();
        let got = [
            free_mem,
            mem,
            free_cores,
            cores,
            used.parse().unwrap(),
            count.parse().unwrap(),
        ];
        for (i, what) in [
            "free MiB",
            "MiB",
            "free compute",
            "compute",
            "shares used",
            "shares",
        ]
        .iter()
        .enumerate()
        {
            t.check(
                format!("{kind} {}/{} {what}", key.0, key.1),
                got[i] as f64,
                want[i] as f64,
            );
        }
    }
    for key in expected.keys().filter(|k| !listed.contains(*k)) {
        t.bad
            .push(format!("cards: {key:?} of hami status is not listed"));
    }

    // Pods: asked, granted, used, used %.
    let nodes_of: BTreeMap<String, String> = m
        .pods
        .iter()
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            Some((
                format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default()
                ),
                node,
            ))
        })
        .collect();
    // Memory used per (pod, device uuid), over its containers: `usage[]` of hami status.
    let mut used_on: BTreeMap<(String, String), f64> = BTreeMap::new();
    for (k, bytes) in &m.live.memory {
        let uuid = m.live.device.get(k).cloned().unwrap_or_default();
        *used_on
            .entry((format!("{}/{}", k.0, k.1), uuid))
            .or_default() += bytes;
    }
    let page_rows = rows(&m.pods_page, "GPU pods (asked");
    let mut page_pods = BTreeSet::new();
    for pod in &m.pods {
        let key = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        let report = pod_report(pod).ok();
        // (uuid, MiB) granted, merged per device as one grant.
        let mut grants: Vec<(String, f64)> = Vec::new();
        let mut asked = Vec::new();
        if let Some(r) = &report {
            for c in &r.containers {
                asked.extend(c.asked.iter().map(|a| a.describe()));
                for g in &c.got {
                    match grants.iter_mut().find(|(u, _)| *u == g.uuid) {
                        Some(same) => same.1 += g.memory_mib as f64,
                        None => grants.push((g.uuid.clone(), g.memory_mib as f64)),
                    }
                }
            }
            // Whole cards: the card's MiB as status lists it.
            for held in &r.whole_cards {
                for card in &held.cards {
                    let mem = m
                        .report
                        .nodes
                        .iter()
                        .flat_map(|n| &n.gpus)
                        .find(|g| g.id == *card)
                        .map(|g| g.memory_mib as f64);
                    if let Some(mem) = mem {
                        grants.push((card.clone(), mem));
                    }
                }
            }
        }
        let mut dra_granted = false;
        for n in &m.dra {
            for d in &n.devices {
                for h in d.holders.iter().filter(|h| h.pods.contains(&key)) {
                    grants.push((d.uuid.clone(), h.memory_bytes as f64 / MIB));
                    dra_granted = true;
                }
            }
        }
        let claims: Vec<&str> = pod
            .spec
            .iter()
            .flat_map(|s| s.resource_claims.iter().flatten())
            .map(|c| c.name.as_str())
            .collect();
        if asked.is_empty() && !claims.is_empty() {
            asked.push(format!("claims {} (DRA)", claims.join(", ")));
        }
        if asked.is_empty() && grants.is_empty() && report.is_some() {
            continue;
        }
        page_pods.insert(key.clone());
        let link = format!(">{key}</a>");
        let Some(row) = page_rows.iter().find(|r| r[0].contains(&link)) else {
            t.bad.push(format!("pods: {key} is not listed"));
            continue;
        };
        if report.is_some() {
            let page_asked: Vec<String> = row[3].split("<br>").map(text).collect();
            let want = if asked.is_empty() {
                vec!["-".to_owned()]
            } else {
                asked.clone()
            };
            t.seen.push_str(&format!("pod-asked {key} = {want:?}\n"));
            if page_asked != want {
                t.bad.push(format!(
                    "pods: {key} asked {page_asked:?}, expected {want:?}"
                ));
            }
        }
        let granted = grants.iter().map(|g| g.1).sum::<f64>();
        let kind = if dra_granted {
            "dra-granted"
        } else {
            "pod-granted"
        };
        match data(&row[4], "granted-mib") {
            Some(v) => t.check(format!("{kind} {key} MiB"), v, granted),
            None if grants.is_empty() => {}
            None => t.bad.push(format!("pods: {key} shows no granted figure")),
        }
        let sampled: Vec<(f64, f64)> = grants
            .iter()
            .filter_map(|(uuid, mib)| {
                used_on
                    .get(&(key.clone(), uuid.clone()))
                    .map(|b| (b / MIB, *mib))
            })
            .collect();
        let used = (!sampled.is_empty()).then(|| sampled.iter().map(|s| s.0).sum::<f64>());
        let limit = sampled.iter().map(|s| s.1).sum::<f64>();
        match (data(&row[5], "used-mib"), used) {
            (Some(v), Some(u)) => t.check(format!("pod-used {key} MiB"), v, u),
            (None, None) => {}
            (v, u) => t
                .bad
                .push(format!("pods: {key} used {v:?}, expected {u:?}")),
        }
        let pct = used.filter(|_| limit > 0.0).map(|u| u * 100.0 / limit);
        match (data(&row[6], "used-pct"), pct) {
            (Some(v), Some(p)) => t.check(format!("pod-used {key} %"), v, p),
            (None, None) => {}
            (v, p) => t
                .bad
                .push(format!("pods: {key} used % {v:?}, expected {p:?}")),
        }
    }
    for row in &page_rows {
        let key = text(&row[0]);
        if !page_pods.contains(&key) {
            t.bad
                .push(format!("pods: {key} is listed but holds or asks nothing"));
        }
    }

    // Overview tiles.
    let mut cards: Vec<(String, String, f64, f64)> = Vec::new(); // node, uuid, MiB, granted
    for n in &m.report.nodes {
        for g in &n.gpus {
            cards.push((
                n.name.clone(),
                g.id.clone(),
                g.memory_mib as f64,
                g.memory_used_mib as f64,
            ));
        }
    }
    for (node, d) in &dra_devices {
        cards.push((
            (*node).to_owned(),
            d.uuid.clone(),
            d.memory_bytes as f64 / MIB,
            d.memory_used_bytes as f64 / MIB,
        ));
    }
    // Pods' memory per card: their containers' series, on their pods' nodes.
    let mut pods_on: BTreeMap<(String, String), f64> = BTreeMap::new();
    for ((pod, uuid), bytes) in &used_on {
        if let Some(node) = nodes_of.get(pod) {
            *pods_on.entry((node.clone(), uuid.clone())).or_default() += bytes;
        }
    }
    let (mut used, mut of_sampled) = (0.0, 0.0);
    for (node, uuid, mem, _) in &cards {
        let key = (node.clone(), uuid.clone());
        let card = match (m.host_memory.get(&key), pods_on.get(&key)) {
            (Some(a), Some(b)) => Some(a.max(*b)),
            (a, b) => a.or(b).copied(),
        };
        if let Some(bytes) = card {
            used += bytes / MIB;
            of_sampled += mem;
        }
    }
    let tiles: [(&str, Option<f64>); 6] = [
        ("data-gpus", Some(cards.len() as f64)),
        ("data-granted-mib", Some(cards.iter().map(|c| c.3).sum())),
        ("data-pending", Some(m.report.pending.len() as f64)),
        ("data-used-mib", (of_sampled > 0.0).then_some(used)),
        ("data-of-mib", (of_sampled > 0.0).then_some(of_sampled)),
        ("allocated-of", Some(cards.iter().map(|c| c.2).sum())),
    ];
    for (name, want) in tiles {
        let page = match name {
            "allocated-of" => {
                let alloc = &m.overview[m.overview.find("data-granted-mib").unwrap()..];
                attr(alloc, "data-of-mib")
            }
            "data-of-mib" => {
                let used_tile = &m.overview[m.overview.find("tile-used").unwrap()..];
                attr(used_tile, "data-of-mib")
            }
            _ => attr(&m.overview, name),
        };
        match (page, want) {
            (Some(p), Some(w)) => t.check(format!("tiles {name}"), p, w),
            (None, None) => {}
            (p, w) => t
                .bad
                .push(format!("overview: {name} {p:?}, expected {w:?}")),
        }
    }
    (t.bad, t.seen)
}
