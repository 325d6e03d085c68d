//! `--prometheus URL`: the UI reads the monitors' series through a real Prometheus
//! (Debian's `prometheus`, CI installs it) via `/federate`, as in a cluster where only
//! Prometheus can reach the monitors.

use hami_local_ports::free_port;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `GET path` on 127.0.0.1:port: the status code, or `None` when nothing answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Starts Prometheus on a free port and waits until it answers `/-/ready` with 200. The
/// port is free when chosen but not reserved: another process (a server of an earlier test
/// still shutting down, on a loaded machine) can take it before Prometheus binds, and then
/// Prometheus exits and that process answers 404 — so a start that exits is retried on
/// another port, and readiness is Prometheus' own answer, not "something listens".
fn start_prometheus(dir: &std::path::Path) -> (u16, std::process::Child) {
    let mut last = String::new();
    for _ in 0..5 {
        last.clear();
        let port = free_port();
        let mut child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts");
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                last = format!("prometheus on port {port} exited: {status}");
                break;
            }
            if http_status(port, "/-/ready") == Some(200) {
                return (port, child);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if last.is_empty() {
            last = format!("prometheus on port {port} not ready in 60 s");
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("prometheus did not come up: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_arrive_through_prometheus_federate() {
    let found = Command::new("prometheus").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "prometheus is not on PATH: install Debian's prometheus package (apt-get install prometheus); CI installs it"
    );
    // A monitor's exposition, as the monitor writes it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|| async {
            "# TYPE hami_container_device_utilization_ratio gauge\nhami_container_device_utilization_ratio{zone=\"vGPU\",namespace=\"ml\",pod=\"train\",container=\"main\",vdevice_index=\"0\",device_uuid=\"GPU-1\"} 42\n# TYPE hami_container_device_memory_bytes gauge\nhami_container_device_memory_bytes{zone=\"vGPU\",namespace=\"ml\",pod=\"train\",container=\"main\",vdevice_index=\"0\",device_uuid=\"GPU-1\"} 1073741824\n# TYPE other_series gauge\nother_series 1\n"
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.ok() });

    let dir = std::env::temp_dir().join(format!("hami-webui-prom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: monitor\n    static_configs:\n      - targets: ['{target}']\n"),
    )
    .unwrap();
    // Blocking waits off the runtime: the exposition above must keep answering scrapes.
    let (port, mut prometheus) = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || start_prometheus(&dir))
            .await
            .unwrap()
    };

    let _ = rustls::crypto::ring::default_provider().install_default();
    // No API server: the banner for it is expected; this test is about the metrics side.
    let client = kube::Client::try_from(kube::Config::new(
        format!("http://127.0.0.1:{}", free_port()).parse().unwrap(),
    ))
    .unwrap();
    let ui_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = hami_webui::scrape::federate_url(&format!("http://127.0.0.1:{port}/"));
    let ui = hami_webui::start(client, ui_listener, vec![url], Duration::from_millis(500)).unwrap();
    let key = (
        "ml".to_owned(),
        "train".to_owned(),
        "main".to_owned(),
        "GPU-1".to_owned(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let usage = loop {
        let got = ui.shared.metrics.read().unwrap().latest.get(&key).copied();
        if let Some(u) = got.filter(|u| u.utilization.is_some() && u.memory_bytes.is_some()) {
            break u;
        }
        let endpoint = ui.shared.metrics.read().unwrap().endpoints[0].clone();
        assert!(
            Instant::now() < deadline,
            "no samples through Prometheus: {endpoint:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(usage.utilization, Some(42.0));
    assert_eq!(usage.memory_bytes, Some(1073741824.0));
    let endpoint = ui.shared.metrics.read().unwrap().endpoints[0].clone();
    assert_eq!(endpoint.error, None);
    assert_eq!(endpoint.bad_lines, 0, "federate's body reads cleanly");
    ui.shutdown();
    let _ = prometheus.kill();
    let _ = prometheus.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
