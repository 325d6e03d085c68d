//! What a plan says per policy pair, read back from the scheduler's cluster state: placed
//! and unplaceable pods (grouped by the scheduler's own reason text), utilization and
//! fragmentation; rendered as a table or JSON.
//!
//! Definitions (also in the crate README):
//! - *memory utilization*: MiB reserved by placed pods / MiB registered, over all GPUs.
//! - *CU utilization*: AMD CUs reserved / AMD CUs registered; NVIDIA cores are reported
//!   separately (percent of cards), never mixed with CUs.
//! - *busy GPU*: holds at least one pod. *Partially used GPU*: busy, with memory and
//!   compute and a share slot still free.
//! - *stranded*: the free memory (and CUs) of a busy GPU on which none of the scenario's
//!   per-GPU slices (each container's request of that vendor, sized for this GPU as the
//!   scheduler sizes it) fits any more: a share slot, memory or cores is exhausted. GPUs
//!   that hold nothing are never stranded: they can still take a whole-card request.
//! - *fragmentation*: stranded free memory / all free memory (and the same for CUs), in
//!   percent; 0 when nothing is free.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hami_protocol::names::Vendor;
use hami_protocol::requests::{DeviceRequest, RequestDefaults, pod_requests};
use hami_scheduler_core::fit::demand;
use hami_scheduler_core::snapshot::{Gpu, GpuUsage};
use serde::Serialize;

use crate::engine::{PlannedPod, PodOutcome, PolicyRun};
use crate::preempt::Preemption;
use crate::scenario::{Workload, node_policy_name};

/// Pods named per unplaceable reason in a report.
const NAMED_PODS: usize = 5;

/// The whole plan: the fleet's size and one report per policy pair.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanReport {
    /// The scenario's name.
    pub scenario: String,
    /// Nodes in the fleet.
    pub nodes: usize,
    /// GPUs registered in the fleet.
    pub gpus: usize,
    /// Pods planned.
    pub pods: usize,
    /// One per GPU × node policy pair, in the scenario's order.
    pub policies: Vec<PolicyReport>,
}

/// What one policy pair does with the scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyReport {
    /// The GPU policy as the scenario names it.
    pub gpu_policy: String,
    /// The node policy.
    pub node_policy: String,
    /// Pods filter placed.
    pub placed: usize,
    /// Pods no node fits.
    pub unplaceable: usize,
    /// Pods asking for no GPU (left to kube-scheduler).
    pub no_gpu: usize,
    /// Pods placed, then evicted by a higher-priority pod, that no node took again
    /// (left out of the JSON when 0, as are the two fields below when empty: a plan
    /// without priorities reads as before).
    #[serde(skip_serializing_if = "is_zero")]
    pub evicted: usize,
    /// Every preemption, in the order it happened.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preemptions: Vec<Preemption>,
    /// The evicted pods grouped by the scheduler's message when they were placed again.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub evicted_reasons: Vec<ReasonGroup>,
    /// Per workload, in scenario order.
    pub workloads: Vec<WorkloadReport>,
    /// Unplaceable pods grouped by the scheduler's message.
    pub reasons: Vec<ReasonGroup>,
    /// Nodes holding at least one pod.
    pub nodes_used: usize,
    /// GPUs holding at least one pod.
    pub gpus_busy: usize,
    /// Busy GPUs with memory, compute and a share slot still free.
    pub gpus_partial: usize,
    /// Device memory, MiB.
    pub memory: Capacity,
    /// AMD compute units.
    pub amd_cus: Capacity,
    /// Percent of NVIDIA cards (100 per card).
    pub nvidia_cores: Capacity,
    /// Where each placed pod went.
    pub placements: Vec<PodPlacement>,
}

/// One workload's outcome under one policy pair.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadReport {
    /// The workload's template name.
    pub name: String,
    /// Pods made from it.
    pub pods: usize,
    /// Of those, placed.
    pub placed: usize,
    /// Of those, unplaceable.
    pub unplaceable: usize,
    /// Of those, evicted and not placed again (left out of the JSON when 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub evicted: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Unplaceable pods with one scheduler message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReasonGroup {
    /// The scheduler's message.
    pub reason: String,
    /// How many pods got it.
    pub count: usize,
    /// The first few pods, `namespace/name`.
    pub pods: Vec<String>,
}

/// Totals of one resource (MiB, CUs or percent).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Capacity {
    /// Registered.
    pub total: u64,
    /// Reserved by placed pods.
    pub used: u64,
    /// Free on busy GPUs that no slice of the scenario fits any more.
    pub stranded: u64,
    /// used / total, percent.
    pub utilization_pct: f64,
    /// stranded / free, percent.
    pub fragmentation_pct: f64,
}

impl Capacity {
    fn add(&mut self, total: u64, used: u64, stranded: bool) {
        self.total += total;
        let used = used.min(total);
        self.used += used;
        if stranded {
            self.stranded += total - used;
        }
    }

    fn finish(&mut self) {
        self.utilization_pct = pct(self.used, self.total);
        self.fragmentation_pct = pct(self.stranded, self.total - self.used);
    }
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        // One decimal, so reports compare exactly.
        (part as f64 * 1000.0 / whole as f64).round() / 10.0
    }
}

/// Where one pod went.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodPlacement {
    /// `namespace/name`.
    pub pod: String,
    /// The node.
    pub node: String,
    /// What it holds on each GPU.
    pub devices: Vec<DevicePlacement>,
}

/// What a pod holds on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DevicePlacement {
    /// Registered device id.
    pub id: String,
    /// MiB.
    pub mem_mib: u64,
    /// CUs (AMD) or percent (NVIDIA).
    pub cores: u64,
}

/// Every per-GPU slice the workloads ask for, per vendor (templates whose requests do not
/// parse are left out: the scheduler refuses those pods anyway).
pub fn workload_slices(workloads: &[Workload]) -> Vec<(Vendor, DeviceRequest)> {
    let mut out: Vec<(Vendor, DeviceRequest)> = Vec::new();
    for w in workloads.iter().filter(|w| w.count > 0) {
        let Ok(requests) = pod_requests(&w.pod, &RequestDefaults::default()) else {
            continue;
        };
        for c in &requests {
            for vendor in Vendor::ALL {
                if let Some(r) = c.get(vendor)
                    && !out.iter().any(|(v, o)| *v == vendor && o == r)
                {
                    out.push((vendor, r.clone()));
                }
            }
        }
    }
    out
}

/// Whether any slice still fits on this GPU, checked as the scheduler checks a GPU
/// (share slots, memory, cores) but without the pod's type/uuid selectors.
fn takes_a_slice(gpu: &Gpu, u: &GpuUsage, slices: &[(Vendor, DeviceRequest)]) -> bool {
    let info = &gpu.info;
    if u.used >= info.count || !info.health {
        return false;
    }
    slices
        .iter()
        .filter(|(v, _)| *v == gpu.vendor)
        .any(|(_, r)| {
            let (mem, cores) = demand(gpu, r);
            let free_mem = info.devmem.saturating_sub(u.mem_mib);
            let free_cores = u64::from(info.devcore).saturating_sub(u.cores);
            free_mem >= mem && free_mem > 0 && free_cores >= cores
        })
}

/// Builds one policy's report.
pub fn policy_report(
    run: &PolicyRun,
    gpu_policy_name: &str,
    pods: &[PlannedPod],
    workloads: &[Workload],
    slices: &[(Vendor, DeviceRequest)],
) -> PolicyReport {
    let mut per_workload: Vec<WorkloadReport> = workloads
        .iter()
        .map(|w| WorkloadReport {
            name: w.name().to_owned(),
            pods: w.count as usize,
            placed: 0,
            unplaceable: 0,
            evicted: 0,
        })
        .collect();
    let mut reasons: BTreeMap<&str, (usize, Vec<String>)> = BTreeMap::new();
    let mut evicted_reasons: BTreeMap<&str, (usize, Vec<String>)> = BTreeMap::new();
    let mut evicted = 0;
    let mut placements = Vec::new();
    let (mut placed, mut unplaceable, mut no_gpu) = (0, 0, 0);
    for (planned, outcome) in pods.iter().zip(&run.outcomes) {
        let name = format!(
            "{}/{}",
            planned
                .pod
                .metadata
                .namespace
                .as_deref()
                .unwrap_or("default"),
            planned.pod.metadata.name.as_deref().unwrap_or_default()
        );
        let w = &mut per_workload[planned.workload];
        match outcome {
            PodOutcome::Placed { node, charges } => {
                placed += 1;
                w.placed += 1;
                placements.push(PodPlacement {
                    pod: name,
                    node: node.clone(),
                    devices: charges
                        .iter()
                        .map(|c| DevicePlacement {
                            id: c.uuid.clone(),
                            mem_mib: c.mem_mib,
                            cores: c.cores,
                        })
                        .collect(),
                });
            }
            PodOutcome::NoGpu => no_gpu += 1,
            PodOutcome::Unplaceable { reason } => {
                unplaceable += 1;
                w.unplaceable += 1;
                tally(&mut reasons, reason, name);
            }
            PodOutcome::Evicted { reason, .. } => {
                evicted += 1;
                w.evicted += 1;
                tally(&mut evicted_reasons, reason, name);
            }
        }
    }
    let reasons = groups(reasons);
    let evicted_reasons = groups(evicted_reasons);

    let (mut memory, mut amd_cus, mut nvidia_cores) = (
        Capacity::default(),
        Capacity::default(),
        Capacity::default(),
    );
    let (mut nodes_used, mut gpus_busy, mut gpus_partial) = (0, 0, 0);
    for node in run.state.nodes() {
        let mut node_busy = false;
        for (gpu, u) in node.devices.gpus.iter().zip(&node.usage) {
            let busy = u.used > 0;
            node_busy |= busy;
            let stranded = busy && !takes_a_slice(gpu, u, slices);
            if busy {
                gpus_busy += 1;
                let info = &gpu.info;
                if u.used < info.count
                    && u.mem_mib < info.devmem
                    && u.cores < u64::from(info.devcore)
                {
                    gpus_partial += 1;
                }
            }
            memory.add(gpu.info.devmem, u.mem_mib, stranded);
            let cores = match gpu.vendor {
                Vendor::Amd => &mut amd_cus,
                Vendor::Nvidia => &mut nvidia_cores,
            };
            cores.add(u64::from(gpu.info.devcore), u.cores, stranded);
        }
        if node_busy {
            nodes_used += 1;
        }
    }
    for c in [&mut memory, &mut amd_cus, &mut nvidia_cores] {
        c.finish();
    }
    PolicyReport {
        gpu_policy: gpu_policy_name.to_owned(),
        node_policy: node_policy_name(run.node_policy).to_owned(),
        placed,
        unplaceable,
        no_gpu,
        evicted,
        preemptions: run.preemptions.clone(),
        evicted_reasons,
        workloads: per_workload,
        reasons,
        nodes_used,
        gpus_busy,
        gpus_partial,
        memory,
        amd_cus,
        nvidia_cores,
        placements,
    }
}

fn tally<'a>(into: &mut BTreeMap<&'a str, (usize, Vec<String>)>, reason: &'a str, pod: String) {
    let entry = into.entry(reason).or_default();
    entry.0 += 1;
    if entry.1.len() < NAMED_PODS {
        entry.1.push(pod);
    }
}

/// The groups, the most pods first (then by message, so reports compare exactly).
fn groups(tallied: BTreeMap<&str, (usize, Vec<String>)>) -> Vec<ReasonGroup> {
    let mut out: Vec<ReasonGroup> = tallied
        .into_iter()
        .map(|(reason, (count, pods))| ReasonGroup {
            reason: reason.to_owned(),
            count,
            pods,
        })
        .collect();
    out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
    out
}

/// "`pod` (priority p) preempts a, b on node n", one line per preemption, then what
/// became of each victim; what `hami plan` prints and the web UI shows.
pub fn preemption_lines(p: &Preemption) -> Vec<String> {
    let victims: Vec<&str> = p.victims.iter().map(|v| v.pod.as_str()).collect();
    let mut lines = vec![format!(
        "pod {} (priority {}) preempts {} on node {}",
        p.pod,
        p.priority,
        victims.join(", "),
        p.node
    )];
    for v in &p.victims {
        lines.push(match &v.replaced_on {
            Some(node) => format!("{} (priority {}) placed again on {node}", v.pod, v.priority),
            None => format!(
                "{} (priority {}) unplaceable after preemption",
                v.pod, v.priority
            ),
        });
    }
    lines
}

/// The JSON form (placements included).
pub fn render_json(report: &PlanReport) -> String {
    serde_json::to_string_pretty(report).unwrap_or_default()
}

/// The table form; `placements` adds every pod's node and GPUs.
pub fn render_table(report: &PlanReport, placements: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "What-if plan {}: {} nodes, {} GPUs, {} pods",
        report.scenario, report.nodes, report.gpus, report.pods
    );
    let has_nvidia = report.policies.iter().any(|p| p.nvidia_cores.total > 0);
    let preempting = report.policies.iter().any(|p| !p.preemptions.is_empty());
    let mut header = vec![
        "GPU POLICY",
        "NODE POLICY",
        "PLACED",
        "UNPLACEABLE",
        "NODES USED",
        "GPUS BUSY",
        "PARTIAL GPUS",
        "MEM UTIL",
        "CU UTIL",
    ];
    if preempting {
        header.insert(4, "EVICTED");
    }
    if has_nvidia {
        header.push("NV CORE UTIL");
    }
    header.extend(["STRANDED MEM", "MEM FRAG", "CU FRAG"]);
    let mut rows = vec![header.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()];
    for p in &report.policies {
        let mut row = vec![
            p.gpu_policy.clone(),
            p.node_policy.clone(),
            p.placed.to_string(),
            p.unplaceable.to_string(),
            format!("{}/{}", p.nodes_used, report.nodes),
            format!("{}/{}", p.gpus_busy, report.gpus),
            p.gpus_partial.to_string(),
            format!("{:.1}%", p.memory.utilization_pct),
            format!("{:.1}%", p.amd_cus.utilization_pct),
        ];
        if preempting {
            row.insert(4, p.evicted.to_string());
        }
        if has_nvidia {
            row.push(format!("{:.1}%", p.nvidia_cores.utilization_pct));
        }
        row.extend([
            mib(p.memory.stranded),
            format!("{:.1}%", p.memory.fragmentation_pct),
            format!("{:.1}%", p.amd_cus.fragmentation_pct),
        ]);
        rows.push(row);
    }
    out.push('\n');
    out.push_str(&table(&rows));
    for p in &report.policies {
        let label = format!("{}/{}", p.gpu_policy, p.node_policy);
        if p.no_gpu > 0 {
            let _ = writeln!(
                out,
                "\n{label}: {} pods ask for no GPU (left to kube-scheduler)",
                p.no_gpu
            );
        }
        reason_groups(&mut out, &format!("{label}: unplaceable pods"), &p.reasons);
        if !p.preemptions.is_empty() {
            let _ = writeln!(out, "\n{label}: preemptions");
            for pre in &p.preemptions {
                let lines = preemption_lines(pre);
                let _ = writeln!(out, "  {}", lines[0]);
                for line in &lines[1..] {
                    let _ = writeln!(out, "    {line}");
                }
            }
        }
        let heading = format!("{label}: unplaceable after preemption");
        reason_groups(&mut out, &heading, &p.evicted_reasons);
        if placements && !p.placements.is_empty() {
            let _ = writeln!(out, "\n{label}: placements");
            let mut rows = vec![vec![
                "POD".to_owned(),
                "NODE".to_owned(),
                "GPU".to_owned(),
                "MEMORY".to_owned(),
                "CORES".to_owned(),
            ]];
            for pl in &p.placements {
                for (i, d) in pl.devices.iter().enumerate() {
                    let (pod, node) = if i == 0 {
                        (pl.pod.clone(), pl.node.clone())
                    } else {
                        (String::new(), String::new())
                    };
                    rows.push(vec![
                        pod,
                        node,
                        d.id.clone(),
                        format!("{} MiB", d.mem_mib),
                        d.cores.to_string(),
                    ]);
                }
            }
            out.push_str(&indent(&table(&rows)));
        }
    }
    if !placements {
        out.push_str(
            "\n(--placements lists every pod's node and GPUs; --output json gives all of it)\n",
        );
    }
    out
}

/// A heading and one line per group, none when there is no group.
fn reason_groups(out: &mut String, heading: &str, groups: &[ReasonGroup]) {
    if groups.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n{heading}");
    for r in groups {
        let more = if r.count > r.pods.len() {
            format!(" and {} more", r.count - r.pods.len())
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  {} pod(s) ({}{more}): {}",
            r.count,
            r.pods.join(", "),
            r.reason
        );
    }
}

/// MiB for people: MiB below 10 GiB, then GiB, then TiB (JSON keeps exact MiB).
fn mib(value: u64) -> String {
    const GIB: u64 = 1024;
    const TIB: u64 = 1024 * 1024;
    if value < 10 * GIB {
        format!("{value} MiB")
    } else if value < 10 * TIB {
        format!("{:.1} GiB", value as f64 / GIB as f64)
    } else {
        format!("{:.1} TiB", value as f64 / TIB as f64)
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// Left-aligned columns separated by two spaces.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let _ = write!(line, "{cell:<width$}  ", width = widths[c]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_protocol::node_register::DeviceInfo;
    use hami_protocol::requests::MemoryRequest;

    fn gpu(devmem: u64, devcore: u32, count: u32) -> Gpu {
        Gpu {
            vendor: Vendor::Amd,
            info: DeviceInfo {
                id: "g".into(),
                count,
                devmem,
                devcore,
                device_type: "AMD X".into(),
                health: true,
                ..Default::default()
            },
        }
    }

    fn slice(mib: u64, pct: u32) -> (Vendor, DeviceRequest) {
        (
            Vendor::Amd,
            DeviceRequest {
                count: 1,
                memory: MemoryRequest::Mib(mib),
                cores_percent: pct,
                priority: None,
                added_limits: Vec::new(),
            },
        )
    }

    #[test]
    fn stranded_when_no_slice_fits() {
        let g = gpu(1000, 100, 4);
        let slices = [slice(400, 25)];
        let u = |used, mem, cores| GpuUsage {
            used,
            mem_mib: mem,
            cores,
        };
        assert!(takes_a_slice(&g, &u(1, 600, 25), &slices));
        // 300 MiB free < 400 asked.
        assert!(!takes_a_slice(&g, &u(1, 700, 25), &slices));
        // CUs exhausted though memory is free.
        assert!(!takes_a_slice(&g, &u(1, 100, 80), &slices));
        // Share slots exhausted.
        assert!(!takes_a_slice(&g, &u(4, 100, 40), &slices));
        // A smaller slice of another workload still fits.
        assert!(takes_a_slice(
            &g,
            &u(1, 700, 25),
            &[slice(400, 25), slice(100, 10)]
        ));
        let mut c = Capacity::default();
        c.add(1000, 700, true);
        c.add(1000, 0, false);
        c.finish();
        assert_eq!(c.stranded, 300);
        assert_eq!(c.utilization_pct, 35.0);
        assert_eq!(c.fragmentation_pct, 23.1);
    }

    #[test]
    fn mib_for_people() {
        assert_eq!(mib(0), "0 MiB");
        assert_eq!(mib(10239), "10239 MiB");
        assert_eq!(mib(266_240), "260.0 GiB");
        assert_eq!(mib(130_752_000), "124.7 TiB");
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(&[
            vec!["A".into(), "BB".into()],
            vec!["CCC".into(), "D".into()],
        ]);
        assert_eq!(t, "A    BB\nCCC  D\n");
    }
}
