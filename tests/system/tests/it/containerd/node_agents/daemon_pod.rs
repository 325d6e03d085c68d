//! What stands between `hami manifests`' DaemonSets and a node here: the hostPaths pointed
//! at the test's trees, and the pod the DaemonSet controller would make (there is no
//! controller-manager).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;

use serde_json::{Value, json};

/// Points the DaemonSet's hostPath volume `volume` at `path`, keeping its type; nothing
/// else of the rendered object changes. An error if the DaemonSet has no such hostPath
/// volume (the chart changed: the test must say where the new path goes).
pub(super) fn redirect(daemon_set: &mut Value, volume: &str, path: &Path) -> Result<(), String> {
    let name = daemon_set["metadata"]["name"].clone();
    let host = daemon_set["spec"]["template"]["spec"]["volumes"]
        .as_array_mut()
        .and_then(|v| v.iter_mut().find(|v| v["name"] == volume))
        .and_then(|v| v.get_mut("hostPath"))
        .ok_or_else(|| format!("DaemonSet {name} has no hostPath volume {volume:?}"))?;
    host["path"] = json!(path.display().to_string());
    Ok(())
}

/// The tolerations the DaemonSet controller adds to every pod it makes
/// (`AddOrUpdateDaemonPodTolerations`, kube-controller-manager 1.2x+), and network
/// unavailability for host-network pods.
fn controller_tolerations(host_network: bool) -> Vec<Value> {
    let mut out: Vec<Value> = [
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ]
    .into_iter()
    .map(|(key, effect)| json!({"key": key, "operator": "Exists", "effect": effect}))
    .collect();
    if host_network {
        out.push(json!({"key": "node.kubernetes.io/network-unavailable",
            "operator": "Exists", "effect": "NoSchedule"}));
    }
    out
}

/// The pod the DaemonSet controller makes for `node` from the DaemonSet as stored
/// (`daemon_set` with its uid), as kube-controller-manager's `syncNodes` does: the
/// template's labels plus `controller-revision-hash` and `pod-template-generation`, its
/// annotations and spec, `generateName: <daemonset>-`, a controller ownerReference; the
/// node pinned by a required node affinity on `metadata.name` (merged into the template's
/// terms, `ReplaceDaemonSetPodNodeNameNodeAffinity`) and the controller's tolerations
/// added. `spec.nodeName` is what the default scheduler then binds (no scheduler runs here).
pub(super) fn pod_for(daemon_set: &Value, node: &str) -> Result<Value, String> {
    let name = daemon_set["metadata"]["name"]
        .as_str()
        .ok_or("the DaemonSet has no name")?;
    let uid = daemon_set["metadata"]["uid"]
        .as_str()
        .ok_or("the DaemonSet has no uid: pass it as the API server stored it")?;
    let template = &daemon_set["spec"]["template"];
    let mut hasher = DefaultHasher::new();
    template.to_string().hash(&mut hasher);
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels["controller-revision-hash"] = json!(format!("{:x}", hasher.finish() & 0xff_ffff_ffff));
    labels["pod-template-generation"] = json!(
        daemon_set["metadata"]["generation"]
            .as_i64()
            .unwrap_or(1)
            .to_string()
    );
    let mut spec = template["spec"].clone();
    let pin = json!({"key": "metadata.name", "operator": "In", "values": [node]});
    let terms = &mut spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    match terms.as_array_mut() {
        Some(terms) if !terms.is_empty() => {
            for term in terms {
                term["matchFields"] = json!([pin.clone()]);
            }
        }
        _ => *terms = json!([{"matchFields": [pin]}]),
    }
    let host_network = spec["hostNetwork"].as_bool().unwrap_or(false);
    let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for t in controller_tolerations(host_network) {
        if !tolerations
            .iter()
            .any(|have| have["key"] == t["key"] && have["effect"] == t["effect"])
        {
            tolerations.push(t);
        }
    }
    spec["tolerations"] = json!(tolerations);
    spec["nodeName"] = json!(node);
    let mut metadata = json!({
        "generateName": format!("{name}-"),
        "namespace": daemon_set["metadata"]["namespace"],
        "labels": labels,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name,
            "uid": uid, "controller": true, "blockOwnerDeletion": true}],
    });
    if template["metadata"]["annotations"].is_object() {
        metadata["annotations"] = template["metadata"]["annotations"].clone();
    }
    Ok(json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}))
}

#[test]
fn the_controllers_pod_keeps_the_template_and_pins_the_node() {
    let ds = json!({"metadata": {"name": "ds", "namespace": "ns", "uid": "u1", "generation": 2},
        "spec": {"template": {"metadata": {"labels": {"app": "a"}},
            "spec": {"hostNetwork": true, "containers": [{"name": "c"}],
                "tolerations": [{"key": "node.kubernetes.io/unschedulable",
                    "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k",
                        "operator": "NotIn", "values": ["dra"]}]}]}}}}}}});
    let pod = pod_for(&ds, "n1").unwrap();
    assert_eq!(pod["metadata"]["generateName"], "ds-");
    assert_eq!(pod["metadata"]["labels"]["app"], "a");
    assert_eq!(pod["metadata"]["labels"]["pod-template-generation"], "2");
    assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "u1");
    assert_eq!(pod["spec"]["nodeName"], "n1");
    assert_eq!(
        pod["spec"]["containers"],
        ds["spec"]["template"]["spec"]["containers"]
    );
    let term = &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0];
    assert_eq!(
        term["matchExpressions"][0]["key"], "k",
        "the template's term kept"
    );
    assert_eq!(term["matchFields"][0]["values"], json!(["n1"]));
    let tolerations = pod["spec"]["tolerations"].as_array().unwrap();
    assert_eq!(
        tolerations.len(),
        7,
        "no duplicate, network-unavailable added"
    );
    let mut no_uid = ds.clone();
    no_uid["metadata"]["uid"] = Value::Null;
    assert!(pod_for(&no_uid, "n1").unwrap_err().contains("uid"));
    let mut ds = ds;
    redirect(&mut ds, "missing", Path::new("/x")).unwrap_err();
}
