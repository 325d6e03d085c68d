//! Slow clients on loopback (a bounded slowloris): half-sent request heads, heads sent a
//! byte at a time, bodies that never complete. The server times them out, never holds more
//! than its connection cap, and keeps answering everyone else.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{http, start_with};
use hami_apiserver::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CAP: usize = 32;
const ATTACKERS: usize = 150;

/// Waits until the server closes `s` (EOF or reset); false if it is still open after `within`.
async fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue, // a 408 or the like before the close
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_is_timed_out_capped_and_the_server_stays_up() {
    let server = start_with(Config {
        max_connections: CAP,
        header_read_timeout: Duration::from_secs(1),
        body_read_timeout: Duration::from_secs(1),
        ..Config::default()
    })
    .await;
    let server = Arc::new(server);
    // The most connections the server ever held, sampled throughout.
    let peak = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (server, peak) = (server.clone(), peak.clone());
        tokio::spawn(async move {
            loop {
                peak.fetch_max(server.open_connections(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let mut half_sent = Vec::new();
    for _ in 0..ATTACKERS {
        let mut s = TcpStream::connect(server.addr()).await.unwrap();
        s.write_all(b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        half_sent.push(s);
    }
    // A head sent one byte at a time: the timeout is for the whole head, not per byte.
    let trickle = {
        let addr = server.addr();
        tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let start = Instant::now();
            for b in b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".iter().cycle() {
                if s.write_all(&[*b]).await.is_err() || start.elapsed() > Duration::from_secs(30) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            start.elapsed()
        })
    };
    // Everyone else is still answered while the attack goes on.
    let t = Instant::now();
    let (code, body) = http(&server, "GET", "/api/v1/namespaces/default", &[], b"").await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "a request waited {:?} behind {ATTACKERS} slow clients",
        t.elapsed()
    );
    // Every half-sent request is closed by the server (those beyond the cap once they got
    // a slot and timed out in turn).
    for (i, s) in half_sent.iter_mut().enumerate() {
        assert!(
            closed_by_server(s, Duration::from_secs(20)).await,
            "half-sent request {i} still held"
        );
    }
    let trickled = trickle.await.unwrap();
    assert!(
        trickled < Duration::from_secs(10),
        "a byte-at-a-time head was held {trickled:?}"
    );
    // A body that never completes: 408, then the connection goes.
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    s.write_all(b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"metadata\":")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let t = Instant::now();
    let _ = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(t.elapsed() < Duration::from_secs(10));
    sampler.abort();
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= CAP, "{peak} connections held at once (cap {CAP})");
    assert!(
        peak >= CAP / 2,
        "the attack never filled the server ({peak})"
    );
    // And the server is fine afterwards.
    let (code, _) = http(&server, "GET", "/healthz", &[], b"").await;
    assert_eq!(code, 200);
    common::eventually("every slow connection is gone", async || {
        server.open_connections() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_answers_in_flight_finish_and_drops_idle_connections() {
    let server = start_with(Config::default()).await;
    server.faults().set_latency(Duration::from_millis(400));
    let addr = server.addr();
    let answer = tokio::spawn(async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(
            b"GET /api/v1/namespaces/default HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    });
    let mut idle = TcpStream::connect(addr).await.unwrap();
    common::eventually("the request is being answered", async || {
        server.requests_in_flight() == 1 && server.open_connections() == 2
    })
    .await;
    let t = Instant::now();
    server.shutdown().await;
    let answer = answer.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        closed_by_server(&mut idle, Duration::from_secs(1)).await,
        "the idle connection outlived the shutdown"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}
