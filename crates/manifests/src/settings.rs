//! What an operator chooses. [`Values`] *is* the Helm chart's values
//! (`deploy/helm/hami-rs/values.yaml`, parsed at build time for the defaults), so the typed
//! manifests and the chart cannot disagree on a key or a default; the agreement test feeds
//! Helm's own merged values back through this type. [`Settings`] adds what Helm takes from
//! the command line and the cluster: the namespace and the Kubernetes version.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use serde::{Deserialize, Serialize};

/// The chart's values.yaml, the one source of the defaults.
pub const VALUES_YAML: &str = include_str!("../../../deploy/helm/hami-rs/values.yaml");

/// Kubernetes minor versions the installation supports (kube-scheduler's config API
/// `kubescheduler.config.k8s.io/v1` and every object kind used exist in all of them).
pub const SUPPORTED_MINORS: std::ops::RangeInclusive<u32> = 27..=37;
/// From this minor on, webhooks' `matchConditions` are on by default (beta 1.28, GA 1.30).
pub const MATCH_CONDITIONS_MINOR: u32 = 28;
/// From this minor on, `resource.k8s.io/v1` (DRA, GA) is served: `draPlugin` needs it.
pub const DRA_V1_MINOR: u32 = 34;
/// The version `hami manifests` renders for when `--kube-version` is not given.
pub const DEFAULT_KUBE_VERSION: &str = "v1.33.0";

/// How the webhook's serving certificate is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub enum TlsMode {
    /// Two `kube-webhook-certgen` Jobs: create the Secret, then patch the caBundle.
    #[serde(rename = "certgen")]
    Certgen,
    /// cert-manager: a self-signed Issuer and a Certificate; the CA is injected by cainjector.
    #[serde(rename = "cert-manager")]
    CertManager,
}

impl TlsMode {
    /// The spelling in values (`certgen`, `cert-manager`).
    pub fn value(self) -> &'static str {
        match self {
            TlsMode::Certgen => "certgen",
            TlsMode::CertManager => "cert-manager",
        }
    }
}

/// The cluster's version as the API server reports it (`v1.30.4`, `v1.29.8-gke.1031000`,
/// `v1.30.4+k3s1`): what Helm's `.Capabilities.KubeVersion` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version (0 when not given).
    pub patch: u32,
}

impl KubeVersion {
    /// Reads `v1.30.4`, `1.30`, `v1.29.8-gke.1031000`, `v1.30.4+k3s1`.
    pub fn parse(s: &str) -> Result<KubeVersion, String> {
        let bad = || {
            format!(
                "Kubernetes version {s:?} must look like v1.33.2 (what `kubectl version` prints as the server version)"
            )
        };
        let core = s.strip_prefix('v').unwrap_or(s);
        let core = core.split(['-', '+']).next().unwrap_or("");
        let mut parts = core.split('.').map(|p| p.parse::<u32>().map_err(|_| bad()));
        let major = parts.next().ok_or_else(bad)??;
        let minor = parts.next().ok_or_else(bad)??;
        let patch = parts.next().unwrap_or(Ok(0))?;
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(KubeVersion {
            major,
            minor,
            patch,
        })
    }

    /// `v<major>.<minor>.<patch>`: the upstream release (and kube-scheduler image tag) the
    /// cluster runs, vendor suffixes dropped.
    pub fn release(&self) -> String {
        format!("v{}.{}.{}", self.major, self.minor, self.patch)
    }

    /// Whether webhooks' `matchConditions` are on by default (1.28 and later).
    pub fn has_match_conditions(&self) -> bool {
        self.minor >= MATCH_CONDITIONS_MINOR
    }
}

/// One container image; `reference()` is `registry/repository:tag`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// E.g. `ghcr.io`.
    pub registry: String,
    /// E.g. `hami-rs/hami-scheduler`.
    pub repository: String,
    /// E.g. `0.1.0`.
    pub tag: String,
}

impl Image {
    /// `registry/repository:tag`.
    pub fn reference(&self) -> String {
        format!("{}/{}:{}", self.registry, self.repository, self.tag)
    }
}

/// Where and how a component's pods run (the keys every component has).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodPlacement {
    /// `priorityClassName` of the pods (empty: none).
    pub priority_class_name: String,
    /// `nodeSelector` of the pods.
    pub node_selector: BTreeMap<String, String>,
    /// `tolerations` of the pods.
    pub tolerations: Vec<Toleration>,
    /// `{}` in values: no affinity.
    pub affinity: Affinity,
    /// `resources` of the main container.
    pub resources: ResourceRequirements,
}

/// `images:`: where the hami-rs images come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Images {
    /// Registry of the hami-rs images.
    pub registry: String,
    /// Tag of the hami-rs images.
    pub tag: String,
    /// `imagePullPolicy` of every container.
    pub pull_policy: String,
    /// The scheduler image (scheduler, web UI).
    pub scheduler: Repository,
    /// The node image (plugins, monitor, labeller, hooks).
    pub node: Repository,
}

/// `images.<image>:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Repository {
    /// Repository within the registry.
    pub repository: String,
}

/// `scheduler:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SchedulerValues {
    /// Scheduler Deployment replicas.
    pub replicas: i32,
    /// The `schedulerName` the webhook sets and the kube-scheduler profile serves.
    pub scheduler_name: String,
    /// Default GPU policy (`spread` or `binpack`).
    pub gpu_scheduler_policy: String,
    /// Default node policy (`binpack` or `spread`).
    pub node_scheduler_policy: String,
    /// The AMD front end of pods without a `hami.io/amd-mode` annotation (`--amd-mode`):
    /// `device-plugin`, or `dra` (the webhook turns `amd.com/*` requests into claim
    /// templates for the AMD DRA driver; needs `draPlugin.enabled`).
    pub amd_mode: String,
    /// The kube-scheduler sidecar.
    pub kube_scheduler: KubeSchedulerValues,
    /// Where the scheduler pods run.
    #[serde(flatten)]
    pub pod: PodPlacement,
}

/// `scheduler.kubeScheduler:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeSchedulerValues {
    /// An empty tag means the cluster's own release.
    pub image: Image,
    /// `resources` of the sidecar.
    pub resources: ResourceRequirements,
}

/// `webhook:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookValues {
    /// failurePolicy where the server has no matchConditions (every pod would be sent).
    pub failure_policy_without_match_conditions: String,
}

/// `tls:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsValues {
    /// How the serving certificate is made.
    pub mode: TlsMode,
    /// The certgen Jobs (`mode: certgen`).
    pub certgen: CertgenValues,
}

/// `tls.certgen:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertgenValues {
    /// The kube-webhook-certgen image.
    pub image: Image,
    /// Where the Jobs run.
    #[serde(flatten)]
    pub pod: PodPlacement,
}

/// `devicePlugin:` (AMD).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DevicePluginValues {
    /// `None`: the plugin's own default (2 shares on gfx12, else 10).
    pub split_count: Option<u32>,
    /// Memory oversubscription factor (a string so `1.5` stays exact).
    pub device_memory_scaling: String,
    /// Seconds between health re-sends to kubelet.
    pub pulse: u64,
    /// Also publish `amd.com/gpumem`/`amd.com/gpucores` capacity (needs `nodes/status` patch).
    pub report_node_capacity: bool,
    /// `cu` (cards sliced by CU masks) or `partition` (one device per XCP).
    pub operating_mode: String,
    /// Host directory under which `vgpu/libamvgpu.so` is installed.
    pub host_hook_path: String,
    /// Run the plugin `privileged` (platforms whose policy hides sysfs/cgroup otherwise).
    pub privileged: bool,
    /// Opt-in: in cu mode also slice hard compute partitions by CU masks
    /// (`--slice-partitions`); off, a partition counts once.
    pub slice_partitions: bool,
    /// Host path of AMD's device-metrics exporter socket (`--exporter-socket`, a health
    /// source); its directory is mounted read-only. Empty: not used.
    pub exporter_socket: String,
    /// CDI device names in Allocate answers.
    pub cdi: CdiValues,
    /// Where the plugin pods run.
    #[serde(flatten)]
    pub pod: PodPlacement,
}

/// CDI device names in Allocate answers (`--cdi`), with the spec kept in `spec_dir`
/// (`--cdi-spec-dir`, a host directory the plugin writes only when this is on).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiValues {
    /// Answer Allocate with CDI device names.
    pub enabled: bool,
    /// Host directory of the plugin's CDI spec.
    pub spec_dir: String,
}

/// `draPlugin:` — the AMD DRA driver `amdgpu-dra-plugin` (issue 20) on the nodes labelled
/// [`crate::names::AMD_MODE_LABEL`]` = dra`; the device plugin stays off those nodes (one
/// mode per node: never the device plugin and DRA for `amd.com/gpu` on one node, KEP-5004).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DraPluginValues {
    /// Install the DRA driver, its DeviceClass and RBAC (needs Kubernetes 1.34 or newer:
    /// `resource.k8s.io/v1`).
    pub enabled: bool,
    /// Shares per GPU (`--split_count`); `None`: the driver's default (2 on gfx12, else 10).
    pub split_count: Option<u32>,
    /// The DeviceClass maps the extended resource `amd.com/gpu` to DRA (KEP-5004: beta
    /// 1.35, GA 1.37), so plain-count pods run on DRA nodes unchanged.
    pub extended_resource_name: bool,
    /// Seconds between ResourceSlice reconciles (`--publish-interval`).
    pub publish_interval: u64,
    /// Host directory of the per-claim CDI specs the driver writes (`--cdi-dir`).
    pub cdi_spec_dir: String,
    /// Where the driver pods run (always also on nodes labelled `hami.io/amd-mode: dra`).
    #[serde(flatten)]
    pub pod: PodPlacement,
}

/// `nvidiaDevicePlugin:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NvidiaDevicePluginValues {
    /// Install the NVIDIA device plugin.
    pub enabled: bool,
    /// Shares per GPU.
    pub device_split_count: u32,
    /// Memory oversubscription factor (a string so `1.5` stays exact).
    pub device_memory_scaling: String,
    /// Core oversubscription factor (a string so `1.5` stays exact).
    pub device_cores_scaling: String,
    /// Also publish `nvidia.com/gpumem`/`nvidia.com/gpucores` capacity.
    pub report_node_capacity: bool,
    /// Host directory under which `vgpu/libvgpu.so` and `vgpu/ld.so.preload` live.
    pub host_hook_path: String,
    /// RuntimeClass that exposes the driver (NVML) to the plugin, e.g. `nvidia`; empty: the
    /// node's default runtime does.
    pub runtime_class_name: String,
    /// Where the plugin pods run.
    #[serde(flatten)]
    pub pod: PodPlacement,
}

/// A component with nothing but an on switch and placement (`nodeLabeller:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentValues {
    /// Install it.
    pub enabled: bool,
    /// Where its pods run.
    #[serde(flatten)]
    pub pod: PodPlacement,
}

/// The read-only web UI (`hami-webui`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebuiValues {
    /// Install it.
    pub enabled: bool,
    /// Prometheus whose `/federate` has the monitors' series; empty for none.
    pub prometheus_url: String,
    /// Grafana whose hami-rs dashboards the pages link for longer ranges; empty for none.
    pub grafana_url: String,
    /// Where its pod runs.
    #[serde(flatten)]
    pub pod: PodPlacement,
}

/// `monitor:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MonitorValues {
    /// Install it.
    pub enabled: bool,
    /// Pre-2026 metric names beside the `hami_*` ones: `none`, `seed` (seed 004's
    /// utilization name) or `all` (`k8s-vgpu-monitor --legacy-metrics`).
    pub legacy_metrics: String,
    /// Where its pods run.
    #[serde(flatten)]
    pub pod: PodPlacement,
}

/// `serviceMonitor:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorValues {
    /// Create ServiceMonitors for the scheduler and the monitor.
    pub enabled: bool,
    /// Added to the ServiceMonitors' labels (what the Prometheus' serviceMonitorSelector
    /// matches, e.g. `release: kube-prometheus-stack`).
    pub labels: BTreeMap<String, String>,
    /// Scrape interval, e.g. `15s`.
    pub interval: String,
}

/// The chart's values, key for key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Values {
    /// `images:`.
    pub images: Images,
    /// `scheduler:`.
    pub scheduler: SchedulerValues,
    /// `webhook:`.
    pub webhook: WebhookValues,
    /// `tls:`.
    pub tls: TlsValues,
    /// `devicePlugin:`.
    pub device_plugin: DevicePluginValues,
    /// `nvidiaDevicePlugin:`.
    pub nvidia_device_plugin: NvidiaDevicePluginValues,
    /// `draPlugin:`.
    pub dra_plugin: DraPluginValues,
    /// `monitor:`.
    pub monitor: MonitorValues,
    /// `webui:`.
    pub webui: WebuiValues,
    /// `nodeLabeller:`.
    pub node_labeller: ComponentValues,
    /// `serviceMonitor:`.
    pub service_monitor: ServiceMonitorValues,
}

impl Values {
    /// Values from a JSON/YAML document of the whole tree (Helm's merged values).
    pub fn from_json(v: serde_json::Value) -> Result<Values, String> {
        serde_json::from_value(v).map_err(|e| format!("values: {e}"))
    }

    /// `images.registry/images.scheduler.repository:images.tag`.
    pub fn scheduler_image(&self) -> Image {
        self.ours(&self.images.scheduler.repository)
    }

    /// `images.registry/images.node.repository:images.tag`.
    pub fn node_image(&self) -> Image {
        self.ours(&self.images.node.repository)
    }

    fn ours(&self, repository: &str) -> Image {
        Image {
            registry: self.images.registry.clone(),
            repository: repository.into(),
            tag: self.images.tag.clone(),
        }
    }
}

impl Default for Values {
    fn default() -> Self {
        // values.yaml is part of this crate's source (include_str!); the unit test below
        // makes a broken file fail at `cargo test`, not at a user's `hami manifests`.
        serde_saphyr::from_str(VALUES_YAML).expect("deploy/helm/hami-rs/values.yaml parses")
    }
}

/// Everything the manifests depend on.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The namespace installed into.
    pub namespace: String,
    /// The cluster's version.
    pub kube_version: KubeVersion,
    /// The chart's values.
    pub values: Values,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            namespace: "hami-system".into(),
            kube_version: KubeVersion::parse(DEFAULT_KUBE_VERSION).expect("valid default"),
            values: Values::default(),
        }
    }
}

impl Settings {
    /// How the extender listener (mutual TLS in both modes) knows its callers: with
    /// cert-manager a CA issues the serving and the client certificates
    /// (`--client-ca-file`); kube-webhook-certgen can issue neither a client certificate
    /// nor keeps its CA key, so its serving certificate itself is pinned
    /// (`--client-cert-pin-file`) and kube-scheduler and forwarding replicas present it.
    pub fn client_ca(&self) -> bool {
        self.values.tls.mode == TlsMode::CertManager
    }

    /// The scheduler Service's DNS name (in the serving certificate's SANs).
    pub fn service_dns_name(&self) -> String {
        format!("{}.{}.svc", crate::names::SCHEDULER, self.namespace)
    }

    /// The kube-scheduler image: the configured tag, else the cluster's release.
    pub fn kube_scheduler_image(&self) -> Image {
        let mut image = self.values.scheduler.kube_scheduler.image.clone();
        if image.tag.is_empty() {
            image.tag = self.kube_version.release();
        }
        image
    }

    /// Refuses choices the cluster would reject later, with what to change (the chart's
    /// values.schema.json and its `fail` calls refuse the same).
    pub fn validate(&self) -> Result<(), String> {
        let v = &self.values;
        let dns_label = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        };
        if !dns_label(&self.namespace) {
            return Err(format!(
                "namespace {:?} is not a DNS-1123 label: use lower-case letters, digits and '-', at most 63 characters",
                self.namespace
            ));
        }
        let k = &self.kube_version;
        if k.major != 1 || !SUPPORTED_MINORS.contains(&k.minor) {
            return Err(format!(
                "Kubernetes {} is not supported: hami-rs supports 1.{} to 1.{}",
                k.release(),
                SUPPORTED_MINORS.start(),
                SUPPORTED_MINORS.end()
            ));
        }

        let grafana = &v.webui.grafana_url;
        let address = grafana
            .strip_prefix("https://")
            .or_else(|| grafana.strip_prefix("http://"));
        if !grafana.is_empty()
            && (address.is_none_or(|a| a.split('/').next().is_none_or(str::is_empty))
                || grafana.contains(['?', '#'])
                || grafana.chars().any(char::is_whitespace))
        {
            return Err(format!(
                "webui.grafanaUrl {grafana:?}: give Grafana's http:// or https:// root address alone (no query, fragment or spaces), e.g. https://grafana.example.com"
            ));
        }
        if v.scheduler.replicas < 1 {
            return Err(format!(
                "scheduler.replicas {} must be at least 1",
                v.scheduler.replicas
            ));
        }
        for (what, p, allowed) in [
            (
                "scheduler.gpuSchedulerPolicy",
                &v.scheduler.gpu_scheduler_policy,
                &["spread", "binpack"][..],
            ),
            (
                "scheduler.nodeSchedulerPolicy",
                &v.scheduler.node_scheduler_policy,
                &["spread", "binpack"][..],
            ),
            (
                "devicePlugin.operatingMode",
                &v.device_plugin.operating_mode,
                &["cu", "partition"][..],
            ),
            (
                "scheduler.amdMode",
                &v.scheduler.amd_mode,
                &[
                    hami_protocol::dra::AMD_MODE_DEVICE_PLUGIN,
                    hami_protocol::dra::AMD_MODE_DRA,
                ][..],
            ),
            (
                "monitor.legacyMetrics",
                &v.monitor.legacy_metrics,
                &["none", "seed", "all"][..],
            ),
            (
                "images.pullPolicy",
                &v.images.pull_policy,
                &["Always", "IfNotPresent", "Never"][..],
            ),
            (
                "webhook.failurePolicyWithoutMatchConditions",
                &v.webhook.failure_policy_without_match_conditions,
                &["Fail", "Ignore"][..],
            ),
        ] {
            if !allowed.contains(&p.as_str()) {
                return Err(format!("{what} {p:?} is not one of {allowed:?}"));
            }
        }
        if v.dra_plugin.enabled && k.minor < DRA_V1_MINOR {
            return Err(format!(
                "draPlugin.enabled needs resource.k8s.io/v1 (Kubernetes 1.{DRA_V1_MINOR} or newer); \
                 this cluster is {}: keep draPlugin.enabled false and use the device plugin",
                k.release()
            ));
        }
        if v.scheduler.amd_mode == hami_protocol::dra::AMD_MODE_DRA && !v.dra_plugin.enabled {
            return Err(
                "scheduler.amdMode dra needs draPlugin.enabled: the webhook's claims are for the AMD DRA driver (and the scheduler's DRA rights come with it)"
                    .into(),
            );
        }
        if v.dra_plugin.publish_interval == 0 {
            return Err("draPlugin.publishInterval must be at least 1 (seconds)".into());
        }
        if !v.dra_plugin.cdi_spec_dir.starts_with('/') {
            return Err(format!(
                "draPlugin.cdiSpecDir {:?} must be an absolute host path, e.g. /var/run/cdi",
                v.dra_plugin.cdi_spec_dir
            ));
        }
        if v.device_plugin.split_count == Some(0)
            || v.nvidia_device_plugin.device_split_count == 0
            || v.dra_plugin.split_count == Some(0)
        {
            return Err("a split count of 0 would offer nothing: use at least 1".into());
        }
        for (what, s) in [
            (
                "devicePlugin.deviceMemoryScaling",
                &v.device_plugin.device_memory_scaling,
            ),
            (
                "nvidiaDevicePlugin.deviceMemoryScaling",
                &v.nvidia_device_plugin.device_memory_scaling,
            ),
            (
                "nvidiaDevicePlugin.deviceCoresScaling",
                &v.nvidia_device_plugin.device_cores_scaling,
            ),
        ] {
            match s.parse::<f64>() {
                Ok(f) if f.is_finite() && f > 0.0 => {}
                _ => {
                    return Err(format!(
                        "{what} {s:?} must be a positive number (1 = no oversubscription)"
                    ));
                }
            }
        }
        for (what, p) in [
            ("devicePlugin.hostHookPath", &v.device_plugin.host_hook_path),
            (
                "nvidiaDevicePlugin.hostHookPath",
                &v.nvidia_device_plugin.host_hook_path,
            ),
        ] {
            if !p.starts_with('/') {
                return Err(format!("{what} {p:?} must be absolute"));
            }
        }
        let plain_path = |p: &str| {
            p.starts_with('/')
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b))
        };
        let socket = &v.device_plugin.exporter_socket;
        if !socket.is_empty() && (!plain_path(socket) || socket.ends_with('/')) {
            return Err(format!(
                "devicePlugin.exporterSocket {socket:?} must be the socket's absolute path of letters, digits and . _ - / (e.g. /var/lib/amd-metrics-exporter/amdgpu_device_metrics_exporter_grpc.socket), or empty for none"
            ));
        }
        let cdi = &v.device_plugin.cdi.spec_dir;
        if !plain_path(cdi) {
            return Err(format!(
                "devicePlugin.cdi.specDir {cdi:?} must be an absolute path of letters, digits and . _ - / (the runtime's CDI directory, e.g. /var/run/cdi)"
            ));
        }
        if v.nvidia_device_plugin.enabled
            && v.monitor.enabled
            && hook_dir(&v.nvidia_device_plugin.host_hook_path)
                != hook_dir(&v.device_plugin.host_hook_path)
        {
            return Err(format!(
                "nvidiaDevicePlugin.hostHookPath {:?} differs from devicePlugin.hostHookPath {:?}: the monitor reads one hook directory, so give both the same path",
                v.nvidia_device_plugin.host_hook_path, v.device_plugin.host_hook_path
            ));
        }
        let images = [
            v.scheduler_image(),
            self.kube_scheduler_image(),
            v.node_image(),
            v.tls.certgen.image.clone(),
        ];
        for img in images {
            if img.registry.is_empty() || img.repository.is_empty() || img.tag.is_empty() {
                return Err(format!(
                    "image {:?} needs a registry, a repository and a tag",
                    img.reference()
                ));
            }
        }
        Ok(())
    }
}

fn hook_dir(p: &str) -> &str {
    p.trim_end_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_yaml_parses_and_round_trips_without_losing_a_key() {
        let raw: serde_json::Value = serde_saphyr::from_str(VALUES_YAML).unwrap();
        let typed = Values::from_json(raw.clone()).unwrap();
        // A key values.yaml has but Values lacks would vanish here.
        let back = serde_json::to_value(&typed).unwrap();
        assert_eq!(normalize(back), normalize(raw));
    }

    /// `{}`/`[]`/null compare equal to absent (Helm treats them alike).
    pub(crate) fn normalize(v: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match v {
            Value::Object(m) => Value::Object(
                m.into_iter()
                    .map(|(k, v)| (k, normalize(v)))
                    .filter(|(_, v)| {
                        !(v.is_null()
                            || v.as_object().is_some_and(|o| o.is_empty())
                            || v.as_array().is_some_and(|a| a.is_empty()))
                    })
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.into_iter().map(normalize).collect()),
            other => other,
        }
    }

    #[test]
    fn kube_versions_as_servers_report_them() {
        for (raw, release) in [
            ("v1.30.4", "v1.30.4"),
            ("v1.29.8-gke.1031000", "v1.29.8"),
            ("v1.30.4+k3s1", "v1.30.4"),
            ("1.33", "v1.33.0"),
        ] {
            assert_eq!(KubeVersion::parse(raw).unwrap().release(), release);
        }
        assert!(KubeVersion::parse("latest").is_err());
        let s = Settings {
            kube_version: KubeVersion::parse("v1.26.9").unwrap(),
            ..Settings::default()
        };
        assert!(s.validate().unwrap_err().contains("1.27 to 1.37"));
    }
}
