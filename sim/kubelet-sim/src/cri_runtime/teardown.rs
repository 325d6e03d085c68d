//! A pod that is gone or finished, torn down in the background as kubelet's pod killer
//! does: containers stopped (their grace period) and removed, then the sandbox, its
//! emptyDir volumes and its pod cgroup.

use std::path::Path;

use hami_cri_api::v1 as cri;

use super::{CriPod, CriRuntime, Step, call};

impl CriRuntime {
    /// Tears `p` down on a task of its own (kept to be awaited at shutdown): a pod with a
    /// long grace period holds up no other pod.
    pub(super) fn teardown(&mut self, p: CriPod, grace: i64) {
        let mut runtime = self.cri.runtime.clone();
        let volumes = self.dir.join(&p.pod.uid);
        let ids: Vec<String> = p
            .init
            .iter()
            .chain(p.apps.iter())
            .filter_map(|(_, s)| match s {
                Step::Created(id) => Some(id.clone()),
                _ => None,
            })
            .collect();
        let (sandbox, cgroup_parent, pod) = (p.sandbox.clone(), p.cgroup_parent.clone(), p.pod);
        self.teardowns.push(tokio::spawn(async move {
            for id in &ids {
                if let Err(e) = call(
                    "StopContainer",
                    runtime.stop_container(cri::StopContainerRequest {
                        container_id: id.clone(),
                        timeout: grace,
                    }),
                )
                .await
                {
                    tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), "{e}");
                }
                let _ = call(
                    "RemoveContainer",
                    runtime.remove_container(cri::RemoveContainerRequest {
                        container_id: id.clone(),
                    }),
                )
                .await;
            }
            if let Some(sandbox) = sandbox {
                let _ = call(
                    "StopPodSandbox",
                    runtime.stop_pod_sandbox(cri::StopPodSandboxRequest {
                        pod_sandbox_id: sandbox.clone(),
                    }),
                )
                .await;
                if let Err(e) = call(
                    "RemovePodSandbox",
                    runtime.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                        pod_sandbox_id: sandbox,
                    }),
                )
                .await
                {
                    tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), "{e}");
                }
            }
            let _ = std::fs::remove_dir_all(&volumes);
            remove_pod_cgroup(&cgroup_parent);
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), "pod's containers and sandbox removed");
        }));
    }
}

/// Removes the pod cgroup runc made as the containers' parent, in every hierarchy (an
/// empty directory only: `rmdir`), as kubelet removes a gone pod's cgroup.
fn remove_pod_cgroup(cgroup_parent: &str) {
    let rel = cgroup_parent.trim_start_matches('/');
    if rel.is_empty() || rel.contains("..") || !rel.contains("pod") {
        return;
    }
    let root = Path::new("/sys/fs/cgroup");
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let mut dirs = vec![root.join(rel)];
    dirs.extend(entries.flatten().map(|e| e.path().join(rel)));
    for d in dirs {
        let _ = std::fs::remove_dir(d);
    }
}
