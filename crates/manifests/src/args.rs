//! `hami manifests` flags. Each flag has the Helm value of the same meaning in brackets;
//! everything else is values.yaml's default (the chart's and these manifests' one source).

use std::io::Write;

use crate::settings::{Image, KubeVersion, Settings, TlsMode};

/// Print the hami-rs manifests (plain YAML for `kubectl apply -f -`).
#[derive(Debug, Clone, clap::Args)]
pub struct ManifestsArgs {
    /// Namespace of every namespaced object [helm: --namespace].
    #[arg(long, default_value = "hami-system")]
    pub namespace: String,
    /// The cluster's version (`kubectl version`'s server version) [helm: the API server's]:
    /// picks the kube-scheduler image and whether the webhook can use matchConditions.
    #[arg(long, default_value = crate::settings::DEFAULT_KUBE_VERSION)]
    pub kube_version: String,
    /// Registry of the hami-rs images [images.registry].
    #[arg(long)]
    pub registry: Option<String>,
    /// Tag of the hami-rs images [images.tag].
    #[arg(long)]
    pub tag: Option<String>,
    /// kube-scheduler image, `registry/repository:tag` [scheduler.kubeScheduler.image.*];
    /// default: registry.k8s.io/kube-scheduler at the cluster's release.
    #[arg(long)]
    pub kube_scheduler_image: Option<String>,
    /// kube-webhook-certgen image [tls.certgen.image.*].
    #[arg(long)]
    pub certgen_image: Option<String>,
    /// Scheduler replicas (one leader) [scheduler.replicas].
    #[arg(long)]
    pub scheduler_replicas: Option<i32>,
    /// schedulerName set by the webhook [scheduler.schedulerName].
    #[arg(long)]
    pub scheduler_name: Option<String>,
    /// GPU policy: spread or binpack [scheduler.gpuSchedulerPolicy].
    #[arg(long)]
    pub gpu_scheduler_policy: Option<String>,
    /// Node policy: binpack or spread [scheduler.nodeSchedulerPolicy].
    #[arg(long)]
    pub node_scheduler_policy: Option<String>,
    /// Webhook certificate source [tls.mode].
    #[arg(long, value_enum)]
    pub tls: Option<TlsMode>,
    /// Slices per GPU; default: the plugin's (2 on gfx12, else 10) [devicePlugin.splitCount].
    #[arg(long)]
    pub split_count: Option<u32>,
    /// Memory oversubscription factor [devicePlugin.deviceMemoryScaling].
    #[arg(long)]
    pub device_memory_scaling: Option<String>,
    /// Publish gpumem/gpucores node capacity [devicePlugin.reportNodeCapacity].
    #[arg(long)]
    pub report_node_capacity: bool,
    /// cu or partition [devicePlugin.operatingMode].
    #[arg(long)]
    pub operating_mode: Option<String>,
    /// Host directory under which vgpu/libamvgpu.so is installed [devicePlugin.hostHookPath].
    #[arg(long)]
    pub host_hook_path: Option<String>,
    /// Run the device plugin privileged [devicePlugin.privileged].
    #[arg(long)]
    pub privileged_device_plugin: bool,
    /// Add the NVIDIA device plugin [nvidiaDevicePlugin.enabled].
    #[arg(long)]
    pub nvidia: bool,
    /// Add the AMD DRA driver, its DeviceClass and RBAC for the nodes labelled
    /// hami.io/amd-mode=dra (Kubernetes >= 1.34) [draPlugin.enabled].
    #[arg(long)]
    pub dra: bool,
    /// Leave out the monitor DaemonSet [monitor.enabled=false].
    #[arg(long)]
    pub no_monitor: bool,
    /// Leave out the node labeller [nodeLabeller.enabled=false].
    #[arg(long)]
    pub no_node_labeller: bool,
    /// Add prometheus-operator ServiceMonitors [serviceMonitor.enabled].
    #[arg(long)]
    pub service_monitor: bool,
    /// Add the read-only web UI Deployment, Service and RBAC [webui.enabled].
    #[arg(long)]
    pub webui: bool,
    /// Prometheus the web UI reads the monitors' series from [webui.prometheusUrl].
    #[arg(long, value_name = "URL", requires = "webui")]
    pub webui_prometheus_url: Option<String>,
    /// Grafana whose hami-rs dashboards the web UI links for longer ranges [webui.grafanaUrl].
    #[arg(long, value_name = "URL", requires = "webui")]
    pub webui_grafana_url: Option<String>,
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
    /// The settings the flags describe; fails on an invalid one.
    pub fn settings(&self) -> Result<Settings, crate::Error> {
        let mut s = Settings {
            namespace: self.namespace.clone(),
            kube_version: KubeVersion::parse(&self.kube_version).map_err(crate::Error::Invalid)?,
            ..Settings::default()
        };
        let v = &mut s.values;
        let set = |dst: &mut String, src: &Option<String>| {
            if let Some(x) = src {
                dst.clone_from(x);
            }
        };
        set(&mut v.images.registry, &self.registry);
        set(&mut v.images.tag, &self.tag);
        if let Some(r) = &self.kube_scheduler_image {
            v.scheduler.kube_scheduler.image = parse_image("kube-scheduler-image", r)?;
        }
        if let Some(r) = &self.certgen_image {
            v.tls.certgen.image = parse_image("certgen-image", r)?;
        }
        if let Some(n) = self.scheduler_replicas {
            v.scheduler.replicas = n;
        }
        set(&mut v.scheduler.scheduler_name, &self.scheduler_name);
        set(
            &mut v.scheduler.gpu_scheduler_policy,
            &self.gpu_scheduler_policy,
        );
        set(
            &mut v.scheduler.node_scheduler_policy,
            &self.node_scheduler_policy,
        );
        if let Some(t) = self.tls {
            v.tls.mode = t;
        }
        let p = &mut v.device_plugin;
        if self.split_count.is_some() {
            p.split_count = self.split_count;
        }
        set(&mut p.device_memory_scaling, &self.device_memory_scaling);
        p.report_node_capacity |= self.report_node_capacity;
        set(&mut p.operating_mode, &self.operating_mode);
        set(&mut p.host_hook_path, &self.host_hook_path);
        p.privileged |= self.privileged_device_plugin;
        if let Some(h) = &self.host_hook_path {
            // One hook directory for both plugins (the monitor reads one).
            v.nvidia_device_plugin.host_hook_path.clone_from(h);
        }
        v.nvidia_device_plugin.enabled |= self.nvidia;
        v.dra_plugin.enabled |= self.dra;
        v.monitor.enabled &= !self.no_monitor;
        v.node_labeller.enabled &= !self.no_node_labeller;
        v.service_monitor.enabled |= self.service_monitor;
        v.webui.enabled |= self.webui;
        if let Some(url) = &self.webui_prometheus_url {
            v.webui.prometheus_url.clone_from(url);
        }
        if let Some(url) = &self.webui_grafana_url {
            v.webui.grafana_url.clone_from(url);
        }
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
    fn split_count_is_passed_only_when_set() {
        let cli = Cli::parse_from(["x"]);
        let args = crate::objects::device_plugin_args(&cli.args.settings().unwrap());
        assert!(!args.iter().any(|a| a.contains("split_count")), "{args:?}");
        let cli = Cli::parse_from(["x", "--split-count", "4"]);
        let args = crate::objects::device_plugin_args(&cli.args.settings().unwrap());
        assert!(args.contains(&"--split_count=4".to_string()), "{args:?}");
    }

    #[test]
    fn webui_is_opt_in_with_its_prometheus() {
        let has_ui = |argv: &[&str]| {
            let s = Cli::parse_from(argv).args.settings().unwrap();
            let objects = crate::objects::all(&s, false).unwrap();
            let ui = objects.iter().any(|o| {
                let v = o.to_value().unwrap();
                v["kind"] == "Deployment" && v["metadata"]["name"] == crate::names::WEBUI
            });
            (ui, crate::objects::webui_args(&s))
        };
        assert!(!has_ui(&["x"]).0);
        let (ui, args) = has_ui(&["x", "--webui", "--webui-prometheus-url", "http://prom:9090"]);
        assert!(ui);
        assert!(
            args.contains(&"--prometheus=http://prom:9090".to_string()),
            "{args:?}"
        );
        assert!(Cli::try_parse_from(["x", "--webui-prometheus-url", "http://p"]).is_err());
        let (_, args) = has_ui(&[
            "x",
            "--webui",
            "--webui-grafana-url",
            "https://grafana.example",
        ]);
        assert!(
            args.contains(&"--grafana-url=https://grafana.example".to_string()),
            "{args:?}"
        );
        assert!(
            !has_ui(&["x", "--webui"])
                .1
                .iter()
                .any(|a| a.starts_with("--grafana-url"))
        );
        for bad in ["grafana:3000", "https://", "https://g?x=1", "https://g a"] {
            let why = Cli::parse_from(["x", "--webui", "--webui-grafana-url", bad])
                .args
                .settings()
                .unwrap_err()
                .to_string();
            assert!(why.contains("webui.grafanaUrl"), "{bad}: {why}");
        }
    }

    #[test]
    fn webui_reads_claims_and_slices_only_in_the_dra_mode() {
        // (resource.k8s.io rules of the hami-webui ClusterRole, its --dra flag)
        let ui = |argv: &[&str]| {
            let s = Cli::parse_from(argv).args.settings().unwrap();
            let role = crate::objects::rbac_objects(&s)
                .iter()
                .map(|o| o.to_value().unwrap())
                .find(|v| {
                    v["kind"] == "ClusterRole" && v["metadata"]["name"] == crate::names::WEBUI
                })
                .unwrap();
            let dra_rules = role["rules"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["apiGroups"][0] == "resource.k8s.io")
                .count();
            let args = crate::objects::webui_args(&s);
            let flag: Vec<String> = args
                .into_iter()
                .filter(|a| a.starts_with("--dra"))
                .collect();
            (dra_rules, flag)
        };
        // Without the rules the UI is told --dra=off: its default (auto) would ask for
        // slices and claims once a node is labelled for DRA.
        assert_eq!(ui(&["x", "--webui"]), (0, vec!["--dra=off".to_string()]));
        assert_eq!(
            ui(&["x", "--webui", "--dra", "--kube-version", "v1.34.0"]),
            (1, vec!["--dra".to_string()])
        );
    }

    #[test]
    fn dra_is_opt_in_and_keeps_the_device_plugin_off_dra_nodes() {
        let objects = |argv: &[&str]| {
            let s = Cli::parse_from(argv).args.settings()?;
            crate::objects::all(&s, false).map_err(|e| anyhow::anyhow!("{e}"))
        };
        let kinds = |objs: &[crate::Object]| -> Vec<String> {
            objs.iter()
                .map(|o| o.to_value().unwrap()["kind"].as_str().unwrap().to_owned())
                .collect()
        };
        assert!(
            !kinds(&objects(&["x", "--kube-version", "v1.34.0"]).unwrap())
                .contains(&"DeviceClass".to_owned())
        );
        let dra = objects(&["x", "--dra", "--kube-version", "v1.34.0"]).unwrap();
        assert!(kinds(&dra).contains(&"DeviceClass".to_owned()));
        let plugin = dra
            .iter()
            .map(|o| o.to_value().unwrap())
            .find(|v| {
                v["metadata"]["name"] == crate::names::DEVICE_PLUGIN && v["kind"] == "DaemonSet"
            })
            .unwrap();
        let terms = &plugin["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(
            terms[0]["matchExpressions"][0],
            serde_json::json!({"key": "hami.io/amd-mode", "operator": "NotIn", "values": ["dra"]})
        );
        // The default cluster version has no resource.k8s.io/v1.
        let e = objects(&["x", "--dra", "--kube-version", "v1.33.0"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("Kubernetes 1.34 or newer"), "{e}");
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
        let cli = Cli::parse_from(["x", "--kube-version", "v1.26.3"]);
        assert!(
            cli.args
                .settings()
                .unwrap_err()
                .to_string()
                .contains("1.27 to 1.37")
        );
        let mut out = Vec::new();
        let cli = Cli::parse_from(["x", "--operating-mode", "xcp"]);
        assert!(run(&cli.args, &mut out).is_err());
        assert!(out.is_empty(), "nothing half-written");
    }
}
