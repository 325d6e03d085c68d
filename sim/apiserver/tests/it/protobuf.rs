//! Protobuf request bodies as client-go sends them (magic `k8s\0` + runtime.Unknown), on
//! create, update, subresources and delete, and the Accept negotiation around them.

use crate::common;

use common::{http, start};
use k8s_pb::api::coordination::v1 as coordination;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use prost::Message;
use serde_json::Value;

const PB: &str = "application/vnd.kubernetes.protobuf";
/// client-go's default for typed clients: protobuf first, JSON as the fallback.
const PB_FIRST: &str = "application/vnd.kubernetes.protobuf, */*";

fn envelope(api_version: &str, kind: &str, msg: &impl Message) -> Vec<u8> {
    let u = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(msg.encode_to_vec()),
        ..Default::default()
    };
    let mut out = b"k8s\0".to_vec();
    out.extend(u.encode_to_vec());
    out
}

fn meta(name: &str) -> Option<meta::ObjectMeta> {
    Some(meta::ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    })
}

async fn send(
    server: &hami_apiserver::RunningApiServer,
    method: &str,
    path: &str,
    accept: &str,
    body: &[u8],
) -> (u16, Value) {
    let (code, out) = http(
        server,
        method,
        path,
        &[("Content-Type", PB), ("Accept", accept)],
        body,
    )
    .await;
    (code, serde_json::from_slice(&out).unwrap_or_default())
}

#[tokio::test]
async fn protobuf_bodies_on_every_write() {
    let server = start().await;
    let pod = core::Pod {
        metadata: meta("p"),
        spec: Some(core::PodSpec {
            containers: vec![core::Container {
                name: Some("c".into()),
                image: Some("busybox".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(Default::default()),
    };
    let pods = "/api/v1/namespaces/default/pods";
    let (code, created) = send(
        &server,
        "POST",
        pods,
        PB_FIRST,
        &envelope("v1", "Pod", &pod),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["spec"]["containers"][0]["image"], "busybox");
    assert_eq!(
        created["status"]["phase"], "Pending",
        "defaults applied as for JSON"
    );
    // Protobuf only: we cannot answer in it, and say so.
    let mut again = pod.clone();
    again.metadata = meta("q");
    let (code, status) = send(&server, "POST", pods, PB, &envelope("v1", "Pod", &again)).await;
    assert_eq!(code, 406, "{status}");
    assert!(server.get_object("v1", "pods", "default", "q").is_none());
    // The envelope must name the endpoint's kind.
    let cm = core::ConfigMap {
        metadata: meta("x"),
        ..Default::default()
    };
    let (code, status) = send(
        &server,
        "POST",
        pods,
        PB_FIRST,
        &envelope("v1", "ConfigMap", &cm),
    )
    .await;
    assert_eq!(code, 400, "{status}");
    // A binding, as kube-scheduler posts it.
    let binding = core::Binding {
        metadata: meta("p"),
        target: Some(core::ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            ..Default::default()
        }),
    };
    let (code, status) = send(
        &server,
        "POST",
        &format!("{pods}/p/binding"),
        PB_FIRST,
        &envelope("v1", "Binding", &binding),
    )
    .await;
    assert_eq!(code, 201, "{status}");
    assert_eq!(
        server.get_object("v1", "pods", "default", "p").unwrap()["spec"]["nodeName"],
        "n1"
    );
    // A lease created and renewed (PUT with the resourceVersion), as leader election does.
    let leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let mut lease = coordination::Lease {
        metadata: meta("l"),
        spec: Some(coordination::LeaseSpec {
            holder_identity: Some("a".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(meta::MicroTime {
                seconds: Some(1_700_000_000),
                nanos: Some(5_000),
            }),
            ..Default::default()
        }),
    };
    let (code, l) = send(
        &server,
        "POST",
        leases,
        PB_FIRST,
        &envelope("coordination.k8s.io/v1", "Lease", &lease),
    )
    .await;
    assert_eq!(code, 201, "{l}");
    assert_eq!(l["spec"]["renewTime"], "2023-11-14T22:13:20.000005Z");
    let rv = l["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    lease.metadata.as_mut().unwrap().resource_version = Some(rv.clone());
    lease.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let body = envelope("coordination.k8s.io/v1", "Lease", &lease);
    let (code, l) = send(&server, "PUT", &format!("{leases}/l"), PB_FIRST, &body).await;
    assert_eq!(code, 200, "{l}");
    assert_eq!(l["spec"]["holderIdentity"], "b");
    // The same renewal again carries a stale resourceVersion now.
    let (code, _) = send(&server, "PUT", &format!("{leases}/l"), PB_FIRST, &body).await;
    assert_eq!(code, 409);
    // Delete with protobuf DeleteOptions: preconditions are honoured.
    let opts = |uid: &str| meta::DeleteOptions {
        preconditions: Some(meta::Preconditions {
            uid: Some(uid.into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let (code, _) = send(
        &server,
        "DELETE",
        &format!("{pods}/p"),
        PB_FIRST,
        &envelope("v1", "DeleteOptions", &opts("wrong")),
    )
    .await;
    assert_eq!(code, 409);
    let uid = created["metadata"]["uid"].as_str().unwrap();
    let (code, _) = send(
        &server,
        "DELETE",
        &format!("{pods}/p"),
        PB_FIRST,
        &envelope("v1", "DeleteOptions", &opts(uid)),
    )
    .await;
    assert_eq!(code, 200);
    assert!(server.get_object("v1", "pods", "default", "p").is_none());
    // Not an envelope at all: a clear 400.
    let (code, status) = send(&server, "POST", pods, PB_FIRST, b"{\"kind\":\"Pod\"}").await;
    assert_eq!(code, 400);
    assert!(
        status["message"].as_str().unwrap().contains("magic"),
        "{status}"
    );
}
