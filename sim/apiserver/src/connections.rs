//! The accept loop: one HTTP/1.1 connection per task, at most `max_connections` at once,
//! request heads that must arrive within `header_read_timeout` (a slowloris cannot hold a
//! connection, and at the cap new clients wait in the listen backlog for a slot instead of
//! the server running out of file descriptors), and a shutdown that ends every connection
//! within a grace period whatever its clients do (over TLS too: the handshake is bounded
//! like a request head): at once for a connection with no request
//! being answered (idle, or a head still being sent), after its answer otherwise.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum_server::accept::Accept;
use axum_server::tls_rustls::RustlsAcceptor;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::JoinSet;

/// Connection limits of a server.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections served at once; more wait in the kernel's listen backlog.
    pub max_connections: usize,
    /// Time for a client to send a complete request head (also the idle time of a
    /// keep-alive connection between requests, as hyper counts it).
    pub header_read_timeout: Duration,
    /// At shutdown, time given to in-flight requests before connections are dropped.
    pub shutdown_grace: Duration,
}

/// The default connection cap: 4096, or 3/4 of the soft open-files limit when that is
/// lower (the store's data dir, the journal and the process need descriptors too).
pub fn default_max_connections() -> usize {
    let soft = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).map(String::from))
        })
        .and_then(|v| v.parse::<usize>().ok());
    match soft {
        Some(n) => (n / 4 * 3).clamp(16, 4096),
        None => 1024,
    }
}

/// Counts a connection, or a request being answered, while it is open.
struct Open(Arc<AtomicUsize>);

impl Open {
    fn new(n: Arc<AtomicUsize>) -> Open {
        n.fetch_add(1, Ordering::SeqCst);
        Open(n)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that holds its request's [`Open`] guard until hyper is done with it.
struct Tracked {
    inner: axum::body::Body,
    _open: (Open, Open),
}

impl axum::body::HttpBody for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// `app`, counting the requests of one connection that are being answered.
#[derive(Clone)]
struct Counting {
    app: axum::Router,
    /// This connection's requests being answered.
    busy: Arc<AtomicUsize>,
    /// Every connection's.
    all_busy: Arc<AtomicUsize>,
}

impl tower::Service<hyper::Request<hyper::body::Incoming>> for Counting {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        tower::Service::<hyper::Request<hyper::body::Incoming>>::poll_ready(&mut self.app, cx)
    }

    fn call(&mut self, req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let open = (
            Open::new(self.busy.clone()),
            Open::new(self.all_busy.clone()),
        );
        let fut = tower::Service::call(&mut self.app, req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|inner| axum::body::Body::new(Tracked { inner, _open: open })))
        })
    }
}

/// What a server counts while it runs.
#[derive(Clone, Default)]
pub struct Counters {
    /// Client connections open.
    pub connections: Arc<AtomicUsize>,
    /// Requests being answered (from the call of the app until the answer is sent).
    pub requests: Arc<AtomicUsize>,
}

/// One connection (plain, or TLS after its handshake) until it ends, or until `shutdown`:
/// then at once when nothing is being answered, after the answer otherwise.
async fn serve_connection<IO>(
    io: IO,
    service: TowerToHyperService<Counting>,
    limits: ConnectionLimits,
    mut shutdown: watch::Receiver<bool>,
    busy: Arc<AtomicUsize>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = shutdown.wait_for(|s| *s) => {}
    }
    conn.as_mut().graceful_shutdown();
    // Nothing being answered (idle, or a head still arriving): close now. Else let the
    // answer finish (the grace bounds it).
    let idle = async {
        while busy.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = idle => {}
    }
}

/// Serves `app` on `listener` (over TLS when `tls` is given) until `stop` fires (or its sender is dropped), then asks
/// every connection to finish its request and drops those still open after the grace.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnectionLimits,
    counters: Counters,
    tls: Option<RustlsAcceptor>,
    mut stop: oneshot::Receiver<()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (shutting_down, shutdown_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => break,
            },
            _ = &mut stop => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE/ENFILE and aborted handshakes: keep serving the others.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        while tasks.try_join_next().is_some() {}
        let _ = stream.set_nodelay(true);
        let busy = Arc::new(AtomicUsize::new(0));
        let service = TowerToHyperService::new(Counting {
            app: app.clone(),
            busy: busy.clone(),
            all_busy: counters.requests.clone(),
        });
        let mut shutdown = shutdown_rx.clone();
        let counted = Open::new(counters.connections.clone());
        let tls = tls.clone();
        tasks.spawn(async move {
            let (_slot, _counted) = (slot, counted);
            let Some(acceptor) = tls else {
                return serve_connection(stream, service, limits, shutdown, busy).await;
            };
            // The handshake is bounded by the acceptor's timeout (the header read timeout),
            // so a client that never finishes it cannot hold a slot.
            let handshake = tokio::select! {
                r = acceptor.accept(stream, ()) => r,
                _ = shutdown.wait_for(|s| *s) => return,
            };
            match handshake {
                Ok((stream, _)) => serve_connection(stream, service, limits, shutdown, busy).await,
                Err(e) => tracing::debug!("TLS handshake failed: {e}"),
            }
        });
    }
    drop(listener);
    let _ = shutting_down.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "{} connections still open after the {:?} shutdown grace; dropping them",
            tasks.len(),
            limits.shutdown_grace
        );
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}
