//! A TCP proxy in front of a running server whose pod watches can be frozen: while
//! [`LaggingPodWatch::freeze`] is on, every byte the server sends on a connection that carried
//! a pod watch request is held back (lists, GETs and patches pass). A client reading through
//! it has a pod watch that lags behind the cluster, as a watch cache, a slow connection or a
//! watch being re-established after an API server restart can lag: its store keeps what it
//! last showed. Plain HTTP only (a test's server without TLS).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The proxy; its task runs on the current tokio runtime until the runtime ends.
pub struct LaggingPodWatch {
    /// `http://127.0.0.1:<port>`: a client's server URL.
    pub url: String,
    frozen: Arc<AtomicBool>,
}

impl LaggingPodWatch {
    /// Starts the proxy in front of `upstream` (a server's [`crate::RunningApiServer::addr`]).
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let frozen = Arc::new(AtomicBool::new(false));
        let freeze = frozen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let pod_watch = Arc::new(AtomicBool::new(false));
                let marks = pod_watch.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n @ 1..) = client_read.read(&mut buf).await {
                        let text = String::from_utf8_lossy(&buf[..n]);
                        if text.contains("/api/v1/pods?") && text.contains("watch=true") {
                            marks.store(true, Ordering::SeqCst);
                        }
                        if server_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                let freeze = freeze.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n @ 1..) = server_read.read(&mut buf).await {
                        while pod_watch.load(Ordering::SeqCst) && freeze.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        if client_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Ok(LaggingPodWatch { url, frozen })
    }

    /// Holds back (`true`) or lets through (`false`) what pod watches receive.
    pub fn freeze(&self, on: bool) {
        self.frozen.store(on, Ordering::SeqCst);
    }
}
