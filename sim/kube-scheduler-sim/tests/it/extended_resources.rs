//! KEP-5004 in the simulated scheduler, through the embedded API server: a pod asking only
//! for `amd.com/gpu`, which a DeviceClass maps, is placed on the node that serves it through
//! DRA (a node offering it as allocatable is a device plugin's, refused with that reason);
//! the scheduler's claim is created (annotated, owned by the pod, `container-0-request-0`),
//! allocated, reserved and recorded in `pod.status.extendedResourceClaimStatus` before the
//! binding; a failed binding deletes the claim it made, so the retry leaves exactly one.

use std::time::Duration;

use hami_apiserver::{ApiServer, Config};
use hami_kube_scheduler_sim::SimKubeScheduler;
use hami_kube_scheduler_sim::dra::DraOptions;
use hami_kube_scheduler_sim::extended_resources::EXTENDED_RESOURCE_CLAIM;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::common::{DRIVER, create, slice};

fn count_pod(name: &str, n: u32) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"hami.io/webhook": "ignore"}},
        "spec": {"schedulerName": "default-scheduler",
            "containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"amd.com/gpu": n.to_string()}}}]}})
}

/// Polls `check` every 50 ms for at most 20 s.
async fn wait<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what} within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_count_goes_to_the_dra_node_through_the_schedulers_claim() {
    let server = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    for n in ["a-device-plugin", "b-dra"] {
        create(
            &nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
        )
        .await;
        create(&Api::<ResourceSlice>::all(client.clone()), slice(n)).await;
    }
    // The first node (tried first: by name) offers amd.com/gpu through a device plugin.
    nodes
        .patch_status(
            "a-device-plugin",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocatable": {"amd.com/gpu": "8"}}})),
        )
        .await
        .unwrap();
    create(
        &Api::<DeviceClass>::all(client.clone()),
        json!({"apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass", "metadata": {"name": "amdgpu.hami-rs.io"},
        "spec": {"extendedResourceName": "amd.com/gpu",
            "selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}}),
    )
    .await;
    // The first binding fails: the claim made for it must go.
    server
        .faults()
        .fail_next(Some("create"), Some("pods/binding"), 1, 409);
    tokio::spawn(
        SimKubeScheduler::dra_only(client.clone(), "default-scheduler", DraOptions::default())
            .run(),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    create(&pods, count_pod("p", 1)).await;

    let pod = wait("p bound", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("p").await.ok()?;
            p.spec.as_ref()?.node_name.is_some().then_some(p)
        }
    })
    .await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("b-dra")
    );
    let st = pod
        .status
        .as_ref()
        .unwrap()
        .extended_resource_claim_status
        .clone()
        .expect("extendedResourceClaimStatus written before binding");
    let m: Vec<(&str, &str, &str)> = st
        .request_mappings
        .iter()
        .map(|m| {
            (
                m.container_name.as_str(),
                m.resource_name.as_str(),
                m.request_name.as_str(),
            )
        })
        .collect();
    assert_eq!(m, vec![("c", "amd.com/gpu", "container-0-request-0")]);
    // The failed try's claim is deleted: one claim left, the recorded one.
    let uid = pod.uid().unwrap();
    let owned = wait("one claim of p", || {
        let claims = claims.clone();
        let uid = uid.clone();
        async move {
            let owned: Vec<ResourceClaim> = claims
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|c| c.owner_references().iter().any(|o| o.uid == uid))
                .collect();
            (owned.len() == 1).then_some(owned)
        }
    })
    .await;
    let c = &owned[0];
    assert_eq!(c.name_any(), st.resource_claim_name);
    assert!(c.name_any().starts_with("p-extended-resources-"));
    assert_eq!(c.annotations()[EXTENDED_RESOURCE_CLAIM], "true");
    let status = c.status.as_ref().unwrap();
    assert_eq!(status.reserved_for.as_ref().unwrap()[0].uid, uid);
    let r = &status
        .allocation
        .as_ref()
        .unwrap()
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        (r.request.as_str(), r.pool.as_str()),
        ("container-0-request-0", "b-dra")
    );
    let used = r.consumed_capacity.as_ref().unwrap();
    assert_eq!(
        (
            used["memory"].0.as_str(),
            used["computeUnits"].0.as_str(),
            used["shares"].0.as_str()
        ),
        ("64Gi", "104", "1")
    );

    // The DRA node's GPU is held whole; the other node is a device plugin's: q waits, and
    // says why for each node.
    create(&pods, count_pod("q", 1)).await;
    let message = wait("q unschedulable", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("q").await.ok()?;
            let cond = p
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled")?;
            (cond.status == "False").then_some(cond.message?)
        }
    })
    .await;
    assert!(
        message.starts_with("0/2 nodes are available: "),
        "{message}"
    );
    assert!(
        message.contains("1 node(s) serve amd.com/gpu through a device plugin, not DRA"),
        "{message}"
    );
    assert!(
        message.contains("1 cannot allocate claim \"<extended-resources: amd.com/gpu>\""),
        "{message}"
    );
}
