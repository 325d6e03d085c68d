//! Which cgroup directory is a pod's, and how long the dmem writer waits for it (pure).
//! [`crate::dmem`] walks the hierarchy and asks [`entry_kind`] of each real directory it
//! meets, level by level, at most [`SEARCH_DEPTH`] levels down; it asks
//! [`CgroupWait::after_miss`] whether to look again after a search that found nothing.
//! The layouts are in `dmem`'s module doc.

use std::time::{Duration, Instant};

/// How many levels below the cgroup root are searched (kubelet's `--cgroup-root` may add
/// levels above `kubepods`; the pod cgroup is at most three below `kubepods`).
pub const SEARCH_DEPTH: usize = 5;

/// How often the writer looks again for a pod cgroup not created yet.
pub const POLL: Duration = Duration::from_millis(50);

/// Whether a cgroup directory name is the pod cgroup of `pod_uid` (both drivers).
pub fn is_pod_cgroup_name(name: &str, pod_uid: &str) -> bool {
    let plain = format!("pod{pod_uid}");
    let systemd = format!("-pod{}.slice", pod_uid.replace('-', "_"));
    name == plain || (name.starts_with("kubepods") && name.ends_with(&systemd))
}

/// What a directory met in the search is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// The pod's cgroup: the search ends.
    Pod,
    /// A level that may hold pod cgroups (`kube*`, `*.slice`, the cgroupfs QoS levels).
    Descend,
    /// Anything else (container cgroups, other services): not searched.
    Skip,
}

/// What the directory `name` is, searching for `pod_uid`'s cgroup.
pub fn entry_kind(name: &str, pod_uid: &str) -> EntryKind {
    if is_pod_cgroup_name(name, pod_uid) {
        EntryKind::Pod
    } else if name.starts_with("kube")
        || name.ends_with(".slice")
        || name == "burstable"
        || name == "besteffort"
    {
        EntryKind::Descend
    } else {
        EntryKind::Skip
    }
}

/// The wait for a pod cgroup that kubelet creates after Allocate returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupWait {
    deadline: Instant,
}

impl CgroupWait {
    /// A wait started at `now` that gives up after `timeout`.
    pub fn new(now: Instant, timeout: Duration) -> Self {
        CgroupWait {
            deadline: now + timeout,
        }
    }

    /// After a search at `now` found no cgroup: how long to sleep before searching again,
    /// or `None` to give up (the deadline has come).
    pub fn after_miss(&self, now: Instant) -> Option<Duration> {
        (now < self.deadline).then_some(POLL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UID: &str = "8f1b2c3d-1111-2222-3333-444455556666";

    #[test]
    fn pod_cgroups_of_both_drivers_and_the_levels_above_them() {
        let systemd = format!("kubepods-burstable-pod{}.slice", UID.replace('-', "_"));
        assert_eq!(entry_kind(&systemd, UID), EntryKind::Pod);
        let guaranteed = format!("kubepods-pod{}.slice", UID.replace('-', "_"));
        assert_eq!(entry_kind(&guaranteed, UID), EntryKind::Pod);
        assert_eq!(entry_kind(&format!("pod{UID}"), UID), EntryKind::Pod);
        for level in [
            "kubepods.slice",
            "kubepods-besteffort.slice",
            "kubepods",
            "burstable",
            "besteffort",
            "machine.slice",
        ] {
            assert_eq!(entry_kind(level, UID), EntryKind::Descend, "{level}");
        }
        // Another pod's cgroup is a level like any `kubepods*.slice`, never a match.
        let other = "kubepods-burstable-pod00000000_0000_0000_0000_000000000000.slice";
        assert_eq!(entry_kind(other, UID), EntryKind::Descend);
        for skipped in [
            "cri-containerd-0123456789ab.scope",
            "crio-conmon-0123456789ab.scope",
            "0123456789abcdef",
            "system.service",
            // The systemd name outside `kubepods*` is not kubelet's.
            &format!("x-pod{}.slice", UID.replace('-', "_"))[..],
        ] {
            let kind = entry_kind(skipped, UID);
            assert_ne!(kind, EntryKind::Pod, "{skipped}");
        }
        assert_eq!(
            entry_kind("cri-containerd-0123456789ab.scope", UID),
            EntryKind::Skip
        );
    }

    #[test]
    fn the_wait_polls_until_its_deadline() {
        let t0 = Instant::now();
        let wait = CgroupWait::new(t0, Duration::from_secs(1));
        assert_eq!(wait.after_miss(t0), Some(POLL));
        assert_eq!(wait.after_miss(t0 + Duration::from_millis(999)), Some(POLL));
        assert_eq!(wait.after_miss(t0 + Duration::from_secs(1)), None);
        assert_eq!(CgroupWait::new(t0, Duration::ZERO).after_miss(t0), None);
    }

    proptest! {
        /// A container cgroup (`cri-containerd-*.scope`, `crio-*`, a bare id) is never
        /// taken for the pod's, whatever the uid.
        #[test]
        fn container_cgroups_are_never_the_pod(uid in "[0-9a-f-]{1,36}", id in "[0-9a-f]{12,64}") {
            for name in [format!("cri-containerd-{id}.scope"), format!("crio-{id}.scope"), id.clone()] {
                prop_assert_ne!(entry_kind(&name, &uid), EntryKind::Pod);
            }
        }
    }
}
