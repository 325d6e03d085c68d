//! cgroup v2 `dmem` limits (kernel ≥ 6.14): after Allocate returns, the runtime creates the
//! container's cgroup under the pod's; we wait (bounded) for a new child of the pod cgroup
//! and write `drm/<bdf>/vram0 <bytes>` into its `dmem.max`, one region per write.
//! Where the controller is absent we say so once: the hook still limits memory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::allocate_plan::DmemLimit;

/// One container's limits, to apply once its cgroup appears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmemJob {
    pub pod_uid: String,
    pub limits: Vec<DmemLimit>,
    /// Children of the pod cgroup that existed before Allocate (filled by the writer).
    pub existing: Vec<String>,
}

/// Whether the dmem controller is available: the root lists it in `cgroup.controllers`.
pub fn dmem_available(cgroup_root: &Path) -> bool {
    std::fs::read_to_string(cgroup_root.join("cgroup.controllers"))
        .map(|c| c.split_whitespace().any(|w| w == "dmem"))
        .unwrap_or(false)
}

/// The pod's cgroup directory: `pod<uid>` (cgroupfs driver) or `*-pod<uid_with_underscores>.slice`
/// (systemd driver), searched a few levels below the root.
pub fn find_pod_cgroup(cgroup_root: &Path, pod_uid: &str) -> Option<PathBuf> {
    let plain = format!("pod{pod_uid}");
    let systemd = format!("pod{}.slice", pod_uid.replace('-', "_"));
    let mut frontier = vec![cgroup_root.to_path_buf()];
    for _ in 0..4 {
        let mut next = Vec::new();
        for dir in frontier {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if !path.is_dir() {
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                if name == plain || name.ends_with(&systemd) {
                    return Some(path);
                }
                next.push(path);
            }
        }
        frontier = next;
    }
    None
}

fn children(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// Writes the limits into `<cgroup>/dmem.max`.
pub fn write_limits(cgroup: &Path, limits: &[DmemLimit]) -> std::io::Result<()> {
    for limit in limits {
        // One region per write(2), as the kernel interface prefers.
        std::fs::write(
            cgroup.join("dmem.max"),
            format!("{} {}\n", limit.region, limit.bytes),
        )?;
    }
    Ok(())
}

/// Applies one job: wait up to `timeout` for a new container cgroup below the pod's.
pub async fn apply_job(
    cgroup_root: &Path,
    mut job: DmemJob,
    timeout: Duration,
) -> Result<PathBuf, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pod_dir = None;
    loop {
        if pod_dir.is_none() {
            pod_dir = find_pod_cgroup(cgroup_root, &job.pod_uid);
            if let Some(dir) = &pod_dir
                && job.existing.is_empty()
            {
                job.existing = children(dir);
            }
        }
        if let Some(dir) = &pod_dir
            && let Some(new) = children(dir)
                .into_iter()
                .find(|c| !job.existing.contains(c))
        {
            let cgroup = dir.join(new);
            write_limits(&cgroup, &job.limits)
                .map_err(|e| format!("cannot write {}/dmem.max: {e}", cgroup.display()))?;
            return Ok(cgroup);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "no container cgroup of pod {} appeared under {} within {timeout:?}: dmem limit not applied",
                job.pod_uid,
                cgroup_root.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The writer task: applies jobs as they come, or reports once that dmem is absent.
pub fn spawn_writer(
    cgroup_root: PathBuf,
    timeout: Duration,
) -> tokio::sync::mpsc::UnboundedSender<DmemJob> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<DmemJob>();
    tokio::spawn(async move {
        let available = dmem_available(&cgroup_root);
        if !available {
            tracing::warn!(
                root = %cgroup_root.display(),
                "the dmem cgroup controller is absent (kernel < 6.14, or not enabled in cgroup.subtree_control): device memory is limited by the hook only"
            );
        }
        while let Some(job) = rx.recv().await {
            if !available {
                continue;
            }
            let root = cgroup_root.clone();
            tokio::spawn(async move {
                match apply_job(&root, job, timeout).await {
                    Ok(cg) => tracing::info!(cgroup = %cg.display(), "dmem limit applied"),
                    Err(e) => tracing::warn!("{e}"),
                }
            });
        }
    });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn limit_lands_in_the_new_container_cgroup() {
        let root = std::env::temp_dir().join(format!("hami-dmem-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let pod =
            root.join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda_b_c.slice");
        std::fs::create_dir_all(pod.join("old")).unwrap();
        std::fs::write(root.join("cgroup.controllers"), "cpu memory dmem\n").unwrap();
        assert!(dmem_available(&root));
        assert_eq!(
            find_pod_cgroup(&root, "a-b-c").as_deref(),
            Some(pod.as_path())
        );
        let job = DmemJob {
            pod_uid: "a-b-c".into(),
            limits: vec![DmemLimit {
                region: "drm/0000:05:00.0/vram0".into(),
                bytes: 4 << 30,
            }],
            existing: Vec::new(),
        };
        let pod2 = pod.clone();
        let creator = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            std::fs::create_dir_all(pod2.join("cri-containerd-123.scope")).unwrap();
        });
        let cg = apply_job(&root, job.clone(), Duration::from_secs(5))
            .await
            .unwrap();
        creator.await.unwrap();
        assert!(cg.ends_with("cri-containerd-123.scope"));
        assert_eq!(
            std::fs::read_to_string(cg.join("dmem.max")).unwrap(),
            "drm/0000:05:00.0/vram0 4294967296\n"
        );
        // Bounded: nothing appears → a clear error.
        let err = apply_job(
            &root,
            DmemJob {
                pod_uid: "zzz".into(),
                ..job
            },
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
        assert!(err.contains("dmem limit not applied"), "{err}");
        std::fs::write(root.join("cgroup.controllers"), "cpu memory\n").unwrap();
        assert!(!dmem_available(&root));
        let _ = std::fs::remove_dir_all(&root);
    }
}
