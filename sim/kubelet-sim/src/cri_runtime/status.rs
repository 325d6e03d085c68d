//! The pod's status from what containerd says: each container's state, restarts and
//! last state, the phase as kubelet's `getPhase` makes it, posted when it changed; and the
//! running containers as the rest of the node may know them (`KubeletSim::containers`).

use std::collections::BTreeMap;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::{CriPod, CriRuntime, Step};
use crate::container_runtime::{ContainerRecord, parent_of};
use crate::cri_spec::{k8s_container_status, pod_phase};

impl CriRuntime {
    /// The running containers with their init's host pid, as the `unshare` runtime
    /// records its own (its runtime pid: the shim, the init's parent).
    pub(super) fn records(&self) -> Vec<ContainerRecord> {
        let mut out = Vec::new();
        for p in self.pods.values() {
            for (name, step) in p.init.iter().chain(p.apps.iter()) {
                let Step::Created(id) = step else { continue };
                let running = p
                    .states
                    .get(name)
                    .is_some_and(|s| s.get("running").is_some());
                let Some(pid) = p.pids.get(id).copied().filter(|_| running) else {
                    continue;
                };
                out.push(ContainerRecord {
                    pod_uid: p.pod.uid.clone(),
                    namespace: p.pod.namespace.clone(),
                    pod: p.pod.name.clone(),
                    container: name.clone(),
                    container_id: id.clone(),
                    cgroup: format!("/{}", p.layout.container(p.qos, &p.pod.uid, id).display()),
                    init_pid: Some(pid),
                    runtime_pid: parent_of(pid).unwrap_or(pid),
                });
            }
        }
        out
    }

    /// The pod's status now.
    pub(super) fn status_of(&self, p: &CriPod) -> Value {
        let now = Instant::now();
        let statuses = |list: &[(String, Step)], specs: &mut dyn Iterator<Item = &Container>| {
            let images: BTreeMap<&str, &str> = specs
                .map(|c| (c.name.as_str(), c.image.as_deref().unwrap_or("")))
                .collect();
            list.iter()
                .map(|(name, step)| {
                    let (id, state) = match step {
                        Step::Pending => (
                            None,
                            match &p.waiting {
                                Some((reason, message)) => {
                                    json!({"waiting": {"reason": reason, "message": message}})
                                }
                                None => json!({"waiting": {"reason": "PodInitializing"}}),
                            },
                        ),
                        Step::Failed(state) => (None, state.clone()),
                        Step::Created(id) => (
                            Some(id.as_str()),
                            p.states.get(name).cloned().unwrap_or_else(
                                || json!({"waiting": {"reason": "ContainerCreating"}}),
                            ),
                        ),
                    };
                    let image_ref = p.image_refs.get(name).map(String::as_str).unwrap_or("");
                    let r = p.restarts.get(name).cloned().unwrap_or_default();
                    // Ended and waiting out its back-off: kubelet's CrashLoopBackOff, the
                    // ended state as the last one.
                    let (state, last) = match r.not_before {
                        Some(t) if t > now && state.get("terminated").is_some() => (
                            json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!(
                                "back-off {}s restarting failed container={name} pod={}_{}({})",
                                r.backoff.as_secs(), p.pod.name, p.pod.namespace, p.pod.uid)}}),
                            state.get("terminated").cloned(),
                        ),
                        _ => (state, r.last.clone()),
                    };
                    let mut s = k8s_container_status(
                        name,
                        images.get(name.as_str()).copied().unwrap_or(""),
                        id,
                        image_ref,
                        state,
                    );
                    s["restartCount"] = json!(r.count);
                    if let Some(last) = last {
                        s["lastState"] = json!({ "terminated": last });
                    }
                    s
                })
                .collect::<Vec<Value>>()
        };
        let apps = statuses(&p.apps, &mut p.spec.containers.iter());
        let inits = statuses(&p.init, &mut p.spec.init_containers.iter().flatten());
        let phase = pod_phase(&p.policy, &inits, &apps);
        let app_states: Vec<Value> = apps.iter().map(|s| s["state"].clone()).collect();
        let ready = phase == "Running" && app_states.iter().all(|s| s.get("running").is_some());
        let mut status = json!({
            "phase": phase,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "containerStatuses": apps,
        });
        let init_states: Vec<Value> = inits.iter().map(|s| s["state"].clone()).collect();
        if !inits.is_empty() {
            status["initContainerStatuses"] = Value::Array(inits);
        }
        if let Some((reason, message)) = &p.waiting {
            status["reason"] = json!(reason);
            status["message"] = json!(message);
        } else if phase == "Failed"
            && let Some(t) = app_states
                .iter()
                .chain(init_states.iter())
                .filter_map(|s| s.get("terminated"))
                .find(|t| t["exitCode"] != json!(0))
        {
            status["reason"] = t["reason"].clone();
            status["message"] = t.get("message").cloned().unwrap_or(json!(""));
        }
        json!({ "status": status })
    }

    /// Patches the pod's status when it changed; a finished pod's device ids are released.
    pub(super) async fn post(&mut self, uid: &str) {
        let Some(p) = self.pods.get(uid) else { return };
        let status = self.status_of(p);
        if p.posted.as_ref() == Some(&status) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &p.pod.namespace);
        let phase = status["status"]["phase"].as_str().unwrap_or("").to_owned();
        if matches!(phase.as_str(), "Failed" | "Succeeded") {
            // The ids go back at once (kubelet frees them once the pod is terminal).
            self.state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .assigned
                .remove(uid);
        }
        match api
            .patch_status(&p.pod.name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Ok(_) => {
                if let Some(reason) = status["status"].get("reason") {
                    tracing::info!(pod = %format!("{}/{}", p.pod.namespace, p.pod.name), %phase, "{reason}: {}", status["status"]["message"]);
                }
                if let Some(p) = self.pods.get_mut(uid) {
                    p.posted = Some(status);
                }
            }
            Err(e) => {
                tracing::warn!(pod = %format!("{}/{}", p.pod.namespace, p.pod.name), "cannot post the status: {e}")
            }
        }
    }
}
