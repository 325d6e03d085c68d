//! The claim controller's record of a pod's claim (`status.resourceClaimStatuses`) comes
//! before placement, as upstream: kube-scheduler finds a template's claim only through the
//! pod's status, and the controller retries recording it. Found by the chaos run's DRA node
//! (tests/chaos): a 409 on that status patch left pods bound with no record (kubelet cannot
//! find their claim: Pending for ever), and a failed binding after it made every later try
//! write the claim with the version it was created at (409 for ever).

use std::time::Duration;

use hami_apiserver::{ApiServer, Config};
use hami_kube_scheduler_sim::SimKubeScheduler;
use hami_kube_scheduler_sim::dra::DraOptions;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::Api;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::common::{DRIVER, create, slice};

/// The pod once bound, with its claim record and claims (within 20 s).
async fn bound(
    pods: &Api<Pod>,
    claims: &Api<ResourceClaim>,
    name: &str,
) -> (Pod, Vec<ResourceClaim>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let p = pods.get(name).await.unwrap();
        if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
            let uid = p.uid().unwrap();
            let owned = claims
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|c| c.owner_references().iter().any(|o| o.uid == uid))
                .collect();
            return (p, owned);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod {name} not bound within 20 s: {:?}",
            p.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_is_bound_only_with_its_claim_recorded_and_allocated() {
    let server = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    create(
        &Api::<Node>::all(client.clone()),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}),
    )
    .await;
    create(&Api::<ResourceSlice>::all(client.clone()), slice("n")).await;
    create(&Api::<DeviceClass>::all(client.clone()), json!({"apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass", "metadata": {"name": "amdgpu-slice"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}}))
    .await;
    create(
        &Api::<ResourceClaimTemplate>::namespaced(client.clone(), "default"),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "slice", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu-slice", "count": 1,
            "capacity": {"requests": {"memory": "8Gi", "computeUnits": "26"}}}}]}}}}),
    )
    .await;
    // The controller's record of the claim in the pod's status is refused once, and so is
    // the first binding (whose undo changes the claim).
    let faults = server.faults();
    faults.fail_next(Some("patch"), Some("pods/status"), 1, 409);
    faults.fail_next(Some("create"), Some("pods/binding"), 1, 409);
    tokio::spawn(
        SimKubeScheduler::dra_only(client.clone(), "default-scheduler", DraOptions::default())
            .run(),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    create(&pods, json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"schedulerName": "default-scheduler",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "slice"}],
            "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]}}))
    .await;

    let (pod, owned) = bound(&pods, &claims, "p").await;
    let recorded: Vec<Option<String>> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|s| s.resource_claim_name.clone())
        .collect();
    assert_eq!(
        owned.len(),
        1,
        "one claim for the pod's one entry: {owned:?}"
    );
    let claim = &owned[0];
    assert_eq!(
        recorded,
        vec![Some(claim.name_any())],
        "bound with its claim recorded in its status"
    );
    let status = claim.status.as_ref().expect("the claim has a status");
    assert!(status.allocation.is_some(), "allocated: {status:?}");
    assert!(
        status
            .reserved_for
            .iter()
            .flatten()
            .any(|r| Some(&r.uid) == pod.metadata.uid.as_ref()),
        "reserved for the pod: {status:?}"
    );
}
