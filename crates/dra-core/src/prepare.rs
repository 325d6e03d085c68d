//! Prepare planning for one claim (issue 20 item 1), as plain data: verify what the
//! scheduler allocated and whom the claim is reserved for, choose CUs with the device
//! plugin's own core (`hami_amd_core::cu_choice`), and derive from `consumedCapacity` the
//! env of SPEC §2.6, the hook config (`hami_protocol::hook_config`), the dmem limits
//! (`hami_amd_core::dmem_plan`), the claim's CDI spec and the `status.devices` entries
//! that publish the chosen CU ranges. Shares of one GPU in one claim are one device for the
//! container (memory summed, CUs joined), each share's CUs published in its own status entry.

use std::collections::BTreeMap;

use hami_amd_core::allocate_plan::{CACHE_CONTAINER_DIR, CACHE_FILE, HOOK_CONFIG_DIR, MountPlan};
use hami_amd_core::cu_choice::{CuChoiceError, choose_cus};
use hami_amd_core::dmem_plan::{DmemLimit, container_dmem};
use hami_amd_core::rocr_visible::rocr_visible_devices;
use hami_amd_discovery::registration::RegisteredDevice;
use hami_protocol::cu_list::{CuListError, CuSet, HsaCuMask};
use hami_protocol::device_list::ContainerDevice;
use hami_protocol::hook_config::{self, HookConfig};
use hami_protocol::memory_limit::MibLimit;
use hami_protocol::names::env;
use hami_protocol::node_register::DeviceMode;
use serde_json::{Value, json};

use crate::api::{AllocatedDeviceStatus, ResourceClaim};
use crate::cdi_claim::{self, CdiDevice};
use crate::quantity;
use crate::slice::{COMPUTE_UNITS, MEMORY};

/// Where the node keeps hooks, caches and configs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareSettings {
    /// The DRA driver name.
    pub driver: String,
    /// Pool name = node name.
    pub node: String,
    /// Host path of the HIP hook, mounted into sliced containers.
    pub hook_host_path: String,
    /// Where the hook appears in the container (`LD_AUDIT`).
    pub hook_container_path: String,
    /// Host root of per-claim cache dirs (`<root>/claims/<uid>`) and hook configs.
    pub cache_host_root: String,
}

/// Where a claim's host files are, from the settings and its UID alone (so that unprepare
/// can find them without a plan, even for a claim whose prepare never completed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPaths {
    /// The claim's cache directory (`<root>/claims/<uid>`), its region file inside.
    pub cache_dir: String,
    /// The claim's hook config (`<root>/<HOOK_CONFIG_DIR>/claim_<uid>.conf`).
    pub hook_config: String,
}

/// The claim's [`ClaimPaths`]; `None` for a UID that is not one path component (empty,
/// `.`/`..`, or holding `/` or NUL), which no API server assigns.
pub fn claim_paths(settings: &PrepareSettings, uid: &str) -> Option<ClaimPaths> {
    if !crate::claim_identity::is_path_component(uid) {
        return None;
    }
    let root = settings.cache_host_root.trim_end_matches('/');
    Some(ClaimPaths {
        cache_dir: format!("{root}/claims/{uid}"),
        hook_config: format!("{root}/{HOOK_CONFIG_DIR}/claim_{uid}.conf"),
    })
}

/// One device the claim got on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The claim request it was allocated for.
    pub request: String,
    /// The ResourceSlice pool.
    pub pool: String,
    /// The device's name in the slice.
    pub device: String,
    /// Which share of a multi-allocation device (`shareID`).
    pub share_id: Option<String>,
    /// Registered id (AMD SMI UUID or partition id).
    pub device_id: String,
    /// Device memory granted, bytes.
    pub mem_bytes: u64,
    /// CUs granted.
    pub cus: CuSet,
    /// Its CDI device id.
    pub cdi_id: String,
}

/// What preparing one claim does, for the shell to carry out.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparePlan {
    /// The claim's UID.
    pub claim_uid: String,
    /// The pod it is reserved for.
    pub pod_uid: String,
    /// Its allocation results on this node, one per share (two shares of one GPU are two
    /// entries, with their own CUs, and one device in the env, hook config and CDI spec).
    pub devices: Vec<PreparedDevice>,
    /// True when every GPU is handed over whole, its shares summed (no hook, no mask, no dmem).
    pub whole: bool,
    /// Env for the claim's containers.
    pub env: BTreeMap<String, String>,
    /// Mounts for the claim's containers (the hook, its config and cache).
    pub mounts: Vec<MountPlan>,
    /// Host path of the hook config to write, and its content.
    pub hook_config: Option<(String, HookConfig)>,
    /// Host cache directory to create, if sliced.
    pub cache_dir: Option<String>,
    /// dmem limits to apply to the pod's cgroup.
    pub dmem: Vec<DmemLimit>,
    /// The claim's CDI spec.
    pub cdi_spec: Value,
    /// Device status to write into the claim.
    pub status: Vec<AllocatedDeviceStatus>,
}

/// Why a claim cannot be prepared; each names the claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// The claim has no UID; its name.
    #[error("claim {0} has no metadata.uid")]
    NoUid(String),
    /// The claim kubelet names was replaced.
    #[error(
        "claim {claim}: the kubelet asked for uid {asked} but the API server has {found} (deleted and recreated?)"
    )]
    UidMismatch {
        /// The claim.
        claim: String,
        /// The UID kubelet asked for.
        asked: String,
        /// The UID the API server has.
        found: String,
    },
    /// The claim's UID cannot name a file.
    #[error(
        "claim {claim} has UID {uid:?}, which is not a single path component; the driver names the claim's files by it and refuses it"
    )]
    BadUid {
        /// The claim.
        claim: String,
        /// Its UID.
        uid: String,
    },
    /// The claim is not allocated; its name.
    #[error("claim {0} is not allocated (status.allocation is empty)")]
    NotAllocated(String),
    /// The claim is reserved for no pod; its name.
    #[error("claim {0} is reserved for no pod (status.reservedFor is empty)")]
    NotReserved(String),
    /// The claim is reserved for several consumers.
    #[error(
        "claim {claim} is reserved for {n} consumers; this driver enforces slice limits per pod and prepares claims of exactly one pod (use one claim per container or pod)"
    )]
    Shared {
        /// The claim.
        claim: String,
        /// How many.
        n: usize,
    },
    /// The claim is reserved for something other than a pod.
    #[error("claim {claim} is reserved for a {resource}, not a pod")]
    NotPod {
        /// The claim.
        claim: String,
        /// What it is reserved for.
        resource: String,
    },
    /// None of the claim's devices are this driver's on this node; the claim.
    #[error("claim {0} has no device of driver this node's driver on pool (node) of this node")]
    NothingHere(String),
    /// The claim names a device this node does not have.
    #[error("claim {claim}: device {device} is not a device of this node (pool {pool})")]
    UnknownDevice {
        /// The claim.
        claim: String,
        /// The pool it names.
        pool: String,
        /// The device it names.
        device: String,
    },
    /// A consumed capacity is not a whole quantity.
    #[error("claim {claim}: device {device}: consumedCapacity.{key}: {source}")]
    Quantity {
        /// The claim.
        claim: String,
        /// The device.
        device: String,
        /// The capacity name.
        key: &'static str,
        /// What is wrong with it.
        source: quantity::QuantityError,
    },
    /// No CUs could be chosen on a device.
    #[error("claim {claim}: device {device}: {source}")]
    Cus {
        /// The claim.
        claim: String,
        /// The device.
        device: String,
        /// Why not.
        source: CuChoiceError,
    },
    /// The CU mask cannot be written.
    #[error("claim {claim}: CU mask: {source}")]
    Mask {
        /// The claim.
        claim: String,
        /// Why not.
        source: CuListError,
    },
    /// The CDI spec is invalid.
    #[error("claim {claim}: CDI spec: {problem}")]
    Cdi {
        /// The claim.
        claim: String,
        /// What is wrong.
        problem: String,
    },
}

/// One GPU as the claim's containers see it: every share the claim has of it.
struct Gpu<'a> {
    /// The slice device name.
    name: String,
    dev: &'a RegisteredDevice,
    /// Bytes, summed over the shares (at most the card's).
    mem: u64,
    /// CUs asked, summed over the shares.
    cores: u32,
    /// CUs chosen, joined over the shares.
    cus: CuSet,
}

/// Plans Prepare of `claim` (the object read from the API server) for kubelet's
/// `asked_uid`. `devices`: this node's slice device names → registered devices;
/// `others_used`: CUs other prepared claims hold, by registered device id.
pub fn plan_prepare(
    claim: &ResourceClaim,
    asked_uid: &str,
    settings: &PrepareSettings,
    devices: &BTreeMap<String, RegisteredDevice>,
    others_used: &BTreeMap<String, CuSet>,
) -> Result<PreparePlan, PrepareError> {
    let name = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or(""),
        claim.metadata.name.as_deref().unwrap_or("")
    );
    let uid = claim
        .metadata
        .uid
        .clone()
        .ok_or_else(|| PrepareError::NoUid(name.clone()))?;
    if uid != asked_uid {
        return Err(PrepareError::UidMismatch {
            claim: name,
            asked: asked_uid.into(),
            found: uid,
        });
    }
    // The UID names the claim's files (CDI spec, cache directory, hook config).
    let paths = claim_paths(settings, &uid).ok_or_else(|| PrepareError::BadUid {
        claim: name.clone(),
        uid: uid.clone(),
    })?;
    let status = claim.status.as_ref();
    let results = status
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .map(|d| d.results.as_slice())
        .ok_or_else(|| PrepareError::NotAllocated(name.clone()))?;
    let reserved = status
        .map(|s| s.reserved_for.as_slice())
        .unwrap_or_default();
    let pod = match reserved {
        [] => return Err(PrepareError::NotReserved(name)),
        [one] => one,
        many => {
            return Err(PrepareError::Shared {
                claim: name,
                n: many.len(),
            });
        }
    };
    if pod.resource != "pods" || pod.api_group.as_deref().is_some_and(|g| !g.is_empty()) {
        return Err(PrepareError::NotPod {
            claim: name,
            resource: pod.resource.clone(),
        });
    }
    let mine: Vec<_> = results
        .iter()
        .filter(|r| r.driver == settings.driver && r.pool == settings.node)
        .collect();
    if mine.is_empty() {
        return Err(PrepareError::NothingHere(name));
    }

    let mut used = others_used.clone();
    let mut prepared = Vec::new();
    // The GPUs the container sees, each once: shares of one GPU in one claim (consumable
    // capacity allows them unless the claim asks for `distinctAttribute`) are one device
    // with their memory summed and their CUs joined (two entries would be
    // `ROCR_VISIBLE_DEVICES=0,0`, where ROCr ends the list at the repeat).
    let mut gpus: Vec<Gpu> = Vec::new();
    for r in &mine {
        let dev = devices
            .get(&r.device)
            .ok_or_else(|| PrepareError::UnknownDevice {
                claim: name.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
            })?;
        let read = |key: &'static str, full: u64| -> Result<u64, PrepareError> {
            match r.consumed_capacity.get(key) {
                Some(v) => quantity::parse(v).map_err(|source| PrepareError::Quantity {
                    claim: name.clone(),
                    device: r.device.clone(),
                    key,
                    source,
                }),
                // An exclusive device (no consumable capacity): all of it.
                None => Ok(full),
            }
        };
        let full_mem = dev.info.devmem << 20;
        let partition = dev.info.mode == DeviceMode::Xcp;
        let (mem, cores) = if partition {
            (full_mem, dev.info.devcore)
        } else {
            (
                read(MEMORY, full_mem)?.min(full_mem),
                u32::try_from(read(COMPUTE_UNITS, dev.info.devcore.into())?).unwrap_or(u32::MAX),
            )
        };
        let taken = used.get(&dev.info.id).cloned().unwrap_or_default();
        let cus = if partition {
            CuSet::range(0, dev.info.devcore)
        } else {
            choose_cus(&taken, dev.info.devcore, cores, dev.cu_per_wgp).map_err(|source| {
                PrepareError::Cus {
                    claim: name.clone(),
                    device: r.device.clone(),
                    source,
                }
            })?
        };
        used.insert(dev.info.id.clone(), taken.union(&cus));
        match gpus.iter_mut().find(|g| g.name == r.device) {
            Some(g) => {
                g.mem = g.mem.saturating_add(mem).min(full_mem);
                g.cores = g.cores.saturating_add(cores);
                g.cus = g.cus.union(&cus);
            }
            None => gpus.push(Gpu {
                name: r.device.clone(),
                dev,
                mem,
                cores,
                cus: cus.clone(),
            }),
        }
        prepared.push(PreparedDevice {
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            share_id: r.share_id.clone(),
            device_id: dev.info.id.clone(),
            mem_bytes: mem,
            cus,
            cdi_id: cdi_claim::device_id(&uid, &r.device),
        });
    }

    let whole = gpus
        .iter()
        .all(|g| g.cores >= g.dev.info.devcore && g.mem >= g.dev.info.devmem << 20);
    let resolved: Vec<&RegisteredDevice> = gpus.iter().map(|g| g.dev).collect();
    let run: Vec<ContainerDevice> = gpus
        .iter()
        .map(|g| ContainerDevice {
            uuid: g.dev.info.id.clone(),
            device_type: g.dev.info.device_type.clone(),
            mem_mib: g.mem >> 20,
            cores: g.cores,
        })
        .collect();
    let mut envs = BTreeMap::new();
    envs.insert(
        env::ROCR_VISIBLE_DEVICES.to_string(),
        rocr_visible_devices(&resolved),
    );
    let mut mounts = Vec::new();
    let mut hook = None;
    let mut cache_dir = None;
    let mut dmem = Vec::new();
    if !whole {
        let visible: Vec<String> = (0..gpus.len()).map(|i| i.to_string()).collect();
        envs.insert(env::HIP_VISIBLE_DEVICES.into(), visible.join(","));
        let mask = HsaCuMask::from_sets(gpus.iter().map(|g| g.cus.clone())).map_err(|source| {
            PrepareError::Mask {
                claim: name.clone(),
                source,
            }
        })?;
        envs.insert(env::HSA_CU_MASK.into(), mask.to_string());
        for (i, g) in gpus.iter().enumerate() {
            envs.insert(
                env::hip_device_memory_limit(i),
                MibLimit(g.mem >> 20).to_string(),
            );
        }
        envs.insert(env::LD_AUDIT.into(), settings.hook_container_path.clone());
        mounts.push(MountPlan {
            container_path: settings.hook_container_path.clone(),
            host_path: settings.hook_host_path.clone(),
            read_only: true,
        });
        let host = paths.cache_dir.clone();
        mounts.push(MountPlan {
            container_path: CACHE_CONTAINER_DIR.into(),
            host_path: host.clone(),
            read_only: false,
        });
        mounts.push(MountPlan {
            container_path: format!("{CACHE_CONTAINER_DIR}/{CACHE_FILE}"),
            host_path: format!("{host}/{CACHE_FILE}"),
            read_only: false,
        });
        let cache = format!("{CACHE_CONTAINER_DIR}/{CACHE_FILE}");
        envs.insert(env::HIP_DEVICE_MEMORY_SHARED_CACHE.into(), cache.clone());
        let global = hook_config::shared_cu_set(gpus.iter().map(|g| &g.cus))
            .and_then(hook_config::global_cu_mask);
        if let Some(g) = &global {
            envs.insert(hook_config::ROC_GLOBAL_CU_MASK.into(), g.clone());
        }
        let mut config = HookConfig {
            shared_cache: Some(cache),
            hsa_cu_mask: Some(mask.to_string()),
            roc_global_cu_mask: global,
            ..HookConfig::default()
        };
        for (i, g) in gpus.iter().enumerate() {
            config.memory_limits.insert(i as u32, g.mem);
        }
        let path = paths.hook_config.clone();
        mounts.push(MountPlan {
            container_path: hook_config::CONTAINER_PATH.into(),
            host_path: path.clone(),
            read_only: true,
        });
        hook = Some((path, config));
        cache_dir = Some(host);
        dmem = container_dmem(&run, &resolved);
    }
    let cdi_devices: Vec<CdiDevice> = gpus
        .iter()
        .map(|g| CdiDevice {
            device: g.name.clone(),
            card: g.dev.card,
            render: g.dev.render,
        })
        .collect();
    let cdi_spec = cdi_claim::spec(&uid, &cdi_devices, &envs, &mounts).map_err(|problem| {
        PrepareError::Cdi {
            claim: name.clone(),
            problem,
        }
    })?;
    let status = prepared
        .iter()
        .map(|p| AllocatedDeviceStatus {
            driver: settings.driver.clone(),
            pool: p.pool.clone(),
            device: p.device.clone(),
            share_id: p.share_id.clone(),
            data: Some(json!({
                hami_protocol::dra::CU_RANGES: p.cus.to_string(),
                hami_protocol::dra::MEMORY_BYTES: p.mem_bytes,
            })),
            ..Default::default()
        })
        .collect();
    Ok(PreparePlan {
        claim_uid: uid,
        pod_uid: pod.uid.clone(),
        devices: prepared,
        whole,
        env: envs,
        mounts,
        hook_config: hook,
        cache_dir,
        dmem,
        cdi_spec,
        status,
    })
}
