//! The hook check in the ledger (issue 29): every workload process of the run is started
//! under its slice's hook, so a monitor that counts one *unhooked* is wrong (or the hook
//! was lost), and a run whose monitors never checked a vendor's pods checked nothing for
//! it. Pure: the monitors' `/metrics` bodies in, findings and coverage out.

use std::collections::{BTreeMap, BTreeSet};

use hami_protocol::scrape::parse_samples;

use crate::ledger::Violation;

/// Processes counted without their slice's hook.
pub const UNHOOKED: &str = "hami_container_unhooked_processes";
/// Processes whose hook could not be told (facts unreadable).
pub const HOOK_UNKNOWN: &str = "hami_container_hook_unknown_processes";

/// `(namespace, pod, container, hook)` of a hook-check series.
pub type HookKey = (String, String, String, String);

/// One container's hook counts as a monitor published them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HookCount {
    /// `hami_container_unhooked_processes`.
    pub unhooked: f64,
    /// `hami_container_hook_unknown_processes`.
    pub unknown: f64,
}

/// The hook-check series of a monitor's `/metrics` body, added into `into`.
pub fn read_hook_series(body: &str, into: &mut BTreeMap<HookKey, HookCount>) {
    for s in parse_samples(body).0 {
        let unhooked = match s.name.as_str() {
            UNHOOKED => true,
            HOOK_UNKNOWN => false,
            _ => continue,
        };
        let label = |k: &str| s.label(k).unwrap_or_default().to_owned();
        let count = into
            .entry((
                label("namespace"),
                label("pod"),
                label("container"),
                label("hook"),
            ))
            .or_default();
        if unhooked {
            count.unhooked += s.value;
        } else {
            count.unknown += s.value;
        }
    }
}

/// A finding per container with a process counted unhooked.
pub fn check_hooks(series: &BTreeMap<HookKey, HookCount>) -> Vec<Violation> {
    series
        .iter()
        .filter(|(_, c)| c.unhooked > 0.0)
        .map(|((ns, pod, container, hook), c)| Violation::Unhooked {
            pod: format!("{ns}/{pod}"),
            container: container.clone(),
            hook: hook.clone(),
            processes: c.unhooked as u64,
        })
        .collect()
}

/// Records which pods each hook was checked in (a series means the monitor matched a GPU
/// process of a sliced container to its pod).
pub fn note_checked(
    series: &BTreeMap<HookKey, HookCount>,
    checked: &mut BTreeMap<String, BTreeSet<String>>,
) {
    for (ns, pod, _, hook) in series.keys() {
        checked
            .entry(hook.clone())
            .or_default()
            .insert(format!("{ns}/{pod}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = "# TYPE hami_container_unhooked_processes gauge\n\
        hami_container_unhooked_processes{namespace=\"default\",pod=\"a\",container=\"main\",hook=\"libvgpu.so\"} 0\n\
        hami_container_hook_unknown_processes{namespace=\"default\",pod=\"a\",container=\"main\",hook=\"libvgpu.so\"} 1\n\
        hami_container_unhooked_processes{namespace=\"default\",pod=\"b\",container=\"main\",hook=\"libamvgpu.so\"} 2\n\
        hami_container_device_memory_bytes{namespace=\"default\",pod=\"c\",container=\"main\",vdevice_index=\"0\"} 5\n";

    #[test]
    fn an_unhooked_process_is_a_violation_and_unknown_is_not() {
        let mut series = BTreeMap::new();
        read_hook_series(BODY, &mut series);
        assert_eq!(series.len(), 2, "{series:?}");
        let found: Vec<String> = check_hooks(&series).iter().map(|v| v.to_string()).collect();
        assert_eq!(
            found,
            [
                "pod default/b container main: 2 processes without libamvgpu.so (its slice is not enforced)"
            ]
        );
    }

    #[test]
    fn coverage_is_per_hook_and_pod() {
        let mut series = BTreeMap::new();
        read_hook_series(BODY, &mut series);
        let mut checked = BTreeMap::new();
        note_checked(&series, &mut checked);
        note_checked(&series, &mut checked);
        assert_eq!(
            checked["libvgpu.so"],
            BTreeSet::from(["default/a".to_owned()])
        );
        assert_eq!(
            checked["libamvgpu.so"],
            BTreeSet::from(["default/b".to_owned()])
        );
        assert!(!checked.contains_key(""));
    }
}
