//! The UI's accept loop: HTTP/1.1, one task per connection, at most `max_connections` at
//! once, and a request head that must arrive within `header_read_timeout` (also the idle
//! time of a kept-alive connection). A client that opens connections and never finishes
//! its headers is dropped after a few seconds, and at the cap new clients wait in the
//! kernel's listen backlog for a slot instead of the UI running out of file descriptors
//! (issue 27: a hundred such clients made it unreachable). Dropping the task that runs
//! [`serve`] closes every connection, so a stopping UI stops at once.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Connection limits of the UI's server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections served at once; more wait in the kernel's listen backlog.
    pub max_connections: usize,
    /// Time for a client to send a whole request head (and a kept-alive connection's
    /// idle time between requests).
    pub header_read_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: max_connections_for(soft_open_files_limit()),
            // A few seconds, and twice the live pages' refresh period (5 s), so a live
            // page's kept-alive connection is never closed as idle under its next fetch.
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

/// The connection cap for a soft open-files limit: half of it (the watchers' and scrapers'
/// connections, the runtime and the planner's capture trees need descriptors too), at least
/// 8 and at most 1024; 512 when the limit is unknown.
pub fn max_connections_for(soft_limit: Option<usize>) -> usize {
    soft_limit.map_or(512, |n| (n / 2).clamp(8, 1024))
}

/// The process's soft `RLIMIT_NOFILE`, from `/proc/self/limits`.
fn soft_open_files_limit() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Serves `app` on `listener` under `limits` until the task running it is dropped (which
/// drops every connection and the requests they were answering).
pub async fn serve(listener: TcpListener, app: axum::Router, limits: ConnectionLimits) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = JoinSet::new();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = loop {
            match listener.accept().await {
                Ok((stream, _)) => break stream,
                Err(e) => {
                    // EMFILE/ENFILE, aborted handshakes: keep serving the others.
                    tracing::warn!("web UI: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        while connections.try_join_next().is_some() {}
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        connections.spawn(async move {
            let _slot = slot;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            if let Err(e) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!("web UI connection ended: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::max_connections_for;

    #[test]
    fn the_cap_leaves_descriptors_for_the_rest() {
        assert_eq!(max_connections_for(Some(100)), 50);
        assert_eq!(max_connections_for(Some(10)), 8);
        assert_eq!(max_connections_for(Some(1 << 20)), 1024);
        assert_eq!(max_connections_for(None), 512);
    }
}
