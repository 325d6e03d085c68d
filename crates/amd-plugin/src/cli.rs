//! Command line of `k8s-device-plugin`. Flags keep the reference's Go spelling
//! (`-pulse`, `-split_count`, …); both `-flag` and `--flag` are accepted, as Go's `flag`
//! package does.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::registration::{OperatingMode, RegistrationSettings};

/// AMD GPU device plugin for Kubernetes (HAMi-compatible).
#[derive(Debug, Clone, Parser)]
#[command(name = "k8s-device-plugin", version)]
pub struct Args {
    /// Seconds between health re-sends to kubelet (0: send once).
    #[arg(long = "pulse", default_value_t = 10, global = true)]
    pub pulse: u64,
    /// Shares per GPU (default: 2 on gfx12, else 10).
    #[arg(long = "split_count", global = true)]
    pub split_count: Option<u32>,
    /// Multiplies every GPU's registered memory; > 1 oversubscribes (sets HIP_OVERSUBSCRIBE).
    #[arg(long = "device_memory_scaling", default_value_t = 1.0, global = true)]
    pub device_memory_scaling: f64,
    /// Also report amd.com/gpumem and amd.com/gpucores as node capacity.
    #[arg(long = "report_node_capacity", global = true)]
    pub report_node_capacity: bool,
    /// Root of sysfs (tests point it at a fixture tree).
    #[arg(long = "sysfs-root", default_value = "/sys", global = true)]
    pub sysfs_root: PathBuf,
    /// Root of /dev as seen by the plugin (health checks open render nodes here).
    #[arg(long = "dev-root", default_value = "/dev", global = true)]
    pub dev_root: PathBuf,
    /// kubelet's device-plugin directory.
    #[arg(
        long = "device-plugin-dir",
        default_value = "/var/lib/kubelet/device-plugins",
        global = true
    )]
    pub device_plugin_dir: PathBuf,
    /// Operating mode: cu (slice cards by CU masks) or partition (one device per XCP).
    #[arg(
        long = "operating-mode",
        env = "OPERATING_MODE",
        default_value = "cu",
        global = true
    )]
    pub operating_mode: String,
    /// Opt-in: in cu mode, also slice hard compute partitions (CPX, QPX…) by CU masks, as
    /// whole cards are (count = share count). Off: a partition is one device of count 1.
    #[arg(
        long = "slice-partitions",
        env = "SLICE_PARTITIONS",
        global = true,
        value_parser = clap::builder::BoolishValueParser::new(),
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub slice_partitions: bool,
    /// Answer Allocate with CDI device names (amd.com/gpu=card<N>) and keep a CDI spec in
    /// --cdi-spec-dir; the container runtime must have CDI enabled (kubelet >= 1.28).
    #[arg(
        long = "cdi",
        env = "USE_CDI",
        global = true,
        value_parser = clap::builder::BoolishValueParser::new(),
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub cdi: bool,
    /// Where the CDI spec (amd.com-gpu.json) is written.
    #[arg(long = "cdi-spec-dir", default_value = "/var/run/cdi", global = true)]
    pub cdi_spec_dir: PathBuf,
    /// Compute partition mode the node is expected to run (e.g. CPX).
    #[arg(long = "compute-partition", env = "COMPUTE_PARTITION", global = true)]
    pub compute_partition: Option<String>,
    /// Node this plugin serves.
    #[arg(long = "node-name", env = "NODE_NAME", global = true)]
    pub node_name: Option<String>,
    /// Host directory holding vgpu/libamvgpu.so (mounted read-only into sliced containers).
    #[arg(
        long = "host-hook-path",
        env = "HOST_HOOK_PATH",
        default_value = "/usr/local",
        global = true
    )]
    pub host_hook_path: PathBuf,
    /// Root of the cgroup v2 hierarchy (dmem limits).
    #[arg(long = "cgroup-root", default_value = "/sys/fs/cgroup", global = true)]
    pub cgroup_root: PathBuf,
    /// Seconds between node annotation refreshes.
    #[arg(long = "register-interval", default_value_t = 30, global = true)]
    pub register_interval: u64,
    /// AMD device-metrics exporter socket (health source when it exists).
    #[arg(
        long = "exporter-socket",
        default_value = "/var/lib/amd-metrics-exporter/amdgpu_device_metrics_exporter_grpc.socket",
        global = true
    )]
    pub exporter_socket: PathBuf,
    /// What to do instead of serving (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands of `k8s-device-plugin`.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Print the GPUs found and the exact hami.io/node-amd-register value (no API server needed).
    Discover {
        /// How to print the report.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

/// How `discover` prints its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable text.
    Text,
    /// For tools: one JSON document.
    Json,
}

/// Go-style single-dash long flags (`-pulse=5`, `-split_count 4`) become `--pulse=5`.
pub fn normalize_go_flags(args: impl IntoIterator<Item = String>) -> Vec<String> {
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            let is_go_long = i > 0
                && a.starts_with('-')
                && !a.starts_with("--")
                && a.len() > 2
                && a.as_bytes()[1].is_ascii_alphabetic();
            if is_go_long { format!("-{a}") } else { a }
        })
        .collect()
}

impl Args {
    /// Registration settings from flags and env (node annotations may override mode and
    /// partition later).
    pub fn registration_settings(&self) -> Result<RegistrationSettings, String> {
        if !(self.device_memory_scaling.is_finite() && self.device_memory_scaling > 0.0) {
            return Err(format!(
                "-device_memory_scaling {} must be a positive number (1 = no oversubscription)",
                self.device_memory_scaling
            ));
        }
        if self.split_count == Some(0) {
            return Err("-split_count 0 would offer nothing: use at least 1".into());
        }
        Ok(RegistrationSettings {
            mode: OperatingMode::parse(&self.operating_mode)?,
            split_count: self.split_count,
            device_memory_scaling: self.device_memory_scaling,
            expected_compute_partition: self
                .compute_partition
                .clone()
                .filter(|s| !s.trim().is_empty()),
            slice_partitions: self.slice_partitions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_flags_are_accepted() {
        let argv = normalize_go_flags(
            [
                "k8s-device-plugin",
                "-pulse=5",
                "-split_count",
                "4",
                "--report_node_capacity",
                "-h",
            ]
            .map(String::from),
        );
        assert_eq!(argv[1], "--pulse=5");
        assert_eq!(argv[2], "--split_count");
        assert_eq!(argv[5], "-h");
        let args = Args::try_parse_from(&argv[..5]).unwrap();
        assert_eq!(args.pulse, 5);
        assert_eq!(args.split_count, Some(4));
        assert!(args.report_node_capacity);
    }

    #[test]
    fn slicing_partitions_is_an_explicit_opt_in() {
        let off = Args::try_parse_from(["p"]).unwrap();
        assert!(!off.registration_settings().unwrap().slice_partitions);
        let on = Args::try_parse_from(["p", "--slice-partitions"]).unwrap();
        assert!(on.registration_settings().unwrap().slice_partitions);
        let explicit = Args::try_parse_from(["p", "--slice-partitions=false"]).unwrap();
        assert!(!explicit.slice_partitions);
    }

    #[test]
    fn bad_settings_say_what_to_change() {
        let mut args = Args::try_parse_from(["p", "--device_memory_scaling", "0"]).unwrap();
        assert!(
            args.registration_settings()
                .unwrap_err()
                .contains("positive")
        );
        args.device_memory_scaling = 1.0;
        args.operating_mode = "xcp".into();
        assert!(
            args.registration_settings()
                .unwrap_err()
                .contains("\"partition\"")
        );
    }
}
