//! Where kubelet and containerd put a pod's cgroups (pure: names only, no I/O).
//!
//! ```text
//! cgroupfs driver: kubepods/<qos>/pod<uid>/<container id>     (Guaranteed: kubepods/pod<uid>/…)
//! systemd driver:  kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice/
//!                  cri-containerd-<container id>.scope
//!                  (Guaranteed: kubepods.slice/kubepods-pod<uid with _>.slice/…)
//! ```
//!
//! `<qos>` is `burstable` or `besteffort`. The pod sandbox (pause container) is a container
//! cgroup like the others, with the id of the container named [`SANDBOX`].

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};

/// The container name the sandbox's id is made from (no real container can have it:
/// container names are lowercase DNS labels).
pub const SANDBOX: &str = "POD";

/// kubelet's `--cgroup-driver` (the flag's values, `cgroupfs` and `systemd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CgroupDriver {
    /// Plain directories (`kubepods/burstable/pod<uid>`).
    Cgroupfs,
    /// systemd slices and scopes (`kubepods.slice/…/kubepods-burstable-pod<uid>.slice`).
    Systemd,
}

/// A pod's QoS class, which picks its level under `kubepods`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    /// Directly under `kubepods`.
    Guaranteed,
    /// Under `kubepods/burstable`.
    Burstable,
    /// Under `kubepods/besteffort`.
    BestEffort,
}

impl Qos {
    /// The lowercase level name (`burstable`, `besteffort`); none for Guaranteed.
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
                compute(
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
fn compute<'a>(containers: impl Iterator<Item = &'a Container>) -> Qos {
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

/// The layout of one node's cgroups (relative to the cgroup root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The node's cgroup driver.
    pub driver: CgroupDriver,
}

impl Layout {
    /// `kubepods` and its QoS levels, parents first: what kubelet creates at start.
    pub fn qos_levels(&self) -> Vec<PathBuf> {
        [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort]
            .into_iter()
            .map(|q| self.level(q))
            .collect()
    }

    fn level(&self, qos: Qos) -> PathBuf {
        match (self.driver, qos.level()) {
            (CgroupDriver::Cgroupfs, None) => "kubepods".into(),
            (CgroupDriver::Cgroupfs, Some(l)) => format!("kubepods/{l}").into(),
            (CgroupDriver::Systemd, None) => "kubepods.slice".into(),
            (CgroupDriver::Systemd, Some(l)) => format!("kubepods.slice/kubepods-{l}.slice").into(),
        }
    }

    /// The pod cgroup of `uid`.
    pub fn pod(&self, qos: Qos, uid: &str) -> PathBuf {
        let name = match (self.driver, qos.level()) {
            (CgroupDriver::Cgroupfs, _) => format!("pod{uid}"),
            (CgroupDriver::Systemd, None) => format!("kubepods-pod{}.slice", uid.replace('-', "_")),
            (CgroupDriver::Systemd, Some(l)) => {
                format!("kubepods-{l}-pod{}.slice", uid.replace('-', "_"))
            }
        };
        self.level(qos).join(name)
    }

    /// The cgroup of container `id` of pod `uid` (containerd's naming).
    pub fn container(&self, qos: Qos, uid: &str, id: &str) -> PathBuf {
        self.pod(qos, uid).join(match self.driver {
            CgroupDriver::Cgroupfs => id.to_owned(),
            CgroupDriver::Systemd => format!("cri-containerd-{id}.scope"),
        })
    }

    /// The pod uid a pod cgroup's directory name carries (`None` for anything else).
    pub fn pod_uid(&self, name: &str) -> Option<String> {
        match self.driver {
            CgroupDriver::Cgroupfs => name.strip_prefix("pod").map(str::to_owned),
            CgroupDriver::Systemd => {
                let rest = name.strip_prefix("kubepods-")?.strip_suffix(".slice")?;
                let uid = rest
                    .strip_prefix("pod")
                    .or_else(|| rest.strip_prefix("burstable-pod"))
                    .or_else(|| rest.strip_prefix("besteffort-pod"))?;
                Some(uid.replace('_', "-"))
            }
        }
        .filter(|u| !u.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const UID: &str = "8f1b2c3d-1111-2222-3333-444455556666";

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn both_drivers_name_every_qos_as_kubelet_and_containerd_do() {
        let fs = Layout {
            driver: CgroupDriver::Cgroupfs,
        };
        let sd = Layout {
            driver: CgroupDriver::Systemd,
        };
        let u = UID.replace('-', "_");
        assert_eq!(
            fs.pod(Qos::Burstable, UID),
            PathBuf::from(format!("kubepods/burstable/pod{UID}"))
        );
        assert_eq!(
            fs.pod(Qos::Guaranteed, UID),
            PathBuf::from(format!("kubepods/pod{UID}"))
        );
        assert_eq!(
            fs.container(Qos::BestEffort, UID, "abc"),
            PathBuf::from(format!("kubepods/besteffort/pod{UID}/abc"))
        );
        assert_eq!(
            sd.pod(Qos::Burstable, UID),
            PathBuf::from(format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"
            ))
        );
        assert_eq!(
            sd.container(Qos::Guaranteed, UID, "abc"),
            PathBuf::from(format!(
                "kubepods.slice/kubepods-pod{u}.slice/cri-containerd-abc.scope"
            ))
        );
        assert_eq!(
            sd.qos_levels(),
            [
                "kubepods.slice",
                "kubepods.slice/kubepods-burstable.slice",
                "kubepods.slice/kubepods-besteffort.slice"
            ]
            .map(PathBuf::from)
        );
        for l in [fs, sd] {
            for q in [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort] {
                let dir = l.pod(q, UID);
                let name = dir.file_name().unwrap().to_str().unwrap();
                assert_eq!(l.pod_uid(name).as_deref(), Some(UID), "{name}");
            }
            // levels and container cgroups carry no uid
            for other in [
                "kubepods-burstable.slice",
                "burstable",
                "cri-containerd-abc.scope",
            ] {
                assert_eq!(l.pod_uid(other), None, "{other}");
            }
        }
    }

    #[test]
    fn qos_is_the_servers_else_computed() {
        let c = |res: serde_json::Value| json!({"name": "c", "image": "i", "resources": res});
        let of = |containers: Vec<serde_json::Value>| {
            Qos::of_pod(&pod(
                json!({"metadata": {}, "spec": {"containers": containers}}),
            ))
        };
        assert_eq!(of(vec![c(json!({}))]), Qos::BestEffort);
        assert_eq!(
            of(vec![c(json!({"limits": {"amd.com/gpu": "1"}}))]),
            Qos::BestEffort
        );
        assert_eq!(
            of(vec![c(json!({"limits": {"cpu": "1", "memory": "1Gi"}}))]),
            Qos::Guaranteed
        );
        assert_eq!(
            of(vec![c(
                json!({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m"}})
            )]),
            Qos::Burstable
        );
        assert_eq!(
            of(vec![
                c(json!({"limits": {"cpu": "1", "memory": "1Gi"}})),
                c(json!({}))
            ]),
            Qos::Burstable
        );
        let stored = pod(
            json!({"metadata": {}, "spec": {"containers": [c(json!({}))]},
            "status": {"qosClass": "Guaranteed"}}),
        );
        assert_eq!(Qos::of_pod(&stored), Qos::Guaranteed);
    }
}
