//! A real API server keeps `events.k8s.io/v1` and core `v1` Events in one storage, so an
//! event recorded through either API shows in both: `kubectl get events` and
//! `kubectl describe pod` read core `v1`, while kube-rs' recorder writes `events.k8s.io/v1`.
//! The embedded server stores the two separately and mirrors every `events.k8s.io/v1`
//! Event as a core `v1` Event under the same namespace and name. (Core events are not
//! mirrored the other way; that gap is documented in the README.)

use serde_json::{Map, Value, json};

/// The core `v1` form of an `events.k8s.io/v1` Event (field names of
/// `k8s.io/kubernetes/pkg/apis/core` ↔ `events/v1` conversion).
pub fn to_core(event: &Value) -> Value {
    let get = |p: &str| crate::meta::at(event, p).cloned();
    let mut metadata = Map::new();
    for field in [
        "name",
        "namespace",
        "uid",
        "labels",
        "annotations",
        "creationTimestamp",
    ] {
        if let Some(v) = event.get("metadata").and_then(|m| m.get(field)) {
            metadata.insert(field.into(), v.clone());
        }
    }
    let event_time = get("/eventTime").filter(|v| !v.is_null());
    let series_count = crate::meta::at(event, "/series/count").and_then(Value::as_i64);
    let last_seen = get("/series/lastObservedTime")
        .or_else(|| get("/deprecatedLastTimestamp"))
        .or_else(|| event_time.clone())
        .or_else(|| get("/metadata/creationTimestamp"));
    // core v1 timestamps are whole seconds (RFC 3339 without fraction).
    let seconds =
        |v: Option<Value>| v.and_then(|v| v.as_str().map(|s| Value::String(whole_seconds(s))));
    let controller = get("/reportingController").unwrap_or(Value::String(String::new()));
    let instance = get("/reportingInstance").unwrap_or(Value::String(String::new()));
    let mut out = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": Value::Object(metadata),
        "involvedObject": get("/regarding").unwrap_or_else(|| json!({})),
        "reason": get("/reason").unwrap_or(Value::String(String::new())),
        "message": get("/note").unwrap_or(Value::String(String::new())),
        "type": get("/type").unwrap_or(Value::String(String::new())),
        "source": {"component": controller.clone(), "host": instance.clone()},
        "reportingComponent": controller,
        "reportingInstance": instance,
        "count": series_count.or_else(|| crate::meta::at(event, "/deprecatedCount").and_then(Value::as_i64)).unwrap_or(1),
        "firstTimestamp": seconds(get("/deprecatedFirstTimestamp").or_else(|| event_time.clone()).or_else(|| get("/metadata/creationTimestamp"))),
        "lastTimestamp": seconds(last_seen),
    });
    if let Some(t) = event_time {
        out["eventTime"] = t;
    }
    for (from, to) in [("/action", "action"), ("/related", "related")] {
        if let Some(v) = get(from).filter(|v| !v.is_null()) {
            out[to] = v;
        }
    }
    out
}

/// `2026-11-29T10:00:00.123456Z` → `2026-11-29T10:00:00Z` (offsets kept).
fn whole_seconds(time: &str) -> String {
    match time.split_once('.') {
        Some((head, rest)) => {
            let zone = rest.trim_start_matches(|c: char| c.is_ascii_digit());
            format!("{head}{zone}")
        }
        None => time.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_event_reads_as_core() {
        let ev = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "p.1", "namespace": "default", "uid": "u"},
            "eventTime": "2026-11-29T10:00:00.123456Z",
            "series": {"count": 3, "lastObservedTime": "2026-11-29T10:05:00.000001Z"},
            "reason": "FilteringFailed", "note": "no available node", "type": "Warning", "action": "Filtering",
            "reportingController": "hami-scheduler", "reportingInstance": "r1",
            "regarding": {"kind": "Pod", "namespace": "default", "name": "p", "uid": "pu"}
        });
        let core = to_core(&ev);
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "no available node");
        assert_eq!(core["count"], 3);
        assert_eq!(core["source"]["component"], "hami-scheduler");
        assert_eq!(core["firstTimestamp"], "2026-11-29T10:00:00Z");
        assert_eq!(core["lastTimestamp"], "2026-11-29T10:05:00Z");
        assert_eq!(core["metadata"]["name"], "p.1");
        assert_eq!(core["action"], "Filtering");
        // Minimal input still gives a valid core event.
        let bare = to_core(&json!({"metadata": {"name": "x", "namespace": "d"}}));
        assert_eq!(bare["count"], 1);
        assert_eq!(bare["involvedObject"], json!({}));
        assert_eq!(
            whole_seconds("2026-11-29T10:00:00+08:00"),
            "2026-11-29T10:00:00+08:00"
        );
        assert_eq!(
            whole_seconds("2026-11-29T10:00:00.5+08:00"),
            "2026-11-29T10:00:00+08:00"
        );
    }
}
