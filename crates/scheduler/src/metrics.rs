//! Prometheus metrics (SPEC §3), names compatible with the reference, every series with
//! `zone="vGPU"`. GPU and pod gauges are computed from the cluster state at scrape time;
//! filter and bind latencies are histograms.

use std::borrow::Cow;
use std::time::Duration;

use hami_protocol::names::Vendor;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::state::ClusterState;

type Labels = Vec<(String, String)>;
type GaugeFamily = Family<Labels, Gauge<f64, AtomicU64>>;

fn latency_histogram() -> Histogram {
    // 0.1 ms .. ~3.3 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

#[derive(Debug, Clone)]
pub struct Metrics {
    filter: Family<Labels, Histogram, fn() -> Histogram>,
    bind: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn result_label(ok: bool) -> Labels {
    vec![("result".into(), if ok { "ok" } else { "error" }.into())]
}

impl Metrics {
    pub fn new() -> Self {
        Self {
            filter: Family::new_with_constructor(latency_histogram),
            bind: Family::new_with_constructor(latency_histogram),
        }
    }

    pub fn observe_filter(&self, took: Duration, ok: bool) {
        self.filter
            .get_or_create(&result_label(ok))
            .observe(took.as_secs_f64());
    }

    pub fn observe_bind(&self, took: Duration, ok: bool) {
        self.bind
            .get_or_create(&result_label(ok))
            .observe(took.as_secs_f64());
    }

    /// The text exposition of every metric, from `state` as it is now.
    pub fn render(&self, state: &ClusterState) -> String {
        let mut registry =
            Registry::with_labels([(Cow::Borrowed("zone"), Cow::Borrowed("vGPU"))].into_iter());
        registry.register(
            "hami_scheduler_filter_duration_seconds",
            "Time to answer an extender filter call",
            self.filter.clone(),
        );
        registry.register(
            "hami_scheduler_bind_duration_seconds",
            "Time to answer an extender bind call, node-lock wait included",
            self.bind.clone(),
        );
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let family = GaugeFamily::default();
            registry.register(name, help, family.clone());
            family
        };
        let mem_limit = gauge(
            &mut registry,
            "hami_gpu_memory_limit_bytes",
            "Device memory of a GPU",
        );
        let core_limit = gauge(
            &mut registry,
            "hami_gpu_core_limit_ratio",
            "Compute of a GPU (100 = the whole GPU)",
        );
        let mem_alloc = gauge(
            &mut registry,
            "hami_gpu_memory_allocated_bytes",
            "Device memory of a GPU allocated to pods",
        );
        let shared = gauge(&mut registry, "hami_gpu_shared_count", "Pods sharing a GPU");
        let core_alloc = gauge(
            &mut registry,
            "hami_gpu_core_allocated_ratio",
            "Compute of a GPU allocated to pods, percent (AMD CUs converted to percent, rounded up)",
        );
        let vmem = gauge(
            &mut registry,
            "hami_vgpu_memory_allocated_bytes",
            "Device memory allocated to a pod on a GPU",
        );
        let vcore = gauge(
            &mut registry,
            "hami_vgpu_core_allocated_ratio",
            "Compute allocated to a pod on a GPU, percent",
        );

        let percent = |vendor: Vendor, cores: u64, devcore: u32| match vendor {
            Vendor::Amd if devcore > 0 => (cores as f64 * 100.0 / f64::from(devcore)).ceil(),
            Vendor::Amd => 0.0,
            Vendor::Nvidia => cores as f64,
        };
        for node in state.nodes() {
            for (gpu, usage) in node.devices.gpus.iter().zip(&node.usage) {
                let labels: Labels = vec![
                    ("node".into(), node.devices.name.clone()),
                    ("device_uuid".into(), gpu.info.id.clone()),
                    ("device_index".into(), gpu.info.index.to_string()),
                    ("device_type".into(), gpu.info.device_type.clone()),
                ];
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
            for charge in &holding.charges {
                let Some(gpu) = node.devices.gpus.iter().find(|g| g.info.id == charge.uuid) else {
                    continue;
                };
                let labels: Labels = vec![
                    ("namespace".into(), holding.namespace.clone()),
                    ("node".into(), holding.node.clone()),
                    ("pod".into(), holding.name.clone()),
                    ("container_index".into(), "0".into()),
                    ("device_uuid".into(), charge.uuid.clone()),
                ];
                vmem.get_or_create(&labels)
                    .set(charge.mem_mib as f64 * 1_048_576.0);
                vcore.get_or_create(&labels).set(percent(
                    gpu.vendor,
                    charge.cores,
                    gpu.info.devcore,
                ));
            }
        }
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
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
            "spec": {"containers": [{"name": "c"}]}})).unwrap();
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
}
