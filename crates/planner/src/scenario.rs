//! The scenario file: a fleet (node groups whose GPUs come from a real KFD capture or are
//! described inline), a workload list (pod templates written as normal pod YAML, each with
//! a count) and the policies to compare.
//!
//! Parsing is strict: unknown fields (in our part of the file *and* in the pod templates,
//! where k8s-openapi would silently drop them) and bad values are refused with the field's
//! path and what to write instead, so a typo never turns into a plan of the wrong thing.

use std::collections::BTreeSet;

use hami_amd_discovery::registration::{OperatingMode, RegistrationSettings};
use hami_protocol::names::Vendor;
use hami_protocol::selection::{GpuPolicy, NodePolicy};
use hami_scheduler_core::preemption::PREEMPTIBLE_LABEL;
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::Value;

use crate::error::PlanError;

/// A real KFD capture the fleet can be built from (`hami-sysfs-fixtures`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CaptureName {
    /// 8 × MI210, two XGMI hives of four.
    Mi210Xgmi,
    /// 8 × MI300X in CPX mode (63 partitions of 38 CUs).
    Mi300xCpx,
    /// One gfx9 desktop GPU (two KFD nodes).
    OneGpu,
}

impl CaptureName {
    /// Every capture (the names an error lists when one is unknown).
    pub const ALL: [CaptureName; 3] = [
        CaptureName::Mi210Xgmi,
        CaptureName::Mi300xCpx,
        CaptureName::OneGpu,
    ];

    /// The name a scenario file uses.
    pub fn as_str(self) -> &'static str {
        match self {
            CaptureName::Mi210Xgmi => "mi210-xgmi",
            CaptureName::Mi300xCpx => "mi300x-cpx",
            CaptureName::OneGpu => "one-gpu",
        }
    }

    /// Reads a capture name; `None` when there is no such capture.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == text)
    }
}

/// Where a node group's GPUs come from.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuSource {
    /// Discovered from a capture's sysfs tree and registered exactly as the AMD plugin
    /// registers them.
    Capture {
        /// Which capture.
        capture: CaptureName,
        /// How the plugin would register it.
        settings: RegistrationSettings,
    },
    /// Described inline.
    Models(Vec<GpuModel>),
}

/// GPUs described inline: `count` identical cards per node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuModel {
    /// Whose card.
    pub vendor: Vendor,
    /// The registered type, e.g. `AMD Instinct MI300X`.
    pub device_type: String,
    /// Cards per node.
    pub count: u32,
    /// Device memory per card, MiB.
    pub memory_mib: u64,
    /// AMD: compute units; NVIDIA: 100 (percent).
    pub cores: u32,
    /// How many pods may share one card.
    pub share: u32,
    /// NUMA node of the cards (-1 unknown).
    pub numa: i32,
    /// The cards of this model on one node form one XGMI hive (all pairwise peers).
    pub xgmi: bool,
}

/// `count` nodes named `<name>-0`, `<name>-1`, ...
#[derive(Debug, Clone, PartialEq)]
pub struct NodeGroup {
    /// Node name prefix.
    pub name: String,
    /// Nodes in the group.
    pub count: u32,
    /// Their GPUs.
    pub gpus: GpuSource,
}

/// `count` pods made from one template, named `<template name>-0`, ...
///
/// The workload's `priority:` and `preemptible: false` are written into the template as
/// the cluster would carry them (`spec.priority`, label `hami.io/preemptible: "false"`), so
/// the planner's preemption reads the pod exactly as the preempt verb reads a live one.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Pods made from the template.
    pub count: u32,
    /// The template.
    pub pod: Pod,
}

impl Workload {
    /// The template's name (pods are named `<name>-<n>`).
    pub fn name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or_default()
    }

    /// Its pods' priority (`spec.priority`, 0 when unset, as kube-scheduler reads it).
    pub fn priority(&self) -> i32 {
        hami_scheduler_core::preemption::priority(&self.pod)
    }
}

/// One GPU policy to compare, with the text the user wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedGpuPolicy {
    /// The policy as written, e.g. `binpack,numa`.
    pub name: String,
    /// The policy.
    pub policy: GpuPolicy,
}

/// A parsed, validated scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// `name:`, or the file's path when absent.
    pub name: String,
    /// Node groups.
    pub fleet: Vec<NodeGroup>,
    /// Workloads, in arrival order.
    pub workloads: Vec<Workload>,
    /// GPU policies to compare.
    pub gpu_policies: Vec<NamedGpuPolicy>,
    /// Node policies to compare.
    pub node_policies: Vec<NodePolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[serde(default)]
    name: Option<String>,
    fleet: Vec<RawNodeGroup>,
    workloads: Vec<RawWorkload>,
    #[serde(default)]
    policies: Option<RawPolicies>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNodeGroup {
    name: String,
    #[serde(deserialize_with = "whole_number")]
    count: i64,
    #[serde(default)]
    capture: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default, deserialize_with = "some_whole_number")]
    split_count: Option<i64>,
    #[serde(default)]
    memory_scaling: Option<f64>,
    #[serde(default)]
    gpus: Option<Vec<RawGpuModel>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpuModel {
    #[serde(default)]
    vendor: Option<String>,
    #[serde(rename = "type")]
    device_type: String,
    #[serde(deserialize_with = "whole_number")]
    count: i64,
    #[serde(deserialize_with = "whole_number")]
    memory_mib: i64,
    #[serde(default, deserialize_with = "some_whole_number")]
    cus: Option<i64>,
    #[serde(default, deserialize_with = "some_whole_number")]
    share: Option<i64>,
    #[serde(default, deserialize_with = "some_whole_number")]
    numa: Option<i64>,
    #[serde(default)]
    xgmi: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    #[serde(deserialize_with = "whole_number")]
    count: i64,
    #[serde(default, deserialize_with = "some_whole_number")]
    priority: Option<i64>,
    #[serde(default, deserialize_with = "some_bool")]
    preemptible: Option<bool>,
    pod: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicies {
    #[serde(default)]
    gpu: Option<Vec<String>>,
    #[serde(default)]
    node: Option<Vec<String>>,
}

/// An integer field; anything else is refused with a hint rather than serde's "expected i64".
fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let value = Value::deserialize(d)?;
    value.as_i64().ok_or_else(|| {
        serde::de::Error::custom(format!(
            "{value} is not a whole number; write an integer such as 1"
        ))
    })
}

fn some_whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    whole_number(d).map(Some)
}

/// A boolean field; a string such as "no" (YAML 1.1) is refused with a hint.
fn some_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    let value = Value::deserialize(d)?;
    value.as_bool().map(Some).ok_or_else(|| {
        serde::de::Error::custom(format!("{value} is not a boolean; write true or false"))
    })
}

/// The policies compared when the scenario names none.
pub const DEFAULT_GPU_POLICIES: [&str; 2] = ["binpack", "spread"];
/// The node policies compared when the scenario names none.
pub const DEFAULT_NODE_POLICIES: [&str; 2] = ["binpack", "spread"];

/// Parses scenario text; `path` is only used in messages.
pub fn parse_scenario(text: &str, path: &str) -> Result<Scenario, PlanError> {
    let field = |field: String, problem: String| PlanError::Field {
        path: path.to_owned(),
        field,
        problem,
    };
    if text.trim().is_empty() {
        return Err(PlanError::Yaml {
            path: path.to_owned(),
            problem:
                "the file is empty: give fleet: and workloads: (see examples/scenarios/small.yaml)"
                    .into(),
        });
    }
    // YAML 1.2 booleans only: under YAML 1.1 a node group named `n` or `no` would be
    // read as `false` (the file is read untyped first, to name fields by path).
    let options = serde_saphyr::options! { strict_booleans: true };
    let value: Value =
        serde_saphyr::from_str_with_options(text, options).map_err(|e| PlanError::Yaml {
            path: path.to_owned(),
            problem: e.to_string().lines().next().unwrap_or_default().to_owned(),
        })?;
    if !value.is_object() {
        return Err(PlanError::Yaml {
            path: path.to_owned(),
            problem: "the top level must be a mapping with fleet: and workloads:".into(),
        });
    }
    let raw: RawScenario = serde_path_to_error::deserialize(&value).map_err(|e| {
        let at = e.path().to_string();
        field(
            if at == "." { "(top level)".into() } else { at },
            e.into_inner().to_string(),
        )
    })?;

    let mut fleet = Vec::with_capacity(raw.fleet.len());
    let mut names = BTreeSet::new();
    for (i, group) in raw.fleet.into_iter().enumerate() {
        let at = |f: &str| format!("fleet[{i}].{f}");
        let group = node_group(group, &at).map_err(|(f, p)| field(f, p))?;
        if !names.insert(group.name.clone()) {
            return Err(field(
                at("name"),
                format!(
                    "{:?} is used by two node groups; give each its own name (nodes are named <name>-<n>)",
                    group.name
                ),
            ));
        }
        fleet.push(group);
    }
    let mut workloads = Vec::with_capacity(raw.workloads.len());
    let mut pod_names = BTreeSet::new();
    for (i, w) in raw.workloads.into_iter().enumerate() {
        let at = |f: &str| format!("workloads[{i}].{f}");
        let count = count(w.count, "pods of this template").map_err(|p| field(at("count"), p))?;
        let mut pod = pod_template(w.pod).map_err(|(f, p)| field(at(&format!("pod{f}")), p))?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        priorities(&mut pod, w.priority, w.preemptible).map_err(|(f, p)| field(at(f), p))?;
        if !pod_names.insert(name.clone()) {
            return Err(field(
                at("pod.metadata.name"),
                format!(
                    "{name:?} is used by two workloads; give each template its own name (pods are named <name>-<n>)"
                ),
            ));
        }
        workloads.push(Workload { count, pod });
    }
    let (gpu, node) = match raw.policies {
        Some(p) => (p.gpu, p.node),
        None => (None, None),
    };
    let gpu_policies = gpu_policies(gpu.as_deref().unwrap_or(&to_strings(&DEFAULT_GPU_POLICIES)))
        .map_err(|(i, p)| field(format!("policies.gpu[{i}]"), p))?;
    let node_policies = node_policies(
        node.as_deref()
            .unwrap_or(&to_strings(&DEFAULT_NODE_POLICIES)),
    )
    .map_err(|(i, p)| field(format!("policies.node[{i}]"), p))?;
    if gpu_policies.is_empty() {
        return Err(field(
            "policies.gpu".into(),
            "is empty: list at least one GPU policy, e.g. [binpack, spread]".into(),
        ));
    }
    if node_policies.is_empty() {
        return Err(field(
            "policies.node".into(),
            "is empty: list at least one node policy, e.g. [binpack, spread]".into(),
        ));
    }
    Ok(Scenario {
        name: raw.name.unwrap_or_else(|| path.to_owned()),
        fleet,
        workloads,
        gpu_policies,
        node_policies,
    })
}

fn to_strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// GPU policies as the `hami.io/gpu-scheduler-policy` annotation spells them.
pub fn gpu_policies(items: &[String]) -> Result<Vec<NamedGpuPolicy>, (usize, String)> {
    let mut out: Vec<NamedGpuPolicy> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let policy = GpuPolicy::parse(item).map_err(|_| {
            (
                i,
                format!(
                    "{item:?} is not a GPU policy: write binpack, spread or mutex, optionally with numa (e.g. binpack,numa)"
                ),
            )
        })?;
        if !out.iter().any(|p| p.policy == policy) {
            out.push(NamedGpuPolicy {
                name: item.trim().to_owned(),
                policy,
            });
        }
    }
    Ok(out)
}

/// Node policies as the `hami.io/node-scheduler-policy` annotation spells them.
pub fn node_policies(items: &[String]) -> Result<Vec<NodePolicy>, (usize, String)> {
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let policy = NodePolicy::parse(item).map_err(|_| {
            (
                i,
                format!("{item:?} is not a node policy: write binpack or spread"),
            )
        })?;
        if !out.contains(&policy) {
            out.push(policy);
        }
    }
    Ok(out)
}

/// The name a scenario file uses for `policy`.
pub fn node_policy_name(policy: NodePolicy) -> &'static str {
    match policy {
        NodePolicy::Binpack => "binpack",
        NodePolicy::Spread => "spread",
    }
}

fn count(value: i64, what: &str) -> Result<u32, String> {
    if value < 0 {
        return Err(format!(
            "{value} is negative; write how many {what} there are (0 or more)"
        ));
    }
    u32::try_from(value)
        .ok()
        .filter(|v| *v <= 1_000_000)
        .ok_or_else(|| format!("{value} is too large; at most 1000000 {what}"))
}

fn positive(value: i64, what: &str) -> Result<u32, String> {
    if value < 1 {
        return Err(format!("{value} must be at least 1: {what}"));
    }
    u32::try_from(value).map_err(|_| format!("{value} is too large: {what}"))
}

fn valid_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid Kubernetes name: use lower-case letters, digits, '-' and '.', starting with a letter or digit"
        ))
    }
}

type FieldProblem = (String, String);

fn node_group(raw: RawNodeGroup, at: &dyn Fn(&str) -> String) -> Result<NodeGroup, FieldProblem> {
    valid_name(&raw.name).map_err(|p| (at("name"), p))?;
    let count = count(raw.count, "nodes of this kind").map_err(|p| (at("count"), p))?;
    let gpus = match (raw.capture, raw.gpus) {
        (Some(_), Some(_)) => {
            return Err((at("gpus"), "give either capture: or gpus:, not both".into()));
        }
        (None, None) => {
            return Err((
                at("capture"),
                format!(
                    "missing: give capture: (one of {}) or describe the GPUs under gpus:",
                    capture_list()
                ),
            ));
        }
        (Some(capture), None) => {
            let capture = CaptureName::parse(capture.trim()).ok_or_else(|| {
                (
                    at("capture"),
                    format!(
                        "unknown capture {capture:?}; use one of {}, or describe the GPUs inline under gpus:",
                        capture_list()
                    ),
                )
            })?;
            let mut settings = RegistrationSettings::default();
            if let Some(mode) = raw.mode {
                settings.mode = OperatingMode::parse(&mode).map_err(|p| (at("mode"), p))?;
            }
            if let Some(split) = raw.split_count {
                settings.split_count = Some(
                    positive(split, "how many pods may share one GPU")
                        .map_err(|p| (at("split_count"), p))?,
                );
            }
            if let Some(scaling) = raw.memory_scaling {
                if !(scaling.is_finite() && scaling > 0.0) {
                    return Err((
                        at("memory_scaling"),
                        format!(
                            "{scaling} must be a number above 0 (1 = real memory, 2 = oversubscribe twice)"
                        ),
                    ));
                }
                settings.device_memory_scaling = scaling;
            }
            GpuSource::Capture { capture, settings }
        }
        (None, Some(models)) => {
            for (f, set) in [
                ("mode", raw.mode.is_some()),
                ("split_count", raw.split_count.is_some()),
                ("memory_scaling", raw.memory_scaling.is_some()),
            ] {
                if set {
                    return Err((
                        at(f),
                        "only applies to capture: nodes; for inline GPUs set share: and memory_mib: per model".into(),
                    ));
                }
            }
            if models.is_empty() {
                return Err((
                    at("gpus"),
                    "is empty: describe at least one GPU model".into(),
                ));
            }
            let models = models
                .into_iter()
                .enumerate()
                .map(|(j, m)| gpu_model(m, &|f: &str| at(&format!("gpus[{j}].{f}"))))
                .collect::<Result<Vec<_>, _>>()?;
            GpuSource::Models(models)
        }
    };
    Ok(NodeGroup {
        name: raw.name,
        count,
        gpus,
    })
}

fn capture_list() -> String {
    CaptureName::ALL
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn gpu_model(raw: RawGpuModel, at: &dyn Fn(&str) -> String) -> Result<GpuModel, FieldProblem> {
    let vendor = match raw.vendor.as_deref().map(str::trim) {
        None | Some("amd") | Some("AMD") => Vendor::Amd,
        Some("nvidia") | Some("NVIDIA") => Vendor::Nvidia,
        Some(other) => {
            return Err((
                at("vendor"),
                format!("unknown vendor {other:?}; write amd or nvidia"),
            ));
        }
    };
    if !raw.device_type.to_ascii_uppercase().contains(vendor.word()) {
        return Err((
            at("type"),
            format!(
                "{:?} must contain {:?} (the scheduler matches {} GPUs by it), e.g. \"{} {}\"",
                raw.device_type,
                vendor.word(),
                vendor.word(),
                vendor.word(),
                raw.device_type
            ),
        ));
    }
    if raw.device_type.contains([',', ':', ';']) {
        return Err((
            at("type"),
            format!(
                "{:?} contains one of , : ; which pod device lists reserve; rename it",
                raw.device_type
            ),
        ));
    }
    let count = positive(raw.count, "GPUs of this model per node").map_err(|p| (at("count"), p))?;
    let memory_mib = u64::from(
        positive(raw.memory_mib, "device memory per GPU in MiB, e.g. 65536")
            .map_err(|p| (at("memory_mib"), p))?,
    );
    let cores = match (vendor, raw.cus) {
        (Vendor::Amd, Some(cus)) => {
            positive(cus, "compute units per GPU, e.g. 104").map_err(|p| (at("cus"), p))?
        }
        (Vendor::Amd, None) => {
            return Err((
                at("cus"),
                "missing: give the compute units per GPU, e.g. cus: 104".into(),
            ));
        }
        (Vendor::Nvidia, Some(_)) => {
            return Err((
                at("cus"),
                "applies to AMD GPUs only (NVIDIA cores are percent of a card)".into(),
            ));
        }
        (Vendor::Nvidia, None) => 100,
    };
    let share = match raw.share {
        Some(s) => positive(s, "how many pods may share one GPU").map_err(|p| (at("share"), p))?,
        None => 10,
    };
    let numa = match raw.numa {
        None => -1,
        Some(n) => i32::try_from(n).ok().filter(|n| *n >= -1).ok_or_else(|| {
            (
                at("numa"),
                format!("{n}: write a NUMA node number, or -1 for unknown"),
            )
        })?,
    };
    if raw.xgmi && vendor != Vendor::Amd {
        return Err((
            at("xgmi"),
            "applies to AMD GPUs only (NVIDIA links are not modelled)".into(),
        ));
    }
    if raw.xgmi && count > 256 {
        return Err((at("xgmi"), "an XGMI hive has at most 256 GPUs".into()));
    }
    Ok(GpuModel {
        vendor,
        device_type: raw.device_type,
        count,
        memory_mib,
        cores,
        share,
        numa,
        xgmi: raw.xgmi,
    })
}

/// Writes the workload's `priority` and `preemptible` into its template, as the cluster
/// carries them: `spec.priority` (what admission resolves a PriorityClass to) and the label
/// the preempt verb honours.
fn priorities(
    pod: &mut Pod,
    priority: Option<i64>,
    preemptible: Option<bool>,
) -> Result<(), (&'static str, String)> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    if let Some(value) = priority {
        let value = i32::try_from(value).map_err(|_| {
            (
                "priority",
                format!(
                    "{value} is out of range for template {name:?}: a PriorityClass value is an integer from {} to {}",
                    i32::MIN,
                    i32::MAX
                ),
            )
        })?;
        let spec = pod.spec.get_or_insert_with(Default::default);
        match spec.priority {
            Some(set) if set != value => {
                return Err((
                    "priority",
                    format!(
                        "{value} disagrees with the template {name:?}'s spec.priority {set}; give the priority once"
                    ),
                ));
            }
            _ => spec.priority = Some(value),
        }
    }
    if preemptible == Some(false) {
        pod.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(PREEMPTIBLE_LABEL.to_owned(), "false".to_owned());
    }
    Ok(())
}

/// Reads a pod template: k8s-openapi drops fields it does not know, so every field of
/// the input must survive a round trip (or it is a typo, named with its path).
fn pod_template(value: Value) -> Result<Pod, FieldProblem> {
    if let Some(kind) = value.get("kind")
        && kind != "Pod"
    {
        return Err((
            ".kind".into(),
            format!("{kind} is not a pod template: write kind: Pod or leave kind out"),
        ));
    }
    let pod: Pod = serde_path_to_error::deserialize(&value).map_err(|e| {
        let at = e.path().to_string();
        (
            if at == "." {
                String::new()
            } else {
                format!(".{at}")
            },
            e.into_inner().to_string(),
        )
    })?;
    let back = serde_json::to_value(&pod).unwrap_or(Value::Null);
    if let Some(unknown) = first_unknown(&value, &back, String::new()) {
        return Err((
            unknown,
            "unknown field (not part of a Kubernetes Pod); check its spelling".into(),
        ));
    }
    match pod.metadata.name.as_deref() {
        None | Some("") => {
            return Err((
                ".metadata.name".into(),
                "missing: give the template a name (its pods are named <name>-0, <name>-1, ...)"
                    .into(),
            ));
        }
        Some(name) => valid_name(name).map_err(|p| (".metadata.name".into(), p))?,
    }
    if pod.spec.is_none() {
        return Err((
            ".spec".into(),
            "missing: give the pod's containers under spec.containers".into(),
        ));
    }
    Ok(pod)
}

/// The path of the first non-null field of `input` that `back` lacks.
fn first_unknown(input: &Value, back: &Value, path: String) -> Option<String> {
    match (input, back) {
        (Value::Object(a), Value::Object(b)) => a.iter().find_map(|(k, v)| {
            if v.is_null() {
                return None;
            }
            let here = format!("{path}.{k}");
            match b.get(k) {
                None => Some(here),
                Some(bv) => first_unknown(v, bv, here),
            }
        }),
        (Value::Array(a), Value::Array(b)) => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_unknown(x, y, format!("{path}[{i}]"))),
        _ => None,
    }
}

#[cfg(test)]
#[path = "scenario_tests.rs"]
mod tests;
