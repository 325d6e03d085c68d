//! Which cgroup directory is a pod's, and how long the dmem writer waits for it (pure).
//!
//! Kubelet names a pod's cgroup from the pod's QoS class and its cgroup driver, directly
//! below `kubepods` (kubelet's default `--cgroup-root=/`):
//!
//! ```text
//! systemd driver:  kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice
//!                  (Guaranteed: kubepods.slice/kubepods-pod<uid with _>.slice)
//! cgroupfs driver: kubepods/<qos>/pod<uid>   (Guaranteed: kubepods/pod<uid>)
//! ```
//!
//! so the plugin's dmem writer computes the path ([`pod_cgroup_candidates`]) and checks
//! those few directories, never walking the tree. Where the driver is not known it is told
//! by which top directory exists ([`driver_from_top`]); where the QoS class is not known
//! every class's path is a candidate (a pod uid names one cgroup only). [`entry_kind`]
//! names what the delegation check meets on its way down to `kubepods`.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};

/// How many levels below the cgroup root the delegation check looks for `kubepods`
/// (kubelet's `--cgroup-root` may add levels above it).
pub const SEARCH_DEPTH: usize = 5;

/// How often the writer looks again for a pod cgroup not created yet.
pub const POLL: Duration = Duration::from_millis(50);

/// kubelet's `--cgroup-driver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupDriver {
    /// Plain directories: `kubepods/burstable/pod<uid>`.
    Cgroupfs,
    /// systemd slices: `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`.
    Systemd,
}

impl CgroupDriver {
    /// kubelet's top cgroup for pods under this driver, relative to the cgroup root.
    pub fn kubepods(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "kubepods",
            CgroupDriver::Systemd => "kubepods.slice",
        }
    }
}

/// The driver a node uses, told by which of kubelet's top cgroups exists (`kubepods.slice`,
/// `kubepods`): `None` when neither does (kubelet has not started) or both do.
pub fn driver_from_top(systemd_top: bool, cgroupfs_top: bool) -> Option<CgroupDriver> {
    match (systemd_top, cgroupfs_top) {
        (true, false) => Some(CgroupDriver::Systemd),
        (false, true) => Some(CgroupDriver::Cgroupfs),
        _ => None,
    }
}

/// A pod's QoS class, which picks its level under `kubepods`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    /// Directly under `kubepods`.
    Guaranteed,
    /// Under the `burstable` level.
    Burstable,
    /// Under the `besteffort` level.
    BestEffort,
}

impl Qos {
    /// Every class, in the order the writer checks them when the pod's is not known.
    pub const ALL: [Qos; 3] = [Qos::Burstable, Qos::BestEffort, Qos::Guaranteed];

    /// The level's name (`burstable`, `besteffort`); none for Guaranteed.
    fn level(self) -> Option<&'static str> {
        match self {
            Qos::Guaranteed => None,
            Qos::Burstable => Some("burstable"),
            Qos::BestEffort => Some("besteffort"),
        }
    }

    /// kubelet's `GetPodQOS`: `status.qosClass` when the API server set it, else computed
    /// from the containers' cpu and memory requests and limits (`ComputePodQOS`).
    pub fn of_pod(pod: &Pod) -> Qos {
        match pod.status.as_ref().and_then(|s| s.qos_class.as_deref()) {
            Some("Guaranteed") => Qos::Guaranteed,
            Some("Burstable") => Qos::Burstable,
            Some("BestEffort") => Qos::BestEffort,
            _ => pod.spec.as_ref().map_or(Qos::BestEffort, |s| {
                compute_qos(
                    s.containers
                        .iter()
                        .chain(s.init_containers.iter().flatten()),
                )
            }),
        }
    }
}

/// `ComputePodQOS` for cpu and memory: no request or limit anywhere is BestEffort; every
/// container limiting both, with requests (defaulted to the limits) equal, is Guaranteed.
fn compute_qos<'a>(containers: impl Iterator<Item = &'a Container>) -> Qos {
    let (mut any, mut guaranteed, mut none) = (false, true, true);
    for c in containers {
        none = false;
        let res = c.resources.as_ref();
        for name in ["cpu", "memory"] {
            let req = res.and_then(|r| r.requests.as_ref()?.get(name));
            let lim = res.and_then(|r| r.limits.as_ref()?.get(name));
            any |= req.is_some() || lim.is_some();
            guaranteed &= lim.is_some_and(|l| req.is_none_or(|r| r == l));
        }
    }
    if !any {
        Qos::BestEffort
    } else if guaranteed && !none {
        Qos::Guaranteed
    } else {
        Qos::Burstable
    }
}

/// The pod cgroup of `pod_uid` for this driver and class, relative to the cgroup root, as
/// kubelet names it; `None` for a uid that cannot be one directory name (empty, `.`/`..`,
/// or holding `/` or NUL), which is never a pod's.
pub fn pod_cgroup_path(driver: CgroupDriver, qos: Qos, pod_uid: &str) -> Option<String> {
    if pod_uid.is_empty() || pod_uid == "." || pod_uid == ".." || pod_uid.contains(['/', '\0']) {
        return None;
    }
    let top = driver.kubepods();
    Some(match (driver, qos.level()) {
        (CgroupDriver::Cgroupfs, None) => format!("{top}/pod{pod_uid}"),
        (CgroupDriver::Cgroupfs, Some(l)) => format!("{top}/{l}/pod{pod_uid}"),
        (CgroupDriver::Systemd, None) => {
            format!("{top}/kubepods-pod{}.slice", pod_uid.replace('-', "_"))
        }
        (CgroupDriver::Systemd, Some(l)) => format!(
            "{top}/kubepods-{l}.slice/kubepods-{l}-pod{}.slice",
            pod_uid.replace('-', "_")
        ),
    })
}

/// Where the pod cgroup of `pod_uid` may be, relative to the cgroup root: one path when
/// the driver and class are known, one per driver and/or class otherwise (at most six).
pub fn pod_cgroup_candidates(
    driver: Option<CgroupDriver>,
    qos: Option<Qos>,
    pod_uid: &str,
) -> Vec<String> {
    let drivers = match driver {
        Some(d) => vec![d],
        None => vec![CgroupDriver::Systemd, CgroupDriver::Cgroupfs],
    };
    let classes = match qos {
        Some(q) => vec![q],
        None => Qos::ALL.to_vec(),
    };
    drivers
        .iter()
        .flat_map(|&d| classes.iter().map(move |&q| (d, q)))
        .filter_map(|(d, q)| pod_cgroup_path(d, q, pod_uid))
        .collect()
}

/// Whether a cgroup directory name is the pod cgroup of `pod_uid` (both drivers).
pub fn is_pod_cgroup_name(name: &str, pod_uid: &str) -> bool {
    let plain = format!("pod{pod_uid}");
    let systemd = format!("-pod{}.slice", pod_uid.replace('-', "_"));
    name == plain || (name.starts_with("kubepods") && name.ends_with(&systemd))
}

/// What a directory met on the way down to a pod's cgroup is.
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

/// The wait for a pod cgroup that kubelet creates after Allocate returns (bounded).
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

    #[test]
    fn the_pod_cgroup_path_is_kubelets_for_each_driver_and_class() {
        let u = UID.replace('-', "_");
        let cases = [
            (
                CgroupDriver::Cgroupfs,
                Qos::Guaranteed,
                format!("kubepods/pod{UID}"),
            ),
            (
                CgroupDriver::Cgroupfs,
                Qos::Burstable,
                format!("kubepods/burstable/pod{UID}"),
            ),
            (
                CgroupDriver::Cgroupfs,
                Qos::BestEffort,
                format!("kubepods/besteffort/pod{UID}"),
            ),
            (
                CgroupDriver::Systemd,
                Qos::Guaranteed,
                format!("kubepods.slice/kubepods-pod{u}.slice"),
            ),
            (
                CgroupDriver::Systemd,
                Qos::Burstable,
                format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"),
            ),
            (
                CgroupDriver::Systemd,
                Qos::BestEffort,
                format!(
                    "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice"
                ),
            ),
        ];
        for (driver, qos, want) in cases {
            let path = pod_cgroup_path(driver, qos, UID).unwrap();
            assert_eq!(path, want, "{driver:?} {qos:?}");
            // The name the path ends in is the one the delegation check calls the pod's.
            let name = path.rsplit('/').next().unwrap();
            assert_eq!(entry_kind(name, UID), EntryKind::Pod, "{path}");
            assert_eq!(
                pod_cgroup_candidates(Some(driver), Some(qos), UID),
                vec![want]
            );
        }
        // Unknown class: one per class; unknown driver too: one per driver and class.
        assert_eq!(
            pod_cgroup_candidates(Some(CgroupDriver::Systemd), None, UID).len(),
            3
        );
        let all = pod_cgroup_candidates(None, None, UID);
        assert_eq!(all.len(), 6);
        assert!(all.iter().all(|p| p.starts_with("kubepods")), "{all:?}");
    }

    #[test]
    fn a_uid_that_is_not_one_directory_name_has_no_cgroup() {
        for uid in ["", ".", "..", "a/../../etc", "x\0y"] {
            assert_eq!(
                pod_cgroup_path(CgroupDriver::Cgroupfs, Qos::Guaranteed, uid),
                None,
                "{uid:?}"
            );
            assert!(pod_cgroup_candidates(None, None, uid).is_empty(), "{uid:?}");
        }
    }

    #[test]
    fn the_driver_is_told_by_the_one_top_cgroup_that_exists() {
        assert_eq!(driver_from_top(true, false), Some(CgroupDriver::Systemd));
        assert_eq!(driver_from_top(false, true), Some(CgroupDriver::Cgroupfs));
        assert_eq!(driver_from_top(false, false), None);
        assert_eq!(driver_from_top(true, true), None);
        assert_eq!(CgroupDriver::Systemd.kubepods(), "kubepods.slice");
        assert_eq!(CgroupDriver::Cgroupfs.kubepods(), "kubepods");
    }

    #[test]
    fn qos_is_the_servers_else_computed_as_kubelet_does() {
        let pod = |v: serde_json::Value| -> Pod { serde_json::from_value(v).unwrap() };
        let c = |res: serde_json::Value| serde_json::json!({"name": "c", "image": "x", "resources": res});
        let spec = |containers: Vec<serde_json::Value>| {
            pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": containers}}))
        };
        assert_eq!(
            Qos::of_pod(&spec(vec![c(serde_json::json!({}))])),
            Qos::BestEffort
        );
        let both = serde_json::json!({"cpu": "1", "memory": "1Gi"});
        assert_eq!(
            Qos::of_pod(&spec(vec![c(serde_json::json!({"limits": both}))])),
            Qos::Guaranteed
        );
        assert_eq!(
            Qos::of_pod(&spec(vec![c(
                serde_json::json!({"limits": both, "requests": both})
            )])),
            Qos::Guaranteed
        );
        assert_eq!(
            Qos::of_pod(&spec(vec![c(
                serde_json::json!({"requests": {"cpu": "1"}})
            )])),
            Qos::Burstable
        );
        assert_eq!(
            Qos::of_pod(&spec(vec![
                c(serde_json::json!({"limits": both})),
                c(serde_json::json!({})),
            ])),
            Qos::Burstable
        );
        // The server's status.qosClass wins over the spec.
        let mut p = spec(vec![c(serde_json::json!({}))]);
        p.status =
            Some(serde_json::from_value(serde_json::json!({"qosClass": "Guaranteed"})).unwrap());
        assert_eq!(Qos::of_pod(&p), Qos::Guaranteed);
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
