use std::collections::BTreeMap;

use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::json;

use super::*;

/// What client-go sends: magic + Unknown{typeMeta, raw}.
fn envelope(api_version: &str, kind: &str, msg: &impl Message) -> Vec<u8> {
    let u = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(msg.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = MAGIC.to_vec();
    out.extend(u.encode_to_vec());
    out
}

fn s(v: &str) -> Option<String> {
    Some(v.to_string())
}

#[test]
fn pod_fields_keep_their_kubernetes_json_names() {
    let pod = core::Pod {
        metadata: Some(meta::ObjectMeta {
            name: s("web"),
            namespace: s(""),
            generate_name: s(""),
            labels: BTreeMap::from([("app".into(), "web".into())]),
            creation_timestamp: Some(meta::Time {
                seconds: Some(-62_135_596_800),
                nanos: Some(0),
            }),
            ..Default::default()
        }),
        spec: Some(core::PodSpec {
            containers: vec![core::Container {
                name: s("main"),
                image: s("nginx"),
                ports: vec![core::ContainerPort {
                    container_port: Some(80),
                    ..Default::default()
                }],
                resources: Some(core::ResourceRequirements {
                    limits: BTreeMap::from([("amd.com/gpu".into(), Quantity { string: s("1") })]),
                    ..Default::default()
                }),
                readiness_probe: Some(core::Probe {
                    handler: Some(core::ProbeHandler {
                        http_get: Some(core::HttpGetAction {
                            port: Some(IntOrString {
                                r#type: Some(1),
                                int_val: Some(0),
                                str_val: s("http"),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    period_seconds: Some(0),
                    ..Default::default()
                }),
                env: vec![core::EnvVar {
                    name: s("A"),
                    value_from: Some(core::EnvVarSource {
                        config_map_key_ref: Some(core::ConfigMapKeySelector {
                            local_object_reference: Some(core::LocalObjectReference {
                                name: s("cfg"),
                            }),
                            key: s("k"),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            volumes: vec![core::Volume {
                name: s("v"),
                volume_source: Some(core::VolumeSource {
                    aws_elastic_block_store: Some(core::AwsElasticBlockStoreVolumeSource {
                        volume_id: s("vol-1"),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }],
            automount_service_account_token: Some(false),
            ..Default::default()
        }),
        status: Some(core::PodStatus::default()),
    };
    let v = decode(&envelope("v1", "Pod", &pod)).unwrap();
    assert_eq!(
        v,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "containers": [{
                    "name": "main", "image": "nginx",
                    "ports": [{"containerPort": 80}],
                    "resources": {"limits": {"amd.com/gpu": "1"}},
                    "readinessProbe": {"httpGet": {"port": "http"}, "periodSeconds": 0},
                    "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}],
                }],
                "volumes": [{"name": "v", "awsElasticBlockStore": {"volumeID": "vol-1"}}],
                "automountServiceAccountToken": false,
            },
            "status": {},
        })
    );
}

#[test]
fn secrets_times_and_raw_json() {
    let secret = core::Secret {
        metadata: Some(meta::ObjectMeta {
            name: s("s"),
            managed_fields: vec![meta::ManagedFieldsEntry {
                manager: s("kubectl"),
                time: Some(meta::Time {
                    seconds: Some(1_700_000_000),
                    nanos: Some(0),
                }),
                fields_v1: Some(meta::FieldsV1 {
                    raw: Some(br#"{"f:data":{}}"#.to_vec()),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        data: BTreeMap::from([("k".into(), b"\x00hi".to_vec()), ("e".into(), vec![])]),
        string_data: BTreeMap::from([("empty".into(), String::new())]),
        r#type: s("Opaque"),
        immutable: None,
    };
    let v = decode(&envelope("v1", "Secret", &secret)).unwrap();
    assert_eq!(v["data"], json!({"k": "AGhp", "e": ""}));
    assert_eq!(v["stringData"], json!({"empty": ""}));
    assert_eq!(v["type"], "Opaque");
    let mf = &v["metadata"]["managedFields"][0];
    assert_eq!(mf["time"], "2023-11-14T22:13:20Z");
    assert_eq!(mf["fieldsV1"], json!({"f:data": {}}));
    assert!(v.get("immutable").is_none());
    let micro = to_json::ToJson::to_json(&meta::MicroTime {
        seconds: Some(1_700_000_000),
        nanos: Some(123_456_000),
    });
    assert_eq!(micro, "2023-11-14T22:13:20.123456Z");
    let d = to_json::ToJson::to_json(&meta::Duration {
        duration: Some(3_723_500_000_000),
    });
    assert_eq!(d, "1h2m3.5s");
}

#[test]
fn every_served_kind_decodes() {
    for r in crate::resources::RESOURCES {
        let v = decode_kind(&r.api_version(), r.kind, &[]).unwrap_or_else(|e| {
            panic!("{} {}: {e}", r.api_version(), r.kind);
        });
        assert!(v.is_object());
    }
    for (av, kind) in [
        ("v1", "Binding"),
        ("policy/v1", "Eviction"),
        ("v1", "DeleteOptions"),
        ("authentication.k8s.io/v1", "TokenRequest"),
    ] {
        assert!(decode_kind(av, kind, &[]).is_ok(), "{kind}");
    }
    let e = decode_kind("apps/v1", "Deployment", &[]).unwrap_err();
    assert_eq!(e.code, 415);
}

#[test]
fn bad_envelopes_are_clear_errors() {
    let e = decode(b"{\"kind\": \"Pod\"}").unwrap_err();
    assert_eq!(e.code, 400);
    assert!(e.message.contains("magic"), "{}", e.message);
    let mut truncated = envelope("v1", "Pod", &core::Pod::default());
    truncated.extend([0x0a, 0xff]);
    assert_eq!(decode(&truncated).unwrap_err().code, 400);
}

#[test]
fn accept_headers() {
    for a in [
        "",
        "application/json",
        "application/vnd.kubernetes.protobuf, */*",
        "application/vnd.kubernetes.protobuf,application/json",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        "application/*;q=0.5",
    ] {
        assert!(accepts_json(a), "{a}");
    }
    for a in [
        "application/vnd.kubernetes.protobuf",
        "application/yaml",
        "text/html",
    ] {
        assert!(!accepts_json(a), "{a}");
    }
}

/// A Quantity message without its string field is Go's zero Quantity, "0" in JSON; a null
/// in `limits` would leave the stored pod unreadable to typed clients (found by the
/// apiserver_protobuf_body fuzz target).
#[test]
fn quantity_without_its_string_is_zero() {
    let pod = core::Pod {
        metadata: Some(meta::ObjectMeta {
            name: s("p"),
            ..Default::default()
        }),
        spec: Some(core::PodSpec {
            containers: vec![core::Container {
                name: s("c"),
                resources: Some(core::ResourceRequirements {
                    limits: BTreeMap::from([("cpu".into(), Quantity { string: None })]),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    let v = decode(&envelope("v1", "Pod", &pod)).unwrap();
    assert_eq!(
        v["spec"]["containers"][0]["resources"]["limits"]["cpu"],
        "0"
    );
}
