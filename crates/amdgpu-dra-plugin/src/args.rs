//! `amdgpu-dra-plugin`'s command line, in the library so that the manifests' and the
//! chart's DaemonSet flags are parsed by the binary's own parser in tests.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use hami_amd_discovery::registration::RegistrationSettings;

/// The driver's flags (the DaemonSet passes them; `crates/manifests` `dra_plugin_args`).
#[derive(Parser, Debug, Clone)]
#[command(
    name = "amdgpu-dra-plugin",
    about = "Kubelet DRA plugin for AMD GPU slices"
)]
pub struct Args {
    /// The node this driver serves (the DaemonSet sets NODE_NAME from spec.nodeName).
    #[arg(long, env = "NODE_NAME", global = true)]
    pub node_name: Option<String>,
    /// The DRA driver name (`spec.driver` of its slices, the DeviceClass's selector).
    #[arg(long, default_value = hami_dra_core::DRIVER, global = true)]
    pub driver_name: String,
    /// Where sysfs is mounted.
    #[arg(long, default_value = "/sys", global = true)]
    pub sysfs_root: PathBuf,
    /// Where the host's `/dev` is mounted (device nodes, health).
    #[arg(long, default_value = "/dev", global = true)]
    pub dev_root: PathBuf,
    /// Shares per GPU; default: the device plugin's (2 on gfx12, else 10).
    #[arg(long = "split_count", global = true)]
    pub split_count: Option<u32>,
    /// Kubelet's plugin-registry directory (the registration socket goes there).
    #[arg(long, default_value = hami_deviceplugin_api::PLUGINS_REGISTRY)]
    pub registry_dir: PathBuf,
    /// Default: /var/lib/kubelet/plugins/<driver>.
    #[arg(long)]
    pub plugin_dir: Option<PathBuf>,
    /// Where the per-claim CDI specs are written (a directory the runtime reads).
    #[arg(long, default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
    /// Host path of libamvgpu.so.
    #[arg(long, default_value = "/usr/local/vgpu/libamvgpu.so")]
    pub hook_host_path: String,
    /// Host root of per-claim cache dirs and hook configs.
    #[arg(long, default_value = "/usr/local/vgpu/dra")]
    pub cache_root: String,
    /// Where the cgroup v2 hierarchy is mounted (dmem limits).
    #[arg(long, default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
    /// Seconds between ResourceSlice reconciles (health and device changes show up this fast).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub publish_interval: u64,
    /// What to do; without one, serve kubelet and publish the node's ResourceSlices.
    #[command(subcommand)]
    pub command: Option<Cmd>,
}

/// The subcommands.
#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum Cmd {
    /// Print the node's ResourceSlices as JSON.
    Slices,
}

impl Args {
    /// The directory of the DRA socket and the checkpoint: `--plugin-dir`, else kubelet's
    /// `/var/lib/kubelet/plugins/<driver>`.
    pub fn plugin_dir(&self) -> PathBuf {
        self.plugin_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet/plugins").join(&self.driver_name))
    }

    /// How GPUs become registered devices, for the slices and Prepare alike.
    pub fn registration_settings(&self) -> RegistrationSettings {
        RegistrationSettings {
            split_count: self.split_count,
            ..Default::default()
        }
    }
}
