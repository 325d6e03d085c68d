//! `hami ui`: the binary serves the web UI for a cluster given by kubeconfig, prints its URL,
//! and a bad --listen is a clear error.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

use hami_apiserver::{ApiServer, Config};
use serde_json::json;

fn get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hami_ui_serves_the_cluster() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let register = r#"[{"id":"G1","index":1,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#;
    api.create_object("v1", "nodes", None, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-7", "annotations": {"hami.io/node-amd-register": register}}}))
        .unwrap();
    let dir = std::env::temp_dir().join(format!("hami-ui-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let port = hami_local_ports::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hami"))
        .args(["ui", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--listen", &addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), format!("hami web UI: http://{addr}/"));
    assert!(get(&addr, "/healthz").ends_with("ok"));
    // The watchers list the node soon after start; bounded wait.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let page = get(&addr, "/");
        if page.contains("gpu-node-7") {
            assert!(page.contains("AMD Instinct MI210"), "{page}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{page}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();

    // A port that is taken: exit 1 with an error that says what to change.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hami"))
        .args(["ui", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--listen", &taken.local_addr().unwrap().to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot listen on") && err.contains("--listen"),
        "{err}"
    );

    // A --dra mode that does not exist: exit 2 naming the ones that do, before any start.
    let out = Command::new(env!("CARGO_BIN_EXE_hami"))
        .args(["ui", "--dra=yes", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value 'yes'") && err.contains("auto, on, off"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
