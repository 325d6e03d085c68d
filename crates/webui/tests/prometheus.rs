//! `--prometheus URL`: the UI reads the monitors' series through a real Prometheus
//! (Debian's `prometheus`, CI installs it) via `/federate`, as in a cluster where only
//! Prometheus can reach the monitors.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
    let port = free_port();
    let mut prometheus = Command::new("prometheus")
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
