//! `resource.k8s.io/v1` (DRA) on the embedded server: DeviceClass and ResourceSlice
//! (cluster-scoped), ResourceClaim (namespaced, `status` subresource) and
//! ResourceClaimTemplate (namespaced) through kube's dynamic API — create, get, list, watch —
//! plus discovery and the real kubectl's `get resourceslices`.

use crate::common;

use std::time::Duration;

use common::{client, start};
use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use serde_json::{Value, json};

fn ar(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        api_version: "resource.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn obj(v: Value) -> DynamicObject {
    serde_json::from_value(v).expect("a DynamicObject")
}

fn device_class() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "amdgpu-slice"},
        "spec": {
            "selectors": [{"cel": {"expression": "device.driver == \"amdgpu.hami-rs.io\""}}],
            "extendedResourceName": "amd.com/gpu"
        }
    })
}

fn slice(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "amdgpu.hami-rs.io",
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [{
                "name": "gpu-0",
                "allowMultipleAllocations": true,
                "attributes": {"type": {"string": "amdgpu-slice"}},
                "capacity": {"memory": {"value": "64Gi",
                    "requestPolicy": {"default": "64Gi", "validRange": {"min": "1Mi", "max": "64Gi", "step": "1Mi"}}}}
            }]
        }
    })
}

fn claim(name: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu-slice", "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": "4Gi"}}
        }}]}}
    })
}

fn template(name: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": claim("x")["spec"].clone()}
    })
}

fn names(list: &kube::core::ObjectList<DynamicObject>) -> Vec<String> {
    list.items
        .iter()
        .map(|o| o.metadata.name.clone().unwrap_or_default())
        .collect()
}

/// The next event of a watch, within 10 s.
async fn next_event(
    s: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<DynamicObject>>> + Unpin),
) -> WatchEvent<DynamicObject> {
    tokio::time::timeout(Duration::from_secs(10), s.try_next())
        .await
        .expect("a watch event within 10 s")
        .expect("a good event")
        .expect("the watch is open")
}

/// create/get/list/watch of one kind; `make(name)` builds an object of it.
async fn crud_and_watch(api: Api<DynamicObject>, make: impl Fn(&str) -> Value, kind: &str) {
    let mut w = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let created = api.create(&PostParams::default(), &obj(make("a"))).await;
    let created = created.unwrap_or_else(|e| panic!("create {kind}: {e}"));
    assert_eq!(created.types.as_ref().unwrap().kind, kind);
    assert_eq!(
        created.types.as_ref().unwrap().api_version,
        "resource.k8s.io/v1"
    );
    assert_eq!(created.metadata.uid.as_ref().unwrap().len(), 36);
    // the spec is kept as sent (no field of these kinds is dropped)
    assert_eq!(created.data["spec"], make("a")["spec"], "{kind}");
    let e = api
        .create(&PostParams::default(), &obj(make("a")))
        .await
        .unwrap_err();
    assert!(matches!(e, kube::Error::Api(ref s) if s.code == 409), "{e}");
    api.create(&PostParams::default(), &obj(make("b")))
        .await
        .unwrap();
    let got = api.get("a").await.unwrap();
    assert_eq!(
        got.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(
        names(&api.list(&ListParams::default()).await.unwrap()),
        ["a", "b"]
    );
    match next_event(&mut w).await {
        WatchEvent::Added(o) => assert_eq!(o.metadata.name.as_deref(), Some("a")),
        other => panic!("{kind}: expected ADDED a, got {other:?}"),
    }
    match next_event(&mut w).await {
        WatchEvent::Added(o) => assert_eq!(o.metadata.name.as_deref(), Some("b")),
        other => panic!("{kind}: expected ADDED b, got {other:?}"),
    }
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"l": "1"}}})),
    )
    .await
    .unwrap();
    match next_event(&mut w).await {
        WatchEvent::Modified(o) => assert_eq!(o.metadata.labels.unwrap()["l"], "1"),
        other => panic!("{kind}: expected MODIFIED, got {other:?}"),
    }
    api.delete("b", &Default::default()).await.unwrap();
    match next_event(&mut w).await {
        WatchEvent::Deleted(o) => assert_eq!(o.metadata.name.as_deref(), Some("b")),
        other => panic!("{kind}: expected DELETED, got {other:?}"),
    }
}

#[tokio::test]
async fn every_kind_creates_gets_lists_and_watches() {
    let server = start().await;
    let c = client(&server);
    crud_and_watch(
        Api::all_with(c.clone(), &ar("DeviceClass", "deviceclasses")),
        |n| {
            let mut v = device_class();
            v["metadata"]["name"] = json!(n);
            v
        },
        "DeviceClass",
    )
    .await;
    crud_and_watch(
        Api::all_with(c.clone(), &ar("ResourceSlice", "resourceslices")),
        |n| slice(n, "node-a"),
        "ResourceSlice",
    )
    .await;
    crud_and_watch(
        Api::namespaced_with(c.clone(), "default", &ar("ResourceClaim", "resourceclaims")),
        claim,
        "ResourceClaim",
    )
    .await;
    crud_and_watch(
        Api::namespaced_with(
            c.clone(),
            "default",
            &ar("ResourceClaimTemplate", "resourceclaimtemplates"),
        ),
        template,
        "ResourceClaimTemplate",
    )
    .await;

    // scope: slices are cluster-scoped, claims are namespaced
    let (code, _) = common::http(
        &server,
        "GET",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceslices",
        &[],
        b"",
    )
    .await;
    assert_eq!(code, 404);
    let (code, body) = common::http(
        &server,
        "GET",
        "/apis/resource.k8s.io/v1/resourceclaims",
        &[],
        b"",
    )
    .await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let all: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(all["kind"], "ResourceClaimList");
    assert_eq!(all["items"][0]["metadata"]["namespace"], "default");
}

#[tokio::test]
async fn discovery_lists_the_group_with_claim_status() {
    let server = start().await;
    let (code, body) = common::http(&server, "GET", "/apis/resource.k8s.io/v1", &[], b"").await;
    assert_eq!(code, 200);
    let list: Value = serde_json::from_slice(&body).unwrap();
    let res: Vec<(&str, bool)> = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap(),
                r["namespaced"].as_bool().unwrap(),
            )
        })
        .collect();
    for want in [
        ("deviceclasses", false),
        ("resourceslices", false),
        ("resourceclaims", true),
        ("resourceclaims/status", true),
        ("resourceclaimtemplates", true),
    ] {
        assert!(res.contains(&want), "{want:?} missing from {res:?}");
    }
    assert!(!res.iter().any(|(n, _)| *n == "resourceslices/status"));
    let (code, body) = common::http(&server, "GET", "/apis", &[], b"").await;
    assert_eq!(code, 200);
    let groups: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "resource.k8s.io" && g["preferredVersion"]["version"] == "v1"),
        "{groups}"
    );
}

#[tokio::test]
async fn claim_status_is_written_only_through_the_subresource() {
    let server = start().await;
    let c = client(&server);
    let claims: Api<DynamicObject> =
        Api::namespaced_with(c, "default", &ar("ResourceClaim", "resourceclaims"));
    let allocation = json!({"devices": {"results": [{
        "request": "gpu", "driver": "amdgpu.hami-rs.io", "pool": "node-a", "device": "gpu-0",
        "shareID": "7d3c0c56-1a0b-4a53-9a51-6b8b2f1f0b10",
        "consumedCapacity": {"memory": "4Gi"}
    }]}});
    // a create cannot allocate: upstream's strategy drops the status (kept as `{}`)
    let mut forged = claim("c");
    forged["status"] = json!({"allocation": allocation,
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u-0"}]});
    let created = claims
        .create(&PostParams::default(), &obj(forged))
        .await
        .unwrap();
    assert_eq!(created.data["status"], json!({}), "{}", created.data);
    assert_eq!(claims.get("c").await.unwrap().data["status"], json!({}));
    // what kube-scheduler does: allocation and reservedFor through status
    let done = claims
        .patch_status(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "allocation": allocation,
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "u-1"}]
            }})),
        )
        .await
        .unwrap();
    assert_eq!(done.data["status"]["allocation"], allocation);
    // the main resource ignores status changes (a driver must use the subresource)
    let mut stale = claims.get("c").await.unwrap();
    stale.data["status"] = json!({"devices": [{"driver": "x", "pool": "p", "device": "d"}]});
    stale.metadata.labels = Some([("l".to_string(), "1".to_string())].into());
    let replaced = claims
        .replace("c", &PostParams::default(), &stale)
        .await
        .unwrap();
    assert_eq!(replaced.metadata.labels.unwrap()["l"], "1");
    assert!(
        replaced.data["status"].get("devices").is_none(),
        "{}",
        replaced.data
    );
    assert_eq!(replaced.data["status"]["allocation"], allocation);
    // the subresource does not change the spec
    let spec = replaced.data["spec"].clone();
    let with_devices = claims
        .patch_status(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "spec": {"devices": {"requests": []}},
                "status": {"devices": [{"driver": "amdgpu.hami-rs.io", "pool": "node-a",
                    "device": "gpu-0", "data": {"cuRanges": "0-7"}}]}
            })),
        )
        .await
        .unwrap();
    assert_eq!(with_devices.data["spec"], spec);
    assert_eq!(
        with_devices.data["status"]["devices"][0]["data"]["cuRanges"],
        "0-7"
    );
    let got = claims.get_status("c").await.unwrap();
    assert_eq!(got.data["status"]["reservedFor"][0]["uid"], "u-1");
    // optimistic concurrency on the subresource too
    let mut old = got.clone();
    old.metadata.resource_version = replaced.metadata.resource_version.clone();
    let e = claims
        .replace_status("c", &PostParams::default(), &old)
        .await
        .unwrap_err();
    assert!(matches!(e, kube::Error::Api(ref s) if s.code == 409), "{e}");
}

#[tokio::test]
async fn kubectl_gets_resourceslices() {
    let Some(kubectl) = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("kubectl"))
            .find(|k| k.is_file())
    }) else {
        panic!("kubectl is not on PATH: this test needs the real kubectl");
    };
    let server = start().await;
    let c = client(&server);
    let slices: Api<DynamicObject> = Api::all_with(c, &ar("ResourceSlice", "resourceslices"));
    slices
        .create(
            &PostParams::default(),
            &obj(slice("node-a-amdgpu-0", "node-a")),
        )
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!(
        "hami-apiserver-resource-v1-{}",
        hami_apiserver::meta::new_uid()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let run = |args: &'static [&'static str]| {
        let kubectl = kubectl.clone();
        let kubeconfig = kubeconfig.clone();
        let dir = dir.clone();
        async move {
            let out = tokio::time::timeout(
                Duration::from_secs(60),
                tokio::process::Command::new(&kubectl)
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(args)
                    .env("HOME", &dir) // a private discovery cache
                    .output(),
            )
            .await
            .expect("kubectl finished within 60 s")
            .expect("kubectl runs");
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success(),
                "kubectl {args:?}: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            stdout
        }
    };
    let table = run(&["get", "resourceslices"]).await;
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["NAME", "NODE", "DRIVER", "POOL", "AGE"],
        "{table}"
    );
    assert_eq!(
        lines[1][..4],
        ["node-a-amdgpu-0", "node-a", "amdgpu.hami-rs.io", "node-a"],
        "{table}"
    );
    // kubectl's --field-selector goes to the server
    let mine = run(&[
        "get",
        "resourceslices",
        "--field-selector",
        "spec.nodeName=node-a,spec.driver=amdgpu.hami-rs.io",
        "-o",
        "name",
    ])
    .await;
    assert_eq!(mine.trim(), "resourceslice.resource.k8s.io/node-a-amdgpu-0");
    let none = run(&[
        "get",
        "resourceslices",
        "--field-selector",
        "spec.nodeName=node-b",
        "-o",
        "name",
    ])
    .await;
    assert_eq!(none.trim(), "", "{none}");
    // claims print their state: pending until allocated, then allocated,reserved
    let claims: Api<DynamicObject> = Api::namespaced_with(
        client(&server),
        "default",
        &ar("ResourceClaim", "resourceclaims"),
    );
    for n in ["a-pending", "b-running"] {
        claims
            .create(&PostParams::default(), &obj(claim(n)))
            .await
            .unwrap();
    }
    claims
        .patch_status(
            "b-running",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "allocation": {"devices": {"results": [{"request": "gpu",
                    "driver": "amdgpu.hami-rs.io", "pool": "node-a", "device": "gpu-0"}]}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "u-1"}]
            }})),
        )
        .await
        .unwrap();
    let table = run(&["get", "resourceclaims"]).await;
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["NAME", "STATE", "AGE"], "{table}");
    assert_eq!(lines[1][..2], ["a-pending", "pending"], "{table}");
    assert_eq!(
        lines[2][..2],
        ["b-running", "allocated,reserved"],
        "{table}"
    );
    let json_out = run(&["get", "resourceslice", "node-a-amdgpu-0", "-o", "json"]).await;
    let got: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(got["spec"]["devices"][0]["name"], "gpu-0");
    let kinds = run(&["api-resources", "--api-group=resource.k8s.io"]).await;
    for k in [
        "DeviceClass",
        "ResourceClaim",
        "ResourceClaimTemplate",
        "ResourceSlice",
    ] {
        assert!(kinds.contains(k), "{k} missing from\n{kinds}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a kubelet plugin does (`spec.nodeName=<node>,spec.driver=<driver>`): only that
/// node's slices of that driver, in lists and watches; upstream's field labels only.
#[tokio::test]
async fn slices_are_listed_and_watched_by_field_selector() {
    let server = start().await;
    let c = client(&server);
    let slices: Api<DynamicObject> = Api::all_with(c, &ar("ResourceSlice", "resourceslices"));
    let mine = "spec.nodeName=node-a,spec.driver=amdgpu.hami-rs.io";
    let mut w = slices
        .watch(&WatchParams::default().fields(mine), "0")
        .await
        .unwrap()
        .boxed();
    let mut other_driver = slice("node-a-other", "node-a");
    other_driver["spec"]["driver"] = json!("gpu.example.com");
    let mut all_nodes = slice("shared", "x");
    let spec = all_nodes["spec"].as_object_mut().unwrap();
    spec.remove("nodeName");
    spec.insert("allNodes".into(), json!(true));
    for o in [
        slice("node-b-0", "node-b"),
        other_driver,
        all_nodes,
        slice("node-a-0", "node-a"),
    ] {
        slices
            .create(&PostParams::default(), &obj(o))
            .await
            .unwrap();
    }
    let listed = slices
        .list(&ListParams::default().fields(mine))
        .await
        .unwrap();
    assert_eq!(names(&listed), ["node-a-0"]);
    // a slice without a node reads as spec.nodeName=""
    let unassigned = slices
        .list(&ListParams::default().fields("spec.nodeName="))
        .await
        .unwrap();
    assert_eq!(names(&unassigned), ["shared"]);
    let by_name = slices
        .list(&ListParams::default().fields("metadata.name=node-b-0"))
        .await
        .unwrap();
    assert_eq!(names(&by_name), ["node-b-0"]);
    // the watch saw only ours: node-b's, the other driver's and the shared slice are
    // created before it, so the first event is node-a-0's
    match next_event(&mut w).await {
        WatchEvent::Added(o) => assert_eq!(o.metadata.name.as_deref(), Some("node-a-0")),
        other => panic!("expected ADDED node-a-0, got {other:?}"),
    }
    slices
        .patch(
            "node-b-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"l": "1"}}})),
        )
        .await
        .unwrap();
    slices
        .patch(
            "node-a-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"l": "2"}}})),
        )
        .await
        .unwrap();
    match next_event(&mut w).await {
        WatchEvent::Modified(o) => assert_eq!(o.metadata.name.as_deref(), Some("node-a-0")),
        other => panic!("expected MODIFIED node-a-0, got {other:?}"),
    }
    // upstream's conversion refuses every other field label, metadata.namespace included
    for bad in ["spec.pool.name", "metadata.namespace", "spec.allNodes"] {
        for watch in [false, true] {
            let e = if watch {
                slices
                    .watch(&WatchParams::default().fields(&format!("{bad}=x")), "0")
                    .await
                    .err()
                    .expect("refused")
            } else {
                slices
                    .list(&ListParams::default().fields(&format!("{bad}=x")))
                    .await
                    .unwrap_err()
            };
            match e {
                kube::Error::Api(s) => {
                    assert_eq!(s.code, 400, "{bad}");
                    assert_eq!(
                        s.message,
                        format!(
                            "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: {bad}"
                        )
                    );
                }
                other => panic!("{bad}: expected a 400, got {other}"),
            }
        }
    }
}
