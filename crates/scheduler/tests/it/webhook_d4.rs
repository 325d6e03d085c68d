//! D-4 through the webhook's AdmissionReview handling (issue 17 item 11): `userInfo`,
//! `oldObject` and the operation reach the decision; UPDATEs that set, change or remove a
//! scheduler-owned annotation are refused to everyone but the configured writers.

use hami_scheduler::admission::WebhookConfig;
use hami_scheduler::http::review;
use serde_json::{Value, json};

fn ask(operation: &str, user: &str, object: Value, old: Value, config: &WebhookConfig) -> Value {
    let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": operation, "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": object, "oldObject": old}});
    let (status, answer) = review(&serde_json::to_vec(&body).unwrap(), config);
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["uid"], "u-1");
    answer["response"].clone()
}

#[test]
fn updates_of_owned_annotations_only_from_the_scheduler_and_plugins() {
    let config = WebhookConfig::default();
    let plain = json!({"metadata": {"name": "web", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
    let mut forged = plain.clone();
    forged["metadata"]["annotations"] =
        json!({"hami.io/amd-cu-allocated": "{\"GPU-1\":\"0-103\"}"});

    // kubectl annotate by a user: refused, with what to do.
    let answer = ask("UPDATE", "alice", forged.clone(), plain.clone(), &config);
    assert_eq!(answer["allowed"], false, "{answer}");
    assert_eq!(answer["status"]["code"], 403);
    let message = answer["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("hami.io/amd-cu-allocated") && message.contains("alice"),
        "{message}"
    );
    // Removing one is refused too (it would free CUs another pod uses).
    assert_eq!(
        ask("UPDATE", "alice", plain.clone(), forged.clone(), &config)["allowed"],
        false
    );
    // The AMD plugin writes it after Allocate: allowed, unchanged.
    let plugin = "system:serviceaccount:kube-system:hami-device-plugin";
    let answer = ask("UPDATE", plugin, forged.clone(), plain.clone(), &config);
    assert_eq!(answer["allowed"], true, "{answer}");
    assert!(answer.get("patch").is_none());
    // Other updates of the user's pod pass.
    let mut relabelled = forged.clone();
    relabelled["metadata"]["labels"] = json!({"tier": "web"});
    assert_eq!(
        ask("UPDATE", "alice", relabelled, forged.clone(), &config)["allowed"],
        true
    );
    // CREATE of a pod without GPU requests carrying one: refused.
    assert_eq!(
        ask("CREATE", "alice", forged.clone(), Value::Null, &config)["allowed"],
        false
    );
    // A user's plain pod is untouched.
    let answer = ask("CREATE", "alice", plain, Value::Null, &config);
    assert_eq!(answer["allowed"], true);
    assert!(answer.get("patch").is_none());
}

/// The guard is also sent pods/status writes (upstream keeps their annotations): such a
/// review, `subResource: status`, is decided as any UPDATE — the DRA quota charge (D-33)
/// and D-4's annotations refused to a tenant, the scheduler's own writes and untouched
/// annotations let through.
#[test]
fn status_writes_are_decided_like_updates() {
    let config = WebhookConfig::default();
    let ask_status = |user: &str, object: &Value, old: &Value| {
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u-2", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "status",
            "operation": "UPDATE", "userInfo": {"username": user},
            "object": object, "oldObject": old}});
        let (status, answer) = review(&serde_json::to_vec(&body).unwrap(), &config);
        assert_eq!(status, 200);
        answer["response"].clone()
    };
    let admitted = json!({"metadata": {"name": "p", "namespace": "default",
        "annotations": {"hami.io/dra-quota-charge": "amd.com/gpu=1,amd.com/gpumem=4096"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]}, "status": {"phase": "Pending"}});
    let mut lowered = admitted.clone();
    lowered["metadata"]["annotations"]["hami.io/dra-quota-charge"] = json!("amd.com/gpu=1");
    let answer = ask_status("alice", &lowered, &admitted);
    assert_eq!(answer["allowed"], false, "{answer}");
    let message = answer["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("hami.io/dra-quota-charge") && message.contains("delete the pod"),
        "{message}"
    );
    let mut forged = admitted.clone();
    forged["metadata"]["annotations"]["hami.io/vgpu-node"] = json!("n1");
    assert_eq!(ask_status("alice", &forged, &admitted)["allowed"], false);
    let scheduler = "system:serviceaccount:kube-system:hami-scheduler";
    assert_eq!(ask_status(scheduler, &lowered, &admitted)["allowed"], true);
    let mut running = admitted.clone();
    running["status"]["phase"] = json!("Running");
    assert_eq!(ask_status("alice", &running, &admitted)["allowed"], true);
}
