//! Issue 27: SIGTERM stops the UI promptly even while a What-if plan runs (before, the
//! runtime waited for the planning thread, minutes). The real `hami-webui` binary against
//! the embedded API server: a large scenario within the UI's limits is posted, and once
//! the UI logs that it plans it, SIGTERM must end the process within seconds.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};

/// 20000 pods over 1000 nodes of 8 GPUs, one policy pair: within the default limits, and
/// many seconds of planning.
const BUSY: &str = "fleet:\n- name: n\n  count: 1000\n  gpus:\n  - {type: AMD Instinct MI300X, count: 8, memory_mib: 196608, cus: 304}\nworkloads:\n- count: 20000\n  pod:\n    metadata: {name: p}\n    spec:\n      containers:\n      - name: c\n        resources: {limits: {amd.com/gpu: 1, amd.com/gpumem: 1024}}\npolicies: {gpu: [binpack], node: [binpack]}\n";

fn form(scenario: &str) -> String {
    let mut out = String::from("scenario=");
    for b in scenario.bytes() {
        if b.is_ascii_alphanumeric() {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_ui_while_it_plans() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start(Config::default()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("hami-webui-sigterm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let addr = format!("127.0.0.1:{}", hami_local_ports::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_hami-webui"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--listen", &addr, "--dra=off"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hami-webui starts");
    let (lines_tx, lines) = mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });

    // The UI listens.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut busy = loop {
        if let Ok(s) = std::net::TcpStream::connect(&addr) {
            break s;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "hami-webui exited early"
        );
        assert!(
            Instant::now() < deadline,
            "hami-webui never listened on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let body = form(BUSY);
    write!(
        busy,
        "POST /whatif HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // It plans (it says so) …
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line.contains("what-if: planning 20000 pods") => break,
            Ok(line) => seen.push(line),
            Err(e) => panic!(
                "the UI never started planning ({e}); it logged:\n{}",
                seen.join("\n")
            ),
        }
    }
    // … and SIGTERM ends it within seconds, not when the plan would.
    let sent = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        if sent.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("hami-webui still ran 10 s after SIGTERM, while planning");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "a clean stop exits 0: {exit:?}");
    drop(busy);
    drop(api);
    let _ = std::fs::remove_dir_all(&dir);
}
