//! Reports over Kubernetes objects, shared by the `hami` CLI (`hami inspect`, `hami status`)
//! and the web UI (`hami ui`): what a pod asked for and what the scheduler's annotations
//! say it got; what a node registered; per node and GPU who holds which slice. Plain data
//! built by pure functions; the callers print or render them.

pub mod dra_status;
mod status;

pub use status::{
    GpuStatus, NodeStatus, PendingPod, StatusReport, WHOLE_CARD_MARK, build as status_report,
    report_from_state,
};

use std::collections::BTreeMap;

use hami_protocol::cu_allocated::CuAllocation;
use hami_protocol::device_list::{ContainerDevices, decode_pod_devices};
use hami_protocol::names::{DEFAULT_SCHEDULER_NAME, Vendor, node as node_keys, pod as pod_keys};
use hami_protocol::node_lock::NodeLock;
use hami_protocol::node_register::decode_node_devices;
use hami_protocol::requests::{
    ContainerKind, MemoryRequest, RequestDefaults, pod_ref, pod_requests,
};
use hami_protocol::rfc3339;
use hami_protocol::whole_cards;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;

/// An object whose fields or annotations cannot be read; the message names the field.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ReportError(pub String);

/// What one pod asked for and got (`hami inspect pod`).
#[derive(Debug, Serialize)]
pub struct PodReport {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The node the scheduler chose (`hami.io/vgpu-node`), else `spec.nodeName`.
    pub node: Option<String>,
    /// `hami.io/bind-phase`, when set.
    pub bind_phase: Option<String>,
    /// Per container, in device-list order.
    pub containers: Vec<ContainerReport>,
    /// Cards the pod holds whole without HAMi having placed it, per vendor (issue 26 item 1).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub whole_cards: Vec<WholeCards>,
    /// Things an operator should know (unpadded annotations, count mismatches).
    pub notes: Vec<String>,
}

/// One vendor's whole cards held by a pod HAMi did not place: the device plugin's record
/// (`hami.io/<vendor>-whole-cards`) as `hami_protocol::whole_cards::held_cards` counts it
/// (live, bound, not placed by the default scheduler name, at most the pod's count).
#[derive(Debug, Serialize)]
pub struct WholeCards {
    /// `AMD` or `NVIDIA`.
    pub vendor: &'static str,
    /// The annotation they are recorded in.
    pub annotation: &'static str,
    /// The cards' registered ids.
    pub cards: Vec<String>,
}

/// What one container asked for and got.
#[derive(Debug, Serialize)]
pub struct ContainerReport {
    /// The container's name.
    pub name: String,
    /// Init, sidecar or app.
    pub kind: ContainerKind,
    /// Its GPU requests, one per vendor.
    pub asked: Vec<Asked>,
    /// The devices its run of the device list names.
    pub got: Vec<Got>,
    /// The device plugin has not yet allocated this container's devices.
    pub waiting_for_allocate: bool,
}

/// One vendor's request of a container.
#[derive(Debug, Serialize)]
pub struct Asked {
    /// `AMD` or `NVIDIA`.
    pub vendor: &'static str,
    /// GPUs asked for.
    pub count: u32,
    /// Memory per GPU.
    pub memory: MemoryRequest,
    /// Percent of each GPU's compute.
    pub cores_percent: u32,
}

/// One device a container got.
#[derive(Debug, Serialize)]
pub struct Got {
    /// `AMD` or `NVIDIA`.
    pub vendor: &'static str,
    /// Registered device id.
    pub uuid: String,
    /// Registered device type.
    #[serde(rename = "type")]
    pub device_type: String,
    /// MiB granted.
    pub memory_mib: u64,
    /// CU count for AMD, percent of SMs for NVIDIA.
    pub cores: u32,
    /// `CUs` or `%`.
    pub cores_unit: &'static str,
    /// From `hami.io/amd-cu-allocated`: the CU ids of this device in the pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cu_ranges: Option<String>,
    /// `true` when several containers of the pod share the device, so the ranges are
    /// their union (the annotation is per pod).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cu_ranges_shared: bool,
}

impl Asked {
    /// One line: `1× AMD: 4096 MiB, 25% cores`.
    pub fn describe(&self) -> String {
        let ask = self;
        let memory = match ask.memory {
            MemoryRequest::Whole => "all memory".to_owned(),
            MemoryRequest::Mib(mib) => format!("{mib} MiB"),
            MemoryRequest::Percent(pct) => format!("{pct}% memory"),
        };
        let cores = match ask.cores_percent {
            0 => "no core share".to_owned(),
            pct => format!("{pct}% cores"),
        };
        format!("{}× {}: {memory}, {cores}", ask.count, ask.vendor)
    }
}

fn annotation_error(key: &str, err: impl std::fmt::Display) -> ReportError {
    ReportError(format!("metadata.annotations[{key}]: {err}"))
}

/// Maps the runs of a device-list annotation to the pod's containers. Full padding (D-1)
/// maps run `i` to container `i`; the reference scheduler omits empty runs, so a shorter
/// list is matched to the containers that ask for the vendor, in order.
fn runs_per_container(
    key: &str,
    runs: Vec<ContainerDevices>,
    asks: &[bool],
    notes: &mut Vec<String>,
) -> Result<Vec<ContainerDevices>, ReportError> {
    if runs.len() == asks.len() {
        return Ok(runs);
    }
    if runs.len() > asks.len() {
        return Err(annotation_error(
            key,
            format!(
                "has {} container runs but the pod has {} containers",
                runs.len(),
                asks.len()
            ),
        ));
    }
    notes.push(format!(
        "{key} has {} runs for {} containers (not padded, as the reference scheduler writes it); runs were matched to the containers that ask for devices, in order",
        runs.len(),
        asks.len()
    ));
    let mut non_empty = runs.into_iter().filter(|r| !r.is_empty());
    Ok(asks
        .iter()
        .map(|asks| {
            if *asks {
                non_empty.next().unwrap_or_default()
            } else {
                Vec::new()
            }
        })
        .collect())
}

/// The report of one pod; fails when its requests or annotations cannot be read.
pub fn pod_report(pod: &Pod) -> Result<PodReport, ReportError> {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let requests =
        pod_requests(pod, &RequestDefaults::default()).map_err(|e| ReportError(e.to_string()))?;
    let mut notes = Vec::new();
    let mut got: Vec<Vec<Got>> = requests.iter().map(|_| Vec::new()).collect();
    let mut waiting = vec![false; requests.len()];

    let cu_allocation = match annotations.get(pod_keys::AMD_CU_ALLOCATED) {
        Some(text) => CuAllocation::parse(text)
            .map_err(|e| annotation_error(pod_keys::AMD_CU_ALLOCATED, e))?,
        None => CuAllocation::default(),
    };

    for vendor in Vendor::ALL {
        let names = vendor.names();
        let asks: Vec<bool> = requests.iter().map(|r| r.get(vendor).is_some()).collect();
        let decode = |key: &str,
                      notes: &mut Vec<String>|
         -> Result<Option<Vec<ContainerDevices>>, ReportError> {
            let Some(text) = annotations.get(key) else {
                return Ok(None);
            };
            let runs = decode_pod_devices(text).map_err(|e| annotation_error(key, e))?;
            runs_per_container(key, runs, &asks, notes).map(Some)
        };
        if let Some(runs) = decode(names.devices_allocated, &mut notes)? {
            // How many containers got each device: CU ranges are recorded per pod.
            let mut holders: BTreeMap<&str, usize> = BTreeMap::new();
            for dev in runs.iter().flatten() {
                *holders.entry(dev.uuid.as_str()).or_default() += 1;
            }
            for (i, run) in runs.iter().enumerate() {
                for dev in run {
                    got[i].push(Got {
                        vendor: vendor.word(),
                        uuid: dev.uuid.clone(),
                        device_type: dev.device_type.clone(),
                        memory_mib: dev.mem_mib,
                        cores: dev.cores,
                        cores_unit: if vendor == Vendor::Amd { "CUs" } else { "%" },
                        cu_ranges: cu_allocation.0.get(&dev.uuid).map(ToString::to_string),
                        cu_ranges_shared: holders.get(dev.uuid.as_str()).copied().unwrap_or(0) > 1,
                    });
                }
                let asked = requests[i]
                    .get(vendor)
                    .map(|r| r.count as usize)
                    .unwrap_or(0);
                if run.len() != asked {
                    notes.push(format!(
                        "container {} asked for {asked} {} GPUs but {} lists {}",
                        requests[i].name,
                        vendor.word(),
                        names.devices_allocated,
                        run.len()
                    ));
                }
            }
        }
        if let Some(runs) = decode(names.devices_to_allocate, &mut notes)? {
            for (i, run) in runs.iter().enumerate() {
                waiting[i] |= !run.is_empty();
            }
        }
    }

    let containers = requests
        .into_iter()
        .zip(got)
        .zip(waiting)
        .map(|((request, got), waiting_for_allocate)| ContainerReport {
            asked: Vendor::ALL
                .iter()
                .filter_map(|v| {
                    request.get(*v).map(|r| Asked {
                        vendor: v.word(),
                        count: r.count,
                        memory: r.memory,
                        cores_percent: r.cores_percent,
                    })
                })
                .collect(),
            name: request.name,
            kind: request.kind,
            got,
            waiting_for_allocate,
        })
        .collect();
    let mut held = Vec::new();
    for vendor in Vendor::ALL {
        // A bad record holds nothing (as for the scheduler): a note, not a failed report.
        match whole_cards::held_cards(pod, vendor, DEFAULT_SCHEDULER_NAME) {
            Ok(Some(h)) => held.push(WholeCards {
                vendor: vendor.word(),
                annotation: whole_cards::key(vendor),
                cards: h.cards,
            }),
            Ok(None) => {}
            Err(e) => notes.push(format!(
                "annotation {}: {e}; it holds no card",
                whole_cards::key(vendor)
            )),
        }
    }
    let owner = pod_ref(pod);
    Ok(PodReport {
        namespace: owner.namespace,
        name: owner.name,
        node: annotations
            .get(pod_keys::VGPU_NODE)
            .cloned()
            .or_else(|| pod.spec.as_ref().and_then(|s| s.node_name.clone())),
        bind_phase: annotations.get(pod_keys::BIND_PHASE).cloned(),
        containers,
        whole_cards: held,
        notes,
    })
}

/// What one node registered (`hami inspect node`).
#[derive(Debug, Serialize)]
pub struct NodeReport {
    /// The node's name.
    pub name: String,
    /// Every registered device, AMD first.
    pub devices: Vec<NodeDevice>,
    /// The node lock, when held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<LockReport>,
    /// `hami.io/amd-operating-mode`, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amd_operating_mode: Option<String>,
    /// `hami.io/amd-compute-partition`, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amd_compute_partition: Option<String>,
}

/// One registered device of a node.
#[derive(Debug, Serialize)]
pub struct NodeDevice {
    /// `AMD` or `NVIDIA`.
    pub vendor: &'static str,
    /// DRM card minor (AMD) or NVML index (NVIDIA).
    pub index: u32,
    /// Registered device id.
    pub id: String,
    /// Registered device type.
    #[serde(rename = "type")]
    pub device_type: String,
    /// Pods that may share it.
    pub shares: u32,
    /// Device memory, MiB.
    pub memory_mib: u64,
    /// AMD: CUs; NVIDIA: 100 × core scaling.
    pub cores: u32,
    /// NUMA node (-1 unknown).
    pub numa: i32,
    /// `hami-core`, `xcp`, …
    pub mode: String,
    /// Whether it may be allocated.
    pub health: bool,
    /// PCI address (AMD).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_bdf: Option<String>,
    /// XGMI peers' PCI addresses (AMD).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub xgmi_peers: Vec<String>,
}

/// The node lock `hami.io/mutex.lock`.
#[derive(Debug, Serialize)]
pub struct LockReport {
    /// The value as written.
    pub value: String,
    /// The holding pod, `namespace/name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// When it was taken, RFC 3339 UTC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub taken_at: Option<String>,
    /// Set when the value cannot be read; the scheduler treats such a lock as abandoned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The report of one node; fails when a register annotation cannot be read.
pub fn node_report(node: &Node) -> Result<NodeReport, ReportError> {
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    let mut devices = Vec::new();
    for vendor in Vendor::ALL {
        let key = vendor.names().node_register;
        let Some(text) = annotations.get(key) else {
            continue;
        };
        let decoded = decode_node_devices(text).map_err(|e| annotation_error(key, e))?;
        devices.extend(decoded.into_iter().map(|d| NodeDevice {
            vendor: vendor.word(),
            index: d.index,
            id: d.id,
            device_type: d.device_type,
            shares: d.count,
            memory_mib: d.devmem,
            cores: d.devcore,
            numa: d.numa,
            mode: d.mode.as_str().to_owned(),
            health: d.health,
            pci_bdf: d.custom_info.pci_bdf,
            xgmi_peers: d.custom_info.xgmi_peers,
        }));
    }
    let lock = annotations
        .get(node_keys::MUTEX_LOCK)
        .map(|value| match NodeLock::parse(value) {
            Ok(lock) => LockReport {
                value: value.clone(),
                owner: lock.owner.map(|o| o.to_string()),
                taken_at: Some(rfc3339::format_utc(lock.taken_at)),
                problem: None,
            },
            Err(e) => LockReport {
                value: value.clone(),
                owner: None,
                taken_at: None,
                problem: Some(e.to_string()),
            },
        });
    Ok(NodeReport {
        name: node.metadata.name.clone().unwrap_or_default(),
        devices,
        lock,
        amd_operating_mode: annotations.get(node_keys::AMD_OPERATING_MODE).cloned(),
        amd_compute_partition: annotations.get(node_keys::AMD_COMPUTE_PARTITION).cloned(),
    })
}
