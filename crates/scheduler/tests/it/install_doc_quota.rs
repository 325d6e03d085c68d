//! docs/install.md's "Quotas and priorities" works as written: its YAML blocks (a Namespace
//! and ResourceQuota with HAMi's keys, a PriorityClass, a sliced pod using it) are applied
//! with the real `kubectl` to the embedded API server, with the scheduler (webhook, filter,
//! bind, preempt verb) and the simulated kube-scheduler in front, as installed. The pod is
//! scheduled; a second copy is refused by the webhook with the very message the page prints;
//! with kube-scheduler ≥ 1.38 the pod evicts a lower-priority slice that fills its GPU and
//! runs, before 1.38 it waits and nothing is evicted, as the page says.
//!
//! The stand-in API server serves no PriorityClass, so the test plays kube-apiserver's
//! Priority admission plugin: the pod is sent with the `spec.priority` and
//! `spec.preemptionPolicy` of the documented class it names (and the class must be the
//! documented one). The blocks' upstream schemas are checked by `hami-manifests`' tests
//! (kubernetes-validate).

use std::path::{Path, PathBuf};
use std::time::Duration;

use hami_kube_scheduler_sim::preemption::PreemptMode;
use hami_protocol::names::Vendor;
use hami_scheduler::config::Settings;
use hami_scheduler::quota::{Dimension, QuotaKey};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

use crate::common::{self, Front, TempDir, wait};

/// One MI210 (64 GiB, 104 CUs) split 10 ways.
const MI210_64G: &str = r#"[{"id":"G","count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#;

const AMD_MEM: QuotaKey = QuotaKey::new(Vendor::Amd, Dimension::MemoryMib);

/// What the section documents.
struct Documented {
    /// The YAML blocks holding neither a pod nor a PriorityClass, verbatim.
    plain_blocks: Vec<String>,
    /// The pod, as kube-apiserver's Priority admission hands it on.
    pod: Value,
    /// The pod's namespace.
    namespace: String,
    /// The refusal `kubectl` prints for a second copy, from "admission webhook" on.
    refusal: String,
}

/// The lines of the section whose heading names "Quotas and priorities".
fn section() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/install.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let mut lines = doc.lines();
    lines
        .by_ref()
        .find(|l| l.starts_with("## ") && l.contains("Quotas and priorities"))
        .expect("docs/install.md has no \"Quotas and priorities\" section");
    lines
        .take_while(|l| !l.starts_with("## "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The fenced blocks of `text`: (info string, body).
fn fenced_blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in text.lines() {
        match (open.take(), line.trim_start().strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), String::new())),
            (Some(block), Some(_)) => out.push(block),
            (Some((info, mut body)), None) => {
                body.push_str(line);
                body.push('\n');
                open = Some((info, body));
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed fenced block in the section");
    out
}

fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---\n")
        .filter(|d| d.lines().any(|l| !l.trim().is_empty()))
        .map(|d| {
            serde_saphyr::from_str(d)
                .unwrap_or_else(|e| panic!("a documented object does not parse: {e}\n{d}"))
        })
        .collect()
}

impl Documented {
    fn read() -> Documented {
        let blocks = fenced_blocks(&section());
        let mut plain_blocks = Vec::new();
        let (mut pods, mut classes) = (Vec::new(), Vec::new());
        for (info, body) in blocks.iter().filter(|(info, _)| info == "yaml") {
            let objects = documents(body);
            let mut plain = true;
            for o in objects {
                let kind = o["kind"].as_str().map(str::to_owned);
                match kind.as_deref() {
                    Some("Pod") => pods.push(o),
                    Some("PriorityClass") => classes.push(o),
                    Some(_) => continue,
                    None => panic!("a {info} block holds an object without kind: {o}"),
                }
                plain = false;
            }
            if plain {
                plain_blocks.push(body.clone());
            }
        }
        assert_eq!(
            (pods.len(), classes.len()),
            (1, 1),
            "the section documents one pod and one PriorityClass"
        );
        let (mut pod, class) = (pods.remove(0), classes.remove(0));
        assert_eq!(
            pod["spec"]["priorityClassName"], class["metadata"]["name"],
            "the documented pod uses the documented PriorityClass"
        );
        let value = class["value"].as_i64().expect("the class has a value");
        assert!(value > 0, "a class that can preempt: {class}");
        pod["spec"]["priority"] = json!(value);
        pod["spec"]["preemptionPolicy"] = class
            .get("preemptionPolicy")
            .cloned()
            .unwrap_or(json!("PreemptLowerPriority"));
        let namespace = pod["metadata"]["namespace"]
            .as_str()
            .expect("the documented pod names its namespace")
            .to_owned();
        let printed = blocks
            .iter()
            .map(|(_, body)| body.trim())
            .find(|b| b.starts_with("Error from server (Forbidden)"))
            .expect("the section shows what kubectl prints for the refused copy");
        let refusal = printed[printed
            .find("admission webhook")
            .expect("the printed refusal names the admission webhook")..]
            .to_owned();
        Documented {
            plain_blocks,
            pod,
            namespace,
            refusal,
        }
    }

    /// The pod's `amd.com/gpumem` limit.
    fn pod_mib(&self) -> u64 {
        let v = &self.pod["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpumem"];
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .expect("the documented pod asks for amd.com/gpumem")
    }

    fn pod_name(&self) -> String {
        self.pod["metadata"]["name"].as_str().unwrap().to_owned()
    }
}

/// The real kubectl against the embedded API server.
struct Kubectl {
    dir: TempDir,
    kubeconfig: PathBuf,
}

impl Kubectl {
    fn new(front: &Front) -> Kubectl {
        let dir = TempDir::new("hami-install-doc-kubectl");
        std::fs::create_dir_all(&dir.0).unwrap();
        let kubeconfig = dir.0.join("kubeconfig");
        front.api.write_kubeconfig(&kubeconfig).unwrap();
        Kubectl { dir, kubeconfig }
    }

    /// `kubectl apply -f <file>` of `text` written as `file`: (success, stderr).
    async fn apply(&self, file: &str, text: &str) -> (bool, String) {
        let path = self.dir.0.join(file);
        std::fs::write(&path, text).unwrap();
        let run = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["apply", "-f"])
            .arg(&path)
            .env("HOME", &self.dir.0) // a private discovery cache
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("kubectl finished within 60 s")
            .expect("kubectl is on PATH (this test applies the documented objects with it)");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn apply_ok(&self, file: &str, text: &str) {
        let (ok, stderr) = self.apply(file, text).await;
        assert!(ok, "kubectl apply -f {file} failed: {stderr}\n{text}");
    }
}

async fn bound(client: &Client, namespace: &str, name: &str) -> bool {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .unwrap()
        .is_some_and(|p| p.spec.and_then(|s| s.node_name).is_some())
}

/// Node `n` with one 64 GiB MI210, the scheduler and the stand-in kube-scheduler (playing
/// `mode`) in front of the API server, the device plugin's stand-in, and the documented
/// Namespace and ResourceQuota applied with kubectl.
async fn installed(mode: PreemptMode) -> (Front, Kubectl, Documented) {
    let doc = Documented::read();
    let (api, client) = common::tls_api().await;
    common::create_node(
        &client,
        json!({"annotations": {"hami.io/node-amd-register": MI210_64G}}),
        json!({"capacity": {"amd.com/gpu": "10"}, "allocatable": {"amd.com/gpu": "10"}}),
    )
    .await;
    let c = common::start_front(
        (api, client),
        &Settings::default(),
        "hami-install-doc",
        |sim| sim.with_preemption(mode),
    )
    .await;
    tokio::spawn(crate::e2e::plugin_stand_in(common::as_component(
        &c.api,
        hami_manifests::names::DEVICE_PLUGIN,
    )));
    let kubectl = Kubectl::new(&c);
    for (i, block) in doc.plain_blocks.iter().enumerate() {
        kubectl.apply_ok(&format!("block-{i}.yaml"), block).await;
    }
    let ns = doc.namespace.clone();
    wait("the scheduler sees the documented quota", || async {
        c.scheduler.state().quota.ledger().governs(&ns)
    })
    .await;
    (c, kubectl, doc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_quota_refuses_a_second_copy_with_the_documented_message() {
    let (c, kubectl, doc) = installed(PreemptMode::Off).await;
    let name = doc.pod_name();
    kubectl
        .apply_ok(&format!("{name}.yaml"), &doc.pod.to_string())
        .await;
    wait("the documented pod is scheduled and charged", || async {
        bound(&c.client, &doc.namespace, &name).await
            && c.scheduler
                .state()
                .quota
                .ledger()
                .used(&doc.namespace)
                .get(AMD_MEM)
                == doc.pod_mib()
    })
    .await;
    let mut copy = doc.pod.clone();
    copy["metadata"]["name"] = json!(format!("{name}-2"));
    let (ok, stderr) = kubectl
        .apply(&format!("{name}-2.yaml"), &copy.to_string())
        .await;
    assert!(!ok, "the second copy was admitted");
    assert!(
        stderr.contains("Error from server (Forbidden): error when creating")
            && stderr.trim_end().ends_with(&doc.refusal),
        "kubectl printed\n{stderr}\nthe page says\n{}",
        doc.refusal
    );
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &doc.namespace);
    assert!(pods.get_opt(&format!("{name}-2")).await.unwrap().is_none());
}

/// [`installed`] with a priority-0 pod in another namespace holding half of the GPU's
/// memory and compute, so the documented pod fits only once it is gone; then the
/// documented pod, applied.
async fn gpu_held_by_a_low_priority_slice(mode: PreemptMode) -> (Front, Documented) {
    let (c, kubectl, doc) = installed(mode).await;
    let other = "team-b";
    Api::<Namespace>::all(c.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": other}})).unwrap(),
        )
        .await
        .unwrap();
    let low: Pod = serde_json::from_value(json!({
        "metadata": {"name": "batch-low", "namespace": other},
        "spec": {"priority": 0, "containers": [{"name": "c", "image": "x", "resources": {"limits":
            {"amd.com/gpu": "1", "amd.com/gpumem": "32768", "amd.com/gpucores": "50"}}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(c.client.clone(), other)
        .create(&PostParams::default(), &low)
        .await
        .unwrap();
    wait("the low-priority slice runs", || {
        bound(&c.client, other, "batch-low")
    })
    .await;
    let name = doc.pod_name();
    kubectl
        .apply_ok(&format!("{name}.yaml"), &doc.pod.to_string())
        .await;
    (c, doc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_1_38_the_documented_pod_evicts_a_lower_priority_slice_and_runs() {
    let (c, doc) = gpu_held_by_a_low_priority_slice(PreemptMode::From138).await;
    let name = doc.pod_name();
    wait("the documented pod runs", || {
        bound(&c.client, &doc.namespace, &name)
    })
    .await;
    let low = Api::<Pod>::namespaced(c.client.clone(), "team-b")
        .get_opt("batch-low")
        .await
        .unwrap();
    assert!(low.is_none(), "the lower-priority slice was not evicted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_1_38_the_documented_pod_waits_and_nothing_is_evicted() {
    let (c, doc) = gpu_held_by_a_low_priority_slice(PreemptMode::Before138).await;
    let name = doc.pod_name();
    let events: Api<Event> = Api::namespaced(c.client.clone(), &doc.namespace);
    wait(
        "a FailedScheduling whose preemption found no victim",
        || async {
            events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .any(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
                        && e.reason.as_deref() == Some("FailedScheduling")
                        && e.note
                            .as_deref()
                            .is_some_and(|n| n.contains("left no victim"))
                })
        },
    )
    .await;
    assert!(!bound(&c.client, &doc.namespace, &name).await);
    assert!(
        Api::<Pod>::namespaced(c.client.clone(), "team-b")
            .get_opt("batch-low")
            .await
            .unwrap()
            .is_some(),
        "a slice was evicted before 1.38"
    );
}
