//! Command line of `nvidia-device-plugin`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::registration::NvidiaSettings;

/// NVIDIA GPU device plugin for Kubernetes (HAMi-compatible).
#[derive(Debug, Clone, Parser)]
#[command(name = "nvidia-device-plugin", version)]
pub struct Args {
    /// NVML library to load (a file name searched like the dynamic linker does, or a path).
    #[arg(
        long = "nvml-library",
        env = "NVML_LIBRARY",
        default_value = "libnvidia-ml.so.1",
        global = true
    )]
    pub nvml_library: String,
    /// Shares per GPU: kubelet ids per GPU, pods that may share it.
    #[arg(long = "device-split-count", default_value_t = 10, global = true)]
    pub device_split_count: u32,
    /// Multiplies every GPU's registered memory; > 1 oversubscribes (sets CUDA_OVERSUBSCRIBE).
    #[arg(long = "device-memory-scaling", default_value_t = 1.0, global = true)]
    pub device_memory_scaling: f64,
    /// Multiplies every GPU's registered cores (100 per GPU).
    #[arg(long = "device-cores-scaling", default_value_t = 1.0, global = true)]
    pub device_cores_scaling: f64,
    /// Also report nvidia.com/gpumem and nvidia.com/gpucores as node capacity.
    #[arg(long = "report-node-capacity", global = true)]
    pub report_node_capacity: bool,
    /// kubelet's device-plugin directory.
    #[arg(
        long = "device-plugin-dir",
        default_value = "/var/lib/kubelet/device-plugins",
        global = true
    )]
    pub device_plugin_dir: PathBuf,
    /// Node this plugin serves.
    #[arg(long = "node-name", env = "NODE_NAME", global = true)]
    pub node_name: Option<String>,
    /// Host directory holding vgpu/libvgpu.so; the plugin writes vgpu/ld.so.preload and
    /// creates vgpu/containers/<pod uid>_<container> there.
    #[arg(
        long = "hook-path",
        env = "HOOK_PATH",
        default_value = "/usr/local",
        global = true
    )]
    pub hook_path: PathBuf,
    /// Seconds between node annotation refreshes.
    #[arg(long = "register-interval", default_value_t = 30, global = true)]
    pub register_interval: u64,
    /// Seconds between device-list re-sends to kubelet (0: only on change).
    #[arg(long = "pulse", default_value_t = 10, global = true)]
    pub pulse: u64,
    /// Seconds without a critical XID after which a GPU an XID made unhealthy is offered
    /// again; 0 (the default, as NVIDIA's plugin): it stays unhealthy until the plugin
    /// restarts.
    #[arg(
        long = "xid-recovery-seconds",
        env = "XID_RECOVERY_SECONDS",
        default_value_t = 0,
        global = true
    )]
    pub xid_recovery_seconds: u64,
    /// What to do instead of serving (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands of `nvidia-device-plugin`.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Print the GPUs NVML reports and the exact hami.io/node-nvidia-register value.
    Discover,
}

impl Args {
    /// Registration settings from the flags, refused with what to change.
    pub fn settings(&self) -> Result<NvidiaSettings, String> {
        let s = NvidiaSettings {
            split_count: self.device_split_count,
            memory_scaling: self.device_memory_scaling,
            cores_scaling: self.device_cores_scaling,
        };
        s.validate()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bad_flags() {
        let args = Args::try_parse_from(["p"]).unwrap();
        assert_eq!(args.settings().unwrap(), NvidiaSettings::default());
        let args = Args::try_parse_from(["p", "--device-split-count", "0"]).unwrap();
        assert!(
            args.settings()
                .unwrap_err()
                .contains("--device-split-count")
        );
        let args = Args::try_parse_from(["p", "--device-memory-scaling=-1"]).unwrap();
        assert!(args.settings().unwrap_err().contains("positive"));
    }
}
