//! Resource names, annotation keys, labels and env variable names (SPEC §1–§2.6), exactly
//! as HAMi spells them so operators can mix our components with the reference's.

/// The GPU vendors we slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Vendor {
    /// AMD GPUs (ROCm/HIP).
    Amd,
    /// NVIDIA GPUs (CUDA).
    Nvidia,
}

impl Vendor {
    /// Every vendor, in the order reports and lists show them.
    pub const ALL: [Vendor; 2] = [Vendor::Amd, Vendor::Nvidia];

    /// The "common word" of the vendor: a registered device type must contain it
    /// (case-insensitive) to be considered for this vendor's requests.
    pub const fn word(self) -> &'static str {
        match self {
            Vendor::Amd => "AMD",
            Vendor::Nvidia => "NVIDIA",
        }
    }

    /// The device type of a product name, as registered (`type` of §2.1), written into
    /// device lists and shown as the `device_type` metric label: the characters device lists
    /// reserve (`,` `:` `;`) become spaces; AMD names contain `AMD` (else `AMD ` is put
    /// in front), NVIDIA names start with `NVIDIA` (else `NVIDIA-`); an empty name is
    /// `AMD GPU` / `NVIDIA-GPU`. Idempotent, so a registered type passes through
    /// unchanged: the scheduler and the monitor label one GPU alike.
    pub fn device_type(self, product: &str) -> String {
        let clean: String = product
            .chars()
            .map(|c| if matches!(c, ',' | ':' | ';') { ' ' } else { c })
            .collect();
        let clean = clean.trim();
        match self {
            _ if clean.is_empty() => match self {
                Vendor::Amd => "AMD GPU".into(),
                Vendor::Nvidia => "NVIDIA-GPU".into(),
            },
            Vendor::Amd if clean.to_ascii_uppercase().contains("AMD") => clean.to_owned(),
            Vendor::Amd => format!("AMD {clean}"),
            Vendor::Nvidia if clean.starts_with("NVIDIA") => clean.to_owned(),
            Vendor::Nvidia => format!("NVIDIA-{clean}"),
        }
    }

    /// File name of the vendor's memory hook as the node installs it and sliced containers
    /// mount it: `libamvgpu.so` (loaded through `LD_AUDIT`), `libvgpu.so` (through
    /// `/etc/ld.so.preload`). The monitor looks for it in a process's mappings (issue 29).
    pub const fn hook_library(self) -> &'static str {
        match self {
            Vendor::Amd => "libamvgpu.so",
            Vendor::Nvidia => "libvgpu.so",
        }
    }

    /// Every name this vendor uses on the wire.
    pub const fn names(self) -> &'static VendorNames {
        match self {
            Vendor::Amd => &AMD,
            Vendor::Nvidia => &NVIDIA,
        }
    }
}

/// The per-vendor names of SPEC §1 and §2.
#[derive(Debug)]
pub struct VendorNames {
    /// Whole GPUs or shares of one (`amd.com/gpu`).
    pub resource_count: &'static str,
    /// Device memory per GPU, MiB (`amd.com/gpumem`).
    pub resource_memory: &'static str,
    /// Device memory per GPU as a percentage (`amd.com/gpumem-percentage`).
    pub resource_memory_percentage: &'static str,
    /// Percent of each GPU's compute (`amd.com/gpucores`).
    pub resource_cores: &'static str,
    /// NVIDIA only.
    pub resource_priority: Option<&'static str>,
    /// Node annotation the plugin registers its devices in (SPEC §2.1).
    pub node_register: &'static str,
    /// Pod annotation: devices the plugin has yet to allocate (SPEC §2.2).
    pub devices_to_allocate: &'static str,
    /// Pod annotation: every device the scheduler gave the pod (SPEC §2.2).
    pub devices_allocated: &'static str,
    /// Pod annotation: only GPUs whose type contains one of these words.
    pub use_gputype: &'static str,
    /// Pod annotation: no GPU whose type contains one of these words.
    pub nouse_gputype: &'static str,
    /// Pod annotation: only these GPU ids.
    pub use_gpuuuid: &'static str,
    /// Pod annotation: none of these GPU ids.
    pub nouse_gpuuuid: &'static str,
    /// Pod annotation: all GPUs of a container on one NUMA node.
    pub numa_bind: &'static str,
    /// AMD only: multi-GPU containers only on XGMI peers.
    pub link_bind: Option<&'static str>,
}

impl VendorNames {
    /// Every extended resource a pod of this vendor may request (SPEC §1), in table order.
    pub fn resources(&self) -> impl Iterator<Item = &'static str> {
        [
            Some(self.resource_count),
            Some(self.resource_memory),
            Some(self.resource_memory_percentage),
            Some(self.resource_cores),
            self.resource_priority,
        ]
        .into_iter()
        .flatten()
    }
}

/// Every extended resource hami-rs manages, all vendors (kube-scheduler's
/// `managedResources`, the webhook's match conditions).
pub fn managed_resources() -> Vec<&'static str> {
    Vendor::ALL
        .iter()
        .flat_map(|v| v.names().resources())
        .collect()
}

/// AMD's names (`amd.com/*`, `hami.io/amd-*`).
pub static AMD: VendorNames = VendorNames {
    resource_count: "amd.com/gpu",
    resource_memory: "amd.com/gpumem",
    resource_memory_percentage: "amd.com/gpumem-percentage",
    resource_cores: "amd.com/gpucores",
    resource_priority: None,
    node_register: "hami.io/node-amd-register",
    devices_to_allocate: "hami.io/amd-devices-to-allocate",
    devices_allocated: "hami.io/amd-devices-allocated",
    use_gputype: "amd.com/use-gputype",
    nouse_gputype: "amd.com/nouse-gputype",
    use_gpuuuid: "amd.com/use-gpu-uuid",
    nouse_gpuuuid: "amd.com/nouse-gpu-uuid",
    numa_bind: "amd.com/numa-bind",
    link_bind: Some("amd.com/link-bind"),
};

/// NVIDIA's names (`nvidia.com/*`, `hami.io/vgpu-*`), as the reference spells them.
pub static NVIDIA: VendorNames = VendorNames {
    resource_count: "nvidia.com/gpu",
    resource_memory: "nvidia.com/gpumem",
    resource_memory_percentage: "nvidia.com/gpumem-percentage",
    resource_cores: "nvidia.com/gpucores",
    resource_priority: Some("nvidia.com/priority"),
    node_register: "hami.io/node-nvidia-register",
    devices_to_allocate: "hami.io/vgpu-devices-to-allocate",
    devices_allocated: "hami.io/vgpu-devices-allocated",
    // No dash before "uuid" on the NVIDIA side: that is the reference's spelling.
    use_gputype: "nvidia.com/use-gputype",
    nouse_gputype: "nvidia.com/nouse-gputype",
    use_gpuuuid: "nvidia.com/use-gpuuuid",
    nouse_gpuuuid: "nvidia.com/nouse-gpuuuid",
    numa_bind: "nvidia.com/numa-bind",
    link_bind: None,
};

/// Pod annotations (SPEC §2.3).
pub mod pod {
    /// The node the scheduler chose for the pod.
    pub const VGPU_NODE: &str = "hami.io/vgpu-node";
    /// Unix seconds when the scheduler chose the node.
    pub const VGPU_TIME: &str = "hami.io/vgpu-time";
    /// Where binding stands: [`crate::node_lock::BindPhase`].
    pub const BIND_PHASE: &str = "hami.io/bind-phase";
    /// Unix seconds when the scheduler bound the pod.
    pub const BIND_TIME: &str = "hami.io/bind-time";
    /// AMD CUs given to the pod per device: [`crate::cu_allocated`].
    pub const AMD_CU_ALLOCATED: &str = "hami.io/amd-cu-allocated";
    /// `binpack`, `spread` or `mutex`, optionally with `numa`: how GPUs are picked on a node.
    pub const GPU_SCHEDULER_POLICY: &str = "hami.io/gpu-scheduler-policy";
    /// `binpack` or `spread`: how the node is picked.
    pub const NODE_SCHEDULER_POLICY: &str = "hami.io/node-scheduler-policy";
    /// Label (and annotation) value that makes the webhook skip an object or namespace.
    pub const WEBHOOK_LABEL: &str = "hami.io/webhook";
    /// The value of [`WEBHOOK_LABEL`] that makes the webhook skip.
    pub const WEBHOOK_IGNORE: &str = "ignore";
    /// Label: a pod labelled `"false"` is never evicted for another pod (issue 30, D-24).
    pub const PREEMPTIBLE_LABEL: &str = "hami.io/preemptible";
    /// What a DRA-mode pod's claims charge its namespace's quotas, written by the webhook
    /// (D-29): `amd.com/gpu=1,amd.com/gpumem=4096,amd.com/gpucores=25`. Owned by the
    /// scheduler like [`super::SCHEDULER_OWNED_ANNOTATIONS`] but not among them: the webhook
    /// writes it into the user's own CREATE, which the D-4 guard then sees; it is one of
    /// [`super::ADMISSION_WRITTEN_ANNOTATIONS`] (D-33).
    pub const DRA_QUOTA_CHARGE: &str = "hami.io/dra-quota-charge";
    /// Label on a workload's replacement pods after `hami defrag apply` moved it: seconds
    /// since the epoch; a fresh one keeps the pod from being moved again (issue 32).
    pub const DEFRAG_MOVED_AT_LABEL: &str = "hami.io/defrag-moved-at";
    /// The label a Deployment's ReplicaSet puts on its pods, one value per pod template:
    /// a defrag reservation's owner is a controller and, when set, this value (D-34).
    pub const TEMPLATE_HASH_LABEL: &str = "pod-template-hash";
}

/// Node annotations (SPEC §2.1, §2.4).
pub mod node {
    /// The node lock: [`crate::node_lock`].
    pub const MUTEX_LOCK: &str = "hami.io/mutex.lock";
    /// Overrides the AMD plugin's `OPERATING_MODE` on this node (`cu` or `partition`).
    pub const AMD_OPERATING_MODE: &str = "hami.io/amd-operating-mode";
    /// Overrides the AMD plugin's `COMPUTE_PARTITION` on this node (e.g. `CPX`).
    pub const AMD_COMPUTE_PARTITION: &str = "hami.io/amd-compute-partition";
    /// Prefix of the annotations `hami defrag apply` writes on a move's target node, one per
    /// moved pod, keyed by the evicted pod's uid (issue 32; Filter does not read them yet).
    pub const DEFRAG_RESERVATION_PREFIX: &str = "reservation.defrag.hami.io/";
}

/// Annotations only the scheduler and the plugins may write. D-4: a pod whose creator sets
/// any of them is denied, because they would let a user pick devices or forge usage.
pub const SCHEDULER_OWNED_ANNOTATIONS: &[&str] = &[
    pod::VGPU_NODE,
    pod::VGPU_TIME,
    pod::BIND_PHASE,
    pod::BIND_TIME,
    pod::AMD_CU_ALLOCATED,
    "hami.io/amd-devices-to-allocate",
    "hami.io/amd-devices-allocated",
    "hami.io/vgpu-devices-to-allocate",
    "hami.io/vgpu-devices-allocated",
    "hami.io/vgpu-mig-allocations",
    crate::whole_cards::AMD_KEY,
    crate::whole_cards::NVIDIA_KEY,
];

/// Annotations the webhook writes into the creator's own CREATE (D-29's quota charge), owned
/// by the scheduler like [`SCHEDULER_OWNED_ANNOTATIONS`]. D-33: the creator's request carries
/// them once patched, so a CREATE is refused only where the webhook sees it unpatched; every
/// UPDATE that sets, changes or removes one is refused to all but the annotation writers.
pub const ADMISSION_WRITTEN_ANNOTATIONS: &[&str] = &[pod::DRA_QUOTA_CHARGE];

/// The scheduler's name when the operator does not choose one (`schedulerName` of the pods
/// it places; the scheduler's `--scheduler-name`).
pub const DEFAULT_SCHEDULER_NAME: &str = "hami-scheduler";

/// Env variables set by the device plugins or read by the hooks (SPEC §2.6, §5, §6).
pub mod env {
    /// ROCr ids of the container's GPUs, in allocation order.
    pub const ROCR_VISIBLE_DEVICES: &str = "ROCR_VISIBLE_DEVICES";
    /// `0..n-1`: HIP's view of the visible GPUs.
    pub const HIP_VISIBLE_DEVICES: &str = "HIP_VISIBLE_DEVICES";
    /// CUs per visible GPU: [`crate::cu_list::HsaCuMask`].
    pub const HSA_CU_MASK: &str = "HSA_CU_MASK";
    /// Followed by the container-local GPU index: `HIP_DEVICE_MEMORY_LIMIT_0`.
    pub const HIP_DEVICE_MEMORY_LIMIT_PREFIX: &str = "HIP_DEVICE_MEMORY_LIMIT_";
    /// Path of the HIP hook inside the container.
    pub const LD_AUDIT: &str = "LD_AUDIT";
    /// Set when memory is oversubscribed: the HIP hook allocates from managed memory.
    pub const HIP_OVERSUBSCRIBE: &str = "HIP_OVERSUBSCRIBE";
    /// The user's HIP task priority, pinned by the hook.
    pub const AMD_TASK_PRIORITY: &str = "AMD_TASK_PRIORITY";
    /// HIP hook log level, 1 (error) to 4 (debug).
    pub const LIBHIP_LOG_LEVEL: &str = "LIBHIP_LOG_LEVEL";
    /// Path of the HIP hook's shared accounting file (default `/tmp/hipdevshr.cache`).
    pub const HIP_DEVICE_MEMORY_SHARED_CACHE: &str = "HIP_DEVICE_MEMORY_SHARED_CACHE";
    /// When true, the HIP hook kills a process found above its limit.
    pub const ACTIVE_OOM_KILLER: &str = "ACTIVE_OOM_KILLER";
    /// CUDA hook memory limit of every GPU; `_<i>` suffixed for GPU `i`.
    pub const CUDA_DEVICE_MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
    /// Percent of the SMs the CUDA hook allows.
    pub const CUDA_DEVICE_SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
    /// Path of the CUDA hook's shared accounting file (default `/tmp/cudevshr.cache`).
    pub const CUDA_DEVICE_MEMORY_SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
    /// The user's CUDA task priority, pinned by the hook.
    pub const CUDA_TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";

    /// `HIP_DEVICE_MEMORY_LIMIT_<index>`.
    pub fn hip_device_memory_limit(index: usize) -> String {
        format!("{HIP_DEVICE_MEMORY_LIMIT_PREFIX}{index}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_types_are_named_once_and_idempotently() {
        assert_eq!(
            Vendor::Amd.device_type("AMD Instinct MI210"),
            "AMD Instinct MI210"
        );
        assert_eq!(
            Vendor::Amd.device_type("Instinct MI210"),
            "AMD Instinct MI210"
        );
        assert_eq!(Vendor::Amd.device_type(" a,b:c; "), "AMD a b c");
        assert_eq!(Vendor::Amd.device_type(""), "AMD GPU");
        assert_eq!(Vendor::Nvidia.device_type("Tesla T4"), "NVIDIA-Tesla T4");
        assert_eq!(Vendor::Nvidia.device_type("NVIDIA A100"), "NVIDIA A100");
        assert_eq!(Vendor::Nvidia.device_type(";"), "NVIDIA-GPU");
        for vendor in Vendor::ALL {
            for name in ["", "x", "AMD-AMD y", "NVIDIA-z", "odd,name:;", "  MI300X  "] {
                let once = vendor.device_type(name);
                assert_eq!(vendor.device_type(&once), once, "{vendor:?} {name:?}");
                assert!(once.to_uppercase().contains(vendor.word()), "{once}");
            }
        }
    }

    #[test]
    fn vendor_tables_use_the_reference_spelling() {
        assert_eq!(Vendor::Amd.names().use_gpuuuid, "amd.com/use-gpu-uuid");
        assert_eq!(Vendor::Nvidia.names().use_gpuuuid, "nvidia.com/use-gpuuuid");
        assert_eq!(
            Vendor::Nvidia.names().devices_allocated,
            "hami.io/vgpu-devices-allocated"
        );
        assert_eq!(env::hip_device_memory_limit(3), "HIP_DEVICE_MEMORY_LIMIT_3");
        assert_eq!(Vendor::Amd.hook_library(), "libamvgpu.so");
        assert_eq!(Vendor::Nvidia.hook_library(), "libvgpu.so");
        for vendor in Vendor::ALL {
            let names = vendor.names();
            assert!(SCHEDULER_OWNED_ANNOTATIONS.contains(&names.devices_allocated));
            assert!(SCHEDULER_OWNED_ANNOTATIONS.contains(&names.devices_to_allocate));
        }
    }

    #[test]
    fn admission_written_annotations_are_not_among_the_scheduler_owned() {
        // D-33: among them, the guard webhook would see the charge the main webhook just
        // patched into the creator's own CREATE and refuse every DRA-mode pod.
        assert!(ADMISSION_WRITTEN_ANNOTATIONS.contains(&pod::DRA_QUOTA_CHARGE));
        for key in ADMISSION_WRITTEN_ANNOTATIONS {
            assert!(!SCHEDULER_OWNED_ANNOTATIONS.contains(key), "{key}");
        }
    }

    #[test]
    fn managed_resources_are_every_vendor_resource_once() {
        let all = managed_resources();
        assert_eq!(all.len(), 9, "{all:?}");
        assert!(all.contains(&"amd.com/gpumem-percentage"));
        assert!(all.contains(&"nvidia.com/priority"));
        let mut dedup = all.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), all.len());
    }
}
