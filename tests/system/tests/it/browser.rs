//! The web UI in a real browser: Debian's Chromium (headless) driven by chromedriver over
//! its W3C HTTP protocol (a small client below), against the demo's cluster (`hami demo`'s
//! components in-process, its example pods, its monitors). Every page loads without
//! console errors and shows what the API server holds: the nodes, one card per
//! registered GPU or partition, the pods; each CU map has one cell per CU and its owners'
//! cells match `hami.io/amd-cu-allocated` (decoded by crates/protocol); charts have data
//! where a monitor has samples and say "No samples yet" where none has; the live refresh
//! runs; the What-if form plans; unknown objects are 404 pages. The demo runs with `--dra`:
//! its DRA node's page has one card per device of the driver's ResourceSlices, each CU map
//! one cell per published CU and its owners' cells match the claims' `cuRanges`, and each
//! DRA pod's page lists its shares. axe-core checks each page (headings, labels,
//! contrast). Issue 27: every page works under the UI's Content-Security-Policy (no
//! violation in the console, the live refresh and the What-if form still run), the
//! answers carry the security headers, a page on another site can neither frame the UI
//! nor submit its What-if form (403). Issue 31: the overview, cards and pods pages are
//! axe-clean at 1440 and 390 px in light and dark (DevTools emulation), and only their
//! tables scroll sideways at 390 px; keyboard focus survives a live update and the pause
//! control stops them. Issue 31 items 6 and 7: the charts label every value tick with its
//! unit, offer only the window the history allows, draw a pod's grant and enforced limit as
//! levels and say why there is no Grafana link; a CU map's owners differ in pattern as
//! well as colour, named in the legend, and keep both across a live update; the MI300X's
//! partitions sit under their physical cards; node and pod pages are axe-clean at 1440 and
//! 390 px in light and dark too. Screenshots go to target/webui-screenshots/.
//!
//! Needs `chromium` and `chromium-driver` (Debian packages; CI installs them) and
//! `npm ci --prefix crates/webui/tests/axe` (CI runs it): fails clearly without them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use hami_demo::{Cluster, DemoArgs, Progress};
use hami_protocol::cu_allocated::CuAllocation;
use hami_protocol::cu_list::CuSet;
use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::names::{Vendor, pod as pod_keys};
use hami_protocol::node_register::decode_node_devices;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

mod stand_ins;
mod webdriver;

use stand_ins::{other_site, repo, sampling_monitor};
use webdriver::Browser;

#[test]
fn every_page_in_chromium_against_the_demo() {
    let _machine = crate::MACHINE.blocking_write();
    let axe_path = repo().join("crates/webui/tests/axe/node_modules/axe-core/axe.min.js");
    let axe_source = std::fs::read_to_string(&axe_path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run `npm ci --prefix crates/webui/tests/axe` (CI does)",
            axe_path.display()
        )
    });
    let shots = repo().join("target/webui-screenshots");
    let browser = Browser::start(shots.clone());

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = std::env::temp_dir().join(format!("hami-webui-browser-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args = DemoArgs {
        once: true,
        api_listen: "127.0.0.1:0".parse().unwrap(),
        examples: repo().join("examples"),
        kubeconfig_out: dir.join("kubeconfig"),
        settle_seconds: 25,
        scenario: None,
        ui_listen: "127.0.0.1:0".parse().unwrap(),
        dra: true,
    };
    let (cluster, demo_ui, ui, nodes, pods, slices, claims, series) = runtime.block_on(async {
        let mut sink = Vec::new();
        let mut progress = Progress::new(&mut sink);
        let cluster = Cluster::start(&args, &mut progress).await.unwrap();
        let demo_ui = hami_demo::start_ui(&cluster, &args).await.unwrap();
        let submitted = cluster
            .submit_examples(&args.examples, &mut progress)
            .await
            .unwrap();
        cluster
            .settle(&submitted, Duration::from_secs(25), &mut progress)
            .await;
        // Card-level counters in the simulated sysfs, as amdgpu exposes them: the real
        // monitors then report host memory and busy percent per card.
        for node in &cluster.nodes {
            let Ok(gpus) = hami_monitor::host_gpus::amd_host_gpus(&node.tree.sysfs_root()) else {
                continue;
            };
            for gpu in gpus {
                let d = format!("bus/pci/drivers/amdgpu/{}", gpu.pci_bdf);
                node.tree
                    .write(&format!("{d}/mem_info_vram_used"), "2147483648\n")
                    .unwrap();
                node.tree
                    .write(&format!("{d}/gpu_busy_percent"), "37\n")
                    .unwrap();
            }
        }
        let nodes = Api::<Node>::all(cluster.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let pods = Api::<Pod>::all(cluster.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
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
        // Container samples for the AMD pods on the MI210 node.
        let mut series = Vec::new();
        for pod in &pods {
            let a = pod.metadata.annotations.clone().unwrap_or_default();
            let Some(list) = a.get(Vendor::Amd.names().devices_allocated) else {
                continue;
            };
            let runs = decode_pod_devices(list).unwrap();
            let containers = &pod.spec.as_ref().unwrap().containers;
            for (run, ctr) in runs
                .iter()
                .skip(
                    pod.spec
                        .as_ref()
                        .unwrap()
                        .init_containers
                        .as_ref()
                        .map_or(0, |c| c.len()),
                )
                .zip(containers)
            {
                for dev in run {
                    series.push((
                        "default".to_owned(),
                        pod.metadata.name.clone().unwrap(),
                        ctr.name.clone(),
                        dev.uuid.clone(),
                        dev.mem_mib,
                    ));
                }
            }
        }
        assert!(!series.is_empty(), "the demo places AMD pods");
        let mut monitors: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("http://{}/metrics", n.monitor_addr))
            .collect();
        monitors.push(sampling_monitor(series.clone()).await);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ui = hami_webui::start(
            cluster.client.clone(),
            listener,
            monitors,
            Duration::from_millis(500),
        )
        .unwrap();
        (cluster, demo_ui, ui, nodes, pods, slices, claims, series)
    });
    let url = ui.url();
    let mut problems: Vec<String> = Vec::new();
    let check_page = |browser: &Browser, name: &str, problems: &mut Vec<String>| {
        let errors = browser.console_errors();
        if !errors.is_empty() {
            problems.push(format!("{name}: console errors: {errors:?}"));
        }
        let violations = browser.axe(&axe_source);
        if !violations.is_empty() {
            problems.push(format!("{name}: axe: {violations:?}"));
        }
        browser.screenshot(name);
    };

    // The demo's own UI serves the same cluster.
    browser.go(&demo_ui.url());
    browser.wait(
        "return document.querySelectorAll('a[href^=\"/nodes/\"]').length >= 3;",
        "the demo UI's node links",
    );

    // Overview: every GPU node, every pending GPU pod; the trend has data; live refresh runs.
    browser.go(&url);
    browser.wait("return document.body.innerText.indexOf('Still listing') < 0 && document.querySelectorAll('figure.chart svg[data-points]').length >= 2;", "the overview with its trend charts");
    let text = browser.text();
    let gpu_nodes: Vec<&Node> = nodes
        .iter()
        .filter(|n| {
            let a = n.metadata.annotations.clone().unwrap_or_default();
            Vendor::ALL
                .iter()
                .any(|v| a.contains_key(v.names().node_register))
        })
        .collect();
    assert!(gpu_nodes.len() >= 3, "{}", gpu_nodes.len());
    for n in &gpu_nodes {
        let name = n.metadata.name.clone().unwrap();
        assert!(text.contains(&name), "overview lists node {name}:\n{text}");
    }
    for p in &pods {
        let bound = p.spec.as_ref().and_then(|s| s.node_name.clone()).is_some();
        let asks = hami_protocol::requests::pod_requests(p, &Default::default())
            .is_ok_and(|r| r.iter().any(|c| !c.is_empty()));
        if !bound && asks {
            let name = p.metadata.name.clone().unwrap();
            assert!(
                text.contains(&format!("default/{name}")),
                "pending pod {name} listed:\n{text}"
            );
        }
    }
    // Compute used per type: the real monitors' card busy percent (sysfs above).
    browser.wait(
        "return document.body.innerText.indexOf('37% busy') >= 0;",
        "the cards' busy percent from the monitors",
    );
    browser.wait("var s = document.getElementById('live-status'); return !!s && s.textContent.indexOf('Live: updated') === 0;", "the live refresh");
    check_page(&browser, "overview", &mut problems);
    // Issue 31 item 6: the trend's three charts (memory, allocation vs usage in percent,
    // utilization) label every value tick with its unit; minutes after the UI started only
    // the 15 min window is offered; without --grafana-url the page says why there is no link.
    browser.wait(
        "return document.querySelectorAll('figure.chart > svg[data-unit]').length >= 3;",
        "the overview's three trend charts",
    );
    let units = browser.js("return Array.prototype.map.call(document.querySelectorAll('figure.chart > svg[data-unit]'), function (s) { var u = s.getAttribute('data-unit'); var ticks = Array.prototype.map.call(s.querySelectorAll('text.tick.y'), function (t) { return t.textContent; }); return [u, ticks.length >= 2 && ticks.every(function (t) { return u === '%' ? /^[0-9.]+%$/.test(t) : t.endsWith(' ' + u); }), s.getAttribute('data-window')]; });");
    let memory_unit = units[0][0].as_str().unwrap_or_default().to_owned();
    assert!(
        ["MiB", "GiB", "TiB"].contains(&memory_unit.as_str()),
        "{units}"
    );
    assert_eq!(
        units,
        json!([
            [memory_unit, true, "15m"],
            ["%", true, "15m"],
            ["%", true, "15m"]
        ]),
        "units on every tick, the 15 min window"
    );
    assert_eq!(
        browser.js("var n = document.querySelector('[data-windows]'); return [n && n.getAttribute('data-windows'), document.querySelectorAll('a.grafana').length, document.body.innerText.indexOf('not given Grafana') >= 0];"),
        json!(["15m", 0, true])
    );
    // The security headers, as the browser receives them.
    let headers = browser.cmd(
        "POST",
        "execute/async",
        Some(json!({"script": "var done = arguments[arguments.length - 1]; fetch('/', {cache: 'no-store'}).then(function (r) { done(['content-security-policy', 'x-content-type-options', 'x-frame-options', 'referrer-policy'].map(function (h) { return r.headers.get(h); })); }, function (e) { done(['fetch failed: ' + e]); });", "args": []})),
    );
    assert_eq!(
        headers,
        json!([
            hami_webui::server::CONTENT_SECURITY_POLICY,
            "nosniff",
            "DENY",
            "same-origin"
        ])
    );

    // Node pages: cards and CU maps against the annotations.
    let mut styles: BTreeMap<String, Vec<Vec<String>>> = BTreeMap::new();
    for n in &gpu_nodes {
        let name = n.metadata.name.clone().unwrap();
        browser.go(&format!("{url}nodes/{name}"));
        browser.wait(
            "return document.querySelectorAll('h1').length === 1;",
            "a node page",
        );
        let a = n.metadata.annotations.clone().unwrap_or_default();
        let mut devices = Vec::new();
        for v in Vendor::ALL {
            if let Some(text) = a.get(v.names().node_register) {
                devices.extend(
                    decode_node_devices(text)
                        .unwrap()
                        .into_iter()
                        .map(|d| (v, d)),
                );
            }
        }
        let cards = browser.js("return document.querySelectorAll('section.card').length;");
        assert_eq!(
            cards,
            json!(devices.len()),
            "node {name}: one card per registered GPU/partition"
        );
        // Expected CU owners per card, from the pods' annotations.
        let mut owners: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for p in &pods {
            if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(name.as_str()) {
                continue;
            }
            let pa = p.metadata.annotations.clone().unwrap_or_default();
            if let Some(text) = pa.get(pod_keys::AMD_CU_ALLOCATED) {
                for (uuid, set) in CuAllocation::parse(text).unwrap().0 {
                    owners.entry(uuid).or_default().insert(
                        format!("default/{}", p.metadata.name.clone().unwrap()),
                        set.len(),
                    );
                }
            }
        }
        for (vendor, d) in &devices {
            let sel = format!(
                "document.querySelector('section[data-card=\"' + CSS.escape({}) + '\"]')",
                json!(d.id)
            );
            if *vendor != Vendor::Amd {
                assert_eq!(
                    browser.js(&format!("return {sel}.querySelectorAll('rect.cu').length;")),
                    json!(0)
                );
                continue;
            }
            let cells = browser.js(&format!("return {sel}.querySelectorAll('rect.cu').length;"));
            assert_eq!(cells, json!(d.devcore), "{name} {}: one cell per CU", d.id);
            let drawn = browser.cu_owners(&sel);
            let expected: BTreeMap<String, u64> = owners.get(&d.id).cloned().unwrap_or_default();
            assert_eq!(drawn, expected, "{name} {}: CU map owners", d.id);
            // Issue 31 item 7: a card's owners differ in pattern (up to seven) and colour,
            // the legend says the pattern in words, and each patterned owner's marks lie
            // over its cells.
            let legend = browser.js(&format!("return Array.prototype.map.call({sel}.querySelectorAll('li[data-pod]'), function (l) {{ return [l.getAttribute('data-pod'), l.getAttribute('data-colour'), l.getAttribute('data-pattern'), l.textContent]; }});"));
            let legend: Vec<Vec<String>> = serde_json::from_value(legend).unwrap();
            assert_eq!(legend.len(), expected.len(), "{name} {}: {legend:?}", d.id);
            let patterns: BTreeSet<&String> = legend.iter().map(|l| &l[2]).collect();
            let colours: BTreeSet<&String> = legend.iter().map(|l| &l[1]).collect();
            assert_eq!(patterns.len(), legend.len().min(7), "{legend:?}");
            assert_eq!(colours.len(), legend.len().min(8), "{legend:?}");
            for l in &legend {
                assert!(l[3].ends_with(&format!("; {})", l[2])), "{l:?}");
            }
            let patterned = legend.iter().filter(|l| l[2] != "plain").count();
            assert_eq!(
                browser.js(&format!(
                    "return {sel}.querySelectorAll('path.marks').length;"
                )),
                json!(patterned),
                "{name} {}: marks per patterned owner",
                d.id
            );
            styles.insert(d.id.clone(), legend);
        }
        // Partitions under their physical card: a group per card, each partition inside
        // its card's group, the partitions the mode implies that did not register shown.
        let mut by_card: BTreeMap<String, usize> = BTreeMap::new();
        for (_, d) in &devices {
            let mode = d.custom_info.compute_partition.as_deref().unwrap_or("SPX");
            if let (false, Some(bdf)) = (mode.eq_ignore_ascii_case("SPX"), &d.custom_info.pci_bdf) {
                *by_card.entry(bdf.clone()).or_default() += 1;
            }
        }
        let groups = browser.js("return Array.prototype.map.call(document.querySelectorAll('section.physical'), function (g) { return [g.getAttribute('data-pci'), +g.getAttribute('data-partitions'), +g.getAttribute('data-expected'), +g.getAttribute('data-missing'), g.querySelectorAll('section.card').length, g.querySelectorAll('.card.missing').length, Array.prototype.map.call(g.querySelectorAll('section.card'), function (c) { return c.getAttribute('data-card'); })]; });");
        let groups: Vec<PhysicalGroup> = serde_json::from_value(groups).unwrap();
        assert_eq!(
            groups.len(),
            by_card.len(),
            "{name}: a group per partitioned card"
        );
        for (bdf, partitions, expected, missing, cards, placeholders, ids) in &groups {
            assert_eq!(by_card.get(bdf), Some(partitions), "{name} {bdf}");
            assert_eq!(
                (*cards, *placeholders),
                (*partitions, *missing),
                "{name} {bdf}"
            );
            assert_eq!(partitions + missing, *expected, "{name} {bdf}");
            for id in ids {
                let (_, d) = devices.iter().find(|(_, d)| d.id == *id).unwrap();
                assert_eq!(d.custom_info.pci_bdf.as_ref(), Some(bdf), "{name} {id}");
            }
        }
        if name == "mi300x-node" {
            assert!(!groups.is_empty(), "the demo's MI300X node is in CPX mode");
        }
        if name == "mi210-node" {
            let used = browser.js("return document.body.innerText.indexOf('2048 used') >= 0;");
            assert_eq!(
                used,
                json!(true),
                "the MI210 cards show the monitor's card memory"
            );
        }
        if name == "mi210-node" {
            // A live update redraws the maps with every owner's colour and pattern kept.
            let before = browser.js("return +(document.body.getAttribute('data-updates') || 0);");
            browser.wait(
                &format!("return +(document.body.getAttribute('data-updates') || 0) > {before};"),
                "a live update of the node page",
            );
            for (id, legend) in &styles {
                let Some(_) = devices.iter().find(|(_, d)| d.id == *id) else {
                    continue;
                };
                let again = browser.js(&format!("return Array.prototype.map.call(document.querySelectorAll('section[data-card=\"' + CSS.escape({}) + '\"] li[data-pod]'), function (l) {{ return [l.getAttribute('data-pod'), l.getAttribute('data-colour'), l.getAttribute('data-pattern'), l.textContent]; }});", json!(id)));
                assert_eq!(
                    &serde_json::from_value::<Vec<Vec<String>>>(again).unwrap(),
                    legend,
                    "{id}"
                );
            }
        }
        check_page(&browser, &format!("node-{name}"), &mut problems);
    }
    assert!(
        owners_seen(&pods) > 0,
        "the demo has pods with CU allocations"
    );

    // The DRA node: a card per device of the driver's slices, CU maps against the claims.
    let dra_nodes: Vec<&Node> = nodes
        .iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("hami.io/amd-mode"))
                == Some(&"dra".to_string())
        })
        .collect();
    assert_eq!(dra_nodes.len(), 1, "the demo --dra has one DRA node");
    let dra_name = dra_nodes[0].metadata.name.clone().unwrap();
    browser.go(&url);
    let overview = browser.text();
    assert!(
        overview.contains("DRA nodes") && overview.contains(&dra_name),
        "the overview lists the DRA node:\n{overview}"
    );
    browser.go(&format!("{url}nodes/{dra_name}"));
    browser.wait(
        "return document.querySelectorAll('section[data-dra-device]').length > 0;",
        "the DRA node's devices",
    );
    let mut dra_devices: BTreeMap<String, u64> = BTreeMap::new();
    for sl in slices
        .iter()
        .filter(|s| s.spec.driver == hami_protocol::dra::DRIVER)
    {
        assert_eq!(sl.spec.node_name.as_deref(), Some(dra_name.as_str()));
        for d in sl.spec.devices.iter().flatten() {
            let cus = d
                .capacity
                .as_ref()
                .and_then(|c| c.get(hami_protocol::dra::COMPUTE_UNITS))
                .map(|q| hami_protocol::capacity::parse(&q.value.0).unwrap())
                .unwrap_or(0);
            dra_devices.insert(format!("{}/{}", sl.spec.pool.name, d.name), cus);
        }
    }
    assert!(!dra_devices.is_empty(), "the DRA driver published devices");
    assert_eq!(
        browser.js("return document.querySelectorAll('section[data-dra-device]').length;"),
        json!(dra_devices.len()),
        "one card per DRA device"
    );
    // Expected CU owners per device: each allocated result's cuRanges, for its pod.
    let mut dra_owners: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut dra_pods: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in &claims {
        let Some(status) = &c.status else { continue };
        let pod = status
            .reserved_for
            .iter()
            .flatten()
            .find(|r| r.resource == "pods")
            .map(|r| format!("{}/{}", c.metadata.namespace.clone().unwrap(), r.name));
        for d in status
            .devices
            .iter()
            .flatten()
            .filter(|d| d.driver == hami_protocol::dra::DRIVER)
        {
            let Some(ranges) = d
                .data
                .as_ref()
                .and_then(|v| v.0.get(hami_protocol::dra::CU_RANGES))
                .and_then(|v| v.as_str())
            else {
                continue;
            };
            let device = format!("{}/{}", d.pool, d.device);
            let total = dra_devices[&device] as u32;
            let set = CuSet::parse(ranges, total).unwrap();
            let owner = pod.clone().unwrap_or_default();
            *dra_owners
                .entry(device)
                .or_default()
                .entry(owner.clone())
                .or_default() += set.len() as u64;
            dra_pods.entry(owner).or_default().push(ranges.to_owned());
        }
    }
    assert!(
        !dra_owners.is_empty(),
        "the demo's DRA claims were prepared"
    );
    for (device, cus) in &dra_devices {
        let sel = format!(
            "document.querySelector('section[data-dra-device=\"' + CSS.escape({}) + '\"]')",
            json!(device)
        );
        let cells = browser.js(&format!("return {sel}.querySelectorAll('rect.cu').length;"));
        assert_eq!(cells, json!(cus), "{device}: one cell per CU");
        let drawn = browser.cu_owners(&sel);
        let expected = dra_owners.get(device).cloned().unwrap_or_default();
        assert_eq!(drawn, expected, "{device}: CU map owners");
    }
    check_page(&browser, &format!("node-{dra_name}"), &mut problems);
    // Each DRA pod's page lists its shares with the CU ranges the driver chose.
    for (pod, ranges) in &dra_pods {
        browser.go(&format!("{url}pods/{pod}"));
        browser.wait(
            "return document.querySelectorAll('h1').length === 1;",
            "a DRA pod page",
        );
        let t = browser.text();
        assert!(t.contains("DRA shares"), "pod {pod}:\n{t}");
        for r in ranges {
            assert!(t.contains(r.as_str()), "pod {pod} shows CUs {r}:\n{t}");
        }
    }
    if let Some(pod) = dra_pods.keys().next() {
        browser.go(&format!("{url}pods/{pod}"));
        check_page(&browser, "pod-dra", &mut problems);
    }

    // Pod pages: containers asked and got; charts with data for the sampled pods.
    for p in &pods {
        let name = p.metadata.name.clone().unwrap();
        let a = p.metadata.annotations.clone().unwrap_or_default();
        browser.go(&format!("{url}pods/default/{name}"));
        browser.wait(
            "return document.querySelectorAll('h1').length === 1;",
            "a pod page",
        );
        let h1 = browser.js("return document.querySelector('h1').textContent;");
        assert_eq!(h1, json!(format!("Pod default/{name}")));
        let spec = p.spec.as_ref().unwrap();
        let containers =
            spec.containers.len() + spec.init_containers.as_ref().map_or(0, |c| c.len());
        let rows = browser.js("return document.querySelectorAll('table tbody')[0].rows.length;");
        assert_eq!(rows, json!(containers), "pod {name}: a row per container");
        if a.contains_key(Vendor::Amd.names().devices_allocated) && spec.node_name.is_some() {
            browser.wait("return document.querySelectorAll('figure.chart svg polyline').length >= 2 && Array.prototype.every.call(document.querySelectorAll('figure.chart > svg'), function (s) { return +s.getAttribute('data-points') > 0; });", &format!("pod {name}'s charts with data"));
            // Issue 31 item 6: each sampled container's grant ("asked") and enforced limit
            // drawn as levels at its granted MiB, on a chart in MiB/GiB with the 15 min
            // window alone (the UI has run for minutes).
            browser.wait(
                "return document.querySelectorAll('figure.chart line.level').length > 0;",
                &format!("pod {name}'s levels"),
            );
            let levels = browser.js("return Array.prototype.map.call(document.querySelectorAll('figure.chart line.level'), function (l) { return [l.getAttribute('data-level'), +l.getAttribute('data-value')]; });");
            let levels: BTreeSet<(String, u64)> =
                serde_json::from_value::<Vec<(String, u64)>>(levels)
                    .unwrap()
                    .into_iter()
                    .collect();
            for (_, pod, _, _, mib) in series.iter().filter(|s| s.1 == name) {
                assert!(
                    levels.contains(&("asked".to_owned(), *mib)),
                    "{pod}: {levels:?}"
                );
                assert!(
                    levels.contains(&("limit".to_owned(), *mib)),
                    "{pod}: {levels:?}"
                );
            }
            assert_eq!(
                browser.js("return [document.querySelector('[data-windows]').getAttribute('data-windows'), Array.prototype.every.call(document.querySelectorAll('figure.chart > svg'), function (s) { return s.getAttribute('data-window') === '15m'; })];"),
                json!(["15m", true]),
                "pod {name}: the 15 min window alone"
            );
            check_page(&browser, &format!("pod-{name}"), &mut problems);
        } else if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
            // DRA pods: their shares are checked above; the real monitor may sample them.
        } else {
            let t = browser.text();
            assert!(
                t.contains("No samples yet"),
                "pod {name} without samples says so:\n{t}"
            );
            if name == "cannot-fit" {
                check_page(&browser, &format!("pod-{name}"), &mut problems);
            }
        }
    }

    // What-if: the form plans the default scenario.
    browser.go(&format!("{url}whatif"));
    browser.js("document.querySelector('form').submit(); return true;");
    browser.wait(
        "return document.querySelectorAll('details').length > 0;",
        "the plan's results",
    );
    assert_eq!(
        browser.js(
            "return +document.querySelector('figure.chart svg').getAttribute('data-points') > 0;"
        ),
        json!(true)
    );
    check_page(&browser, "whatif", &mut problems);

    // Cards and Pods (issue 31 items 1 and 2): every GPU node on the cards page, its fits
    // filter answering, every placed GPU pod on the pods page; both axe-clean.
    browser.go(&format!("{url}cards"));
    browser.wait(
        "return document.querySelectorAll('h1').length === 1 && document.querySelectorAll('table tbody tr').length > 0;",
        "the cards page",
    );
    let cards = browser.text();
    for n in &gpu_nodes {
        let name = n.metadata.name.clone().unwrap();
        assert!(
            cards.contains(&name),
            "the cards page lists {name}:\n{cards}"
        );
    }
    check_page(&browser, "cards", &mut problems);
    browser.go(&format!("{url}cards?mem=1024&pct=10"));
    browser.wait(
        "return document.querySelectorAll('h1').length === 1;",
        "the cards page filtered to a 1 GiB / 10 % slice",
    );
    check_page(&browser, "cards-fits", &mut problems);
    browser.go(&format!("{url}pods"));
    browser.wait(
        "return document.querySelectorAll('h1').length === 1;",
        "the pods page",
    );
    let listed = browser.text();
    for p in &pods {
        let a = p.metadata.annotations.clone().unwrap_or_default();
        if a.contains_key(Vendor::Amd.names().devices_allocated) {
            let name = p.metadata.name.clone().unwrap();
            assert!(
                listed.contains(&name),
                "the pods page lists {name}:\n{listed}"
            );
        }
    }
    check_page(&browser, "pods", &mut problems);

    // Issue 31 items 3 and 9: the overview, cards and pods pages axe-clean at 1440 and
    // 390 px, light and dark; at 390 px only the tables' own boxes scroll sideways (the
    // page itself does not), and dark really is dark.
    // Issue 31 items 6 and 7 too: a node page with CU maps, the MI300X's partitions grouped
    // under their cards, and a pod page with its charts.
    let sampled_pod = format!("pods/default/{}", series[0].1);
    for (page, path) in [
        ("overview", ""),
        ("cards", "cards"),
        ("pods", "pods"),
        ("node-mi210", "nodes/mi210-node"),
        ("node-mi300x", "nodes/mi300x-node"),
        ("pod-charts", sampled_pod.as_str()),
    ] {
        for width in [1440, 390] {
            for dark in [false, true] {
                let look = if dark { "dark" } else { "light" };
                browser.emulate(width, dark);
                browser.go(&format!("{url}{path}"));
                browser.wait(
                    "return document.querySelectorAll('h1').length === 1 && document.querySelectorAll('main table, main svg').length > 0;",
                    &format!("the {page} page at {width} px, {look}"),
                );
                assert_eq!(
                    browser.js("return [window.innerWidth, matchMedia('(prefers-color-scheme: dark)').matches, getComputedStyle(document.body).backgroundColor];"),
                    json!([width, dark, if dark { "rgb(18, 20, 23)" } else { "rgb(255, 255, 255)" }]),
                    "{page}: the emulated width and colour scheme"
                );
                let overflow = browser.js(
                    "return document.documentElement.scrollWidth - document.documentElement.clientWidth;",
                );
                if overflow.as_i64() != Some(0) {
                    problems.push(format!(
                        "{page} at {width} px, {look}: the page scrolls sideways by {overflow} px"
                    ));
                }
                check_page(&browser, &format!("{page}-{width}-{look}"), &mut problems);
            }
        }
    }
    browser.emulate_reset();

    // Issue 31 item 5: a live update keeps keyboard focus (the page is updated in place,
    // not replaced), and the pause control stops updates.
    browser.go(&url);
    browser.wait(
        "return +(document.body.getAttribute('data-updates') || 0) >= 1;",
        "the overview's first live update",
    );
    assert_eq!(
        browser.js("window.__focused = document.querySelector('main table a[href^=\"/nodes/\"]'); window.__focused.focus(); window.__updates = +document.body.getAttribute('data-updates'); window.__changes = +document.body.getAttribute('data-changes'); return document.activeElement === window.__focused;"),
        json!(true),
        "a node link takes focus"
    );
    browser.wait(
        "return +document.body.getAttribute('data-updates') >= window.__updates + 2;",
        "two more live updates",
    );
    assert_eq!(
        browser.js("return [document.activeElement === window.__focused, document.body.contains(window.__focused), +document.body.getAttribute('data-changes') > window.__changes];"),
        json!([true, true, true]),
        "focus survives live updates that changed the page (the figures' ages at least)"
    );
    browser.js("document.getElementById('live-pause').click(); window.__updates = +document.body.getAttribute('data-updates'); return true;");
    assert_eq!(
        browser.js("return document.getElementById('live-pause').getAttribute('aria-pressed');"),
        json!("true")
    );
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!(
        browser.js("return +document.body.getAttribute('data-updates') === window.__updates;"),
        json!(true),
        "no update while paused"
    );
    browser.js("document.getElementById('live-pause').click(); return true;");
    browser.wait(
        "return +document.body.getAttribute('data-updates') > window.__updates;",
        "live updates after resuming",
    );
    check_page(&browser, "overview-live", &mut problems);

    // Another site can neither submit the What-if form nor frame the UI.
    let elsewhere = runtime.block_on(other_site(url.clone()));
    browser.go(&format!("{elsewhere}post"));
    browser.js("document.getElementById('go').click(); return true;");
    browser.wait(
        "return document.body.innerText.indexOf('open the What-if page of this UI') >= 0;",
        "the UI's refusal of another site's form",
    );
    assert_eq!(
        browser.js("return document.querySelectorAll('details').length;"),
        json!(0),
        "nothing planned for another site"
    );
    let _ = browser.console_errors(); // the 403 status itself is logged by Chromium
    browser.go(&format!("{elsewhere}frame"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let errors = browser.console_errors();
        if errors.iter().any(|e| e.contains("frame-ancestors")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Chromium never refused to frame the UI (console: {errors:?})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Unknown objects.
    browser.go(&format!("{url}nodes/no-such-node"));
    assert_eq!(
        browser.js("return document.querySelector('h1').textContent;"),
        json!("Not found")
    );
    let _ = browser.console_errors(); // the 404 status itself is logged by Chromium
    browser.screenshot("not-found");

    assert!(problems.is_empty(), "{}", problems.join("\n"));
    ui.shutdown();
    demo_ui.shutdown();
    runtime.block_on(cluster.shutdown());
    drop(browser);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A physical card's group on a node page: its PCI address, partitions shown, expected by
/// its mode and missing (its attributes), the partition cards and placeholders inside, and
/// the partitions' ids.
type PhysicalGroup = (String, usize, usize, usize, usize, usize, Vec<String>);

fn owners_seen(pods: &[Pod]) -> usize {
    pods.iter()
        .filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(pod_keys::AMD_CU_ALLOCATED))
        })
        .count()
}
