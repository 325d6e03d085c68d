//! Prometheus metrics (SPEC §3), names compatible with the reference, every series with
//! `zone="vGPU"`, help text on every family. GPU and pod gauges are computed from the
//! cluster state at scrape time; filter and bind latencies are histograms. The body is
//! OpenMetrics or Prometheus text 0.0.4, as the scraper's `Accept` asks
//! (`hami_protocol::exposition`). `device_type` is `Vendor::device_type` of the registered
//! type, as the monitor labels the same GPU; `container_index` is the container's run in
//! the pod's device list (init and sidecar containers first). The defragmentation gauges
//! (`crate::defrag_metrics`, D-30) are measured from node snapshots taken under the state
//! lock, after it is released ([`Metrics::take`], [`Metrics::encode`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use hami_protocol::exposition::Format;
use hami_protocol::names::Vendor;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::snapshot::{Gpu, NodeSnapshot};
use crate::state::ClusterState;

pub(crate) type Labels = Vec<(String, String)>;
pub(crate) type GaugeFamily = Family<Labels, Gauge<f64, AtomicU64>>;

fn latency_histogram() -> Histogram {
    // 0.1 ms .. ~3.3 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// The scheduler's own metrics: filter and bind latencies, filter refusals; the cluster gauges are
/// rendered from the state.
#[derive(Debug, Clone)]
pub struct Metrics {
    filter: Family<Labels, Histogram, fn() -> Histogram>,
    bind: Family<Labels, Histogram, fn() -> Histogram>,
    /// Nodes refused by filter, by reason (`fit::refusal_labels`, a fixed set).
    refusals: Family<Labels, Counter>,
    /// The preempt verb's calls and victims (`crate::preempt`).
    pub preempt: crate::preempt::PreemptMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn reason_label(reason: &str) -> Labels {
    vec![("reason".into(), reason.into())]
}

fn result_label(ok: bool) -> Labels {
    vec![("result".into(), if ok { "ok" } else { "error" }.into())]
}

impl Metrics {
    /// Every refusal reason starts at 0, so dashboards see a series from the first scrape.
    pub fn new() -> Self {
        let refusals = Family::<Labels, Counter>::default();
        // Every reason from the start: a dashboard's rate() sees 0, not a missing series.
        for label in crate::fit::refusal_labels() {
            let _ = refusals.get_or_create(&reason_label(label));
        }
        Self {
            filter: Family::new_with_constructor(latency_histogram),
            bind: Family::new_with_constructor(latency_histogram),
            refusals,
            preempt: Default::default(),
        }
    }

    /// Counts one filter call's refused nodes per reason.
    pub fn count_refusals(&self, refusals: &std::collections::BTreeMap<&'static str, u64>) {
        for (label, n) in refusals {
            self.refusals.get_or_create(&reason_label(label)).inc_by(*n);
        }
    }

    /// Records one filter call's latency, labelled `result=ok|error`.
    pub fn observe_filter(&self, took: Duration, ok: bool) {
        self.filter
            .get_or_create(&result_label(ok))
            .observe(took.as_secs_f64());
    }

    /// Records one bind call's latency, labelled `result=ok|error`.
    pub fn observe_bind(&self, took: Duration, ok: bool) {
        self.bind
            .get_or_create(&result_label(ok))
            .observe(took.as_secs_f64());
    }

    /// The OpenMetrics exposition of every metric, from `state` as it is now.
    pub fn render(&self, state: &ClusterState) -> String {
        self.render_as(state, Format::OpenMetrics)
    }

    /// Every metric in `format` (see [`Format::negotiate`] for choosing it from `Accept`).
    pub fn render_as(&self, state: &ClusterState, format: Format) -> String {
        self.encode(self.take(state), format)
    }

    /// What a scrape needs from `state`, taken while its lock is held: every gauge but the
    /// defragmentation ones, and a copy of the node snapshots for those.
    pub fn take(&self, state: &ClusterState) -> Taken {
        Taken {
            registry: self.registry(state),
            nodes: state.nodes().cloned().collect(),
        }
    }

    /// The scrape's text in `format`, the defragmentation gauges measured here: call it
    /// after releasing the state lock (measuring runs the fit rule per reference slice and
    /// card, too slow to hold Filter up on a large fleet).
    pub fn encode(&self, taken: Taken, format: Format) -> String {
        let Taken {
            mut registry,
            nodes,
        } = taken;
        crate::defrag_metrics::register(&mut registry, &nodes);
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &registry);
        format.encode(&out)
    }

    fn registry(&self, state: &ClusterState) -> Registry {
        let mut registry =
            Registry::with_labels([(Cow::Borrowed("zone"), Cow::Borrowed("vGPU"))].into_iter());
        registry.register(
            "hami_scheduler_filter_duration_seconds",
            "Seconds to answer an extender filter call, by result (ok, error)",
            self.filter.clone(),
        );
        registry.register(
            "hami_scheduler_bind_duration_seconds",
            "Seconds to answer an extender bind call, node-lock wait included, by result (ok, error)",
            self.bind.clone(),
        );
        registry.register(
            "hami_scheduler_filter_refusals",
            "Nodes a filter call refused, by reason: the GPU-level fit reasons (CardInsufficientMemory, CardInsufficientCore, ...; a node counts once under each reason its GPUs gave) and node-level ones (NodeInsufficientDevice, NodeUnregistered, NodeDraMode: the node serves AMD GPUs through the DRA driver, NoVendorGpu, RegisterInvalid, PluginNotServing: kubelet reports 0 devices, PluginStale: the plugin's heartbeat stopped)",
            self.refusals.clone(),
        );
        self.preempt.register(&mut registry);
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let family = GaugeFamily::default();
            registry.register(name, help, family.clone());
            family
        };
        let mem_limit = gauge(
            &mut registry,
            "hami_gpu_memory_limit_bytes",
            "Device memory of a GPU in bytes, as registered by its device plugin",
        );
        let core_limit = gauge(
            &mut registry,
            "hami_gpu_core_limit_ratio",
            "Compute of a GPU in percent (100 = the whole GPU; NVIDIA: the registered devcore)",
        );
        let mem_alloc = gauge(
            &mut registry,
            "hami_gpu_memory_allocated_bytes",
            "Device memory of a GPU allocated to pods, in bytes",
        );
        let shared = gauge(
            &mut registry,
            "hami_gpu_shared_count",
            "Shares of a GPU in use: running containers holding a slice of it",
        );
        let core_alloc = gauge(
            &mut registry,
            "hami_gpu_core_allocated_ratio",
            "Compute of a GPU allocated to pods, in percent of the GPU, not CUs (AMD: allocated CUs x 100 / the GPU's CUs, rounded up; NVIDIA: the sum of gpucores)",
        );
        let vmem = gauge(
            &mut registry,
            "hami_vgpu_memory_allocated_bytes",
            "Device memory allocated to one container of a pod on a GPU, in bytes (container_index: the container's position in the pod's device list, init containers first)",
        );
        let vcore = gauge(
            &mut registry,
            "hami_vgpu_core_allocated_ratio",
            "Compute allocated to one container of a pod on a GPU, in percent of the GPU, not CUs (AMD: granted CUs x 100 / the GPU's CUs, rounded up; NVIDIA: gpucores)",
        );

        let percent = |vendor: Vendor, cores: u64, devcore: u32| match vendor {
            Vendor::Amd if devcore > 0 => (cores as f64 * 100.0 / f64::from(devcore)).ceil(),
            Vendor::Amd => 0.0,
            Vendor::Nvidia => cores as f64,
        };
        for node in state.nodes() {
            for (gpu, usage) in node.devices.gpus.iter().zip(&node.usage) {
                let labels = gpu_labels(&node.devices.name, gpu);
                mem_limit
                    .get_or_create(&labels)
                    .set(gpu.info.devmem as f64 * 1_048_576.0);
                core_limit.get_or_create(&labels).set(match gpu.vendor {
                    Vendor::Amd => 100.0,
                    Vendor::Nvidia => f64::from(gpu.info.devcore),
                });
                mem_alloc
                    .get_or_create(&labels)
                    .set(usage.mem_mib as f64 * 1_048_576.0);
                shared.get_or_create(&labels).set(f64::from(usage.used));
                core_alloc.get_or_create(&labels).set(percent(
                    gpu.vendor,
                    usage.cores,
                    gpu.info.devcore,
                ));
            }
        }
        for (_, holding) in state.holdings() {
            let Some(node) = state.node(&holding.node) else {
                continue;
            };
            for grant in &holding.grants {
                let Some(gpu) = node.devices.gpus.iter().find(|g| g.info.id == grant.uuid) else {
                    continue;
                };
                let labels: Labels = vec![
                    ("namespace".into(), holding.namespace.clone()),
                    ("node".into(), holding.node.clone()),
                    ("pod".into(), holding.name.clone()),
                    ("container_index".into(), grant.container_index.to_string()),
                    ("device_uuid".into(), grant.uuid.clone()),
                ];
                vmem.get_or_create(&labels)
                    .set(grant.mem_mib as f64 * 1_048_576.0);
                vcore.get_or_create(&labels).set(percent(
                    gpu.vendor,
                    grant.cores.into(),
                    gpu.info.devcore,
                ));
            }
        }
        // HAMi's quota families (issue 30), labelled as HAMi labels them:
        // `hami_resource_quota_used{namespace, quota_name, limit}` with `quota_name` the
        // resource a key limits (`nvidia.com/gpumem`) and `limit` the limit's value, and
        // `hami_resource_quota_limit{namespace, quota_name}`. Several ResourceQuotas of one
        // namespace limiting one resource all apply, so the smallest limit is the one shown.
        let quota_used = gauge(
            &mut registry,
            "hami_resource_quota_used",
            "What a namespace uses of a resource limited by a HAMi quota key (limits.<vendor>/gpu in GPUs, gpumem in MiB, gpucores in percent of a GPU); quota_name: the resource, limit: the limit in force",
        );
        let quota_limit = gauge(
            &mut registry,
            "hami_resource_quota_limit",
            "The limit in force on a resource by a HAMi quota key (limits.<vendor>/gpu in GPUs, gpumem in MiB, gpucores in percent of a GPU); quota_name: the resource",
        );
        let mut in_force: BTreeMap<(String, &'static str), (u64, u64)> = BTreeMap::new();
        for row in state.quota.rows() {
            let entry = in_force
                .entry((row.namespace, row.resource))
                .or_insert((row.used, row.limit));
            entry.1 = entry.1.min(row.limit);
        }
        for ((namespace, resource), (used, limit)) in in_force {
            let limit_labels: Labels = vec![
                ("namespace".into(), namespace),
                ("quota_name".into(), resource.into()),
            ];
            let mut used_labels = limit_labels.clone();
            used_labels.push(("limit".into(), limit.to_string()));
            quota_used.get_or_create(&used_labels).set(used as f64);
            quota_limit.get_or_create(&limit_labels).set(limit as f64);
        }
        registry
    }
}

/// A scrape's share of the state, taken under its lock ([`Metrics::take`]).
#[derive(Debug)]
pub struct Taken {
    registry: Registry,
    nodes: Vec<NodeSnapshot>,
}

/// A GPU's labels on every per-GPU family.
pub(crate) fn gpu_labels(node: &str, gpu: &Gpu) -> Labels {
    vec![
        ("node".into(), node.to_owned()),
        ("device_uuid".into(), gpu.info.id.clone()),
        ("device_index".into(), gpu.info.index.to_string()),
        (
            "device_type".into(),
            gpu.vendor.device_type(&gpu.info.device_type),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use serde_json::json;

    #[test]
    fn gauges_from_state() {
        let mut state = ClusterState::new();
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": {
            "hami.io/node-amd-register": r#"[{"id":"G","index":1,"count":10,"devmem":1024,"devcore":304,"type":"AMD Instinct MI300X","health":true}]"#}}})).unwrap();
        state.upsert_node(&node);
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {
            "hami.io/vgpu-node": "n1", "hami.io/amd-devices-allocated": "G,AMD Instinct MI300X,512,76:;"}},
            "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]}})).unwrap();
        state.upsert_pod(&pod);
        let m = Metrics::new();
        m.observe_filter(Duration::from_millis(2), true);
        let text = m.render(&state);
        let find = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name) && l.contains("device_uuid=\"G\""))
                .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
                .to_string()
        };
        assert!(
            find("hami_gpu_memory_limit_bytes{").ends_with(" 1073741824.0"),
            "{text}"
        );
        assert!(
            find("hami_gpu_core_allocated_ratio{").ends_with(" 25.0"),
            "76/304 CUs = 25%: {text}"
        );
        assert!(find("hami_gpu_shared_count{").ends_with(" 1.0"));
        assert!(find("hami_vgpu_memory_allocated_bytes{").contains(r#"pod="p""#));
        assert!(
            text.lines().any(
                |l| l.starts_with("hami_scheduler_filter_duration_seconds_count{")
                    && l.contains(r#"result="ok""#)
                    && l.contains(r#"zone="vGPU""#)
                    && l.ends_with(" 1")
            ),
            "{text}"
        );
        assert!(find("hami_gpu_memory_limit_bytes{").contains(r#"zone="vGPU""#));
    }

    #[test]
    fn filter_refusals_are_counted_by_reason() {
        use crate::extender::{FilterConfig, decide_filter};
        let mut state = ClusterState::new();
        let reg = |mem: u64| {
            format!(
                r#"[{{"id":"G{mem}","count":10,"devmem":{mem},"devcore":100,"type":"AMD Instinct MI210","health":true}}]"#
            )
        };
        for (name, ann) in [
            ("small", json!({"hami.io/node-amd-register": reg(100)})),
            ("tiny", json!({"hami.io/node-amd-register": reg(50)})),
            ("garbled", json!({"hami.io/node-amd-register": "not json"})),
        ] {
            let node: Node =
                serde_json::from_value(json!({"metadata": {"name": name, "annotations": ann}}))
                    .unwrap();
            state.upsert_node(&node);
        }
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "500"}}}]}})).unwrap();
        let names: Vec<String> = ["small", "tiny", "garbled", "gone"]
            .map(String::from)
            .into();
        let d = decide_filter(&mut state, &pod, &names, &FilterConfig::default(), 0);
        assert!(d.result.nodenames.is_none(), "{d:?}");
        let m = Metrics::new();
        let before = m.render(&state);
        // Every reason is there from the start, at 0 (a fixed label set).
        for label in crate::fit::refusal_labels() {
            let line = format!(
                r#"hami_scheduler_filter_refusals_total{{zone="vGPU",reason="{label}"}} 0"#
            );
            assert!(
                before.lines().any(|l| l == line),
                "{line} missing in\n{before}"
            );
        }
        m.count_refusals(&d.refusals);
        m.count_refusals(&d.refusals);
        let text = m.render(&state);
        let value = |reason: &str| {
            let prefix = format!(
                r#"hami_scheduler_filter_refusals_total{{zone="vGPU",reason="{reason}"}} "#
            );
            text.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .unwrap_or_else(|| panic!("{reason} missing in\n{text}"))
                .to_string()
        };
        assert_eq!(value("CardInsufficientMemory"), "4", "2 nodes x 2 calls");
        assert_eq!(value("RegisterInvalid"), "2");
        assert_eq!(value("NodeUnregistered"), "2");
        assert_eq!(value("CardInsufficientCore"), "0");
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("hami_scheduler_filter_refusals_total{"))
                .count(),
            crate::fit::refusal_labels().len(),
            "no label outside the fixed set"
        );
    }

    #[test]
    fn a_dra_node_refusal_is_counted_as_dra_mode_not_unregistered() {
        use crate::extender::{FilterConfig, decide_filter};
        let mut state = ClusterState::new();
        for node in [
            json!({"metadata": {"name": "dra", "labels": {"hami.io/amd-mode": "dra"}}}),
            json!({"metadata": {"name": "bare"}}),
        ] {
            state.upsert_node(&serde_json::from_value::<Node>(node).unwrap());
        }
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]}})).unwrap();
        let names = vec!["dra".to_owned(), "bare".to_owned()];
        let d = decide_filter(&mut state, &pod, &names, &FilterConfig::default(), 0);
        assert!(d.result.nodenames.is_none(), "{d:?}");
        // kube-scheduler still shows the user what to change on the DRA node.
        // No eviction can make room there: never offered to preemption (issue 30).
        let why = &d.result.failed_and_unresolvable_nodes["dra"];
        assert!(
            why.contains("DRA driver") && why.contains("hami.io/amd-mode: dra"),
            "{why}"
        );
        let m = Metrics::new();
        m.count_refusals(&d.refusals);
        let text = m.render(&state);
        let value = |reason: &str| {
            let prefix = format!(
                r#"hami_scheduler_filter_refusals_total{{zone="vGPU",reason="{reason}"}} "#
            );
            text.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .unwrap_or_else(|| panic!("{reason} missing in\n{text}"))
                .to_string()
        };
        assert_eq!(value("NodeDraMode"), "1", "the DRA node");
        assert_eq!(value("NodeUnregistered"), "1", "only the bare node");
    }

    /// Two nodes, a pod with an init container and two app containers, one of them on two
    /// GPUs; the registered type lacks the vendor word.
    fn busy_state() -> ClusterState {
        let mut state = ClusterState::new();
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": {
            "hami.io/node-amd-register": r#"[{"id":"G0","index":0,"count":10,"devmem":1024,"devcore":100,"type":"Instinct MI210","health":true},{"id":"G1","index":1,"count":10,"devmem":1024,"devcore":100,"type":"Instinct MI210","health":true}]"#}}})).unwrap();
        state.upsert_node(&node);
        let gpu = json!({"limits": {"amd.com/gpu": "1"}});
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {
            "hami.io/vgpu-node": "n1",
            "hami.io/amd-devices-allocated": "G0,AMD Instinct MI210,100,10:;G0,AMD Instinct MI210,200,20:;G0,AMD Instinct MI210,300,30:G1,AMD Instinct MI210,400,40:;"}},
            "spec": {"schedulerName": "hami-scheduler", "initContainers": [{"name": "i", "resources": gpu}],
                "containers": [{"name": "a", "resources": gpu}, {"name": "b", "resources": gpu}]}})).unwrap();
        state.upsert_pod(&pod);
        state
    }

    #[test]
    fn container_index_is_the_device_list_position() {
        let text = Metrics::new().render(&busy_state());
        let value = |index: &str, uuid: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("hami_vgpu_memory_allocated_bytes{")
                        && l.contains(&format!(r#"container_index="{index}""#))
                        && l.contains(&format!(r#"device_uuid="{uuid}""#))
                })
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("container {index} on {uuid} missing:\n{text}"))
        };
        let mib = 1_048_576.0;
        assert_eq!(value("0", "G0"), 100.0 * mib);
        assert_eq!(value("1", "G0"), 200.0 * mib);
        assert_eq!(value("2", "G0"), 300.0 * mib);
        assert_eq!(value("2", "G1"), 400.0 * mib);
        assert!(
            text.lines()
                .any(|l| l.starts_with("hami_vgpu_core_allocated_ratio{")
                    && l.contains(r#"container_index="2""#)
                    && l.contains(r#"device_uuid="G1""#)
                    && l.ends_with(" 40.0")),
            "40 of 100 CUs = 40 percent:\n{text}"
        );
    }

    #[test]
    fn prometheus_text_when_asked_with_help_zone_and_one_device_type() {
        let m = Metrics::new();
        m.observe_bind(Duration::from_millis(3), false);
        let state = busy_state();
        let om = m.render_as(
            &state,
            Format::negotiate(Some("application/openmetrics-text")),
        );
        assert!(
            !m.render_as(&state, Format::negotiate(None))
                .contains("# EOF")
        );
        assert!(om.ends_with("# EOF\n"), "{om}");
        let text = m.render_as(
            &state,
            Format::negotiate(Some("text/plain;version=0.0.4;q=1,*/*;q=0.1")),
        );
        assert!(!text.contains("# EOF"), "{text}");
        let mut helped = std::collections::BTreeSet::new();
        let mut typed = std::collections::BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                assert!(help.len() > 10, "{line}");
                helped.insert(name.to_owned());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                typed.insert(rest.split(' ').next().unwrap().to_owned());
            } else {
                assert!(line.contains(r#"zone="vGPU""#), "no zone: {line}");
                if line.contains("device_type=") {
                    assert!(
                        line.contains(r#"device_type="AMD Instinct MI210""#),
                        "{line}"
                    );
                }
            }
        }
        assert_eq!(helped, typed, "every family has help:\n{text}");
        assert!(typed.contains("hami_scheduler_bind_duration_seconds"));
        for family in [
            "hami_gpu_core_allocated_ratio",
            "hami_vgpu_core_allocated_ratio",
        ] {
            let help = text
                .lines()
                .find(|l| l.starts_with(&format!("# HELP {family} ")))
                .unwrap();
            assert!(
                help.contains("percent") && help.contains("not CUs"),
                "{help}"
            );
        }
    }
}
