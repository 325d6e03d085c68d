//! ResourceSlice publishing against the embedded API server, from the MI210 capture (8 ×
//! MI210, two XGMI hives): the slice appears Node-owned with the right devices and
//! capacities; an unchanged pool writes nothing (resourceVersion kept); a change bumps the
//! generation; an unhealthy device becomes a taint and stays; stale slices of this driver
//! and node go, other drivers' and nodes' stay (listed by field selector: another node's
//! slices are never even read); the periodic loop republishes.

use std::time::Duration;

use hami_amd_discovery::registration::RegistrationSettings;
use hami_amdgpu_dra_plugin::slice_publisher::{SlicePublisher, resource_slices};
use hami_dra_core::api::ResourceSlice;
use hami_dra_core::slice::{COMPUTE_UNITS, MEMORY, SHARES, UNHEALTHY_TAINT};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;

struct Harness {
    server: hami_apiserver::RunningApiServer,
    client: kube::Client,
    tree: hami_sysfs_fixtures::FixtureTree,
    node_uid: String,
}

async fn harness() -> Harness {
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .expect("server starts");
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-a"}})).unwrap();
    let node = nodes.create(&PostParams::default(), &node).await.unwrap();
    Harness {
        server,
        client,
        tree: hami_sysfs_fixtures::mi210_xgmi().unwrap(),
        node_uid: node.metadata.uid.unwrap(),
    }
}

fn publisher(h: &Harness) -> SlicePublisher {
    SlicePublisher {
        client: h.client.clone(),
        driver: hami_dra_core::DRIVER.into(),
        node: "node-a".into(),
        sysfs_root: h.tree.sysfs_root(),
        dev_root: h.tree.dev_root(),
        settings: RegistrationSettings::default(),
    }
}

fn slices_api(h: &Harness) -> Api<DynamicObject> {
    Api::all_with(h.client.clone(), &resource_slices())
}

async fn slices(h: &Harness) -> Vec<(ResourceSlice, String)> {
    let list = slices_api(h).list(&Default::default()).await.unwrap();
    list.items
        .into_iter()
        .map(|o| {
            let rv = o.metadata.resource_version.clone().unwrap();
            (
                serde_json::from_value(serde_json::to_value(o).unwrap()).unwrap(),
                rv,
            )
        })
        .collect()
}

fn slice_obj(name: &str, driver: &str, node: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node,
            "pool": {"name": node, "generation": 3, "resourceSliceCount": 1}, "devices": []}
    }))
    .unwrap()
}

#[tokio::test]
async fn the_pool_is_published_kept_bumped_tainted_and_cleaned() {
    let h = harness().await;
    // leftovers: one of ours (an older naming), another driver's, ours for another node
    for (name, driver, node) in [
        ("node-a-old", hami_dra_core::DRIVER, "node-a"),
        ("node-a-rocm", "gpu.amd.com", "node-a"),
        ("node-b-ours", hami_dra_core::DRIVER, "node-b"),
    ] {
        slices_api(&h)
            .create(&PostParams::default(), &slice_obj(name, driver, node))
            .await
            .unwrap();
    }
    let mut p = publisher(&h);
    let first = p.refresh().await.unwrap();
    let ours = "node-a-amdgpu-hami-rs-io-0";
    assert_eq!(first.created, [ours]);
    assert_eq!(first.deleted, ["node-a-old"]);
    // the stale slice's generation 3 was the previous pool's: the new one is newer
    assert_eq!(first.generation, 4);
    let all = slices(&h).await;
    let mut names: Vec<&str> = all
        .iter()
        .map(|(s, _)| s.metadata.name.as_deref().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["node-a-amdgpu-hami-rs-io-0", "node-a-rocm", "node-b-ours"]
    );
    let (s, rv) = all
        .iter()
        .find(|(s, _)| s.metadata.name.as_deref() == Some(ours))
        .unwrap()
        .clone();
    assert_eq!(s.spec.driver, hami_dra_core::DRIVER);
    assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
    assert_eq!(s.spec.pool.name, "node-a");
    assert_eq!(s.spec.pool.resource_slice_count, 1);
    let owner = &s.metadata.owner_references[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Node", "node-a", h.node_uid.as_str())
    );
    assert_eq!(s.spec.devices.len(), 8);
    for (i, d) in s.spec.devices.iter().enumerate() {
        assert_eq!(d.name, format!("gpu-{i}"));
        assert!(d.allow_multiple_allocations);
        assert!(d.taints.is_empty(), "{d:?}");
        // MI210: 64 GiB, 104 CUs (gfx90a, no WGP pairs), split count 10
        assert_eq!(d.capacity[MEMORY].value, "64Gi", "{d:?}");
        assert_eq!(d.capacity[COMPUTE_UNITS].value, "104");
        assert_eq!(d.capacity[SHARES].value, "10");
        let cu_policy = d.capacity[COMPUTE_UNITS].request_policy.as_ref().unwrap();
        assert_eq!(
            cu_policy.valid_range.as_ref().unwrap().step.as_deref(),
            Some("1")
        );
        assert_eq!(
            d.attributes["gfxVersion"].version.as_deref(),
            Some("9.0.10")
        );
        assert!(d.attributes.contains_key("xgmiHive"), "{d:?}");
    }

    // nothing changed: nothing written, the resourceVersion stays
    let again = p.refresh().await.unwrap();
    assert!(!again.wrote(), "{again:?}");
    assert_eq!(again.generation, 4);
    let (_, rv_again) = slices(&h)
        .await
        .into_iter()
        .find(|(s, _)| s.metadata.name.as_deref() == Some(ours))
        .unwrap();
    assert_eq!(rv_again, rv);

    // a change (the split count): generation + 1, shares follow
    p.settings.split_count = Some(4);
    let changed = p.refresh().await.unwrap();
    assert_eq!(changed.updated, [ours]);
    assert_eq!(changed.generation, 5);
    let (s, _) = slices(&h)
        .await
        .into_iter()
        .find(|(s, _)| s.metadata.name.as_deref() == Some(ours))
        .unwrap();
    assert_eq!(s.spec.pool.generation, 5);
    assert!(
        s.spec
            .devices
            .iter()
            .all(|d| d.capacity[SHARES].value == "4")
    );

    // gpu-0's render node goes: still published, tainted NoSchedule; the others untouched
    let reg = hami_amd_discovery::registration::register(
        &hami_amd_discovery::discovery::discover(&h.tree.sysfs_root()).unwrap(),
        &RegistrationSettings::default(),
        |_| true,
    );
    h.tree
        .remove_dev(&format!("dri/renderD{}", reg.devices[0].render))
        .unwrap();
    let tainted = p.refresh().await.unwrap();
    assert_eq!(tainted.generation, 6);
    let (s, _) = slices(&h)
        .await
        .into_iter()
        .find(|(s, _)| s.metadata.name.as_deref() == Some(ours))
        .unwrap();
    assert_eq!(s.spec.devices.len(), 8);
    let t = &s.spec.devices[0].taints;
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(
        (t[0].key.as_str(), t[0].effect.as_str()),
        (UNHEALTHY_TAINT, "NoSchedule")
    );
    let added = t[0].time_added.clone().unwrap();
    assert!(s.spec.devices[1..].iter().all(|d| d.taints.is_empty()));
    // still unhealthy: the taint (and its time) is kept, nothing written
    assert!(!p.refresh().await.unwrap().wrote());
    let (s, _) = slices(&h)
        .await
        .into_iter()
        .find(|(s, _)| s.metadata.name.as_deref() == Some(ours))
        .unwrap();
    assert_eq!(s.spec.devices[0].taints[0].time_added, Some(added));
}

#[tokio::test]
async fn the_loop_republishes_a_deleted_slice_and_stops_on_shutdown() {
    let h = harness().await;
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(publisher(&h).run(Duration::from_millis(100), async move {
        let _ = rx.await;
    }));
    let ours = "node-a-amdgpu-hami-rs-io-0";
    let api = slices_api(&h);
    let wait_for_slice = async || {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(o) = api.get(ours).await {
                return o;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the slice never appeared"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let first = wait_for_slice().await;
    // someone deletes it (an admin, a GC race): the next round puts it back
    api.delete(ours, &Default::default()).await.unwrap();
    let back = wait_for_slice().await;
    assert_ne!(back.metadata.uid, first.metadata.uid);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the loop stops on shutdown")
        .unwrap();
}

#[tokio::test]
async fn another_nodes_slices_are_never_read_or_changed() {
    let h = harness().await;
    // node-b's slices of our driver, one of them unreadable as a v1 slice: were it ever
    // taken for ours, the publisher would delete it as a broken slice of its own
    let mut broken = slice_obj(
        "node-b-amdgpu-hami-rs-io-0",
        hami_dra_core::DRIVER,
        "node-b",
    );
    broken.data["spec"]["devices"] = json!([{"name": 5}]);
    let mut before = Vec::new();
    for o in [
        broken,
        slice_obj("node-b-old", hami_dra_core::DRIVER, "node-b"),
    ] {
        let created = slices_api(&h)
            .create(&PostParams::default(), &o)
            .await
            .unwrap();
        before.push(created.metadata.resource_version.unwrap());
    }
    h.server.clear_request_log();
    let mut p = publisher(&h);
    let first = p.refresh().await.unwrap();
    assert_eq!(first.created, ["node-a-amdgpu-hami-rs-io-0"]);
    assert!(first.deleted.is_empty(), "{first:?}");
    // a change, so that the second round writes too
    p.settings.split_count = Some(4);
    assert_eq!(
        p.refresh().await.unwrap().updated,
        ["node-a-amdgpu-hami-rs-io-0"]
    );
    let log = h.server.request_log();
    let slice_requests: Vec<_> = log
        .iter()
        .filter(|r| r.resource == "resourceslices")
        .collect();
    let lists: Vec<_> = slice_requests.iter().filter(|r| r.verb == "list").collect();
    assert_eq!(lists.len(), 2, "{slice_requests:#?}");
    for l in &lists {
        assert!(
            l.query
                .contains("fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Damdgpu.hami-rs.io"),
            "{l:?}"
        );
    }
    for r in &slice_requests {
        assert!(
            r.name.as_deref().is_none_or(|n| n.starts_with("node-a-")),
            "a request about another node's slice: {r:?}"
        );
    }
    // both of node-b's slices are as they were
    for (name, rv) in ["node-b-amdgpu-hami-rs-io-0", "node-b-old"]
        .iter()
        .zip(&before)
    {
        let got = slices_api(&h).get(name).await.unwrap();
        assert_eq!(got.metadata.resource_version.as_ref(), Some(rv), "{name}");
    }
}
