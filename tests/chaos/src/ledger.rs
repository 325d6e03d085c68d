//! The invariant ledger: pure checks over the pods and nodes the API server holds. Every
//! annotation is decoded by `hami-protocol`; nothing here parses a wire format by hand.
//!
//! A pod *holds* devices when it is bound (`spec.nodeName` set), not finished, and carries
//! a device list: that is what its containers get. Filter reservations of unbound pods are
//! the scheduler's own bookkeeping and are not counted.

use std::collections::BTreeMap;
use std::fmt;

use hami_demo::Live;
use hami_kubelet_sim::records::{RECORD_ANNOTATION, envs_of};
use hami_protocol::cu_allocated::CuAllocation;
use hami_protocol::cu_list::{CuSet, HsaCuMask};
use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::memory_limit::parse_memory_limit;
use hami_protocol::names::{Vendor, env, pod as pod_keys};
use hami_protocol::node_register::decode_node_devices;
use hami_protocol::requests::{ContainerKind, container_slots};
use k8s_openapi::api::core::v1::{Node, Pod};

/// The pod's `gpumem` request of container `container` in bytes (MiB in the spec), if any.
fn gpumem_limit(pod: &Pod, container: &str) -> Option<u64> {
    let c = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?;
    let limits = c.resources.as_ref()?.limits.as_ref()?;
    ["amd.com/gpumem", "nvidia.com/gpumem"]
        .iter()
        .find_map(|k| limits.get(*k))
        // Canonical form, as the API server stores it: 3000 MiB reads `3k`.
        .and_then(|q| hami_protocol::quantity::parse_count(&q.0).ok())
        .map(|mib| mib << 20)
}

/// Real usage against limits: every container's memory on every device (the monitors'
/// readings) is within the limit its region states and within its pod's `gpumem`.
pub fn check_usage(live: &Live, pods: &[Pod]) -> Vec<Violation> {
    let by_key: BTreeMap<(String, String), &Pod> = pods
        .iter()
        .map(|p| {
            (
                (
                    p.metadata.namespace.clone().unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default(),
                ),
                p,
            )
        })
        .collect();
    let mut out = Vec::new();
    for (k @ (ns, pod, container, _), used) in &live.memory {
        let used = *used as u64;
        let device = live.device.get(k).cloned().unwrap_or_default();
        let mut limits = vec![];
        if let Some(l) = live.limit.get(k) {
            limits.push((*l as u64, "region"));
        }
        if let Some(l) = by_key
            .get(&(ns.clone(), pod.clone()))
            .and_then(|p| gpumem_limit(p, container))
        {
            limits.push((l, "gpumem"));
        }
        for (limit, whose) in limits {
            // A limit of 0 in a region means "none set".
            if limit > 0 && used > limit {
                out.push(Violation::OverLimit {
                    pod: format!("{ns}/{pod}"),
                    container: container.clone(),
                    device: device.clone(),
                    used,
                    limit,
                    whose,
                });
            }
        }
    }
    out
}

/// Device memory the monitors still count for pod `ns/pod`, bytes.
pub fn memory_of(live: &Live, ns: &str, pod: &str) -> u64 {
    live.memory
        .iter()
        .filter(|((n, p, _, _), _)| n == ns && p == pod)
        .map(|(_, v)| *v as u64)
        .sum()
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// The pods holding a GPU ask for more memory (MiB), cores or shares than it registered.
    Overcommit {
        /// The node that registered the GPU.
        node: String,
        /// The GPU's id as registered.
        gpu: String,
        /// Which resource overflowed: memory, cores or shares.
        what: &'static str,
        /// The sum the pods hold.
        used: u64,
        /// What the GPU registered.
        capacity: u64,
        /// The pods holding it, to find the double allocation.
        pods: Vec<String>,
    },
    /// Two live pods were given intersecting CU ranges of one GPU.
    CuOverlap {
        /// The GPU both ranges are on.
        gpu: String,
        /// One of the two pods.
        a: String,
        /// The other pod.
        b: String,
        /// The CUs both were given.
        common: String,
    },
    /// A pod's device list names a GPU its node did not register.
    UnknownGpu {
        /// The pod naming it.
        pod: String,
        /// The pod's node.
        node: String,
        /// The unregistered GPU id.
        gpu: String,
    },
    /// A bound pod's annotations do not decode.
    Undecodable {
        /// The pod carrying them.
        pod: String,
        /// Which annotation failed, and why.
        what: String,
    },
    /// What kubelet-sim got from the plugin disagrees with the pod's annotations.
    AllocationMismatch {
        /// The pod allocated.
        pod: String,
        /// The container whose allocation differs.
        container: String,
        /// What differs.
        what: String,
    },
    /// A pod that fits was not Running with `bind-phase=success` in time after the faults stopped.
    Stranded {
        /// The pod left behind.
        pod: String,
        /// Its phase and bind state when the wait ran out.
        state: String,
    },
    /// A container's real device memory (the monitor's reading of its region) is above its
    /// limit: the region's, or the pod's `gpumem` request.
    OverLimit {
        /// The pod over its limit.
        pod: String,
        /// Its container.
        container: String,
        /// The device the monitor read.
        device: String,
        /// Device memory in use, as the monitor read it.
        used: u64,
        /// The limit exceeded.
        limit: u64,
        /// Whose limit: the region's or the pod request's.
        whose: &'static str,
    },
    /// The allocated ResourceClaims on a DRA slice device consume more memory (bytes),
    /// computeUnits or shares than the device's capacity in its ResourceSlice.
    DraOvercommit {
        /// `<pool>/<device>`.
        device: String,
        /// The capacity that overflowed.
        what: &'static str,
        /// The sum the claims consume.
        used: u64,
        /// The device's capacity.
        capacity: u64,
        /// The claims allocated on it.
        claims: Vec<String>,
    },
    /// A claim is allocated a device no ResourceSlice of its pool publishes.
    DraUnknownDevice {
        /// The claim.
        claim: String,
        /// `<pool>/<device>`.
        device: String,
    },
    /// What the driver published in a claim's `status.devices` disagrees with its allocation.
    DraStatusMismatch {
        /// The claim.
        claim: String,
        /// What differs.
        what: String,
    },
    /// A Running DRA pod whose claim is not allocated to its node, reserved for it and
    /// prepared, or whose container did not get what the driver published.
    DraNotPrepared {
        /// The pod.
        pod: String,
        /// What is missing or differs.
        what: String,
    },
    /// After the run: a claim, or a checkpoint entry of the driver or kubelet-sim, left of a
    /// pod that is gone.
    DraLeftover {
        /// The claim.
        claim: String,
        /// What is left.
        what: String,
    },
    /// A killed container's device memory was still counted this long after the kill.
    NotReleased {
        /// The pod whose container was killed.
        pod: String,
        /// Device memory still counted.
        used: u64,
        /// Milliseconds from the kill to this reading.
        after_ms: u64,
    },
    /// A monitor counted a workload process without its slice's hook (every process of
    /// the run starts under it): its memory limit is not enforced.
    Unhooked {
        /// The pod.
        pod: String,
        /// Its container.
        container: String,
        /// The hook missing.
        hook: String,
        /// Processes counted without it.
        processes: u64,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overcommit {
                node,
                gpu,
                what,
                used,
                capacity,
                pods,
            } => write!(
                f,
                "{node}/{gpu}: {what} over-committed: {used} > {capacity} by {pods:?}"
            ),
            Violation::CuOverlap { gpu, a, b, common } => {
                write!(f, "{gpu}: pods {a} and {b} share CUs {common}")
            }
            Violation::UnknownGpu { pod, node, gpu } => {
                write!(
                    f,
                    "pod {pod} holds {gpu}, which node {node} did not register"
                )
            }
            Violation::Undecodable { pod, what } => write!(f, "pod {pod}: {what}"),
            Violation::AllocationMismatch {
                pod,
                container,
                what,
            } => write!(f, "pod {pod} container {container}: {what}"),
            Violation::Stranded { pod, state } => write!(f, "pod {pod} stranded: {state}"),
            Violation::OverLimit {
                pod,
                container,
                device,
                used,
                limit,
                whose,
            } => write!(
                f,
                "pod {pod} container {container} uses {used} B of device {device}, above its {whose} limit {limit} B"
            ),
            Violation::DraOvercommit {
                device,
                what,
                used,
                capacity,
                claims,
            } => write!(
                f,
                "DRA device {device}: {what} over-committed: {used} > {capacity} by claims {claims:?}"
            ),
            Violation::DraUnknownDevice { claim, device } => write!(
                f,
                "claim {claim} is allocated {device}, which no ResourceSlice publishes"
            ),
            Violation::DraStatusMismatch { claim, what } => write!(f, "claim {claim}: {what}"),
            Violation::DraNotPrepared { pod, what } => write!(f, "DRA pod {pod}: {what}"),
            Violation::DraLeftover { claim, what } => {
                write!(f, "claim {claim} left over: {what}")
            }
            Violation::NotReleased {
                pod,
                used,
                after_ms,
            } => write!(
                f,
                "pod {pod}: {used} B of device memory still counted {after_ms} ms after its process was killed"
            ),
            Violation::Unhooked {
                pod,
                container,
                hook,
                processes,
            } => write!(
                f,
                "pod {pod} container {container}: {processes} processes without {hook} (its slice is not enforced)"
            ),
        }
    }
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

fn annotation<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(name))
        .map(String::as_str)
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// Bound, not finished, not being deleted.
pub fn is_live_holder(pod: &Pod) -> bool {
    bound_node(pod).is_some()
        && !matches!(phase(pod), Some("Succeeded" | "Failed"))
        && pod.metadata.deletion_timestamp.is_none()
}

/// The vendor whose device list the pod carries, with the decoded list.
fn devices_of(
    pod: &Pod,
) -> Option<(
    Vendor,
    Result<Vec<hami_protocol::device_list::ContainerDevices>, String>,
)> {
    Vendor::ALL.into_iter().find_map(|v| {
        annotation(pod, v.names().devices_allocated)
            .map(|t| (v, decode_pod_devices(t).map_err(|e| e.to_string())))
    })
}

#[derive(Default, Clone, Copy)]
struct Charge {
    mem: u64,
    cores: u64,
    shares: u64,
}

/// Per GPU, what one pod takes: init containers run one at a time before the app
/// containers (their peak counts), app containers and sidecars together.
fn pod_charges(
    pod: &Pod,
    runs: &[hami_protocol::device_list::ContainerDevices],
) -> BTreeMap<String, Charge> {
    let slots = pod.spec.as_ref().map(container_slots).unwrap_or_default();
    let mut together: BTreeMap<String, Charge> = BTreeMap::new();
    let mut init_peak: BTreeMap<String, Charge> = BTreeMap::new();
    for (i, run) in runs.iter().enumerate() {
        let init = slots.get(i).is_some_and(|s| s.kind == ContainerKind::Init);
        for dev in run {
            if init {
                let c = init_peak.entry(dev.uuid.clone()).or_default();
                c.mem = c.mem.max(dev.mem_mib);
                c.cores = c.cores.max(u64::from(dev.cores));
                c.shares = 1;
            } else {
                let c = together.entry(dev.uuid.clone()).or_default();
                c.mem += dev.mem_mib;
                c.cores += u64::from(dev.cores);
                c.shares = 1;
            }
        }
    }
    for (gpu, peak) in init_peak {
        let c = together.entry(gpu).or_default();
        c.mem = c.mem.max(peak.mem);
        c.cores = c.cores.max(peak.cores);
        c.shares = 1;
    }
    together
}

/// Over-commitment (memory, cores, shares), unknown GPUs and CU overlaps among the pods
/// that hold devices now.
pub fn check_placement(pods: &[Pod], nodes: &[Node]) -> Vec<Violation> {
    let mut out = Vec::new();
    // (node, gpu) → (devmem, devcore, count)
    let mut capacity: BTreeMap<(String, String), (u64, u64, u64)> = BTreeMap::new();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        for v in Vendor::ALL {
            let Some(text) = node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(v.names().node_register))
            else {
                continue;
            };
            for d in decode_node_devices(text).unwrap_or_default() {
                capacity.insert(
                    (name.clone(), d.id.clone()),
                    (d.devmem, u64::from(d.devcore), u64::from(d.count)),
                );
            }
        }
    }
    let mut used: BTreeMap<(String, String), (Charge, Vec<String>)> = BTreeMap::new();
    let mut cus: BTreeMap<String, Vec<(String, CuSet)>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| is_live_holder(p)) {
        let Some((vendor, runs)) = devices_of(pod) else {
            continue;
        };
        let node = bound_node(pod).unwrap_or_default().to_string();
        let runs = match runs {
            Ok(r) => r,
            Err(e) => {
                out.push(Violation::Undecodable {
                    pod: key(pod),
                    what: format!("device list: {e}"),
                });
                continue;
            }
        };
        for (gpu, c) in pod_charges(pod, &runs) {
            let slot = used.entry((node.clone(), gpu)).or_default();
            slot.0.mem += c.mem;
            slot.0.cores += c.cores;
            slot.0.shares += c.shares;
            slot.1.push(key(pod));
        }
        if vendor == Vendor::Amd
            && let Some(text) = annotation(pod, pod_keys::AMD_CU_ALLOCATED)
        {
            match CuAllocation::parse(text) {
                Ok(map) => {
                    for (gpu, set) in map.0 {
                        cus.entry(gpu).or_default().push((key(pod), set));
                    }
                }
                Err(e) => out.push(Violation::Undecodable {
                    pod: key(pod),
                    what: format!("{}: {e}", pod_keys::AMD_CU_ALLOCATED),
                }),
            }
        }
    }
    for ((node, gpu), (charge, holders)) in used {
        let Some(&(devmem, devcore, count)) = capacity.get(&(node.clone(), gpu.clone())) else {
            for pod in holders {
                out.push(Violation::UnknownGpu {
                    pod,
                    node: node.clone(),
                    gpu: gpu.clone(),
                });
            }
            continue;
        };
        for (what, u, cap) in [
            ("memory MiB", charge.mem, devmem),
            ("cores", charge.cores, devcore),
            ("shares", charge.shares, count),
        ] {
            if u > cap {
                out.push(Violation::Overcommit {
                    node: node.clone(),
                    gpu: gpu.clone(),
                    what,
                    used: u,
                    capacity: cap,
                    pods: holders.clone(),
                });
            }
        }
    }
    for (gpu, sets) in cus {
        for (i, (a, sa)) in sets.iter().enumerate() {
            for (b, sb) in &sets[i + 1..] {
                if sa.overlaps(sb) {
                    out.push(Violation::CuOverlap {
                        gpu: gpu.clone(),
                        a: a.clone(),
                        b: b.clone(),
                        common: sa.intersection(sb).to_string(),
                    });
                }
            }
        }
    }
    out
}

/// For every Running pod: each container with devices has a kubelet-sim record, and the
/// limits the plugin handed out (memory per device, CU mask or SM limit) are the ones the
/// scheduler annotated.
pub fn check_agreement(pods: &[Pod]) -> Vec<Violation> {
    let mut out = Vec::new();
    for pod in pods
        .iter()
        .filter(|p| is_live_holder(p) && phase(p) == Some("Running"))
    {
        let Some((vendor, Ok(runs))) = devices_of(pod) else {
            continue;
        };
        let record = annotation(pod, RECORD_ANNOTATION).unwrap_or("");
        let cu_map = annotation(pod, pod_keys::AMD_CU_ALLOCATED)
            .and_then(|t| CuAllocation::parse(t).ok())
            .unwrap_or_default();
        let slots = pod.spec.as_ref().map(container_slots).unwrap_or_default();
        for (slot, run) in slots.iter().zip(&runs) {
            if run.is_empty() {
                continue;
            }
            let container = slot.container.name.clone();
            let mut bad = |what: String| {
                out.push(Violation::AllocationMismatch {
                    pod: key(pod),
                    container: container.clone(),
                    what,
                })
            };
            let Some(envs) = envs_of(record, &slot.container.name) else {
                bad("Running, but kubelet-sim recorded no Allocate for it".into());
                continue;
            };
            let get = |name: &str| envs.get(name).and_then(|v| v.as_str()).map(str::to_owned);
            let mask = get(env::HSA_CU_MASK).map(|m| HsaCuMask::parse(&m));
            for (i, dev) in run.iter().enumerate() {
                let limit_name = match vendor {
                    Vendor::Amd => env::hip_device_memory_limit(i),
                    Vendor::Nvidia => format!("{}_{i}", env::CUDA_DEVICE_MEMORY_LIMIT),
                };
                // A whole card needs no memory limit; a limit that is there must match.
                if let Some(text) = get(&limit_name) {
                    match parse_memory_limit(&text) {
                        Ok(bytes) if bytes == dev.mem_mib << 20 => {}
                        Ok(bytes) => bad(format!(
                            "{limit_name}={text} ({bytes} bytes) but the device list says {} MiB on {}",
                            dev.mem_mib, dev.uuid
                        )),
                        Err(e) => bad(format!("{limit_name}={text}: {e}")),
                    }
                }
                if vendor == Vendor::Amd
                    && let Some(annotated) = cu_map.0.get(&dev.uuid)
                {
                    match &mask {
                        Some(Ok(mask)) => match mask.get(i as u32) {
                            Some(got) if got == annotated => {}
                            got => bad(format!(
                                "HSA_CU_MASK device {i} = {:?} but {} says {annotated} for {}",
                                got.map(ToString::to_string),
                                pod_keys::AMD_CU_ALLOCATED,
                                dev.uuid
                            )),
                        },
                        Some(Err(e)) => bad(format!("HSA_CU_MASK does not decode: {e}")),
                        None => bad(format!(
                            "{} gives {} CUs {annotated} but Allocate set no HSA_CU_MASK",
                            pod_keys::AMD_CU_ALLOCATED,
                            dev.uuid
                        )),
                    }
                }
                if vendor == Vendor::Nvidia
                    && let Some(text) = get(env::CUDA_DEVICE_SM_LIMIT)
                    && text != dev.cores.to_string()
                {
                    bad(format!(
                        "CUDA_DEVICE_SM_LIMIT={text} but the device list says {}",
                        dev.cores
                    ));
                }
            }
        }
    }
    out
}

/// Why a pod is not settled: it should be bound, Running, with `bind-phase=success` (a DRA
/// pod has no bind phase: kube-scheduler allocates its claims, no extender binds it).
pub fn unsettled(pod: &Pod) -> Option<String> {
    let running = phase(pod) == Some("Running") && bound_node(pod).is_some();
    let phase_ok = crate::ledger_dra::is_dra_pod(pod)
        || annotation(pod, pod_keys::BIND_PHASE) == Some("success");
    (!(running && phase_ok)).then(|| {
        format!(
            "phase {:?}, node {:?}, bind-phase {:?}",
            phase(pod),
            bound_node(pod),
            annotation(pod, pod_keys::BIND_PHASE)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node() -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n", "annotations": {
            "hami.io/node-amd-register": r#"[{"id":"G","count":2,"devmem":1000,"devcore":100,"type":"AMD Instinct MI210","health":true}]"#}}}))
        .unwrap()
    }

    fn pod(name: &str, mem: u64, cores: u32, cus: &str, record: Option<serde_json::Value>) -> Pod {
        let mut annotations = json!({
            "hami.io/amd-devices-allocated": format!("G,AMD Instinct MI210,{mem},{cores}:;"),
            "hami.io/amd-cu-allocated": json!({"G": cus}).to_string(),
            "hami.io/bind-phase": "success",
        });
        if let Some(r) = record {
            annotations[RECORD_ANNOTATION] = json!(r.to_string());
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap()
    }

    fn record(limit: &str, mask: &str) -> serde_json::Value {
        json!({"c": [{"resource": "amd.com/gpu", "deviceIds": ["G"],
            "envs": {"HIP_DEVICE_MEMORY_LIMIT_0": limit, "HSA_CU_MASK": mask}}]})
    }

    #[test]
    fn disjoint_pods_that_fit_pass() {
        let pods = [
            pod("a", 400, 40, "0-39", Some(record("400m", "0:0-39"))),
            pod("b", 600, 60, "40-99", Some(record("600m", "0:40-99"))),
        ];
        assert_eq!(check_placement(&pods, &[node()]), vec![]);
        assert_eq!(check_agreement(&pods), vec![]);
        assert!(pods.iter().all(|p| unsettled(p).is_none()));
    }

    #[test]
    fn overcommit_overlap_and_mismatch_are_caught() {
        let pods = [
            pod("a", 600, 40, "0-39", Some(record("600m", "0:0-39"))),
            pod("b", 600, 70, "30-99", Some(record("500m", "0:40-99"))),
            pod("c", 1, 1, "", None),
        ];
        let v = check_placement(&pods, &[node()]);
        let text: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert!(
            text.iter()
                .any(|t| t.contains("memory MiB over-committed: 1201 > 1000")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("cores over-committed: 111 > 100"))
        );
        assert!(
            text.iter()
                .any(|t| t.contains("shares over-committed: 3 > 2"))
        );
        assert!(
            text.iter().any(|t| t.contains("share CUs 30-39")),
            "{text:?}"
        );
        let m: Vec<String> = check_agreement(&pods)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            m.iter()
                .any(|t| t.contains("HIP_DEVICE_MEMORY_LIMIT_0=500m")),
            "{m:?}"
        );
        assert!(
            m.iter().any(|t| t.contains("HSA_CU_MASK device 0")),
            "{m:?}"
        );
        assert!(
            m.iter()
                .any(|t| t.contains("default/c") && t.contains("no Allocate")),
            "{m:?}"
        );
    }

    #[test]
    fn unbound_and_finished_pods_hold_nothing() {
        let mut a = pod("a", 900, 90, "0-89", None);
        let mut b = pod("b", 900, 90, "0-89", None);
        a.spec.as_mut().unwrap().node_name = None;
        b.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(check_placement(&[a.clone(), b], &[node()]), vec![]);
        assert!(unsettled(&a).unwrap().contains("node None"));
    }

    #[test]
    fn a_gpu_the_node_never_registered_is_reported() {
        let p = pod("a", 1, 1, "0", None);
        let v = check_placement(&[p], &[]);
        assert!(
            matches!(&v[..], [Violation::UnknownGpu { gpu, .. }] if gpu == "G"),
            "{v:?}"
        );
    }

    #[test]
    fn usage_above_a_region_or_gpumem_limit_is_caught() {
        let mut p = pod("a", 1024, 10, "0-9", None);
        p.spec.as_mut().unwrap().containers[0].resources =
            serde_json::from_value(json!({"limits": {"amd.com/gpumem": "1024"}})).unwrap();
        let k = |pod: &str| {
            (
                "default".to_string(),
                pod.to_string(),
                "c".to_string(),
                "0".to_string(),
            )
        };
        let mut live = Live::default();
        live.memory.insert(k("a"), 512.0 * 1048576.0);
        live.limit.insert(k("a"), 2048.0 * 1048576.0);
        assert!(check_usage(&live, std::slice::from_ref(&p)).is_empty());
        assert_eq!(memory_of(&live, "default", "a"), 512 << 20);
        // Within the region's 2 GiB but above the pod's 1 GiB request.
        live.memory.insert(k("a"), 1536.0 * 1048576.0);
        let v = check_usage(&live, std::slice::from_ref(&p));
        assert!(
            matches!(
                &v[..],
                [Violation::OverLimit {
                    whose: "gpumem",
                    ..
                }]
            ),
            "{v:?}"
        );
        // A pod the ledger has no spec for is held to its region's limit.
        live.memory.insert(k("b"), 3000.0 * 1048576.0);
        live.limit.insert(k("b"), 2048.0 * 1048576.0);
        let v = check_usage(&live, &[p]);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().any(|v| v.to_string().contains("region limit")));
        assert_eq!(memory_of(&live, "default", "c"), 0);
    }
}
