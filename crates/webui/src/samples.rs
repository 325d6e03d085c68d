//! What the monitors say: the latest per-container and per-card samples, and an hour of
//! history per series and for the whole cluster, in memory (the UI keeps no database; a
//! restart starts the trend afresh, Prometheus keeps the long view). Pure: the scraper
//! (`scrape.rs`) hands in parsed samples with the time and the world they describe.
//!
//! Card figures are keyed by node and device, never by uuid alone: nodes built from one
//! capture (the demo's device-plugin and DRA MI210 nodes) report the same uuids. Host
//! series carry their node; a container's node is its pod's. An endpoint that cannot be
//! read keeps its last samples (shown with their age) for up to an hour.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use hami_protocol::scrape::Sample;

use crate::world::World;

/// How long history is kept at full resolution (every scrape), in seconds; per container
/// and device, nothing older is kept.
pub const HISTORY_SECONDS: i64 = 3600;

/// How long the cluster trend is kept, in seconds: past [`HISTORY_SECONDS`] one point a
/// [`THINNED_STEP`] (three series of about 1,000 points; the per-container series, one per
/// container and device, stay an hour long so memory does not grow with the pods).
pub const TREND_SECONDS: i64 = 6 * 3600;

/// The trend's step past its first hour, in seconds.
pub const THINNED_STEP: i64 = 60;

/// One container's use of one device.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    /// Percent of the device's compute (AMD: engine busy time of the container's processes).
    pub utilization: Option<f64>,
    /// Device memory in use, bytes.
    pub memory_bytes: Option<f64>,
    /// The container's memory limit on the device, bytes.
    pub limit_bytes: Option<f64>,
    /// When it was sampled (seconds since the epoch; the oldest of a sum).
    pub at: Option<i64>,
}

/// (namespace, pod, container, device uuid).
pub type SeriesKey = (String, String, String, String);

/// (node, device uuid): where a card figure belongs.
pub type CardKey = (String, String);

/// What one card reports, or its pods report on it, at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CardSample {
    /// Percent busy.
    pub utilization: Option<f64>,
    /// Device memory in use, bytes.
    pub memory_bytes: Option<f64>,
    /// When it was sampled (seconds since the epoch; the oldest of a sum).
    pub at: i64,
}

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

    /// Appends a point of a cluster trend at `at` ([`Series::prune_trend`]).
    pub fn push_trend(&mut self, at: i64, value: f64) {
        self.0.push_back((at, value));
        self.prune_trend(at);
    }

    /// Keeps a cluster trend [`TREND_SECONDS`] long: every point of the last hour, one
    /// point a minute (each minute's first) before that.
    pub fn prune_trend(&mut self, now: i64) {
        while self
            .0
            .front()
            .is_some_and(|(t, _)| *t < now - TREND_SECONDS)
        {
            self.0.pop_front();
        }
        // Only the points that left the hour since the last call need thinning: walk back
        // from the hour's edge through the last ten minutes before it (pruned every scrape,
        // everything older was thinned already).
        let edge = now - HISTORY_SECONDS;
        let mut i = self.0.partition_point(|(t, _)| *t < edge);
        while i >= 2 {
            let (later, earlier) = (self.0[i - 1].0, self.0[i - 2].0);
            if later.div_euclid(THINNED_STEP) == earlier.div_euclid(THINNED_STEP) {
                self.0.remove(i - 1);
            } else if later < edge - 10 * THINNED_STEP {
                break;
            }
            i -= 1;
        }
    }

    /// How far back the series reaches from `now`, in seconds (0 when empty).
    pub fn reach(&self, now: i64) -> i64 {
        self.0.front().map_or(0, |(t, _)| (now - t).max(0))
    }
}

/// What one endpoint's last good scrape said, by key.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Said {
    /// Per container and device.
    pub containers: BTreeMap<SeriesKey, Usage>,
    /// The container series' nodes (their pods' nodes when scraped).
    pub container_nodes: BTreeMap<SeriesKey, String>,
    /// Host series per node and device.
    pub hosts: BTreeMap<CardKey, CardSample>,
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
    /// When the current run of errors began.
    pub failing_since: Option<i64>,
    /// Lines of the last body that were not samples.
    pub bad_lines: usize,
    /// The nodes its last good scrape reported on (host series' `node`, containers' pods).
    pub nodes: BTreeSet<String>,
    /// Its last good scrape's samples.
    pub said: Said,
}

/// Which nodes the endpoints report on, rebuilt with each round (a page asks per node and
/// card; with a monitor per node, going through every endpoint each time would not scale).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Covered {
    /// Nodes some endpoint reported on, or whose name is an endpoint URL's host.
    pub nodes: BTreeSet<String>,
    /// Some endpoint has not answered yet (and is not failing).
    pub waiting: bool,
    /// Some endpoint never answered and is failing.
    pub unreadable: bool,
}

/// The host of a URL (`http://HOST:PORT/path`).
fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let end = rest.find([':', '/']).unwrap_or(rest.len());
    &rest[..end]
}

/// Everything scraped from the monitors.
#[derive(Debug, Default)]
pub struct Metrics {
    /// One per monitor URL, in the order given.
    pub endpoints: Vec<Endpoint>,
    /// The latest sample per container and device.
    pub latest: BTreeMap<SeriesKey, Usage>,
    /// Card-level (host) samples per node and device.
    pub cards: BTreeMap<CardKey, CardSample>,
    /// Containers' samples summed per node and device.
    pub pods_on_cards: BTreeMap<CardKey, CardSample>,
    /// Utilization history per container and device.
    pub utilization: BTreeMap<SeriesKey, Series>,
    /// Memory history per container and device.
    pub memory: BTreeMap<SeriesKey, Series>,
    /// Cluster MiB granted (device plugins' GPUs and DRA claims), over [`TREND_SECONDS`].
    pub trend_granted: Series,
    /// Cluster MiB in use, over [`TREND_SECONDS`].
    pub trend_used: Series,
    /// Mean utilization, over [`TREND_SECONDS`].
    pub trend_utilization: Series,
    /// Cluster GPU memory, MiB (the cards' and DRA devices' total), over [`TREND_SECONDS`]:
    /// what the allocation and usage percentages divide by at each moment.
    pub trend_capacity: Series,
    /// Grafana's base URL (`--grafana-url`): the pages link its dashboards for ranges
    /// longer than the UI keeps; `None`, no link (the pages say so).
    pub grafana: Option<String>,
    /// Which nodes the endpoints cover.
    pub covered: Covered,
}

fn key(s: &Sample) -> Option<SeriesKey> {
    Some((
        s.label("namespace")?.to_owned(),
        s.label("pod")?.to_owned(),
        s.label("container")?.to_owned(),
        s.label("device_uuid")?.to_owned(),
    ))
}

/// What one body says, its containers placed on their pods' nodes in `world`.
fn read(samples: &[Sample], world: &World, now: i64) -> Said {
    let mut said = Said::default();
    for s in samples.iter().filter(|s| s.value.is_finite()) {
        match s.name.as_str() {
            "hami_container_device_utilization_ratio"
            | "hami_container_device_memory_bytes"
            | "hami_vgpu_memory_limit_bytes" => {
                let Some(k) = key(s) else { continue };
                let u = said.containers.entry(k).or_default();
                u.at = Some(now);
                match s.name.as_str() {
                    "hami_container_device_utilization_ratio" => u.utilization = Some(s.value),
                    "hami_container_device_memory_bytes" => u.memory_bytes = Some(s.value),
                    _ => u.limit_bytes = Some(s.value),
                }
            }
            "hami_host_gpu_utilization_ratio" | "hami_host_gpu_memory_used_bytes" => {
                let (Some(node), Some(uuid)) = (s.label("node"), s.label("device_uuid")) else {
                    continue;
                };
                let card = said
                    .hosts
                    .entry((node.to_owned(), uuid.to_owned()))
                    .or_default();
                card.at = now;
                if s.name.ends_with("ratio") {
                    card.utilization = Some(s.value);
                } else {
                    card.memory_bytes = Some(s.value);
                }
            }
            _ => {}
        }
    }
    for k in said.containers.keys() {
        let node = world
            .pods
            .get(&format!("{}/{}", k.0, k.1))
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.node_name.clone());
        if let Some(node) = node {
            said.container_nodes.insert(k.clone(), node);
        }
    }
    said
}

impl Metrics {
    /// Nothing scraped yet from `urls`.
    pub fn with_endpoints(urls: &[String]) -> Self {
        let mut m = Metrics {
            endpoints: urls
                .iter()
                .map(|u| Endpoint {
                    url: u.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        m.index_coverage();
        m
    }

    /// Rebuilds [`Metrics::covered`] from the endpoints.
    pub fn index_coverage(&mut self) {
        let mut c = Covered::default();
        for e in &self.endpoints {
            c.nodes.extend(e.nodes.iter().cloned());
            c.nodes.insert(url_host(&e.url).to_owned());
            if e.last_ok.is_none() {
                if e.error.is_some() {
                    c.unreadable = true;
                } else {
                    c.waiting = true;
                }
            }
        }
        self.covered = c;
    }

    /// Takes one round of scrapes (`results[i]` from endpoint `i`) at `now`, with the
    /// world at that moment (the pods' nodes, the memory granted, whether the API server
    /// answers). The trend gets no point while the API server cannot be read or no
    /// endpoint answered: a gap, not figures that only look live.
    pub fn ingest(
        &mut self,
        now: i64,
        results: Vec<Result<(Vec<Sample>, usize), String>>,
        world: &World,
    ) {
        let mut fresh: Vec<usize> = Vec::new();
        for (i, (endpoint, result)) in self.endpoints.iter_mut().zip(results).enumerate() {
            match result {
                Ok((samples, bad)) => {
                    endpoint.error = None;
                    endpoint.failing_since = None;
                    endpoint.last_ok = Some(now);
                    endpoint.bad_lines = bad;
                    endpoint.said = read(&samples, world, now);
                    endpoint.nodes = endpoint
                        .said
                        .hosts
                        .keys()
                        .map(|(n, _)| n.clone())
                        .chain(endpoint.said.container_nodes.values().cloned())
                        .collect();
                    fresh.push(i);
                }
                Err(e) => {
                    endpoint.error = Some(e);
                    endpoint.failing_since.get_or_insert(now);
                    // Past the hour, what it last said is no longer shown.
                    if endpoint.last_ok.is_some_and(|t| t < now - HISTORY_SECONDS) {
                        endpoint.said = Said::default();
                    }
                }
            }
        }
        // Merged by key: a container that two endpoints report (a monitor and a Prometheus
        // federating it) counts once.
        let mut latest: BTreeMap<SeriesKey, Usage> = BTreeMap::new();
        let mut nodes: BTreeMap<&SeriesKey, &String> = BTreeMap::new();
        let mut cards: BTreeMap<CardKey, CardSample> = BTreeMap::new();
        for e in &self.endpoints {
            latest.extend(e.said.containers.iter().map(|(k, u)| (k.clone(), *u)));
            nodes.extend(e.said.container_nodes.iter());
            cards.extend(e.said.hosts.iter().map(|(k, c)| (k.clone(), *c)));
        }
        let mut pods_on_cards: BTreeMap<CardKey, CardSample> = BTreeMap::new();
        for (k, u) in &latest {
            let Some(node) = nodes.get(k) else { continue };
            let at = u.at.unwrap_or(now);
            let card = pods_on_cards
                .entry(((*node).clone(), k.3.clone()))
                .or_insert(CardSample {
                    at,
                    ..Default::default()
                });
            add(&mut card.memory_bytes, u.memory_bytes);
            add(&mut card.utilization, u.utilization);
            card.at = card.at.min(at);
        }
        let fresh_usage: BTreeMap<&SeriesKey, &Usage> = fresh
            .iter()
            .flat_map(|i| self.endpoints[*i].said.containers.iter())
            .collect();
        for (k, u) in &fresh_usage {
            if let Some(v) = u.utilization {
                self.utilization
                    .entry((*k).clone())
                    .or_default()
                    .push(now, v);
            }
            if let Some(v) = u.memory_bytes {
                self.memory.entry((*k).clone()).or_default().push(now, v);
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
            &mut self.trend_capacity,
        ] {
            series.prune_trend(now);
        }
        self.utilization.retain(|_, s| !s.0.is_empty());
        self.memory.retain(|_, s| !s.0.is_empty());
        // Only what was sampled is drawn: no memory samples, no "used" point (not a 0).
        // Every container counts, DRA ones too: the monitor reports a DRA container's
        // claim region under the slice device's uuid, like a device-plugin container's.
        if world.api_down_since().is_none() && !fresh.is_empty() {
            let used: Vec<f64> = fresh_usage
                .values()
                .filter_map(|u| u.memory_bytes)
                .collect();
            let utils: Vec<f64> = fresh_usage.values().filter_map(|u| u.utilization).collect();
            self.trend_granted
                .push_trend(now, world.memory_granted_mib());
            self.trend_capacity.push_trend(now, memory_total_mib(world));
            if !used.is_empty() {
                self.trend_used
                    .push_trend(now, used.iter().fold(0.0, |a, b| a + b) / 1048576.0);
            }
            if !utils.is_empty() {
                self.trend_utilization.push_trend(
                    now,
                    utils.iter().fold(0.0, |a, b| a + b) / utils.len() as f64,
                );
            }
        }
        self.latest = latest;
        self.cards = cards;
        self.pods_on_cards = pods_on_cards;
        self.index_coverage();
    }

    /// Latest usage of a pod on a device, summed over its containers.
    pub fn pod_device(&self, namespace: &str, pod: &str, uuid: &str) -> Usage {
        let mut out = Usage::default();
        for ((ns, p, _, d), u) in &self.latest {
            if ns == namespace && p == pod && d == uuid {
                out.absorb(u);
            }
        }
        out
    }

    /// [`Metrics::pod_device`] of every (namespace, pod, device uuid) at once: one pass
    /// over the series for a page listing every pod (`/pods`).
    pub fn pod_devices(&self) -> BTreeMap<(&str, &str, &str), Usage> {
        let mut out: BTreeMap<(&str, &str, &str), Usage> = BTreeMap::new();
        for ((ns, p, _, d), u) in &self.latest {
            out.entry((ns, p, d)).or_default().absorb(u);
        }
        out
    }

    /// One banner for the monitors that cannot be read (one cause), saying since when.
    pub fn banners(&self) -> Vec<String> {
        let failing: Vec<&Endpoint> = self
            .endpoints
            .iter()
            .filter(|e| e.error.is_some())
            .collect();
        let Some(since) = failing.iter().filter_map(|e| e.failing_since).min() else {
            return Vec::new();
        };
        let since = crate::html::since(since);
        let what = |e: &Endpoint| format!("{} ({})", e.url, e.error.as_deref().unwrap_or_default());
        let stops = if failing.len() == self.endpoints.len() {
            " The trend stops until one answers."
        } else {
            ""
        };
        let text = if let [one] = failing.as_slice() {
            format!(
                "The monitor at {} cannot be read {since}: {}. Figures show what it last said, with their age.{stops}",
                one.url,
                one.error.as_deref().unwrap_or_default()
            )
        } else {
            let listed: Vec<String> = failing.iter().take(5).map(|e| what(e)).collect();
            let more = failing.len().saturating_sub(5);
            format!(
                "{} of {} monitors cannot be read {since}: {}{}. Figures show what they last said, with their age.{stops}",
                failing.len(),
                self.endpoints.len(),
                listed.join("; "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            )
        };
        vec![text]
    }
}

/// GPU memory in the whole cluster, MiB: the device plugins' GPUs and partitions plus
/// [`World::dra_devices`] (the same cards [`World::memory_granted_mib`] charges on).
fn memory_total_mib(world: &World) -> f64 {
    let plugin: f64 = world
        .state
        .nodes()
        .flat_map(|n| n.devices.gpus.iter().map(|g| g.info.devmem as f64))
        .fold(0.0, |a, b| a + b);
    let dra: f64 = world
        .dra_devices()
        .map(|(_, d)| d.memory_bytes as f64 / 1048576.0)
        .fold(0.0, |a, b| a + b);
    plugin + dra
}

impl Usage {
    /// Adds another container's use of the same device (the oldest moment kept).
    fn absorb(&mut self, u: &Usage) {
        add(&mut self.memory_bytes, u.memory_bytes);
        add(&mut self.utilization, u.utilization);
        add(&mut self.limit_bytes, u.limit_bytes);
        self.at = match (self.at, u.at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
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
            &World::default(),
        );
        assert_eq!(m.pod_device("ns", "p", "G").utilization, Some(40.0));
        assert_eq!(m.trend_used.0.back(), Some(&(100, 1.0)));
        assert_eq!(m.trend_granted.0.back(), Some(&(100, 0.0)));
        assert_eq!(m.banners().len(), 1);
        assert!(m.banners()[0].contains("http://b/metrics"));
        // An hour later a vanished container's series has aged out; the cluster trend keeps
        // its first point (six hours), with no "used" point where nothing was sampled.
        m.ingest(
            100 + HISTORY_SECONDS + 1,
            vec![Ok((vec![], 0)), Ok((vec![], 0))],
            &World::default(),
        );
        assert!(m.utilization.is_empty());
        assert_eq!(m.trend_used.0.len(), 1, "no memory samples, no point");
        assert_eq!(m.trend_granted.0.len(), 2);
        assert!(m.banners().is_empty());
        assert_eq!(m.pod_device("ns", "p", "G"), Usage::default());
        // Six hours on, only the latest round's point is left.
        m.ingest(
            100 + TREND_SECONDS + 1,
            vec![Ok((vec![], 0)), Ok((vec![], 0))],
            &World::default(),
        );
        assert!(m.trend_used.0.is_empty());
        let kept: Vec<i64> = m.trend_granted.0.iter().map(|(t, _)| *t).collect();
        assert_eq!(
            kept,
            vec![100 + HISTORY_SECONDS + 1, 100 + TREND_SECONDS + 1]
        );
    }

    #[test]
    fn the_trend_keeps_every_point_of_the_hour_and_one_a_minute_for_six() {
        let mut s = Series::default();
        let (start, step) = (1_000_000, 5);
        let mut t = start;
        while t <= start + 7 * 3600 {
            s.push_trend(t, (t - start) as f64);
            t += step;
        }
        let now = t - step;
        // The last hour: every 5 s point (721); before it, back to six hours: one a minute,
        // each minute's first (300).
        let recent =
            s.0.iter()
                .filter(|(t, _)| *t >= now - HISTORY_SECONDS)
                .count();
        assert_eq!(recent, 721);
        let older: Vec<i64> =
            s.0.iter()
                .filter(|(t, _)| *t < now - HISTORY_SECONDS)
                .map(|(t, _)| *t)
                .collect();
        assert_eq!(older.len(), 300, "{older:?}");
        assert!(older[0] >= now - TREND_SECONDS);
        assert!(
            older.iter().all(|t| t % THINNED_STEP == 0),
            "each minute's first"
        );
        assert!(older.windows(2).all(|w| w[1] - w[0] == THINNED_STEP));
        assert_eq!(s.reach(now), now - older[0]);
        // The values stay those of their moments.
        assert!(s.0.iter().all(|(t, v)| *v == (*t - start) as f64));
    }

    #[test]
    fn an_unreadable_monitor_keeps_what_it_said_with_its_age() {
        let mut m = Metrics::with_endpoints(&["http://a/metrics".into()]);
        let body = "hami_container_device_utilization_ratio{namespace=\"ns\",pod=\"p\",container=\"c\",vdevice_index=\"0\",device_uuid=\"G\"} 40\n";
        let w = World::default();
        m.ingest(100, vec![Ok(parse_samples(body))], &w);
        m.ingest(110, vec![Err("refused".into())], &w);
        m.ingest(120, vec![Err("refused".into())], &w);
        let u = m.pod_device("ns", "p", "G");
        assert_eq!((u.utilization, u.at), (Some(40.0), Some(100)));
        assert_eq!(m.endpoints[0].failing_since, Some(110));
        assert_eq!(
            m.trend_utilization.0.len(),
            1,
            "no point while nothing answers"
        );
        assert!(
            m.banners()[0].contains("since 00:01 UTC"),
            "{:?}",
            m.banners()
        );
        // Past the hour without an answer, it is no longer shown.
        m.ingest(100 + HISTORY_SECONDS + 1, vec![Err("refused".into())], &w);
        assert_eq!(m.pod_device("ns", "p", "G"), Usage::default());
    }

    #[test]
    fn a_container_two_endpoints_report_counts_once() {
        // A node's monitor and a Prometheus federating it: one container, one figure.
        let mut w = World::default();
        w.upsert_pod(
            serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1",
                    "containers": [{"name": "c", "image": "app"}]}}))
            .unwrap(),
        );
        let mut m = Metrics::with_endpoints(&[
            "http://n1:9394/metrics".into(),
            "http://prometheus:9090/federate".into(),
        ]);
        let body = "hami_container_device_memory_bytes{namespace=\"ns\",pod=\"p\",container=\"c\",vdevice_index=\"0\",device_uuid=\"G\"} 1048576\n";
        m.ingest(
            100,
            vec![Ok(parse_samples(body)), Ok(parse_samples(body))],
            &w,
        );
        let card = m.pods_on_cards[&("n1".to_owned(), "G".to_owned())];
        assert_eq!(card.memory_bytes, Some(1048576.0));
        assert_eq!(m.trend_used.0.back(), Some(&(100, 1.0)));
        assert!(m.endpoints.iter().all(|e| e.nodes.contains("n1")));
    }
}
