//! What the monitors say: the latest per-container and per-card samples, and an hour of
//! history per series and for the whole cluster, in memory (the UI keeps no database; a
//! restart starts the trend afresh, Prometheus keeps the long view). Pure: the scraper
//! (`scrape.rs`) hands in parsed samples with the time.

use std::collections::{BTreeMap, VecDeque};

use hami_protocol::scrape::Sample;

/// How long history is kept, in seconds.
pub const HISTORY_SECONDS: i64 = 3600;

/// One container's use of one device.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    /// Percent of the device's compute (AMD: engine busy time of the container's processes).
    pub utilization: Option<f64>,
    /// Device memory in use, bytes.
    pub memory_bytes: Option<f64>,
    /// The container's memory limit on the device, bytes.
    pub limit_bytes: Option<f64>,
}

/// (namespace, pod, container, device uuid).
pub type SeriesKey = (String, String, String, String);

/// A time series of (seconds since the epoch, value), oldest first, an hour long at most.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series(pub VecDeque<(i64, f64)>);

impl Series {
    /// Appends a point at `at` and drops what is older than an hour.
    pub fn push(&mut self, at: i64, value: f64) {
        self.0.push_back((at, value));
        self.prune(at);
    }

    /// Drops the points older than an hour before `now`.
    pub fn prune(&mut self, now: i64) {
        while self
            .0
            .front()
            .is_some_and(|(t, _)| *t < now - HISTORY_SECONDS)
        {
            self.0.pop_front();
        }
    }
}

/// The state of one monitor endpoint.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Endpoint {
    /// The monitor's `/metrics` URL.
    pub url: String,
    /// Seconds since the epoch of the last good scrape.
    pub last_ok: Option<i64>,
    /// The last scrape's error, while it lasts.
    pub error: Option<String>,
    /// Lines of the last body that were not samples.
    pub bad_lines: usize,
}

/// Everything scraped from the monitors.
#[derive(Debug, Default)]
pub struct Metrics {
    /// One per monitor URL, in the order given.
    pub endpoints: Vec<Endpoint>,
    /// The latest sample per container and device.
    pub latest: BTreeMap<SeriesKey, Usage>,
    /// Card-level (host) samples by device uuid: (utilization percent, memory bytes).
    pub cards: BTreeMap<String, (Option<f64>, Option<f64>)>,
    /// Utilization history per container and device.
    pub utilization: BTreeMap<SeriesKey, Series>,
    /// Memory history per container and device.
    pub memory: BTreeMap<SeriesKey, Series>,
    /// Cluster MiB granted (device plugins' GPUs and DRA claims), over the last hour.
    pub trend_granted: Series,
    /// Cluster MiB in use, over the last hour.
    pub trend_used: Series,
    /// Mean utilization, over the last hour.
    pub trend_utilization: Series,
}

fn key(s: &Sample) -> Option<SeriesKey> {
    Some((
        s.label("namespace")?.to_owned(),
        s.label("pod")?.to_owned(),
        s.label("container")?.to_owned(),
        s.label("device_uuid")?.to_owned(),
    ))
}

impl Metrics {
    /// Nothing scraped yet from `urls`.
    pub fn with_endpoints(urls: &[String]) -> Self {
        Metrics {
            endpoints: urls
                .iter()
                .map(|u| Endpoint {
                    url: u.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Takes one round of scrapes (`results[i]` from endpoint `i`) at `now`, and the
    /// memory granted at that moment ([`crate::world::World::memory_granted_mib`]).
    pub fn ingest(
        &mut self,
        now: i64,
        results: Vec<Result<(Vec<Sample>, usize), String>>,
        granted_mib: f64,
    ) {
        let mut latest: BTreeMap<SeriesKey, Usage> = BTreeMap::new();
        let mut cards = BTreeMap::new();
        for (endpoint, result) in self.endpoints.iter_mut().zip(results) {
            let (samples, bad) = match result {
                Ok(ok) => ok,
                Err(e) => {
                    endpoint.error = Some(e);
                    continue;
                }
            };
            endpoint.error = None;
            endpoint.last_ok = Some(now);
            endpoint.bad_lines = bad;
            for s in samples.iter().filter(|s| s.value.is_finite()) {
                match s.name.as_str() {
                    "hami_container_device_utilization_ratio" => {
                        if let Some(k) = key(s) {
                            latest.entry(k).or_default().utilization = Some(s.value);
                        }
                    }
                    "hami_container_device_memory_bytes" => {
                        if let Some(k) = key(s) {
                            latest.entry(k).or_default().memory_bytes = Some(s.value);
                        }
                    }
                    "hami_vgpu_memory_limit_bytes" => {
                        if let Some(k) = key(s) {
                            latest.entry(k).or_default().limit_bytes = Some(s.value);
                        }
                    }
                    "hami_host_gpu_utilization_ratio" | "hami_host_gpu_memory_used_bytes" => {
                        if let Some(uuid) = s.label("device_uuid") {
                            let card: &mut (Option<f64>, Option<f64>) =
                                cards.entry(uuid.to_owned()).or_default();
                            if s.name.ends_with("ratio") {
                                card.0 = Some(s.value);
                            } else {
                                card.1 = Some(s.value);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        for (k, u) in &latest {
            if let Some(v) = u.utilization {
                self.utilization.entry(k.clone()).or_default().push(now, v);
            }
            if let Some(v) = u.memory_bytes {
                self.memory.entry(k.clone()).or_default().push(now, v);
            }
        }
        // Series of containers that went away age out with the hour.
        for series in self
            .utilization
            .values_mut()
            .chain(self.memory.values_mut())
        {
            series.prune(now);
        }
        for series in [
            &mut self.trend_granted,
            &mut self.trend_used,
            &mut self.trend_utilization,
        ] {
            series.prune(now);
        }
        self.utilization.retain(|_, s| !s.0.is_empty());
        self.memory.retain(|_, s| !s.0.is_empty());
        // Only what was sampled is drawn: no memory samples, no "used" point (not a 0).
        // Every container counts, DRA ones too: the monitor reports a DRA container's
        // claim region under the slice device's uuid, like a device-plugin container's.
        let used: Vec<f64> = latest.values().filter_map(|u| u.memory_bytes).collect();
        let utils: Vec<f64> = latest.values().filter_map(|u| u.utilization).collect();
        self.trend_granted.push(now, granted_mib);
        if !used.is_empty() {
            self.trend_used
                .push(now, used.iter().fold(0.0, |a, b| a + b) / 1048576.0);
        }
        if !utils.is_empty() {
            self.trend_utilization.push(
                now,
                utils.iter().fold(0.0, |a, b| a + b) / utils.len() as f64,
            );
        }
        self.latest = latest;
        self.cards = cards;
    }

    /// Latest usage of a pod on a device, summed over its containers.
    pub fn pod_device(&self, namespace: &str, pod: &str, uuid: &str) -> Usage {
        let mut out = Usage::default();
        for ((ns, p, _, d), u) in &self.latest {
            if ns == namespace && p == pod && d == uuid {
                add(&mut out.memory_bytes, u.memory_bytes);
                add(&mut out.utilization, u.utilization);
                add(&mut out.limit_bytes, u.limit_bytes);
            }
        }
        out
    }

    /// Banners about monitors that cannot be read.
    pub fn banners(&self) -> Vec<String> {
        self.endpoints
            .iter()
            .filter_map(|e| {
                e.error.as_ref().map(|err| {
                    format!("The monitor at {} cannot be read: {err}. Its charts show what was last seen.", e.url)
                })
            })
            .collect()
    }
}

fn add(total: &mut Option<f64>, value: Option<f64>) {
    if let Some(v) = value {
        *total = Some(total.unwrap_or(0.0) + v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_protocol::scrape::parse_samples;

    #[test]
    fn ingest_keeps_latest_history_and_errors() {
        let mut m =
            Metrics::with_endpoints(&["http://a/metrics".into(), "http://b/metrics".into()]);
        let body = "hami_container_device_utilization_ratio{namespace=\"ns\",pod=\"p\",container=\"c\",vdevice_index=\"0\",device_uuid=\"G\"} 40\nhami_container_device_memory_bytes{namespace=\"ns\",pod=\"p\",container=\"c\",vdevice_index=\"0\",device_uuid=\"G\"} 1048576\n";
        m.ingest(
            100,
            vec![Ok(parse_samples(body)), Err("connection refused".into())],
            512.0,
        );
        assert_eq!(m.pod_device("ns", "p", "G").utilization, Some(40.0));
        assert_eq!(m.trend_used.0.back(), Some(&(100, 1.0)));
        assert_eq!(m.trend_granted.0.back(), Some(&(100, 512.0)));
        assert_eq!(m.banners().len(), 1);
        assert!(m.banners()[0].contains("http://b/metrics"));
        // An hour later the first point is gone; a vanished series ages out.
        m.ingest(
            100 + HISTORY_SECONDS + 1,
            vec![Ok((vec![], 0)), Ok((vec![], 0))],
            0.0,
        );
        assert!(m.utilization.is_empty());
        assert!(m.trend_used.0.is_empty(), "no memory samples, no point");
        assert_eq!(m.trend_granted.0.len(), 1);
        assert!(m.banners().is_empty());
        assert_eq!(m.pod_device("ns", "p", "G"), Usage::default());
    }
}
