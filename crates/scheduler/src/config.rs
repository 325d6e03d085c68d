//! Flags and the YAML config file. A flag given on the command line wins over the file,
//! the file over the built-in defaults, so the scheduler runs with neither.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::{GpuPolicy, NodePolicy};
use serde::Deserialize;

use crate::admission::WebhookConfig;
use crate::extender::FilterConfig;
use crate::watch_health::WatchTuning;

/// Command-line flags of `hami-scheduler`; where the config file has a field of the same name, the
/// flag wins.
#[derive(Debug, Clone, clap::Args)]
pub struct SchedulerArgs {
    /// kubeconfig file; without it, $KUBECONFIG, ~/.kube/config, then in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Listener for /webhook, /healthz, /readyz; also /filter and /bind when it is a
    /// loopback address and no --extender-bind is given (a listener other pods reach never
    /// serves them: any pod could bind with the scheduler's rights).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http_bind: SocketAddr,
    /// Listener for /filter and /bind (kube-scheduler's extender urlPrefix, and where
    /// followers forward to the leader). Any address other than loopback needs
    /// --client-ca-file: every caller must then present a certificate from that CA.
    #[arg(long)]
    pub extender_bind: Option<SocketAddr>,
    /// CA (PEM) of the client certificates the extender listener requires
    /// (kube-scheduler's extender tlsConfig certFile, the replicas' forwarding
    /// certificate); the leader's serving certificate is checked against it too.
    #[arg(
        long,
        requires = "extender_bind",
        conflicts_with = "client_cert_pin_file"
    )]
    pub client_ca_file: Option<PathBuf>,
    /// Instead of a CA: the certificate (first of this PEM file) every caller of the
    /// extender listener must present, byte for byte, proving it holds the key. Give the
    /// serving certificate (--cert-file): the replicas and kube-scheduler beside them
    /// present it as their client certificate. Works with certificates issued for server
    /// authentication only (kube-webhook-certgen's); the followers then pin the leader's
    /// certificate the same way.
    #[arg(long, requires = "extender_bind")]
    pub client_cert_pin_file: Option<PathBuf>,
    /// Client certificate (PEM) a follower presents when it forwards /filter and /bind to
    /// the leading replica.
    #[arg(long, requires = "forward_client_key_file")]
    pub forward_client_cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, requires = "forward_client_cert_file")]
    pub forward_client_key_file: Option<PathBuf>,
    /// Name the leader's certificate must carry when forwarding (e.g. the Service's DNS
    /// name from its SANs); default: the leader's pod IP.
    #[arg(long)]
    pub forward_server_name: Option<String>,
    /// Prometheus metrics listener (/metrics).
    #[arg(long, default_value = "0.0.0.0:9395")]
    pub metrics_bind_address: SocketAddr,
    /// TLS certificate (PEM); reloaded when the file changes. Plain HTTP without it.
    #[arg(long, requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// YAML config file (see README).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The schedulerName pods are given (must match kube-scheduler's profile).
    #[arg(long)]
    pub scheduler_name: Option<String>,
    /// GPU policy when the pod does not choose: binpack, spread or mutex (+ ",numa").
    #[arg(long)]
    pub gpu_scheduler_policy: Option<String>,
    /// Node policy when the pod does not choose: binpack or spread.
    #[arg(long)]
    pub node_scheduler_policy: Option<String>,
    /// Node locks older than this many seconds may be taken over (D-2).
    #[arg(long)]
    pub node_lock_expiry_seconds: Option<u64>,
    /// How long bind waits for a busy node lock; keep it below kube-scheduler's extender
    /// httpTimeout (30 s).
    #[arg(long)]
    pub bind_lock_wait_seconds: Option<u64>,
    /// Run leader election on a Lease; only the leader filters and binds.
    #[arg(long)]
    pub leader_elect: bool,
    /// Lease name for leader election.
    #[arg(long, default_value = "hami-scheduler")]
    pub lease_name: String,
    /// Lease namespace for leader election (the pod's own when run in-cluster).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease (defaults to the pod name or host name). The
    /// pod name: followers find the leader's pod, and its IP, by it.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// How long a Lease holds without renewal, measured by each replica from when it saw
    /// the last renewal (its own monotonic clock).
    #[arg(long, default_value_t = 15)]
    pub leader_elect_lease_duration_seconds: u64,
    /// How often the Lease is read and renewed.
    #[arg(long, default_value_t = 2000)]
    pub leader_elect_retry_period_millis: u64,
    /// The AMD front end of pods without a `hami.io/amd-mode` annotation: `device-plugin`
    /// (the device plugin and this extender) or `dra` (the webhook turns `amd.com/*`
    /// requests into ResourceClaimTemplates for the AMD DRA driver).
    #[arg(long, env = "AMD_MODE", default_value = hami_protocol::dra::AMD_MODE_DEVICE_PLUGIN)]
    pub amd_mode: String,
}

/// The YAML config file. Resource names and annotation keys are HAMi's and fixed.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileConfig {
    /// Overridden by `--scheduler-name`.
    pub scheduler_name: Option<String>,
    /// Overridden by `--gpu-scheduler-policy`.
    pub gpu_scheduler_policy: Option<String>,
    /// Overridden by `--node-scheduler-policy`.
    pub node_scheduler_policy: Option<String>,
    /// Overridden by `--node-lock-expiry-seconds`.
    pub node_lock_expiry_seconds: Option<u64>,
    /// Overridden by `--bind-lock-wait-seconds`.
    pub bind_lock_wait_seconds: Option<u64>,
    /// Also take pods whose schedulerName is `default-scheduler` (no flag).
    pub force_overwrite_default_scheduler: Option<bool>,
    /// Usernames that may write scheduler-owned pod annotations (D-4); default: the
    /// chart's scheduler and device-plugin ServiceAccounts in `$POD_NAMESPACE`.
    pub annotation_writers: Option<Vec<String>>,
    /// What containers that leave out a count, memory or cores get.
    #[serde(default)]
    pub defaults: FileDefaults,
}

/// The config file's `defaults:` (HAMi's names).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileDefaults {
    /// NVIDIA MiB when a container gives neither gpumem nor a percentage (0 = whole card).
    pub nvidia_default_memory: Option<u64>,
    /// NVIDIA cores when memory is given without gpucores.
    pub nvidia_default_cores: Option<u32>,
    /// Count added when memory or cores come without a count.
    pub default_gpu_num: Option<u32>,
}

/// Everything resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The `schedulerName` of the pods this scheduler places.
    pub scheduler_name: String,
    /// What filter decides with.
    pub filter: FilterConfig,
    /// What the webhook decides with.
    pub webhook: WebhookConfig,
    /// Node locks older than this may be taken over (D-2).
    pub node_lock_expiry: Duration,
    /// How long bind waits for a busy node lock.
    pub bind_lock_wait: Duration,
    /// When the node and pod watches count as stalled or failing.
    pub watch: WatchTuning,
    /// How the DRA mode's unused claim templates are swept.
    pub template_sweep: crate::dra_sweep::SweepTuning,
}

impl Default for Settings {
    fn default() -> Self {
        Settings::resolve(&SchedulerArgs::defaults(), FileConfig::default())
            .expect("defaults are valid")
    }
}

impl SchedulerArgs {
    /// The flags' defaults (what a bare `hami-scheduler` runs with).
    pub fn defaults() -> Self {
        <Self as clap::FromArgMatches>::from_arg_matches(
            &<Self as clap::Args>::augment_args(clap::Command::new("x")).get_matches_from(["x"]),
        )
        .expect("defaults parse")
    }
}

impl Settings {
    /// Reads the config file `args` names (if any) and resolves it with the flags.
    pub fn load(args: &SchedulerArgs) -> anyhow::Result<Self> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    anyhow::anyhow!("cannot read config file {}: {e}", path.display())
                })?;
                serde_saphyr::from_str(&text).map_err(|e| {
                    anyhow::anyhow!(
                        "config file {}: {}",
                        path.display(),
                        e.to_string().lines().next().unwrap_or_default()
                    )
                })?
            }
            None => FileConfig::default(),
        };
        Self::resolve(args, file)
    }

    /// Flags override the file; the file overrides the defaults. Fails on an invalid policy or
    /// setting.
    pub fn resolve(args: &SchedulerArgs, file: FileConfig) -> anyhow::Result<Self> {
        let scheduler_name = args
            .scheduler_name
            .clone()
            .or(file.scheduler_name)
            .unwrap_or_else(|| "hami-scheduler".into());
        let gpu_policy = match args
            .gpu_scheduler_policy
            .as_ref()
            .or(file.gpu_scheduler_policy.as_ref())
        {
            Some(p) => {
                GpuPolicy::parse(p).map_err(|e| anyhow::anyhow!("gpu scheduler policy: {e}"))?
            }
            None => GpuPolicy::default(),
        };
        let node_policy = match args
            .node_scheduler_policy
            .as_ref()
            .or(file.node_scheduler_policy.as_ref())
        {
            Some(p) => {
                NodePolicy::parse(p).map_err(|e| anyhow::anyhow!("node scheduler policy: {e}"))?
            }
            None => NodePolicy::Binpack,
        };
        let defaults = RequestDefaults {
            nvidia_default_memory_mib: file.defaults.nvidia_default_memory.unwrap_or(0),
            nvidia_default_cores: file.defaults.nvidia_default_cores.unwrap_or(0),
            default_gpu_count: file.defaults.default_gpu_num.unwrap_or(1),
        };
        if defaults.nvidia_default_cores > 100 {
            anyhow::bail!("defaults.nvidiaDefaultCores is a percentage: use 0 to 100");
        }
        if defaults.default_gpu_count == 0 {
            anyhow::bail!("defaults.defaultGpuNum must be at least 1");
        }
        let expiry = args
            .node_lock_expiry_seconds
            .or(file.node_lock_expiry_seconds)
            .unwrap_or(60);
        let wait = args
            .bind_lock_wait_seconds
            .or(file.bind_lock_wait_seconds)
            .unwrap_or(25);
        if expiry == 0 {
            anyhow::bail!("node lock expiry must be at least 1 second");
        }
        let amd_mode = crate::dra_claims::AmdMode::parse(&args.amd_mode)
            .map_err(|e| anyhow::anyhow!("--amd-mode: {e}"))?;
        Ok(Settings {
            filter: FilterConfig {
                gpu_policy,
                node_policy,
                defaults: defaults.clone(),
            },
            webhook: WebhookConfig {
                scheduler_name: scheduler_name.clone(),
                force_overwrite_default_scheduler: file
                    .force_overwrite_default_scheduler
                    .unwrap_or(true),
                defaults,
                annotation_writers: file.annotation_writers.unwrap_or_else(|| {
                    crate::admission::default_annotation_writers(&args.lease_namespace)
                }),
                amd_mode,
            },
            scheduler_name,
            node_lock_expiry: Duration::from_secs(expiry),
            bind_lock_wait: Duration::from_secs(wait),
            watch: WatchTuning::default(),
            template_sweep: crate::dra_sweep::SweepTuning::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_with_no_config() {
        let s = Settings::default();
        assert_eq!(s.scheduler_name, "hami-scheduler");
        assert_eq!(s.node_lock_expiry, Duration::from_secs(60));
        assert_eq!(s.filter.node_policy, NodePolicy::Binpack);
    }

    #[test]
    fn flags_win_over_file() {
        let file: FileConfig = serde_saphyr::from_str(
            "schedulerName: from-file\ngpuSchedulerPolicy: binpack\nnodeLockExpirySeconds: 30\ndefaults:\n  nvidiaDefaultCores: 20\n",
        )
        .unwrap();
        let mut args = SchedulerArgs::defaults();
        args.scheduler_name = Some("from-flag".into());
        let s = Settings::resolve(&args, file).unwrap();
        assert_eq!(s.scheduler_name, "from-flag");
        assert_eq!(s.webhook.scheduler_name, "from-flag");
        assert_eq!(s.node_lock_expiry, Duration::from_secs(30));
        assert_eq!(s.filter.defaults.nvidia_default_cores, 20);
        assert_eq!(
            s.webhook.annotation_writers,
            [
                "system:serviceaccount:kube-system:hami-scheduler",
                "system:serviceaccount:kube-system:hami-device-plugin",
                "system:serviceaccount:kube-system:hami-nvidia-device-plugin"
            ]
        );
        let mut in_ns = SchedulerArgs::defaults();
        in_ns.lease_namespace = "hami".into();
        let custom: FileConfig =
            serde_saphyr::from_str("annotationWriters: [system:serviceaccount:x:y]\n").unwrap();
        assert_eq!(
            Settings::resolve(&in_ns, FileConfig::default())
                .unwrap()
                .webhook
                .annotation_writers[0],
            "system:serviceaccount:hami:hami-scheduler"
        );
        assert_eq!(
            Settings::resolve(&in_ns, custom)
                .unwrap()
                .webhook
                .annotation_writers,
            ["system:serviceaccount:x:y"]
        );
    }

    #[test]
    fn bad_config_is_refused_clearly() {
        assert!(serde_saphyr::from_str::<FileConfig>("schedulerNmae: x\n").is_err());
        let bad = |yaml: &str| {
            Settings::resolve(
                &SchedulerArgs::defaults(),
                serde_saphyr::from_str(yaml).unwrap(),
            )
            .unwrap_err()
            .to_string()
        };
        assert!(bad("gpuSchedulerPolicy: fastest\n").contains("gpu scheduler policy"));
        assert!(bad("defaults:\n  nvidiaDefaultCores: 120\n").contains("0 to 100"));
        assert!(bad("nodeLockExpirySeconds: 0\n").contains("at least 1"));
        let mut dra = SchedulerArgs::defaults();
        assert_eq!(
            Settings::resolve(&dra, FileConfig::default())
                .unwrap()
                .webhook
                .amd_mode,
            crate::dra_claims::AmdMode::DevicePlugin
        );
        dra.amd_mode = "dra".into();
        assert_eq!(
            Settings::resolve(&dra, FileConfig::default())
                .unwrap()
                .webhook
                .amd_mode,
            crate::dra_claims::AmdMode::Dra
        );
        dra.amd_mode = "both".into();
        let e = Settings::resolve(&dra, FileConfig::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--amd-mode") && e.contains("device-plugin or dra"),
            "{e}"
        );
    }
}
