//! Which pod and container a process belongs to, from `/proc/<pid>/cgroup` (pure).
//!
//! kubelet names a pod's cgroup after its UID (`pod<uid>`, with `_` for `-` under the
//! systemd driver) and the runtime names the container's after its id
//! (`cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`, or `<id>` under the
//! cgroupfs driver). The container id is what `status.containerStatuses[].containerID`
//! carries after `<runtime>://`.

/// A process's pod UID and container id, as its cgroup path names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodContainer {
    /// The pod's UID, with `-` (as the API server writes it).
    pub pod_uid: String,
    /// The runtime's container id.
    pub container_id: String,
}

/// Reads the pod and container of a `/proc/<pid>/cgroup` text (v1 or v2). `None` for
/// processes outside any pod (host daemons) or in a pod's sandbox without a container id.
pub fn pod_container_of(cgroup: &str) -> Option<PodContainer> {
    cgroup.lines().find_map(|line| {
        // `hierarchy-id:controllers:path`; the path may itself contain ':'.
        let path = line.splitn(3, ':').nth(2)?;
        parse_path(path)
    })
}

fn parse_path(path: &str) -> Option<PodContainer> {
    let mut segments = path.split('/').filter(|s| !s.is_empty());
    let mut pod_uid = None;
    for segment in segments.by_ref() {
        if let Some(uid) = pod_uid_of(segment) {
            pod_uid = Some(uid);
            break;
        }
    }
    let pod_uid = pod_uid?;
    let container = segments.next()?;
    let container_id = container_id_of(container)?;
    Some(PodContainer {
        pod_uid,
        container_id,
    })
}

/// `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid_of(segment: &str) -> Option<String> {
    let segment = segment.strip_suffix(".slice").unwrap_or(segment);
    let at = segment.rfind("pod")?;
    if at > 0 && !segment[..at].ends_with('-') {
        return None;
    }
    let uid = segment[at + 3..].replace('_', "-");
    (uid.len() >= 32 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')).then_some(uid)
}

fn container_id_of(segment: &str) -> Option<String> {
    let segment = segment.strip_suffix(".scope").unwrap_or(segment);
    let id = ["cri-containerd-", "crio-", "docker-", "cri-o-"]
        .iter()
        .find_map(|prefix| segment.strip_prefix(prefix))
        .unwrap_or(segment);
    (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
}

/// The id part of `status.containerStatuses[].containerID` (`containerd://<id>`).
pub fn container_id_from_status(container_id: &str) -> &str {
    container_id
        .split_once("://")
        .map_or(container_id, |(_, id)| id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UID: &str = "8f1b2c3d-1111-2222-3333-444455556666";
    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn systemd_driver_v2() {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(
            pod_container_of(&text),
            Some(PodContainer {
                pod_uid: UID.into(),
                container_id: CID.into()
            })
        );
    }

    #[test]
    fn cgroupfs_driver_v1_and_guaranteed_pods() {
        let text = format!(
            "12:pids:/kubepods/besteffort/pod{UID}/{CID}\n11:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
        );
        assert_eq!(pod_container_of(&text).unwrap().container_id, CID);
        let text = format!("0::/kubepods/pod{UID}/{CID}\n");
        assert_eq!(pod_container_of(&text).unwrap().pod_uid, UID);
        let text = format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/crio-{CID}.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(pod_container_of(&text).unwrap().container_id, CID);
    }

    #[test]
    fn host_processes_and_sandboxes_have_no_container() {
        assert_eq!(
            pod_container_of("0::/system.slice/containerd.service\n"),
            None
        );
        assert_eq!(
            pod_container_of("0::/user.slice/user-1000.slice/podman.scope\n"),
            None
        );
        assert_eq!(pod_container_of(&format!("0::/kubepods/pod{UID}\n")), None);
        assert_eq!(pod_container_of(""), None);
    }

    #[test]
    fn status_ids_lose_their_runtime_prefix() {
        assert_eq!(
            container_id_from_status(&format!("containerd://{CID}")),
            CID
        );
        assert_eq!(container_id_from_status(CID), CID);
    }

    proptest! {
        #[test]
        fn never_panics(text in ".{0,300}") {
            let _ = pod_container_of(&text);
        }
    }
}
