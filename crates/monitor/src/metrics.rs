//! Prometheus exposition of a [`Snapshot`] (prometheus-client, OpenMetrics text, or the
//! Prometheus text format 0.0.4 when the scraper's `Accept` asks for it:
//! `hami_protocol::exposition`). Names are the reference's (SPEC Appendix A), every series
//! carries `zone="vGPU"` (`hami_build_info` too, unlike the reference) and help text, legacy
//! names are added by [`LegacyMetrics`] (seed 004's utilization name by default). `device_type` is `Vendor::device_type` of the
//! registered type, the label the scheduler gives the same GPU. Pure: snapshot in, text out.

use std::borrow::Cow;

use hami_protocol::exposition::Format;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::node_monitor::Snapshot;

/// HELP of the utilization metric (D-6: clamping is stated).
pub const UTILIZATION_HELP: &str = "Container device utilization ratio (0-100): NVIDIA = sum of the SM utilization NVML reports for the container's live processes; AMD = engine busy time of the container's processes on that device or partition (gfx + compute engines, DRM fdinfo, attributed by the DRM node the process opened) as a percent of the sampling interval, which is time busy, not a share of the compute units; sums above 100 are clamped to 100";

type Labels = Vec<(&'static str, Cow<'static, str>)>;

/// Which pre-2026 metric names are emitted beside the `hami_*` ones (`--legacy-metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LegacyMetrics {
    /// None: only the `hami_*` names.
    None,
    /// Seed 004's `Device_utilization_desc_of_container` only: the per-pod utilization
    /// series users of the reference query (the default).
    #[default]
    Seed,
    /// Every name of the reference monitor.
    All,
}

impl LegacyMetrics {
    fn seed(self) -> bool {
        self != LegacyMetrics::None
    }
    fn all(self) -> bool {
        self == LegacyMetrics::All
    }
}

#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, f64)>,
}

impl Family {
    fn gauge(name: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind: MetricType::Gauge,
            samples: Vec::new(),
        }
    }
    fn push(&mut self, labels: Labels, value: f64) {
        self.samples.push((labels, value));
    }
    fn encode(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.samples.is_empty() {
            return Ok(());
        }
        let mut metric = encoder.encode_descriptor(self.name, self.help, None, self.kind)?;
        for (labels, value) in &self.samples {
            let family = metric.encode_family(labels)?;
            match self.kind {
                MetricType::Counter => ConstCounter::new(*value as u64).encode(family)?,
                _ => ConstGauge::new(*value).encode(family)?,
            }
        }
        Ok(())
    }
}

fn s(text: &str) -> Cow<'static, str> {
    Cow::Owned(text.to_owned())
}

fn index_label(index: Option<usize>) -> Cow<'static, str> {
    index.map_or(Cow::Borrowed(""), |i| Cow::Owned(i.to_string()))
}

/// Builds every family of a snapshot.
fn families(snapshot: &Snapshot, legacy_names: LegacyMetrics) -> Vec<Family> {
    let legacy = legacy_names.all();
    let mut used = Family::gauge(
        "hami_vgpu_memory_used_bytes",
        "vGPU device memory usage in bytes",
    );
    let mut limit = Family::gauge(
        "hami_vgpu_memory_limit_bytes",
        "vGPU device memory limit in bytes",
    );
    let mut ctr_mem = Family::gauge(
        "hami_container_device_memory_bytes",
        "Container device memory usage in bytes",
    );
    let mut util = Family::gauge("hami_container_device_utilization_ratio", UTILIZATION_HELP);
    let mut clamped = Family::gauge(
        "hami_container_device_utilization_clamped",
        "1 when the raw utilization sum of this container and device exceeded 100 and hami_container_device_utilization_ratio was clamped",
    );
    let mut context = Family::gauge(
        "hami_vgpu_memory_context_bytes",
        "vGPU device memory context size in bytes",
    );
    let mut module = Family::gauge(
        "hami_vgpu_memory_module_bytes",
        "vGPU device memory module size in bytes",
    );
    let mut buffer = Family::gauge(
        "hami_vgpu_memory_buffer_bytes",
        "vGPU device memory buffer size in bytes",
    );
    let mut last_kernel = Family::gauge(
        "hami_container_last_kernel_elapsed_seconds",
        "Seconds since last kernel execution in container",
    );
    let mut alloc_mem = Family::gauge(
        "hami_container_device_allocated_memory_bytes",
        "Device memory granted to the container by the scheduler (from the pod's device annotation), in bytes",
    );
    let mut alloc_cores = Family::gauge(
        "hami_container_device_allocated_cores",
        "Compute granted to the container on the device, by vendor label: AMD = a count of compute units (CUs, not percent), NVIDIA = percent of the SMs (gpucores)",
    );
    let mut cu_mask = Family::gauge(
        "hami_container_device_cu_mask_info",
        "AMD compute units granted on the device (hami.io/amd-cu-allocated, pod-wide), as the cu_mask label",
    );
    let mut whole_card = Family::gauge(
        "hami_vgpu_whole_card",
        "1 for each card a pod HAMi did not place holds whole (the device plugin's hami.io/amd-whole-cards or hami.io/nvidia-whole-cards record, issue 26): all of its memory and compute are the pod's, and no slice is placed on it",
    );
    let mut unhooked = Family::gauge(
        "hami_container_unhooked_processes",
        "Processes of the container on a GPU whose slice expects the memory hook (hook label: libamvgpu.so, libvgpu.so) but which do not map it: the slice's memory limit is NOT enforced for them (the dynamic linker could not load the hook). A SliceNotEnforced Event is posted on the pod. 0 when every GPU process of the container was checked and has it",
    );
    let mut hook_unknown = Family::gauge(
        "hami_container_hook_unknown_processes",
        "Processes of the container on a GPU whose /proc/<pid>/maps or environ the monitor could not read, so whether the memory hook is loaded is unknown (not counted as unhooked); the monitor needs hostPID and the right to read other users' /proc entries",
    );
    let mut host_mem = Family::gauge(
        "hami_host_gpu_memory_used_bytes",
        "GPU device memory usage in bytes",
    );
    let mut host_util = Family::gauge(
        "hami_host_gpu_utilization_ratio",
        "GPU core utilization ratio (0-100)",
    );
    let mut errors = Family {
        name: "hami_monitor_errors",
        help: "Inputs the monitor skipped, by kind (bad cache files, directories without a pod, vanished /proc entries, ...); each kind also logs one rate-limited warning",
        kind: MetricType::Counter,
        samples: Vec::new(),
    };
    let mut l_used = Family::gauge("vGPU_device_memory_usage_in_bytes", "vGPU device usage");
    let mut l_limit = Family::gauge("vGPU_device_memory_limit_in_bytes", "vGPU device limit");
    let mut l_desc = Family::gauge(
        "Device_memory_desc_of_container",
        "Container device memory description",
    );
    let mut l_util = Family::gauge(
        "Device_utilization_desc_of_container",
        "Container device utilization (0-100), seed 004's name for hami_container_device_utilization_ratio (same value): NVIDIA = SM utilization of the container's processes; AMD = engine busy time of the container's processes on that device or partition over the sampling interval",
    );
    let mut l_kernel = Family::gauge(
        "Device_last_kernel_of_container",
        "Container device last kernel description",
    );
    let mut l_host_mem = Family::gauge("HostGPUMemoryUsage", "GPU device memory usage");
    let mut l_host_util = Family::gauge("HostCoreUtilization", "GPU core utilization");

    for c in &snapshot.containers {
        for d in &c.devices {
            let labels: Labels = vec![
                ("namespace", s(&c.namespace)),
                ("pod", s(&c.pod)),
                ("container", s(&c.container)),
                ("vdevice_index", index_label(d.vdevice_index)),
                ("device_uuid", s(&d.device_uuid)),
            ];
            let old: Labels = vec![
                ("podnamespace", s(&c.namespace)),
                ("podname", s(&c.pod)),
                ("ctrname", s(&c.container)),
                ("vdeviceid", index_label(d.vdevice_index)),
                ("deviceuuid", s(&d.device_uuid)),
            ];
            if let Some(bytes) = d.memory_used {
                used.push(labels.clone(), bytes as f64);
                ctr_mem.push(labels.clone(), bytes as f64);
                if legacy {
                    l_used.push(old.clone(), bytes as f64);
                }
            }
            if let Some(bytes) = d.memory_limit {
                limit.push(labels.clone(), bytes as f64);
                if legacy {
                    l_limit.push(old.clone(), bytes as f64);
                }
            }
            if let Some(b) = d.breakdown {
                context.push(labels.clone(), b.context as f64);
                module.push(labels.clone(), b.module as f64);
                buffer.push(labels.clone(), b.data as f64);
                if legacy {
                    let mut desc = old.clone();
                    let offset = b
                        .total
                        .saturating_sub(b.context)
                        .saturating_sub(b.module)
                        .saturating_sub(b.data);
                    desc.push(("context", s(&b.context.to_string())));
                    desc.push(("module", s(&b.module.to_string())));
                    desc.push(("data", s(&b.data.to_string())));
                    desc.push(("offset", s(&offset.to_string())));
                    l_desc.push(desc, b.total as f64);
                }
            }
            if let Some(u) = d.utilization {
                util.push(labels.clone(), u.percent);
                clamped.push(labels.clone(), if u.clamped { 1.0 } else { 0.0 });
                if legacy_names.seed() {
                    l_util.push(old.clone(), u.percent);
                }
            }
            if let Some(secs) = c.last_kernel_elapsed {
                last_kernel.push(labels.clone(), secs as f64);
                if legacy {
                    l_kernel.push(old.clone(), secs as f64);
                }
            }
        }
    }
    for a in &snapshot.allocations {
        let labels: Labels = vec![
            ("namespace", s(&a.namespace)),
            ("pod", s(&a.pod)),
            ("container", s(&a.container)),
            ("vdevice_index", s(&a.vdevice_index.to_string())),
            ("device_uuid", s(&a.device_uuid)),
            ("vendor", Cow::Borrowed(a.vendor)),
        ];
        alloc_mem.push(labels.clone(), a.memory_bytes as f64);
        alloc_cores.push(labels.clone(), a.cores as f64);
        if let Some(mask) = &a.cu_mask {
            let mut l = labels;
            l.push(("cu_mask", s(mask)));
            cu_mask.push(l, 1.0);
        }
    }
    for w in &snapshot.whole_cards {
        let labels: Labels = vec![
            ("namespace", s(&w.namespace)),
            ("pod", s(&w.pod)),
            ("device_uuid", s(&w.device_uuid)),
        ];
        whole_card.push(labels, 1.0);
    }
    for (at, tally) in snapshot.hooks.iter() {
        let labels: Labels = vec![
            ("namespace", s(&at.namespace)),
            ("pod", s(&at.pod)),
            ("container", s(&at.container)),
            ("hook", Cow::Borrowed(at.vendor.hook_library())),
        ];
        unhooked.push(labels.clone(), f64::from(tally.unhooked));
        hook_unknown.push(labels, f64::from(tally.unknown));
    }
    for g in snapshot.host.iter() {
        let labels: Labels = vec![
            ("node", s(&snapshot.node)),
            ("device_index", s(&g.index.to_string())),
            ("device_uuid", s(&g.uuid)),
            ("device_type", s(&g.device_type)),
        ];
        let old: Labels = vec![
            ("nodeid", s(&snapshot.node)),
            ("deviceidx", s(&g.index.to_string())),
            ("deviceuuid", s(&g.uuid)),
            ("devicetype", s(&g.device_type)),
        ];
        if let Some(bytes) = g.memory_used {
            host_mem.push(labels.clone(), bytes as f64);
            if legacy {
                l_host_mem.push(old.clone(), bytes as f64);
            }
        }
        if let Some(busy) = g.busy_percent {
            host_util.push(labels, busy);
            if legacy {
                l_host_util.push(old, busy);
            }
        }
    }
    for (kind, count) in &snapshot.errors {
        errors.push(vec![("kind", Cow::Borrowed(*kind))], *count as f64);
    }
    vec![
        host_mem,
        host_util,
        used,
        limit,
        ctr_mem,
        util,
        clamped,
        context,
        module,
        buffer,
        last_kernel,
        alloc_mem,
        alloc_cores,
        cu_mask,
        whole_card,
        unhooked,
        hook_unknown,
        errors,
        l_host_mem,
        l_host_util,
        l_used,
        l_limit,
        l_desc,
        l_util,
        l_kernel,
    ]
}

#[derive(Debug)]
struct SnapshotCollector {
    families: Vec<Family>,
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in &self.families {
            family.encode(&mut encoder)?;
        }
        Ok(())
    }
}

/// Build information of this binary.
fn build_info_labels() -> Vec<(&'static str, Cow<'static, str>)> {
    vec![
        ("version", Cow::Borrowed(env!("CARGO_PKG_VERSION"))),
        (
            "revision",
            Cow::Borrowed(option_env!("HAMI_GIT_REVISION").unwrap_or("unknown")),
        ),
        (
            "build_date",
            Cow::Borrowed(option_env!("HAMI_BUILD_DATE").unwrap_or("unknown")),
        ),
        (
            "rust_version",
            Cow::Borrowed(env!("CARGO_PKG_RUST_VERSION")),
        ),
        ("compiler", Cow::Borrowed("rustc")),
        (
            "platform",
            Cow::Owned(format!(
                "{}/{}",
                std::env::consts::OS,
                std::env::consts::ARCH
            )),
        ),
    ]
}

#[derive(Debug)]
struct BuildInfo;

impl Collector for BuildInfo {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut metric = encoder.encode_descriptor(
            "hami_build_info",
            "Build information of k8s-vgpu-monitor",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(metric.encode_family(&build_info_labels())?)
    }
}

/// The whole `/metrics` body as OpenMetrics text, ending in `# EOF`.
pub fn render(snapshot: &Snapshot, legacy: LegacyMetrics) -> String {
    render_as(snapshot, legacy, Format::OpenMetrics)
}

/// The whole `/metrics` body in `format` (see [`Format::negotiate`]).
pub fn render_as(snapshot: &Snapshot, legacy: LegacyMetrics, format: Format) -> String {
    let collector = SnapshotCollector {
        families: families(snapshot, legacy),
    };
    let mut registry =
        Registry::with_labels([(Cow::Borrowed("zone"), Cow::Borrowed("vGPU"))].into_iter());
    registry.register_collector(Box::new(BuildInfo));
    registry.register_collector(Box::new(collector));
    let mut out = String::with_capacity(1 << 16);
    // Writing into a String cannot fail; the encoder only errors on writer failure.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    format.encode(&out)
}

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = Format::OpenMetrics.content_type();
