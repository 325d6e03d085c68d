//! The webhook's DRA mode end to end on the embedded API server: pods written with HAMi's
//! AMD API go through the shipped webhook configuration (over HTTPS), which creates the
//! content-addressed ResourceClaimTemplates and patches the pods; the simulated
//! kube-scheduler's claim controller makes the claims and its DynamicResources plugin
//! allocates them (dra-core's allocator) on the DRA nodes' ResourceSlices, which have the
//! shape the AMD DRA driver publishes for the MI210 capture (64 GiB, 104 CUs, 10 shares).

mod common;

use std::time::Duration;

use hami_kube_scheduler_sim::dra::DraOptions;
use hami_protocol::dra::{DRIVER, LAST_USED_ANNOTATION, MANAGED_BY_LABEL, MANAGED_BY_WEBHOOK};
use hami_protocol::requests::{RequestDefaults, pod_requests};
use hami_scheduler::config::Settings;
use hami_scheduler::dra_claims::{pod_claims, shapes};
use hami_scheduler::dra_sweep::SweepTuning;
use hami_scheduler::extender_client::{ExtenderClient, Trust};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use common::{Front as Cluster, wait};

/// One device as the AMD DRA driver's `hami_dra_core::slice::device` publishes it.
fn device(index: usize, product: &str, memory: &str, cus: u64, numa: i64) -> Value {
    json!({
        "name": format!("gpu-{index}"),
        "allowMultipleAllocations": true,
        "attributes": {
            "type": {"string": "amdgpu-slice"},
            "uuid": {"string": format!("{product}-uuid-{index}").replace(' ', "-")},
            "productName": {"string": product},
            "gfxVersion": {"version": "9.0.10"},
            "wgpMode": {"bool": false},
            "partitionIndex": {"int": 0},
            "xgmiHive": {"string": "0000:03:00.0"},
            "xgmiPeers": {"int": 3},
            "resource.kubernetes.io/pciBusID": {"string": format!("0000:{:02x}:00.0", 3 + index)},
            "resource.kubernetes.io/numaNode": {"int": numa},
        },
        "capacity": {
            "memory": {"value": memory, "requestPolicy": {"default": memory, "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"}}},
            "computeUnits": {"value": cus.to_string(), "requestPolicy": {"default": cus.to_string(), "validRange": {"min": "1", "max": cus.to_string(), "step": "1"}}},
            "shares": {"value": "10", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "10", "step": "1"}}},
        }
    })
}

async fn dra_node(client: &Client, node: &str, devices: Vec<Value>) {
    let n: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": {"hami.io/amd-mode": "dra"}},
    }))
    .unwrap();
    let created = Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &n)
        .await
        .unwrap();
    let slice: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-amdgpu-hami-rs-io-0"), "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": created.metadata.uid, "controller": true}]},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}
    }))
    .unwrap();
    Api::<ResourceSlice>::all(client.clone())
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
}

async fn start(settings: Settings) -> Cluster {
    let (api, client) = common::tls_api().await;
    // The chart's DeviceClass (draPlugin on).
    let mut manifests = hami_manifests::Settings::default();
    manifests.values.dra_plugin.enabled = true;
    let hami_manifests::Object::DeviceClass(class) =
        hami_manifests::objects::device_class(&manifests)
    else {
        panic!("the chart's DeviceClass is not a DeviceClass")
    };
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    common::start_front((api, client), &settings, "hami-dra-webhook", |sim| {
        sim.with_dra(DraOptions::default())
    })
    .await
}

fn amd_pod(name: &str, annotations: Value, limits: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "image": "rocm/pytorch", "resources": {"limits": limits}}]}
    }))
    .unwrap()
}

fn dra() -> Value {
    json!({"hami.io/amd-mode": "dra"})
}

fn slice_limits() -> Value {
    json!({"amd.com/gpu": "1", "amd.com/gpucores": "25", "amd.com/gpumem": "4096"})
}

async fn create(c: &Cluster, pod: &Pod) -> Result<Pod, String> {
    Api::<Pod>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), pod)
        .await
        .map_err(|e| e.to_string())
}

async fn templates(c: &Cluster) -> Vec<ResourceClaimTemplate> {
    Api::<ResourceClaimTemplate>::namespaced(c.client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// The pod once bound, and its (allocated) claim.
async fn bound(c: &Cluster, name: &str) -> (Pod, ResourceClaim) {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(c.client.clone(), "default");
    wait(&format!("{name} is bound"), || async {
        let p = pods.get(name).await.unwrap();
        p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
    })
    .await;
    let pod = pods.get(name).await.unwrap();
    let claim_name = pod
        .status
        .as_ref()
        .unwrap()
        .resource_claim_statuses
        .as_ref()
        .unwrap()[0]
        .resource_claim_name
        .clone()
        .unwrap();
    let claim = claims.get(&claim_name).await.unwrap();
    (pod, claim)
}

/// (request, device, consumedCapacity) of each allocation result.
fn results(claim: &ResourceClaim) -> Vec<(String, String, Value)> {
    let allocation = claim.status.as_ref().unwrap().allocation.as_ref().unwrap();
    allocation
        .devices
        .as_ref()
        .unwrap()
        .results
        .iter()
        .flatten()
        .map(|r| {
            (
                r.request.clone(),
                format!("{}/{}", r.pool, r.device),
                serde_json::to_value(&r.consumed_capacity).unwrap(),
            )
        })
        .collect()
}

fn container_json(pod: &Pod) -> Value {
    serde_json::to_value(&pod.spec.as_ref().unwrap().containers[0]).unwrap()
}

fn limits_of(pod: &Pod) -> Value {
    container_json(pod)["resources"]["limits"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amd_requests_become_claims_that_dra_allocates() {
    let c = start(Settings::default()).await;
    dra_node(
        &c.client,
        "dra-node",
        (0..2)
            .map(|i| device(i, "AMD Instinct MI210", "64Gi", 104, 0))
            .collect(),
    )
    .await;

    // 25 % of 104 CUs = 26 (floor), 4096 MiB.
    let first = create(&c, &amd_pod("slice-1", dra(), slice_limits()))
        .await
        .unwrap();
    let spec = first.spec.as_ref().unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some("hami-scheduler"));
    let text = container_json(&first).to_string();
    assert!(!text.contains("amd.com/"), "amd.com/* left: {text}");
    assert_eq!(
        container_json(&first)["resources"]["claims"],
        json!([{"name": "hami-amd-c"}])
    );
    let entries = spec.resource_claims.as_ref().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].name, "hami-amd-c");
    let template_name = entries[0].resource_claim_template_name.clone().unwrap();
    assert!(template_name.starts_with("hami-amd-"), "{template_name}");
    let made = templates(&c).await;
    assert_eq!(made.len(), 1);
    assert_eq!(
        made[0].metadata.name.as_deref(),
        Some(template_name.as_str())
    );
    assert_eq!(
        made[0].metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
        MANAGED_BY_WEBHOOK
    );

    let (pod, claim) = bound(&c, "slice-1").await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("dra-node")
    );
    let r = results(&claim);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, "gpu");
    assert_eq!(r[0].2["computeUnits"], "26", "{r:?}");
    assert_eq!(r[0].2["memory"], "4Gi", "{r:?}");
    assert_eq!(r[0].2["shares"], "1", "{r:?}");

    // An identical pod shares the template (content-addressed) and gets its own claim.
    let second = create(&c, &amd_pod("slice-2", dra(), slice_limits()))
        .await
        .unwrap();
    assert_eq!(
        second
            .spec
            .as_ref()
            .unwrap()
            .resource_claims
            .as_ref()
            .unwrap()[0]
            .resource_claim_template_name
            .as_deref(),
        Some(template_name.as_str())
    );
    assert_eq!(templates(&c).await.len(), 1);
    let (_, claim2) = bound(&c, "slice-2").await;
    assert_ne!(claim2.metadata.name, claim.metadata.name);
    assert_eq!(results(&claim2)[0].2["computeUnits"], "26");

    // Two GPUs in one container: two distinct devices (distinctAttribute on the uuid).
    create(
        &c,
        &amd_pod(
            "pair",
            dra(),
            json!({"amd.com/gpu": "2", "amd.com/gpumem": "1024", "amd.com/gpucores": "10"}),
        ),
    )
    .await
    .unwrap();
    let (_, pair) = bound(&c, "pair").await;
    let r = results(&pair);
    assert_eq!(r.len(), 2, "{r:?}");
    assert_ne!(r[0].1, r[1].1, "the same device twice: {r:?}");
    assert!(r.iter().all(|x| x.2["computeUnits"] == "10"), "{r:?}");
    assert!(r.iter().all(|x| x.2["memory"] == "1Gi"), "{r:?}");

    // A device-plugin pod is unchanged from today: amd.com/* limits kept, no claims.
    let limits = json!({"amd.com/gpu": "1", "amd.com/gpucores": "25"});
    let plain = create(
        &c,
        &amd_pod(
            "plugin-pod",
            json!({"hami.io/amd-mode": "device-plugin"}),
            limits.clone(),
        ),
    )
    .await
    .unwrap();
    assert!(plain.spec.as_ref().unwrap().resource_claims.is_none());
    assert_eq!(limits_of(&plain), limits);
    let unannotated = create(&c, &amd_pod("default-pod", json!({}), limits.clone()))
        .await
        .unwrap();
    assert!(unannotated.spec.as_ref().unwrap().resource_claims.is_none());
    assert_eq!(limits_of(&unannotated), limits);

    // dryRun (sideEffects: NoneOnDryRun): the same answer, nothing created.
    let review = |dry_run: bool| {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE", "namespace": "default", "dryRun": dry_run,
            "userInfo": {"username": "alice"},
            "object": amd_pod("dry", dra(), json!({"amd.com/gpu": "1", "amd.com/gpucores": "30"}))}})
    };
    let webhook = ExtenderClient::new(
        &c.front.base,
        Trust::Ca(c.front.ca_pem.clone().into_bytes()),
    )
    .unwrap();
    let before = templates(&c).await.len();
    let answer: Value = webhook.call("webhook", &review(true)).await.unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(answer["response"]["patchType"], "JSONPatch", "{answer}");
    assert_eq!(
        templates(&c).await.len(),
        before,
        "dryRun created a template"
    );
    let answer: Value = webhook.call("webhook", &review(false)).await.unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(
        templates(&c).await.len(),
        before + 1,
        "the real request creates it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_are_refused_with_what_to_change() {
    let c = start(Settings::default()).await;
    let denied = |pod: Pod| {
        let c = &c;
        async move {
            let e = create(c, &pod).await.unwrap_err();
            assert!(
                templates(c).await.is_empty(),
                "a refused pod left a template"
            );
            e
        }
    };
    // No slice of the driver yet: percentages cannot be converted.
    let e = denied(amd_pod("early", dra(), slice_limits())).await;
    assert!(
        e.contains("no ResourceSlice of amdgpu.hami-rs.io yet")
            && e.contains("percentages need the device size"),
        "{e}"
    );
    // ... a fixed size can (the claim waits for a device).
    let fixed = create(
        &c,
        &amd_pod("fixed", dra(), json!({"amd.com/gpumem": "1024"})),
    )
    .await
    .unwrap();
    assert!(fixed.spec.as_ref().unwrap().resource_claims.is_some());
    Api::<Pod>::namespaced(c.client.clone(), "default")
        .delete("fixed", &DeleteParams::default())
        .await
        .unwrap();
    for t in templates(&c).await {
        Api::<ResourceClaimTemplate>::namespaced(c.client.clone(), "default")
            .delete(&t.metadata.name.unwrap(), &DeleteParams::default())
            .await
            .unwrap();
    }

    dra_node(
        &c.client,
        "dra-node",
        vec![device(0, "AMD Instinct MI210", "64Gi", 104, 0)],
    )
    .await;
    for (cores, expected) in [
        ("0", "from 1 to 100"),
        ("101", "from 1 to 100"),
        ("abc", "amd.com/gpucores"),
    ] {
        let e = denied(amd_pod(
            "cores",
            dra(),
            json!({"amd.com/gpu": "1", "amd.com/gpucores": cores}),
        ))
        .await;
        assert!(e.contains(expected), "gpucores {cores}: {e}");
    }
    let e = denied(amd_pod(
        "mode",
        json!({"hami.io/amd-mode": "bogus"}),
        slice_limits(),
    ))
    .await;
    assert!(
        e.contains("hami.io/amd-mode") && e.contains("write device-plugin or dra"),
        "{e}"
    );
    // The slices arrive through the webhook's informer: wait until it has them.
    wait("the webhook sees the slice", || async {
        create(
            &c,
            &amd_pod(
                "probe",
                dra(),
                json!({"amd.com/gpu": "1", "amd.com/gpumem": "70000", "amd.com/gpucores": "5"}),
            ),
        )
        .await
        .unwrap_err()
        .contains("the largest is AMD Instinct MI210 with 65536 MiB")
    })
    .await;
    let e = denied(amd_pod("huge", dra(), json!({"amd.com/gpumem": "70000"}))).await;
    assert!(
        e.contains("70000 MiB") && e.contains("the largest is AMD Instinct MI210 with 65536 MiB"),
        "{e}"
    );

    // A template of the webhook's name with another spec: never overwritten, refused.
    let pod = amd_pod("taken", dra(), slice_limits());
    let requests = pod_requests(&pod, &RequestDefaults::default()).unwrap();
    let slices = Api::<ResourceSlice>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let ours = pod_claims(&pod, &requests, &shapes(&slices)).unwrap();
    let mut foreign = ours[0].template("default");
    foreign
        .spec
        .spec
        .devices
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()[0]
        .exactly
        .as_mut()
        .unwrap()
        .count = Some(3);
    Api::<ResourceClaimTemplate>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let e = create(&c, &pod).await.unwrap_err();
    assert!(
        e.contains(&format!(
            "ResourceClaimTemplate default/{}",
            ours[0].template_name
        )) && e.contains("exists with a different spec"),
        "{e}"
    );
    let kept = Api::<ResourceClaimTemplate>::namespaced(c.client.clone(), "default")
        .get(&ours[0].template_name)
        .await
        .unwrap();
    assert_eq!(kept.spec, foreign.spec, "the user's template was changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_shapes_are_tried_smallest_first_and_unused_templates_are_swept() {
    let settings = Settings {
        template_sweep: SweepTuning {
            interval: Duration::from_millis(100),
            grace: Duration::from_millis(500),
        },
        ..Settings::default()
    };
    let c = start(settings).await;
    dra_node(
        &c.client,
        "mi210-node",
        vec![device(0, "AMD Instinct MI210", "64Gi", 104, 0)],
    )
    .await;
    dra_node(
        &c.client,
        "mi300x-node",
        vec![device(0, "AMD Instinct MI300X", "192Gi", 304, 0)],
    )
    .await;
    // Half the memory and a quarter of the CUs of whichever device: MI210 first (32Gi, 26),
    // else MI300X (96Gi, 76).
    let limits = json!({"amd.com/gpumem-percentage": "50", "amd.com/gpucores": "25"});
    wait("the webhook sees both shapes", || async {
        let p = create(&c, &amd_pod("probe", dra(), limits.clone()))
            .await
            .unwrap();
        let name = p.spec.as_ref().unwrap().resource_claims.as_ref().unwrap()[0]
            .resource_claim_template_name
            .clone()
            .unwrap();
        Api::<Pod>::namespaced(c.client.clone(), "default")
            .delete("probe", &DeleteParams::default())
            .await
            .unwrap();
        let t = Api::<ResourceClaimTemplate>::namespaced(c.client.clone(), "default")
            .get(&name)
            .await
            .unwrap();
        let request = &t.spec.spec.devices.unwrap().requests.unwrap()[0];
        request
            .first_available
            .as_ref()
            .is_some_and(|s| s.len() == 2)
    })
    .await;
    let mut placed = Vec::new();
    for i in 0..3 {
        let name = format!("half-{i}");
        create(&c, &amd_pod(&name, dra(), limits.clone()))
            .await
            .unwrap();
        let (pod, claim) = bound(&c, &name).await;
        let node = pod.spec.unwrap().node_name.unwrap();
        let r = results(&claim);
        assert_eq!(r.len(), 1, "{r:?}");
        let expected = match node.as_str() {
            "mi210-node" => ("gpu/shape-0", "26", "32Gi"),
            "mi300x-node" => ("gpu/shape-1", "76", "96Gi"),
            other => panic!("placed on {other}"),
        };
        assert_eq!(
            (
                r[0].0.as_str(),
                r[0].2["computeUnits"].as_str().unwrap(),
                r[0].2["memory"].as_str().unwrap()
            ),
            expected,
            "{r:?}"
        );
        placed.push(node);
    }
    // Two halves of memory fit one MI210; the third pod can only take the MI300X.
    placed.sort();
    assert_eq!(placed, ["mi210-node", "mi210-node", "mi300x-node"]);

    // More memory than an MI210 has (80000 MiB > 65536): only the MI300X shape, one pinned
    // exactly request; 10 % of 304 CUs = 30.
    create(
        &c,
        &amd_pod(
            "big",
            dra(),
            json!({"amd.com/gpumem": "80000", "amd.com/gpucores": "10"}),
        ),
    )
    .await
    .unwrap();
    let (pod, claim) = bound(&c, "big").await;
    assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some("mi300x-node"));
    let r = results(&claim);
    assert_eq!(
        (r[0].0.as_str(), r[0].2["computeUnits"].as_str()),
        ("gpu", Some("30"))
    );

    // Once no pod references a managed template for the grace period, it is deleted;
    // a referenced one stays.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let template_of = |name: &'static str| {
        let pods = pods.clone();
        async move {
            pods.get(name)
                .await
                .unwrap()
                .spec
                .unwrap()
                .resource_claims
                .unwrap()[0]
                .resource_claim_template_name
                .clone()
                .unwrap()
        }
    };
    let (half, big) = (template_of("half-0").await, template_of("big").await);
    let names = || async {
        templates(&c)
            .await
            .into_iter()
            .filter_map(|t| t.metadata.name)
            .collect::<Vec<_>>()
    };
    assert!(names().await.contains(&half) && names().await.contains(&big));
    for name in ["half-0", "half-1", "half-2"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait("the unused template is swept", || async {
        !names().await.contains(&half)
    })
    .await;
    assert_eq!(names().await, [big], "only the referenced template stays");
}

/// `(verb, status)` of the webhook's requests on resourceclaimtemplates in `c`'s log since
/// `from` (the claim controller's reflector and the sweeper only list and watch or delete).
fn template_calls(c: &Cluster, from: usize) -> Vec<(String, u16)> {
    c.api.request_log()[from..]
        .iter()
        .filter(|r| {
            r.resource == "resourceclaimtemplates"
                && matches!(r.verb.as_str(), "create" | "get" | "patch")
        })
        .map(|r| (r.verb.clone(), r.status))
        .collect()
}

fn template_name_of(pod: &Pod) -> String {
    pod.spec.as_ref().unwrap().resource_claims.as_ref().unwrap()[0]
        .resource_claim_template_name
        .clone()
        .unwrap()
}

fn stamp_of(t: &ResourceClaimTemplate) -> i64 {
    let value = &t.metadata.annotations.as_ref().unwrap()[LAST_USED_ANNOTATION];
    hami_protocol::rfc3339::parse(value).unwrap()
}

/// The sweeper race (dra_sweep.rs): a reused template is stamped before the pod is
/// answered, a stamp that loses to another write is retried at the new version, a
/// template deleted between the webhook's 409 and its read is made again (the pod then
/// gets its claim and runs), and a refused stamp denies the pod, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_templates_are_stamped_and_one_swept_meanwhile_is_made_again() {
    let c = start(Settings::default()).await;
    dra_node(
        &c.client,
        "mi210-node",
        vec![device(0, "AMD Instinct MI210", "64Gi", 104, 0)],
    )
    .await;
    let api: Api<ResourceClaimTemplate> = Api::namespaced(c.client.clone(), "default");
    let before = hami_plugin_core::node_lock_client::unix_now();
    let first = create(&c, &amd_pod("first", dra(), slice_limits()))
        .await
        .unwrap();
    let name = template_name_of(&first);
    let made = api.get(&name).await.unwrap();
    assert!(stamp_of(&made) >= before, "created without a fresh stamp");

    // Reused: 409, read, stamped at the version read.
    let from = c.api.request_log().len();
    create(&c, &amd_pod("second", dra(), slice_limits()))
        .await
        .unwrap();
    let calls = template_calls(&c, from);
    assert_eq!(
        calls,
        [
            ("create".into(), 409),
            ("get".into(), 200),
            ("patch".into(), 200)
        ],
        "{calls:?}"
    );
    let stamped = api.get(&name).await.unwrap();
    // (Within the same second the stamp is unchanged and the write a no-op, as upstream
    // makes it: such a stamp is fresh to every sweeper anyway.)
    assert!(stamp_of(&stamped) >= stamp_of(&made));
    let log = c.api.request_log();
    let patch = log[from..]
        .iter()
        .find(|r| r.resource == "resourceclaimtemplates" && r.verb == "patch")
        .unwrap();
    let body: Value = serde_json::from_str(&patch.body).unwrap();
    assert_eq!(
        body["metadata"]["resourceVersion"].as_str(),
        made.metadata.resource_version.as_deref(),
        "the stamp is not conditional on the version read: {body}"
    );

    // The stamp loses to another write (409 Conflict): read again, stamped again.
    c.api
        .faults()
        .fail_next(Some("patch"), Some("resourceclaimtemplates"), 1, 409);
    let from = c.api.request_log().len();
    create(&c, &amd_pod("third", dra(), slice_limits()))
        .await
        .unwrap();
    let calls = template_calls(&c, from);
    assert_eq!(
        calls,
        [
            ("create".into(), 409),
            ("get".into(), 200),
            ("patch".into(), 409),
            ("get".into(), 200),
            ("patch".into(), 200)
        ],
        "{calls:?}"
    );

    // Swept between the webhook's 409 and its read: the GET finds it gone, the webhook
    // creates it again before answering, and the pod's claim is made from it.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    for p in ["first", "second", "third"] {
        pods.delete(p, &DeleteParams::default()).await.unwrap();
    }
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    c.api
        .faults()
        .fail_next(Some("create"), Some("resourceclaimtemplates"), 1, 409);
    let from = c.api.request_log().len();
    let fourth = create(&c, &amd_pod("fourth", dra(), slice_limits()))
        .await
        .unwrap();
    assert_eq!(template_name_of(&fourth), name);
    let calls = template_calls(&c, from);
    assert_eq!(
        calls[..3],
        [
            ("create".into(), 409),
            ("get".into(), 404),
            ("create".into(), 201)
        ],
        "{calls:?}"
    );
    let again = api.get(&name).await.unwrap();
    assert_ne!(again.metadata.uid, made.metadata.uid);
    let (_, claim) = bound(&c, "fourth").await;
    assert_eq!(results(&claim).len(), 1);

    // A refused stamp denies the pod, naming the template, the annotation and the error.
    c.api
        .faults()
        .fail_next(Some("patch"), Some("resourceclaimtemplates"), 1, 403);
    let denied = create(&c, &amd_pod("fifth", dra(), slice_limits()))
        .await
        .unwrap_err();
    assert!(
        denied.contains(&format!("cannot mark ResourceClaimTemplate default/{name}"))
            && denied.contains(LAST_USED_ANNOTATION)
            && denied.contains("403"),
        "{denied}"
    );
}

/// The webhook's AdmissionReview answer for `pod` (CREATE by alice, dryRun: nothing made).
async fn review(c: &Cluster, pod: &Pod) -> Value {
    let webhook = ExtenderClient::new(
        &c.front.base,
        Trust::Ca(c.front.ca_pem.clone().into_bytes()),
    )
    .unwrap();
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-9", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE", "namespace": "default", "dryRun": true,
        "userInfo": {"username": "alice"}, "object": pod}});
    webhook.call("webhook", &review).await.unwrap()
}

/// Issue 26 item 9: one node publishing 9 device types that sort before "AMD Instinct
/// MI210" (tainted here: nothing can run on them) no longer removes the MI210s from every
/// percentage pod's claim — the landed code cut the name-sorted types at 8, and the pod
/// waited for good. The 8 types with the most devices are listed (the two MI210s first,
/// smallest first), the pod lands on an MI210, and the admission response's warnings (which
/// kubectl prints) name the two types left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_device_types_than_a_claim_lists_keep_the_real_gpus_and_say_so() {
    let c = start(Settings::default()).await;
    dra_node(
        &c.client,
        "odd-node",
        (0..9)
            .map(|i| {
                let mut d = device(i, &format!("AMD Aaa {i}"), "128Gi", 104, 0);
                d["taints"] = json!([{"key": "example.com/broken", "effect": "NoSchedule"}]);
                d
            })
            .collect(),
    )
    .await;
    dra_node(
        &c.client,
        "dra-node",
        (0..2)
            .map(|i| device(i, "AMD Instinct MI210", "64Gi", 104, 0))
            .collect(),
    )
    .await;
    let pod = amd_pod("quarter", dra(), slice_limits());
    // The slices arrive through the webhook's informer: wait until it has all ten types.
    wait("the webhook sees every device type", || async {
        review(&c, &pod).await["response"]["warnings"]
            .as_array()
            .is_some_and(|w| {
                w.first()
                    .is_some_and(|w| w.as_str().unwrap().contains(" 10 AMD device types"))
            })
    })
    .await;
    let answer = review(&c, &pod).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(
        answer["response"]["warnings"],
        json!([
            "spec.containers[0] (c): 10 AMD device types can hold the request, more than the 8 a claim may list: kept the 8 with the most devices, left out 2",
            "spec.containers[0] (c): left out AMD Aaa 7 (131072 MiB, 104 CUs, 1 device): the pod cannot land on it",
            "spec.containers[0] (c): left out AMD Aaa 8 (131072 MiB, 104 CUs, 1 device): the pod cannot land on it",
        ]),
        "{answer}"
    );

    // Through the API server: the claim lists the MI210 first, and the pod lands there.
    create(&c, &pod).await.unwrap();
    let (bound_pod, claim) = bound(&c, "quarter").await;
    assert_eq!(
        bound_pod.spec.unwrap().node_name.as_deref(),
        Some("dra-node")
    );
    let r = results(&claim);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, "gpu/shape-0", "{r:?}");
    assert!(r[0].1.starts_with("dra-node/"), "{r:?}");
    assert_eq!(r[0].2["computeUnits"], "26", "{r:?}");
}
