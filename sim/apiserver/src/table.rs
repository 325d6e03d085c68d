//! Server-side printing: `meta.k8s.io/v1` Table responses, which `kubectl get` asks for
//! (`Accept: application/json;as=Table;...`) and prints column by column.

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// Whether the Accept header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

/// Kubernetes' `duration.HumanDuration` (the AGE column).
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let secs = secs.max(0);
    let minutes = secs / 60;
    let hours = secs / 3600;
    let days = hours / 24;
    if secs < 120 {
        format!("{secs}s")
    } else if minutes < 10 {
        let s = secs % 60;
        if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        }
    } else if minutes < 180 {
        format!("{minutes}m")
    } else if hours < 8 {
        let m = minutes % 60;
        if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        let h = hours % 24;
        if h == 0 {
            format!("{days}d")
        } else {
            format!("{days}d{h}h")
        }
    } else if hours < 24 * 365 * 2 {
        format!("{days}d")
    } else if hours < 24 * 365 * 8 {
        format!("{}y{}d", days / 365, days % 365)
    } else {
        format!("{}y", days / 365)
    }
}

fn age_of(ts: Option<&str>) -> String {
    let Some(ts) = ts else {
        return "<unknown>".into();
    };
    match ts.parse::<k8s_openapi::jiff::Timestamp>() {
        Ok(t) => human_duration(crate::meta::now_timestamp().as_second() - t.as_second()),
        Err(_) => "<unknown>".into(),
    }
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn col(name: &str, ty: &str, priority: u8) -> Value {
    let mut c =
        json!({"name": name, "type": ty, "format": "", "description": "", "priority": priority});
    if name == "Name" {
        c["format"] = json!("name");
    }
    c
}

fn age(obj: &Value) -> Value {
    json!(age_of(
        obj.pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
    ))
}

fn pod_cells(p: &Value) -> Vec<Value> {
    let specs = p
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(Vec::len)
        .unwrap_or(0);
    let statuses = p
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ready = statuses
        .iter()
        .filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true))
        .count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
        .sum();
    let mut status = if s(p, "/status/reason").is_empty() {
        s(p, "/status/phase").to_string()
    } else {
        s(p, "/status/reason").to_string()
    };
    for c in &statuses {
        let waiting = s(c, "/state/waiting/reason");
        let terminated = s(c, "/state/terminated/reason");
        if !waiting.is_empty() {
            status = waiting.to_string();
        } else if !terminated.is_empty() {
            status = terminated.to_string();
        }
    }
    if p.pointer("/metadata/deletionTimestamp").is_some() {
        status = "Terminating".into();
    }
    let none = |x: &str| {
        if x.is_empty() {
            "<none>".to_string()
        } else {
            x.to_string()
        }
    };
    vec![
        json!(s(p, "/metadata/name")),
        json!(format!("{ready}/{specs}")),
        json!(status),
        json!(restarts),
        age(p),
        json!(none(s(p, "/status/podIP"))),
        json!(none(s(p, "/spec/nodeName"))),
        json!(none(s(p, "/status/nominatedNodeName"))),
        json!("<none>"),
    ]
}

fn node_cells(n: &Value) -> Vec<Value> {
    let conds = n
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ready = conds
        .iter()
        .find(|c| s(c, "/type") == "Ready")
        .map(|c| s(c, "/status").to_string());
    let mut status = match ready.as_deref() {
        Some("True") => "Ready".to_string(),
        Some("False") => "NotReady".to_string(),
        _ => "Unknown".to_string(),
    };
    if n.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<String> = n
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|l| {
            l.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    roles.sort();
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.join(",")
    };
    let ip = n
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|x| s(x, "/type") == "InternalIP"))
        .map(|x| s(x, "/address").to_string())
        .unwrap_or_else(|| "<none>".into());
    vec![
        json!(s(n, "/metadata/name")),
        json!(status),
        json!(roles),
        age(n),
        json!(s(n, "/status/nodeInfo/kubeletVersion")),
        json!(ip),
    ]
}

/// kubectl's STATE of a claim (`printResourceClaim`): deleted, pending, allocated,reserved.
fn claim_state(c: &Value) -> String {
    let mut states = Vec::new();
    let deleted = c.pointer("/metadata/deletionTimestamp").is_some();
    if deleted {
        states.push("deleted");
    }
    if c.pointer("/status/allocation").is_none_or(Value::is_null) {
        if !deleted {
            states.push("pending");
        }
    } else {
        states.push("allocated");
        if c.pointer("/status/reservedFor")
            .and_then(Value::as_array)
            .is_some_and(|r| !r.is_empty())
        {
            states.push("reserved");
        }
    }
    states.join(",")
}

fn len_of(v: &Value, ptr: &str) -> usize {
    v.pointer(ptr)
        .and_then(Value::as_object)
        .map(|m| m.len())
        .unwrap_or(0)
}

/// Column definitions and row cells for a resource type.
/// Renders the cells of one row.
type CellsFn = fn(&Value) -> Vec<Value>;

fn columns_and_cells(r: &ResourceType) -> (Vec<Value>, CellsFn) {
    match r.plural {
        "pods" => (
            vec![
                col("Name", "string", 0),
                col("Ready", "string", 0),
                col("Status", "string", 0),
                col("Restarts", "string", 0),
                col("Age", "string", 0),
                col("IP", "string", 1),
                col("Node", "string", 1),
                col("Nominated Node", "string", 1),
                col("Readiness Gates", "string", 1),
            ],
            pod_cells,
        ),
        "nodes" => (
            vec![
                col("Name", "string", 0),
                col("Status", "string", 0),
                col("Roles", "string", 0),
                col("Age", "string", 0),
                col("Version", "string", 0),
                col("Internal-IP", "string", 1),
            ],
            node_cells,
        ),
        "namespaces" => (
            vec![
                col("Name", "string", 0),
                col("Status", "string", 0),
                col("Age", "string", 0),
            ],
            |o| {
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(s(o, "/status/phase")),
                    age(o),
                ]
            },
        ),
        "configmaps" => (
            vec![
                col("Name", "string", 0),
                col("Data", "integer", 0),
                col("Age", "string", 0),
            ],
            |o| {
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(len_of(o, "/data") + len_of(o, "/binaryData")),
                    age(o),
                ]
            },
        ),
        "secrets" => (
            vec![
                col("Name", "string", 0),
                col("Type", "string", 0),
                col("Data", "integer", 0),
                col("Age", "string", 0),
            ],
            |o| {
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(s(o, "/type")),
                    json!(len_of(o, "/data")),
                    age(o),
                ]
            },
        ),
        "leases" => (
            vec![
                col("Name", "string", 0),
                col("Holder", "string", 0),
                col("Age", "string", 0),
            ],
            |o| {
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(s(o, "/spec/holderIdentity")),
                    age(o),
                ]
            },
        ),
        // upstream's printers for resource.k8s.io (DeviceClass and ResourceClaimTemplate
        // print NAME, AGE like the default)
        "resourceslices" => (
            vec![
                col("Name", "string", 0),
                col("Node", "string", 0),
                col("Driver", "string", 0),
                col("Pool", "string", 0),
                col("Age", "string", 0),
            ],
            |o| {
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(s(o, "/spec/nodeName")),
                    json!(s(o, "/spec/driver")),
                    json!(s(o, "/spec/pool/name")),
                    age(o),
                ]
            },
        ),
        "resourceclaims" => (
            vec![
                col("Name", "string", 0),
                col("State", "string", 0),
                col("Age", "string", 0),
            ],
            |o| vec![json!(s(o, "/metadata/name")), json!(claim_state(o)), age(o)],
        ),
        "events" if r.group.is_empty() => (
            vec![
                col("Last Seen", "string", 0),
                col("Type", "string", 0),
                col("Reason", "string", 0),
                col("Object", "string", 0),
                col("Message", "string", 0),
            ],
            |o| {
                let last = o
                    .pointer("/lastTimestamp")
                    .and_then(Value::as_str)
                    .or_else(|| o.pointer("/eventTime").and_then(Value::as_str))
                    .or_else(|| {
                        o.pointer("/metadata/creationTimestamp")
                            .and_then(Value::as_str)
                    });
                vec![
                    json!(age_of(last)),
                    json!(s(o, "/type")),
                    json!(s(o, "/reason")),
                    json!(format!(
                        "{}/{}",
                        s(o, "/involvedObject/kind").to_lowercase(),
                        s(o, "/involvedObject/name")
                    )),
                    json!(s(o, "/message")),
                ]
            },
        ),
        _ => (
            vec![col("Name", "string", 0), col("Age", "string", 0)],
            |o| vec![json!(s(o, "/metadata/name")), age(o)],
        ),
    }
}

/// A Table of `objects`; rows carry the objects' metadata as PartialObjectMetadata.
pub fn table(
    r: &ResourceType,
    objects: &[&Value],
    rv: Option<u64>,
    continue_token: Option<&str>,
) -> Value {
    let (columns, cells) = columns_and_cells(r);
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            json!({
                "cells": cells(o),
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}
            })
        })
        .collect();
    let mut meta = json!({});
    if let Some(rv) = rv {
        meta["resourceVersion"] = json!(rv.to_string());
    }
    if let Some(c) = continue_token {
        meta["continue"] = json!(c);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": columns, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;

    #[test]
    fn human_durations_match_kubernetes() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(125), "2m5s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(100 * 86400), "100d");
        assert_eq!(human_duration(-5), "<invalid>");
    }

    #[test]
    fn pod_and_node_rows() {
        let p = json!({"metadata": {"name": "p", "creationTimestamp": "2020-01-01T00:00:00Z"}, "spec": {"containers": [{}, {}], "nodeName": "n1"}, "status": {"phase": "Running", "containerStatuses": [{"ready": true, "restartCount": 2}]}});
        let t = table(lookup("", "v1", "pods").unwrap(), &[&p], Some(5), None);
        assert_eq!(t["rows"][0]["cells"][1], "1/2");
        assert_eq!(t["rows"][0]["cells"][2], "Running");
        assert_eq!(t["rows"][0]["cells"][3], 2);
        assert_eq!(t["rows"][0]["cells"][6], "n1");
        assert_eq!(
            t["columnDefinitions"].as_array().unwrap().len(),
            t["rows"][0]["cells"].as_array().unwrap().len()
        );
        let n = json!({"metadata": {"name": "n", "labels": {"node-role.kubernetes.io/gpu": ""}}, "spec": {"unschedulable": true}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let t = table(lookup("", "v1", "nodes").unwrap(), &[&n], None, None);
        assert_eq!(t["rows"][0]["cells"][1], "Ready,SchedulingDisabled");
        assert_eq!(t["rows"][0]["cells"][2], "gpu");
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }

    #[test]
    fn resourceslice_and_claim_rows() {
        let rs = lookup("resource.k8s.io", "v1", "resourceslices").unwrap();
        let sl = json!({"metadata": {"name": "s"}, "spec": {"nodeName": "n1", "driver": "d.io", "pool": {"name": "p1"}}});
        let shared = json!({"metadata": {"name": "t"}, "spec": {"allNodes": true, "driver": "d.io", "pool": {"name": "p2"}}});
        let t = table(rs, &[&sl, &shared], None, None);
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["Name", "Node", "Driver", "Pool", "Age"]);
        assert_eq!(
            t["rows"][0]["cells"].as_array().unwrap()[1..4],
            [json!("n1"), json!("d.io"), json!("p1")]
        );
        assert_eq!(t["rows"][1]["cells"][1], "");
        let rc = lookup("resource.k8s.io", "v1", "resourceclaims").unwrap();
        let alloc = json!({"devices": {"results": []}});
        let state = |c: Value| table(rc, &[&c], None, None)["rows"][0]["cells"][1].clone();
        assert_eq!(state(json!({"metadata": {"name": "c"}})), "pending");
        assert_eq!(
            state(json!({"metadata": {"name": "c"}, "status": {"allocation": alloc}})),
            "allocated"
        );
        assert_eq!(
            state(
                json!({"metadata": {"name": "c"}, "status": {"allocation": alloc, "reservedFor": [{"name": "p"}]}})
            ),
            "allocated,reserved"
        );
        assert_eq!(
            state(json!({"metadata": {"name": "c", "deletionTimestamp": "2026-01-01T00:00:00Z"}})),
            "deleted"
        );
        assert_eq!(
            state(
                json!({"metadata": {"name": "c", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"allocation": alloc}})
            ),
            "deleted,allocated"
        );
    }
}
