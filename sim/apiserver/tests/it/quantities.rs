//! Quantities come back in the real API server's canonical form, whatever the client sent:
//! JSON and protobuf bodies, create, update and patch, and what kubectl prints. A pod
//! asking `amd.com/gpumem: 3000` is read back as `3k` by every reader (webhook,
//! scheduler, plugins), as on a real cluster.

use crate::common;

use common::{client, http, http_json, start};
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::api::resource::Quantity as PbQuantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use kube::api::{Api, Patch, PatchParams, PostParams};
use prost::Message;
use serde_json::{Value, json};

fn sliced_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {
            "limits": {"amd.com/gpu": "1", "amd.com/gpumem": "3000", "amd.com/gpucores": "50"},
            "requests": {"cpu": "1000m", "memory": "1024Mi"}}}],
         "initContainers": [{"name": "init", "image": "busybox", "resources": {
            "limits": {"nvidia.com/gpumem": 16000}}}]}
    })
}

#[tokio::test]
async fn a_pods_gpumem_3000_is_read_back_as_3k() {
    let server = start().await;
    let pods: Api<Pod> = Api::namespaced(client(&server), "default");
    let created = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(sliced_pod("p")).unwrap(),
        )
        .await
        .unwrap();
    let read = pods.get("p").await.unwrap();
    for pod in [&created, &read] {
        let spec = pod.spec.as_ref().unwrap();
        let c = spec.containers[0].resources.as_ref().unwrap();
        let limits = c.limits.as_ref().unwrap();
        assert_eq!(limits["amd.com/gpumem"].0, "3k");
        assert_eq!(limits["amd.com/gpucores"].0, "50");
        assert_eq!(limits["amd.com/gpu"].0, "1");
        let requests = c.requests.as_ref().unwrap();
        assert_eq!(requests["cpu"].0, "1");
        assert_eq!(requests["memory"].0, "1Gi");
        let init = spec.init_containers.as_ref().unwrap()[0].resources.as_ref();
        // Sent as a JSON number, stored as a canonical string.
        assert_eq!(
            init.unwrap().limits.as_ref().unwrap()["nvidia.com/gpumem"].0,
            "16k"
        );
    }
}

#[tokio::test]
async fn protobuf_bodies_are_canonicalized_too() {
    let server = start().await;
    let q = |s: &str| PbQuantity {
        string: Some(s.into()),
    };
    let pod = core::Pod {
        metadata: Some(meta::ObjectMeta {
            name: Some("pb".into()),
            ..Default::default()
        }),
        spec: Some(core::PodSpec {
            containers: vec![core::Container {
                name: Some("c".into()),
                image: Some("busybox".into()),
                resources: Some(core::ResourceRequirements {
                    limits: [
                        ("nvidia.com/gpumem".to_string(), q("2000000")),
                        ("nvidia.com/gpu".to_string(), q("1")),
                    ]
                    .into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    let envelope = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
        }),
        raw: Some(pod.encode_to_vec()),
        ..Default::default()
    };
    let mut body = b"k8s\0".to_vec();
    body.extend(envelope.encode_to_vec());
    let (code, out) = http(
        &server,
        "POST",
        "/api/v1/namespaces/default/pods",
        &[
            ("Content-Type", "application/vnd.kubernetes.protobuf"),
            ("Accept", "application/json"),
        ],
        &body,
    )
    .await;
    let created: Value = serde_json::from_slice(&out).unwrap_or_default();
    assert_eq!(code, 201, "{created}");
    let limits = &created["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(limits["nvidia.com/gpumem"], "2M");
    assert_eq!(limits["nvidia.com/gpu"], "1");
}

#[tokio::test]
async fn node_status_and_quota_writes_are_canonicalized() {
    let server = start().await;
    let c = client(&server);
    let nodes: Api<Node> = Api::all(c.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap(),
        )
        .await
        .unwrap();
    let patched = nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": {"amd.com/gpumem": "262000", "amd.com/gpu": "4"},
                "allocatable": {"amd.com/gpumem": "262000", "memory": "2097152Ki"}}})),
        )
        .await
        .unwrap();
    let status = patched.status.unwrap();
    assert_eq!(status.capacity.unwrap()["amd.com/gpumem"].0, "262k");
    let allocatable = status.allocatable.unwrap();
    assert_eq!(allocatable["amd.com/gpumem"].0, "262k");
    assert_eq!(allocatable["memory"].0, "2Gi");

    let quotas: Api<ResourceQuota> = Api::namespaced(c, "default");
    let mut quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "q"},
        "spec": {"hard": {"limits.amd.com/gpumem": "40000"}}}))
    .unwrap();
    let created = quotas.create(&PostParams::default(), &quota).await.unwrap();
    assert_eq!(
        created.spec.as_ref().unwrap().hard.as_ref().unwrap()["limits.amd.com/gpumem"].0,
        "40k"
    );
    quota.metadata = created.metadata;
    quota.spec.as_mut().unwrap().hard.as_mut().unwrap().insert(
        "limits.amd.com/gpumem".into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("50000".into()),
    );
    let updated = quotas
        .replace("q", &PostParams::default(), &quota)
        .await
        .unwrap();
    assert_eq!(
        updated.spec.unwrap().hard.unwrap()["limits.amd.com/gpumem"].0,
        "50k"
    );
}

#[tokio::test]
async fn a_value_that_is_no_quantity_is_refused_before_admission() {
    let server = start().await;
    let mut pod = sliced_pod("bad");
    pod["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpumem"] = json!("3 GB");
    let (code, status) = http_json(
        &server,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        &pod,
    )
    .await;
    assert_eq!(code, 400, "{status}");
    let message = status["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("amd.com/gpumem") && message.contains("\"3 GB\""),
        "{message}"
    );
}

/// The real kubectl prints what is stored: `3k`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_the_canonical_form() {
    let server = start().await;
    let dir = std::env::temp_dir().join(format!(
        "hami-apiserver-quantities-{}",
        hami_apiserver::meta::new_uid()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    std::fs::write(dir.join("pod.json"), sliced_pod("k").to_string()).unwrap();
    let kubectl = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .env("HOME", &dir)
            .kill_on_drop(true);
        cmd
    };
    let created = kubectl(&["create", "-f", dir.join("pod.json").to_str().unwrap()])
        .output()
        .await
        .expect("kubectl is on PATH (these tests need it)");
    assert!(created.status.success(), "{created:?}");
    let got = kubectl(&[
        "get",
        "pod",
        "k",
        "-o",
        r#"jsonpath={.spec.containers[0].resources.limits.amd\.com/gpumem}"#,
    ])
    .output()
    .await
    .unwrap();
    assert!(got.status.success(), "{got:?}");
    assert_eq!(String::from_utf8_lossy(&got.stdout), "3k");
    std::fs::remove_dir_all(&dir).ok();
}
