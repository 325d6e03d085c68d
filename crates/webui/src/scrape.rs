//! The metrics side: every few seconds, GET each monitor's `/metrics` (or Prometheus's
//! `/federate` for the hami series) over plain HTTP, with a time and size budget, and hand
//! the parsed samples to [`Metrics`]. An unreachable endpoint becomes a banner.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use hami_protocol::scrape::{Sample, parse_samples};

use crate::samples::Metrics;
use crate::world::World;

/// Largest body read from one endpoint.
const MAX_BODY: usize = 32 << 20;
const TIMEOUT: Duration = Duration::from_secs(3);

/// The federate URL that selects the series the UI reads.
pub fn federate_url(prometheus: &str) -> String {
    format!(
        "{}/federate?match%5B%5D=%7B__name__%3D~%22hami_.%2A%22%7D",
        prometheus.trim_end_matches('/')
    )
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

async fn fetch(client: &HttpClient, url: &str) -> Result<(Vec<Sample>, usize), String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("bad URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err("only http:// URLs are scraped (the monitors serve plain HTTP)".into());
    }
    let request = hyper::Request::get(uri)
        .header("accept", "text/plain; version=0.0.4")
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let work = async {
        let response = client.request(request).await.map_err(|e| {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                text = format!("{text}: {s}");
                source = s.source();
            }
            text
        })?;
        if !response.status().is_success() {
            return Err(format!("HTTP {}", response.status()));
        }
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| format!("reading the body: {e}"))?
            .to_bytes();
        let text = String::from_utf8_lossy(&body);
        Ok(parse_samples(&text))
    };
    tokio::time::timeout(TIMEOUT, work)
        .await
        .map_err(|_| format!("no answer within {}s", TIMEOUT.as_secs()))?
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Scrapes every `interval` until the runtime stops.
pub async fn run(world: Arc<RwLock<World>>, metrics: Arc<RwLock<Metrics>>, interval: Duration) {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let urls: Vec<String> = match metrics.read() {
        Ok(m) => m.endpoints.iter().map(|e| e.url.clone()).collect(),
        Err(_) => return,
    };
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        let results = futures::future::join_all(urls.iter().map(|u| fetch(&client, u))).await;
        // The world's lock first, as the pages take them.
        let Ok(w) = world.read() else { return };
        let Ok(mut m) = metrics.write() else { return };
        m.ingest(now(), results, &w);
    }
}

/// Seconds since the epoch (the clock the scraper stamps samples with).
pub fn unix_now() -> i64 {
    now()
}
