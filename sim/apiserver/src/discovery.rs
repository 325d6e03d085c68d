//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]`.

use serde_json::{Value, json};

use crate::resources::{self, ResourceType};

/// The Kubernetes version this server presents (matches the k8s-openapi feature in use).
pub const SERVER_MAJOR: &str = "1";
/// The minor version presented alongside [`SERVER_MAJOR`].
pub const SERVER_MINOR: &str = "33";

/// The `/version` document kubectl and client-go read (gitVersion names this server).
pub fn version() -> Value {
    json!({
        "major": SERVER_MAJOR,
        "minor": SERVER_MINOR,
        "gitVersion": format!("v{SERVER_MAJOR}.{SERVER_MINOR}.0-hami.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// The legacy `/api` document: only `v1`, reached at `server_address`.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
    })
}

fn group_doc(group: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

/// The `/apis` document: every named group this server serves, one version each.
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = resources::named_groups()
        .iter()
        .map(|(g, v)| group_doc(g, v))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`; None if the group is not served.
pub fn api_group(group: &str) -> Option<Value> {
    resources::named_groups()
        .iter()
        .find(|(g, _)| *g == group)
        .map(|(g, v)| {
            let mut d = group_doc(g, v);
            d["kind"] = json!("APIGroup");
            d["apiVersion"] = json!("v1");
            d
        })
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn resource_entries(r: &ResourceType) -> Vec<Value> {
    let mut main = json!({
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": VERBS,
    });
    if !r.short_names.is_empty() {
        main["shortNames"] = json!(r.short_names);
    }
    if r.plural == "pods" {
        main["categories"] = json!(["all"]);
    }
    let mut out = vec![main];
    for sub in r.subresources {
        let e = match *sub {
            "status" => {
                json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]})
            }
            "binding" => {
                json!({"name": format!("{}/binding", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": "Binding", "verbs": ["create"]})
            }
            "token" => {
                json!({"name": format!("{}/token", r.plural), "singularName": "", "namespaced": r.namespaced, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]})
            }
            "eviction" => {
                json!({"name": format!("{}/eviction", r.plural), "singularName": "", "namespaced": r.namespaced, "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]})
            }
            other => {
                json!({"name": format!("{}/{other}", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get"]})
            }
        };
        out.push(e);
    }
    out
}

/// `/api/v1` or `/apis/<group>/<version>`; None if not served.
pub fn api_resource_list(group: &str, version: &str) -> Option<Value> {
    if !resources::group_version_served(group, version) {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let entries: Vec<Value> = resources::in_group_version(group, version)
        .into_iter()
        .flat_map(resource_entries)
        .collect();
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": entries}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents() {
        let core = api_resource_list("", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"pods/binding") && names.contains(&"nodes/status"));
        assert!(api_resource_list("apps", "v1").is_none());
        assert_eq!(api_group_list()["groups"].as_array().unwrap().len(), 6);
        assert_eq!(
            api_group("coordination.k8s.io").unwrap()["preferredVersion"]["version"],
            "v1"
        );
        assert!(api_group("apps").is_none());
    }
}
