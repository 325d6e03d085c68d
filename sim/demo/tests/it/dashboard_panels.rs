//! Every panel of both Grafana dashboards (deploy/grafana/*.json) has data against the demo
//! (issue 15): the demo runs with its built-in examples and GPU-busy workloads, a real
//! Prometheus (Debian's `prometheus` package; CI installs it) scrapes every node monitor
//! and the scheduler each second, and each panel query — its `$variables` set the way
//! Grafana sets them for "All" — returns at least one series with a finite value through
//! `/api/v1/query`. Needs root and util-linux (`unshare`) for the workloads, as
//! tests/it/workloads.rs does.

use crate::common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{once_args, scratch, start_running_workloads};
use hami_demo::Progress;
use hami_local_ports::free_port;
use serde_json::Value;

/// Panels that are legitimately empty against the demo, by dashboard file and title, and why.
const EXEMPT: &[(&str, &str, &str)] = &[(
    "hami-rs-vgpu.json",
    "Containers whose utilization sum was clamped",
    "shows only containers whose per-device utilization summed above 100 (`== 1`); no demo pod does",
)];

/// A pod submitted once Prometheus has scraped the settled demo, so the scheduler's
/// filter/bind counters increase between two scrapes and the latency and rate panels have
/// a non-zero rate to show (counters that only ever held one value have a rate of 0 and a
/// NaN quantile).
const LATE_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: late-share
spec:
  containers:
  - name: main
    image: nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04
    resources:
      limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 512, nvidia.com/gpucores: 5}
"#;

/// A Prometheus server that is killed with the test.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Scrapes every `targets` entry each second.
fn start_prometheus(dir: &Path, targets: &[(String, SocketAddr)]) -> Prometheus {
    let mut config = String::from(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n",
    );
    for (job, addr) in targets {
        config.push_str(&format!(
            "  - job_name: '{job}'\n    static_configs:\n      - targets: ['{addr}']\n"
        ));
    }
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    // The chosen port is free but not reserved: a process of an earlier test can take it
    // before Prometheus binds; Prometheus then exits ("address already in use") and that
    // process answers. So wait for Prometheus' own `/-/ready`, and retry on another port
    // when it exits.
    let log = dir.join("prometheus.log");
    let mut last = String::new();
    for _ in 0..5 {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        // One file for both streams, so neither overwrites the other.
        let out = std::fs::File::create(&log).unwrap();
        let mut child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run prometheus ({e}): install Debian's prometheus package (apt-get install prometheus); CI installs it"
                )
            });
        let deadline = Instant::now() + Duration::from_secs(60);
        last = format!("prometheus on {addr} not ready in 60 s");
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                last = format!(
                    "prometheus on {addr} exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                break;
            }
            if get(addr, "/-/ready").is_ok_and(|(code, _)| code == 200) {
                return Prometheus { child, addr, log };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("prometheus did not come up: {last}");
}

/// `GET path` over HTTP/1.0 (so the body is neither chunked nor kept alive): (status, body).
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

/// Percent-encodes a query-string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query's result vector, or Prometheus' error.
fn query(prom: SocketAddr, expr: &str) -> Result<Vec<Value>, String> {
    let (status, body) = get(prom, &format!("/api/v1/query?query={}", encode(expr)))
        .map_err(|e| format!("GET /api/v1/query: {e}"))?;
    let json: Value = serde_json::from_str(&body)
        .map_err(|e| format!("HTTP {status}, not JSON ({e}): {body}"))?;
    if json["status"] != "success" {
        return Err(format!("HTTP {status}: {body}"));
    }
    Ok(json["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// Series whose value is a finite number (a panel shows NaN as no data).
fn finite(series: &[Value]) -> usize {
    series
        .iter()
        .filter(|s| {
            s["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        })
        .count()
}

/// One panel query with the dashboard's variables as Grafana sets them for "All".
struct PanelQuery {
    dashboard: String,
    title: String,
    expr: String,
}

/// Grafana's values for the dashboard's variables: "All" (`allValue`) where the variable
/// offers it, else its current value; the datasource is not part of any expression.
fn variables(dashboard: &Value) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = var["name"].as_str().unwrap().to_owned();
        let value = if var["includeAll"] == true {
            var["allValue"].as_str().unwrap_or(".*").to_owned()
        } else {
            var["current"]["value"].as_str().unwrap_or("").to_owned()
        };
        vars.insert(name, value);
    }
    // Grafana's built-in: at least four scrape intervals (1 s here), at least a minute.
    vars.insert("__rate_interval".into(), "1m".into());
    vars
}

fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = expr.to_owned();
    // Longest names first, so `$pod` never eats part of `$podname`.
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for name in names {
        out = out
            .replace(&format!("${{{name}}}"), &vars[name])
            .replace(&format!("${name}"), &vars[name]);
    }
    out
}

fn panel_queries(dir: &Path) -> Vec<PanelQuery> {
    fn walk(
        panels: &Value,
        file: &str,
        vars: &BTreeMap<String, String>,
        out: &mut Vec<PanelQuery>,
    ) {
        for panel in panels.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push(PanelQuery {
                        dashboard: file.to_owned(),
                        title: panel["title"].as_str().unwrap_or("").to_owned(),
                        expr: substitute(expr, vars),
                    });
                }
            }
            walk(&panel["panels"], file, vars, out);
        }
    }
    let mut out = Vec::new();
    for file in ["hami-rs-vgpu.json", "hami-rs-scheduler.json"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let dashboard: Value = serde_json::from_str(&text).unwrap();
        let vars = variables(&dashboard);
        // A variable's own query (`label_values(metric, label)`) must offer values too,
        // or the dashboard's drop-downs are empty.
        for var in dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let Some(def) = var["definition"].as_str() else {
                continue;
            };
            let inner = def
                .strip_prefix("label_values(")
                .and_then(|d| d.strip_suffix(')'))
                .and_then(|d| d.rsplit_once(','))
                .unwrap_or_else(|| {
                    panic!("{file}: variable query {def:?} is not label_values(m, l)")
                });
            out.push(PanelQuery {
                dashboard: file.to_owned(),
                title: format!("variable ${}", var["name"].as_str().unwrap()),
                expr: substitute(
                    &format!("count by ({}) ({})", inner.1.trim(), inner.0.trim()),
                    &vars,
                ),
            });
        }
        let before = out.len();
        walk(&dashboard["panels"], file, &vars, &mut out);
        assert!(out.len() > before, "{file}: no panel queries found");
    }
    for q in &out {
        assert!(
            !q.expr.contains('$'),
            "{} / {}: a variable the dashboard does not define: {}",
            q.dashboard,
            q.title,
            q.expr
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_panel_has_data_against_the_demo() {
    let _one_cluster = common::ONE_CLUSTER.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Fail early and clearly when the real peer is missing.
    let found = Command::new("prometheus").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "prometheus is not on PATH: install Debian's prometheus package (apt-get install prometheus); CI installs it"
    );
    let grafana = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana");
    let queries = panel_queries(&grafana);
    for (file, title, _) in EXEMPT {
        assert!(
            queries
                .iter()
                .any(|q| q.dashboard == *file && q.title == *title),
            "exempt panel {file} / {title} is not in the dashboard any more"
        );
    }

    let dir = scratch("dashboard");
    std::fs::create_dir_all(dir.join("late")).unwrap();
    std::fs::write(dir.join("late/late-share.yaml"), LATE_POD).unwrap();
    let args = once_args("built-in".into(), &dir);
    let mut sink = Vec::new();
    let mut progress = Progress::new(&mut sink);
    let cluster = start_running_workloads(&args, &mut progress).await;

    let mut targets = vec![("scheduler".to_owned(), cluster.scheduler_metrics)];
    targets.extend(
        cluster
            .nodes
            .iter()
            .map(|n| (format!("monitor-{}", n.name), n.monitor_addr)),
    );
    // Blocking waits off the runtime: the demo keeps serving scrapes meanwhile.
    let prom = {
        let (dir, targets) = (dir.clone(), targets.clone());
        tokio::task::spawn_blocking(move || start_prometheus(&dir, &targets))
            .await
            .unwrap()
    };
    let addr = prom.addr;

    // Every target up (Prometheus ready and one successful scrape of each).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let health = tokio::task::spawn_blocking(move || get(addr, "/api/v1/targets"))
            .await
            .unwrap();
        let up: Vec<String> = health
            .ok()
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .map(|json| {
                json["data"]["activeTargets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|t| t["health"] == "up")
                    .filter_map(|t| t["labels"]["job"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if up.len() == targets.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never had every target up ({up:?} of {targets:?}):\n{}",
            prom.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let mut progress = Progress::new(&mut sink);
    let submitted = cluster
        .submit_examples(&args.examples, &mut progress)
        .await
        .unwrap();
    cluster
        .settle(&submitted, Duration::from_secs(20), &mut progress)
        .await;
    // Once Prometheus holds the settled counters, one more pod moves them.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let bound = tokio::task::spawn_blocking(move || {
            query(addr, "hami_scheduler_bind_duration_seconds_count")
        })
        .await
        .unwrap();
        if bound.is_ok_and(|s| !s.is_empty()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped the scheduler's bind counter:\n{}",
            prom.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let late = cluster
        .submit_examples(&dir.join("late"), &mut progress)
        .await
        .unwrap();
    cluster
        .settle(&late, Duration::from_secs(10), &mut progress)
        .await;

    // Poll every query until each non-exempt one has a finite series (the live series and
    // the rates need a few scrapes), bounded.
    let exempt = |q: &PanelQuery| {
        EXEMPT
            .iter()
            .any(|(f, t, _)| q.dashboard == *f && q.title == *t)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let queries = std::sync::Arc::new(queries);
    loop {
        let qs = queries.clone();
        let results: Vec<Result<Vec<Value>, String>> =
            tokio::task::spawn_blocking(move || qs.iter().map(|q| query(addr, &q.expr)).collect())
                .await
                .unwrap();
        let mut empty = Vec::new();
        for (q, result) in queries.iter().zip(&results) {
            match result {
                // A query Prometheus refuses is a broken dashboard, exempt or not.
                Err(e) => panic!("{} / {}: {}\n  {e}", q.dashboard, q.title, q.expr),
                Ok(series) if finite(series) == 0 && !exempt(q) => {
                    empty.push(format!("{} / {}: {}", q.dashboard, q.title, q.expr))
                }
                Ok(_) => {}
            }
        }
        if empty.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "panels without data against the demo:\n  {}\ndemo log:\n{}",
            empty.join("\n  "),
            String::from_utf8_lossy(&sink)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(prom);
    cluster.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
