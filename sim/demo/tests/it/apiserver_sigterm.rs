//! `hami-apiserver` (what `hami apiserver` runs) as a process: SIGTERM ends it and its watch
//! streams promptly, even with a client holding a half-sent request (which once kept it alive for minutes, feeding
//! watchers a stale view).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills the server if the test fails before it exits.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn sigterm_ends_the_server_and_its_watches_promptly() {
    let dir = std::env::temp_dir().join(format!("hami-apiserver-sigterm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let _ = std::fs::remove_file(&kubeconfig);
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_hami-apiserver"))
            .args(["--listen", "127.0.0.1:0", "--kubeconfig-out"])
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start hami-apiserver"),
    );
    let addr = wait_for("the kubeconfig", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&kubeconfig).ok()?;
        let url = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: "))?;
        Some(
            url.trim()
                .trim_matches('"')
                .trim_start_matches("http://")
                .to_string(),
        )
    });
    // A watch, established (its response head has arrived).
    let mut watch = TcpStream::connect(&addr).unwrap();
    watch
        .write_all(
            b"GET /api/v1/namespaces/default/configmaps?watch=true HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .unwrap();
    watch
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut head = [0u8; 12];
    watch.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    // A client that never finishes its request, and an idle one.
    let mut half = TcpStream::connect(&addr).unwrap();
    half.write_all(b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let _idle = TcpStream::connect(&addr).unwrap();
    std::thread::sleep(Duration::from_millis(100)); // let the server read the half-sent head

    // Read the watch to its end on a thread: when does the server end it?
    let watch_end = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let r = watch.read_to_end(&mut rest);
        (Instant::now(), r.is_ok())
    });
    let t = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = wait_for(
        "hami-apiserver to exit after SIGTERM",
        Duration::from_secs(15),
        || child.0.try_wait().unwrap(),
    );
    let took = t.elapsed();
    assert!(status.success(), "{status}");
    // Nothing was being answered (a head still arriving is not a request yet): no reason
    // to wait for the shutdown grace.
    assert!(took < Duration::from_secs(2), "exit took {took:?}");
    // The watch ended at once, not when the process finally went.
    let (ended_at, clean) = watch_end.join().unwrap();
    assert!(clean, "the watch stream did not end cleanly");
    let watch_took = ended_at.duration_since(t);
    assert!(
        watch_took < Duration::from_secs(2),
        "the watch stream stayed open {watch_took:?} after SIGTERM"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
