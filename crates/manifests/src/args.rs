//! `hami manifests` flags. Each flag has the Helm value of the same meaning in brackets.

use std::io::Write;

use crate::settings::{Image, Settings, TlsMode};

/// Print the hami-rs manifests (plain YAML for `kubectl apply -f -`).
#[derive(Debug, Clone, clap::Args)]
pub struct ManifestsArgs {
    /// Namespace of every namespaced object [helm: --namespace].
    #[arg(long, default_value = "hami-system")]
    pub namespace: String,
    /// Registry of the hami-rs images [images.registry].
    #[arg(long, default_value = crate::settings::DEFAULT_REGISTRY)]
    pub registry: String,
    /// Tag of the hami-rs images [images.tag].
    #[arg(long, default_value = crate::settings::DEFAULT_TAG)]
    pub tag: String,
    /// kube-scheduler image, `registry/repository:tag` [scheduler.kubeScheduler.image.*];
    /// use the version of your control plane.
    #[arg(long, default_value = "registry.k8s.io/kube-scheduler:v1.33.0")]
    pub kube_scheduler_image: String,
    /// kube-webhook-certgen image [tls.certgen.image.*].
    #[arg(
        long,
        default_value = "registry.k8s.io/ingress-nginx/kube-webhook-certgen:v1.5.0"
    )]
    pub certgen_image: String,
    /// Scheduler replicas (one leader) [scheduler.replicas].
    #[arg(long, default_value_t = 1)]
    pub scheduler_replicas: i32,
    /// schedulerName set by the webhook [scheduler.schedulerName].
    #[arg(long, default_value = "hami-scheduler")]
    pub scheduler_name: String,
    /// GPU policy: spread or binpack [scheduler.gpuSchedulerPolicy].
    #[arg(long, default_value = "spread")]
    pub gpu_scheduler_policy: String,
    /// Node policy: binpack or spread [scheduler.nodeSchedulerPolicy].
    #[arg(long, default_value = "binpack")]
    pub node_scheduler_policy: String,
    /// Webhook certificate source [tls.mode].
    #[arg(long, value_enum, default_value_t = TlsMode::Certgen)]
    pub tls: TlsMode,
    /// Slices per GPU [devicePlugin.splitCount].
    #[arg(long, default_value_t = 10)]
    pub split_count: u32,
    /// Memory oversubscription factor [devicePlugin.deviceMemoryScaling].
    #[arg(long, default_value = "1")]
    pub device_memory_scaling: String,
    /// Publish gpumem/gpucores node capacity [devicePlugin.reportNodeCapacity].
    #[arg(long)]
    pub report_node_capacity: bool,
    /// cu or partition [devicePlugin.operatingMode].
    #[arg(long, default_value = "cu")]
    pub operating_mode: String,
    /// Host directory under which vgpu/libamvgpu.so is installed [devicePlugin.hostHookPath].
    #[arg(long, default_value = "/usr/local")]
    pub host_hook_path: String,
    /// Run the device plugin privileged [devicePlugin.privileged].
    #[arg(long)]
    pub privileged_device_plugin: bool,
    /// Leave out the monitor DaemonSet [monitor.enabled=false].
    #[arg(long)]
    pub no_monitor: bool,
    /// Leave out the node labeller [nodeLabeller.enabled=false].
    #[arg(long)]
    pub no_node_labeller: bool,
    /// Add prometheus-operator ServiceMonitors [serviceMonitor.enabled].
    #[arg(long)]
    pub service_monitor: bool,
}

fn parse_image(what: &str, reference: &str) -> Result<Image, crate::Error> {
    let bad = || {
        crate::Error::Invalid(format!(
            "--{what} {reference:?} must look like registry/repository:tag"
        ))
    };
    let (rest, tag) = reference.rsplit_once(':').ok_or_else(bad)?;
    let (registry, repository) = rest.split_once('/').ok_or_else(bad)?;
    if tag.contains('/') {
        return Err(bad());
    }
    Ok(Image {
        registry: registry.into(),
        repository: repository.into(),
        tag: tag.into(),
    })
}

impl ManifestsArgs {
    pub fn settings(&self) -> Result<Settings, crate::Error> {
        let d = Settings::default();
        let ours = |img: &Image| Image {
            registry: self.registry.clone(),
            tag: self.tag.clone(),
            ..img.clone()
        };
        let mut s = Settings {
            namespace: self.namespace.clone(),
            scheduler_image: ours(&d.scheduler_image),
            node_image: ours(&d.node_image),
            kube_scheduler_image: parse_image("kube-scheduler-image", &self.kube_scheduler_image)?,
            certgen_image: parse_image("certgen-image", &self.certgen_image)?,
            scheduler_replicas: self.scheduler_replicas,
            scheduler_name: self.scheduler_name.clone(),
            gpu_scheduler_policy: self.gpu_scheduler_policy.clone(),
            node_scheduler_policy: self.node_scheduler_policy.clone(),
            tls: self.tls,
            monitor_enabled: !self.no_monitor,
            node_labeller_enabled: !self.no_node_labeller,
            service_monitor_enabled: self.service_monitor,
            ..d
        };
        s.device_plugin.split_count = self.split_count;
        s.device_plugin.device_memory_scaling = self.device_memory_scaling.clone();
        s.device_plugin.report_node_capacity = self.report_node_capacity;
        s.device_plugin.operating_mode = self.operating_mode.clone();
        s.device_plugin.host_hook_path = self.host_hook_path.clone();
        s.device_plugin.privileged = self.privileged_device_plugin;
        s.validate().map_err(crate::Error::Invalid)?;
        Ok(s)
    }
}

/// `hami manifests`: writes the YAML stream to `out`.
pub fn run(args: &ManifestsArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let yaml = crate::render(&args.settings()?)?;
    out.write_all(yaml.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ManifestsArgs,
    }

    #[test]
    fn defaults_are_the_default_settings() {
        let cli = Cli::parse_from(["hami-manifests"]);
        assert_eq!(cli.args.settings().unwrap(), Settings::default());
    }

    #[test]
    fn bad_flags_say_what_to_change() {
        let cli = Cli::parse_from(["x", "--kube-scheduler-image", "kube-scheduler"]);
        let e = cli.args.settings().unwrap_err().to_string();
        assert!(e.contains("registry/repository:tag"), "{e}");
        let cli = Cli::parse_from(["x", "--split-count", "0"]);
        assert!(
            cli.args
                .settings()
                .unwrap_err()
                .to_string()
                .contains("at least 1")
        );
        let cli = Cli::parse_from(["x", "--host-hook-path", "usr/local"]);
        assert!(
            cli.args
                .settings()
                .unwrap_err()
                .to_string()
                .contains("absolute")
        );
        let mut out = Vec::new();
        let cli = Cli::parse_from(["x", "--operating-mode", "xcp"]);
        assert!(run(&cli.args, &mut out).is_err());
        assert!(out.is_empty(), "nothing half-written");
    }
}
