//! Can pod cgroups on this node get `dmem.max`? (issue 26 item 10), the pure decision.
//!
//! A cgroup has `dmem.max` only when its parent lists `dmem` in `cgroup.subtree_control`,
//! which the parent may do only when *its* parent does, up to the root: so every pod cgroup
//! gets it exactly when the root, each level down to kubelet's `kubepods` cgroup, `kubepods`
//! itself and its QoS levels (`burstable`/`besteffort`, or `kubepods-burstable.slice`/
//! `kubepods-besteffort.slice`) all list `dmem` there. Kubelet's cgroup library (runc's
//! `CreateCgroupPath`, both drivers) writes every controller the root's `cgroup.controllers`
//! lists into each ancestor as it creates a pod cgroup, so this normally holds on a kernel
//! with the controller; it does not where kubelet's view of the root differs from the host's
//! (a nested or containerised kubelet) or after someone removed it. systemd knows no `dmem`
//! controller, so it neither enables nor removes it (`Delegate=` cannot turn it on).
//!
//! [`decide`] judges the levels as read (the plugin's `dmem_delegation::read_delegation`, the
//! shell, finds and reads them, read-only); [`change_event`] says what a change is worth telling; [`annotation_value`]
//! is what the node's `hami.io/amd-dmem` annotation says.

use std::path::Path;

use crate::health_events::GpuEvent;
use crate::pod_cgroup::SEARCH_DEPTH;

/// The node annotation that says whether pod cgroups can get `dmem.max` (values:
/// [`annotation_value`]).
pub const ANNOTATION: &str = "hami.io/amd-dmem";

/// Node Event reason: the kernel has no dmem controller (root `cgroup.controllers`).
pub const REASON_UNAVAILABLE: &str = "AMDGPUDmemUnavailable";
/// Node Event reason: some level above the pod cgroups does not delegate dmem.
pub const REASON_NOT_DELEGATED: &str = "AMDGPUDmemNotDelegated";
/// Node Event reason: kubelet's `kubepods` cgroup was not found, nothing could be checked.
pub const REASON_UNCHECKED: &str = "AMDGPUDmemUnchecked";
/// Node Event reason: pod cgroups get `dmem.max` again after they did not.
pub const REASON_DELEGATED: &str = "AMDGPUDmemDelegated";

/// One cgroup directory above the pod cgroups, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLevel {
    /// Path relative to the cgroup root (`""` for the root itself).
    pub rel: String,
    /// The contents of its `cgroup.subtree_control`; `None` when it could not be read.
    pub subtree_control: Option<String>,
}

/// Whether pod cgroups on this node can get `dmem.max`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DmemDelegation {
    /// Every level above the pod cgroups enables dmem: each pod cgroup has `dmem.max`.
    Delegated,
    /// The root's `cgroup.controllers` does not list dmem (kernel older than 6.14, built
    /// without `CONFIG_CGROUP_DMEM`, `cgroup_disable=dmem`, or no cgroup v2 root here).
    Absent,
    /// No `kubepods` cgroup under the root within [`SEARCH_DEPTH`] levels: kubelet has not
    /// made it yet, or runs with `--cgroups-per-qos=false` or another cgroup root.
    NoKubepods,
    /// These levels (relative paths, top-down; `""` is the root) do not list dmem in
    /// `cgroup.subtree_control`: writing `+dmem` into each, in this order, fixes it.
    Missing(Vec<String>),
}

/// Judges the levels from the root down to `kubepods` and its QoS levels (`levels`, root
/// first; empty when no `kubepods` was found), given the root's `cgroup.controllers`
/// (`None` when unreadable).
pub fn decide(root_controllers: Option<&str>, levels: &[CgroupLevel]) -> DmemDelegation {
    if !root_controllers.is_some_and(lists_dmem) {
        return DmemDelegation::Absent;
    }
    if levels.is_empty() {
        return DmemDelegation::NoKubepods;
    }
    let missing: Vec<String> = levels
        .iter()
        .filter(|l| !l.subtree_control.as_deref().is_some_and(lists_dmem))
        .map(|l| l.rel.clone())
        .collect();
    if missing.is_empty() {
        DmemDelegation::Delegated
    } else {
        DmemDelegation::Missing(missing)
    }
}

fn lists_dmem(controllers: &str) -> bool {
    controllers.split_whitespace().any(|c| c == "dmem")
}

/// Whether a directory is kubelet's top cgroup for pods (both drivers).
pub fn is_kubepods(name: &str) -> bool {
    name == "kubepods" || name == "kubepods.slice"
}

/// Whether a directory below `kubepods` is a QoS level (pods of that class live in it).
pub fn is_qos_level(name: &str) -> bool {
    matches!(
        name,
        "burstable" | "besteffort" | "kubepods-burstable.slice" | "kubepods-besteffort.slice"
    )
}

/// How a level is named to a person: its path as this plugin sees it.
fn shown(root: &Path, rel: &str) -> String {
    if rel.is_empty() {
        root.display().to_string()
    } else {
        root.join(rel).display().to_string()
    }
}

/// The value of [`ANNOTATION`]: `delegated`, `absent`, `unchecked`, or
/// `not-delegated:<rel>,<rel>` (levels relative to the cgroup root, `/` for the root).
pub fn annotation_value(state: &DmemDelegation) -> String {
    match state {
        DmemDelegation::Delegated => "delegated".into(),
        DmemDelegation::Absent => "absent".into(),
        DmemDelegation::NoKubepods => "unchecked".into(),
        DmemDelegation::Missing(levels) => {
            let names: Vec<&str> = levels
                .iter()
                .map(|l| if l.is_empty() { "/" } else { l.as_str() })
                .collect();
            format!("not-delegated:{}", names.join(","))
        }
    }
}

/// A one-line description of `state` (logs and Events), naming what to fix.
pub fn describe(state: &DmemDelegation, root: &Path) -> String {
    const HOOK_ONLY: &str = "device memory of slices is limited by the libamvgpu.so hook only (docs/install.md, \"dmem\")";
    match state {
        DmemDelegation::Delegated => format!(
            "pod cgroups under {} get dmem.max: the dmem limit applies",
            root.display()
        ),
        DmemDelegation::Absent => format!(
            "the dmem cgroup controller is absent on this node ({}/cgroup.controllers does not list dmem: kernel older than 6.14, or the controller is not enabled): {HOOK_ONLY}",
            root.display()
        ),
        DmemDelegation::NoKubepods => format!(
            "no kubepods cgroup (kubepods or kubepods.slice) within {SEARCH_DEPTH} levels of {}: whether pod cgroups get dmem.max is unchecked (is --cgroup-root the host's cgroup v2 root?)",
            root.display()
        ),
        DmemDelegation::Missing(levels) => {
            let dirs: Vec<String> = levels.iter().map(|l| shown(root, l)).collect();
            format!(
                "pod cgroups cannot get dmem.max: cgroup.subtree_control of {} does not list dmem; write +dmem into each, in this order; until then {HOOK_ONLY}",
                dirs.join(", ")
            )
        }
    }
}

/// The Node Event a check's outcome is worth, given the previous one (`None` at the
/// first check): a problem when it starts or changes, a recovery when it ends, nothing
/// while it stays (a healthy first check is not news).
pub fn change_event(
    previous: Option<&DmemDelegation>,
    now: &DmemDelegation,
    root: &Path,
) -> Option<GpuEvent> {
    if previous == Some(now) {
        return None;
    }
    let (reason, kind) = match now {
        DmemDelegation::Delegated => {
            previous?;
            (REASON_DELEGATED, "Normal")
        }
        DmemDelegation::Absent => (REASON_UNAVAILABLE, "Warning"),
        DmemDelegation::NoKubepods => (REASON_UNCHECKED, "Warning"),
        DmemDelegation::Missing(_) => (REASON_NOT_DELEGATED, "Warning"),
    };
    Some(GpuEvent {
        reason,
        kind,
        message: describe(now, root),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn level(rel: &str, control: Option<&str>) -> CgroupLevel {
        CgroupLevel {
            rel: rel.into(),
            subtree_control: control.map(str::to_owned),
        }
    }

    #[test]
    fn every_level_must_delegate() {
        let all = "cpuset cpu io memory pids dmem";
        let levels = [
            level("", Some(all)),
            level("kubepods.slice", Some("cpu memory pids")),
            level("kubepods.slice/kubepods-burstable.slice", None),
            level("kubepods.slice/kubepods-besteffort.slice", Some(all)),
        ];
        assert_eq!(
            decide(Some(all), &levels),
            DmemDelegation::Missing(vec![
                "kubepods.slice".into(),
                "kubepods.slice/kubepods-burstable.slice".into()
            ])
        );
        let full: Vec<_> = levels.iter().map(|l| level(&l.rel, Some(all))).collect();
        assert_eq!(decide(Some(all), &full), DmemDelegation::Delegated);
        // A name that merely contains dmem is not dmem.
        assert_eq!(
            decide(Some("cpu dmemx"), &full),
            DmemDelegation::Absent,
            "root must list dmem itself"
        );
        assert_eq!(decide(None, &full), DmemDelegation::Absent);
        assert_eq!(decide(Some(all), &[]), DmemDelegation::NoKubepods);
    }

    #[test]
    fn annotation_and_message_name_the_levels() {
        let state = DmemDelegation::Missing(vec!["".into(), "kubepods".into()]);
        assert_eq!(annotation_value(&state), "not-delegated:/,kubepods");
        let text = describe(&state, Path::new("/sys/fs/cgroup"));
        assert!(
            text.contains("/sys/fs/cgroup, /sys/fs/cgroup/kubepods does not list dmem"),
            "{text}"
        );
        assert!(text.contains("write +dmem"), "{text}");
        assert_eq!(annotation_value(&DmemDelegation::Delegated), "delegated");
    }

    #[test]
    fn events_on_changes_only() {
        let root = Path::new("/sys/fs/cgroup");
        let missing = DmemDelegation::Missing(vec!["kubepods".into()]);
        let ok = DmemDelegation::Delegated;
        assert_eq!(change_event(None, &ok, root), None);
        assert_eq!(
            change_event(None, &missing, root).unwrap().reason,
            REASON_NOT_DELEGATED
        );
        assert_eq!(change_event(Some(&missing), &missing, root), None);
        let other = DmemDelegation::Missing(vec!["kubepods/burstable".into()]);
        assert_eq!(
            change_event(Some(&missing), &other, root).unwrap().reason,
            REASON_NOT_DELEGATED
        );
        let back = change_event(Some(&missing), &ok, root).unwrap();
        assert_eq!((back.reason, back.kind), (REASON_DELEGATED, "Normal"));
        assert_eq!(
            change_event(None, &DmemDelegation::Absent, root)
                .unwrap()
                .reason,
            REASON_UNAVAILABLE
        );
        assert_eq!(
            change_event(None, &DmemDelegation::NoKubepods, root)
                .unwrap()
                .reason,
            REASON_UNCHECKED
        );
    }

    proptest! {
        /// Delegated exactly when the root lists dmem and every level's subtree_control
        /// does; otherwise the missing levels are exactly those that do not, in order.
        #[test]
        fn delegated_iff_every_level_lists_dmem(
            root_has in any::<bool>(),
            levels in prop::collection::vec(
                (any::<bool>(), prop::option::of("[a-z ]{0,12}")), 1..6),
        ) {
            let root = if root_has { "cpu dmem" } else { "cpu memory" };
            let levels: Vec<CgroupLevel> = levels
                .iter()
                .enumerate()
                .map(|(i, (has, other))| CgroupLevel {
                    rel: format!("l{i}"),
                    subtree_control: other.as_ref().map(|o| {
                        if *has { format!("{o} dmem") } else { o.replace("dmem", "") }
                    }),
                })
                .collect();
            let lacking: Vec<String> = levels
                .iter()
                .filter(|l| !l.subtree_control.as_deref().is_some_and(|c| c.split_whitespace().any(|w| w == "dmem")))
                .map(|l| l.rel.clone())
                .collect();
            let got = decide(Some(root), &levels);
            if !root_has {
                prop_assert_eq!(got, DmemDelegation::Absent);
            } else if lacking.is_empty() {
                prop_assert_eq!(got, DmemDelegation::Delegated);
            } else {
                prop_assert_eq!(got, DmemDelegation::Missing(lacking));
            }
        }
    }
}
