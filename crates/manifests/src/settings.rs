//! What an operator chooses: images, namespace, TLS, component flags. Every field has a
//! Helm value of the same meaning (`deploy/helm/hami-rs/values.yaml`); the agreement test
//! renders both with the same choices.

/// How the webhook's serving certificate is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    /// Two `kube-webhook-certgen` Jobs: create the Secret, then patch the caBundle.
    Certgen,
    /// cert-manager: a self-signed Issuer and a Certificate; the CA is injected by cainjector.
    CertManager,
}

impl TlsMode {
    pub fn value(self) -> &'static str {
        match self {
            TlsMode::Certgen => "certgen",
            TlsMode::CertManager => "cert-manager",
        }
    }
}

/// One container image; `reference()` is `registry/repository:tag`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub registry: String,
    pub repository: String,
    pub tag: String,
}

impl Image {
    fn new(registry: &str, repository: &str, tag: &str) -> Image {
        Image {
            registry: registry.into(),
            repository: repository.into(),
            tag: tag.into(),
        }
    }

    pub fn reference(&self) -> String {
        format!("{}/{}:{}", self.registry, self.repository, self.tag)
    }
}

/// Everything the manifests depend on.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub namespace: String,
    pub image_pull_policy: String,
    pub scheduler_image: Image,
    pub kube_scheduler_image: Image,
    pub node_image: Image,
    pub certgen_image: Image,
    pub scheduler_replicas: i32,
    /// The `schedulerName` the webhook sets and the kube-scheduler profile serves.
    pub scheduler_name: String,
    pub gpu_scheduler_policy: String,
    pub node_scheduler_policy: String,
    pub tls: TlsMode,
    pub device_plugin: DevicePluginSettings,
    pub monitor_enabled: bool,
    pub node_labeller_enabled: bool,
    pub service_monitor_enabled: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DevicePluginSettings {
    pub split_count: u32,
    pub device_memory_scaling: String,
    pub pulse: u64,
    /// Also publish `amd.com/gpumem`/`amd.com/gpucores` capacity (needs `nodes/status` patch).
    pub report_node_capacity: bool,
    pub operating_mode: String,
    /// Host directory under which `vgpu/libamvgpu.so` is installed.
    pub host_hook_path: String,
    /// Run the plugin `privileged` (platforms whose policy hides sysfs/cgroup otherwise).
    pub privileged: bool,
}

pub const DEFAULT_REGISTRY: &str = "ghcr.io";
pub const DEFAULT_TAG: &str = "0.1.0";

impl Default for Settings {
    fn default() -> Self {
        Settings {
            namespace: "hami-system".into(),
            image_pull_policy: "IfNotPresent".into(),
            scheduler_image: Image::new(DEFAULT_REGISTRY, "hami-rs/hami-scheduler", DEFAULT_TAG),
            kube_scheduler_image: Image::new("registry.k8s.io", "kube-scheduler", "v1.33.0"),
            node_image: Image::new(DEFAULT_REGISTRY, "hami-rs/hami-node", DEFAULT_TAG),
            certgen_image: Image::new(
                "registry.k8s.io",
                "ingress-nginx/kube-webhook-certgen",
                "v1.5.0",
            ),
            scheduler_replicas: 1,
            scheduler_name: "hami-scheduler".into(),
            gpu_scheduler_policy: "spread".into(),
            node_scheduler_policy: "binpack".into(),
            tls: TlsMode::Certgen,
            device_plugin: DevicePluginSettings {
                split_count: 10,
                device_memory_scaling: "1".into(),
                pulse: 10,
                report_node_capacity: false,
                operating_mode: "cu".into(),
                host_hook_path: "/usr/local".into(),
                privileged: false,
            },
            monitor_enabled: true,
            node_labeller_enabled: true,
            service_monitor_enabled: false,
        }
    }
}

impl Settings {
    /// Refuses choices the cluster would reject later, with what to change.
    pub fn validate(&self) -> Result<(), String> {
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
        if self.scheduler_replicas < 1 {
            return Err(format!(
                "scheduler replicas {} must be at least 1",
                self.scheduler_replicas
            ));
        }
        for (what, p, allowed) in [
            (
                "gpu scheduler policy",
                &self.gpu_scheduler_policy,
                &["spread", "binpack"][..],
            ),
            (
                "node scheduler policy",
                &self.node_scheduler_policy,
                &["spread", "binpack"][..],
            ),
            (
                "device plugin operating mode",
                &self.device_plugin.operating_mode,
                &["cu", "partition"][..],
            ),
        ] {
            if !allowed.contains(&p.as_str()) {
                return Err(format!("{what} {p:?} is not one of {allowed:?}"));
            }
        }
        if self.device_plugin.split_count == 0 {
            return Err("device plugin split count 0 would offer nothing: use at least 1".into());
        }
        match self.device_plugin.device_memory_scaling.parse::<f64>() {
            Ok(f) if f.is_finite() && f > 0.0 => {}
            _ => {
                return Err(format!(
                    "device memory scaling {:?} must be a positive number (1 = no oversubscription)",
                    self.device_plugin.device_memory_scaling
                ));
            }
        }
        if !self.device_plugin.host_hook_path.starts_with('/') {
            return Err(format!(
                "host hook path {:?} must be absolute",
                self.device_plugin.host_hook_path
            ));
        }
        for img in [
            &self.scheduler_image,
            &self.kube_scheduler_image,
            &self.node_image,
            &self.certgen_image,
        ] {
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
