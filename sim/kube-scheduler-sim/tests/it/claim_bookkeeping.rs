//! What the claim controller keeps of each pod to bridge the informers' lag (the claim it
//! created, the record it wrote in the pod's status) lasts as long as the pod: a long demo
//! has many pods come and go, and these entries were once kept for every pod ever seen.

use std::time::Duration;

use futures::StreamExt;
use hami_apiserver::{ApiServer, Config};
use hami_kube_scheduler_sim::claim_controller::{ensure_claims, free};
use hami_kube_scheduler_sim::dra::{DraOptions, DraState};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::Client;
use kube::api::{Api, DeleteParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::common::create;

/// Waits (bounded: 20 s) until `f` holds.
async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A pod informer, as the simulated scheduler runs one.
async fn pod_informer(client: &Client) -> Store<Pod> {
    let (store, writer) = reflector::store::<Pod>();
    tokio::spawn(
        reflector::reflector(
            writer,
            watcher(Api::<Pod>::all(client.clone()), watcher::Config::default()).default_backoff(),
        )
        .for_each(|_| async {}),
    );
    let _ = store.wait_until_ready().await;
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_of_gone_pods_are_forgotten() {
    let server = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    create(
        &Api::<ResourceClaimTemplate>::namespaced(client.clone(), "default"),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "slice", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu-slice", "count": 1}}]}}}}),
    )
    .await;
    // Started after the template exists: its first list holds it.
    let state = DraState::start(&client, DraOptions::default()).await;
    let pods = pod_informer(&client).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    const ROUNDS: usize = 6;
    const PODS: usize = 8;
    for round in 0..ROUNDS {
        let names: Vec<String> = (0..PODS).map(|i| format!("p-{round}-{i}")).collect();
        for name in &names {
            create(
                &api,
                json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"resourceClaims": [
                    {"name": "a", "resourceClaimTemplateName": "slice"},
                    {"name": "b", "resourceClaimTemplateName": "slice"}],
                    "containers": [{"name": "c", "image": "x"}]}}),
            )
            .await;
        }
        until("the pods are seen", || {
            names
                .iter()
                .all(|n| pods.get(&ObjectRef::new(n).within("default")).is_some())
        })
        .await;
        for name in &names {
            let pod = pods.get(&ObjectRef::new(name).within("default")).unwrap();
            ensure_claims(&client, &state, &pod).await.unwrap();
        }
        // While the pods live, a freeing pass keeps what the controller made for them.
        free(&client, &state, &pods).await;
        assert_eq!(
            state.claim_controller_entries(),
            (2 * PODS, 2 * PODS),
            "round {round}: two claims created and recorded per live pod"
        );
        for name in &names {
            api.delete(name, &DeleteParams::default()).await.unwrap();
        }
        until("the pods are gone", || {
            names
                .iter()
                .all(|n| pods.get(&ObjectRef::new(n).within("default")).is_none())
        })
        .await;
        free(&client, &state, &pods).await;
        assert_eq!(
            state.claim_controller_entries(),
            (0, 0),
            "round {round}: nothing kept of {} pods that came and went",
            (round + 1) * PODS
        );
    }
}
