//! KEP-5004 (extended resources backed by DRA), the pure part, as kube-scheduler's
//! `DynamicResources` plugin does it (`extendeddynamicresources.go`, `extended/cache.go`):
//! which extended resources a DeviceClass maps (`spec.extendedResourceName`, and always the
//! implicit `deviceclass.resource.kubernetes.io/<class>`), what a pod asks of them, which of
//! them a node serves through DRA (mapped and no allocatable there: a node with allocatable
//! serves it through a device plugin, never both), and the special claim: generateName
//! `<pod>-extended-resources-`, annotation [`EXTENDED_RESOURCE_CLAIM`], owned by the pod, one
//! `exactly` request per container and resource (`container-<i>-request-<j>`: `i` the index
//! in init containers + containers, `j` the resource's index among the container's sorted
//! request names; count = the quantity; non-sidecar init containers reuse later long-lived
//! containers' requests or share the largest of theirs), with the
//! `pod.status.extendedResourceClaimStatus.requestMappings` to match.
//!
//! Requests are the container's `requests`, else its `limits` (the API server's defaulting
//! copies limits into requests; the embedded one may not have).

use std::collections::{BTreeMap, BTreeSet};

use hami_dra_core::quantity;
use k8s_openapi::api::core::v1::{Container, ContainerExtendedResourceRequest, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use serde_json::{Value, json};

/// The annotation (value `"true"`) marking the scheduler's extended-resource claim.
pub const EXTENDED_RESOURCE_CLAIM: &str = "resource.kubernetes.io/extended-resource-claim";
/// The prefix of a DeviceClass's implicit extended resource name.
pub const IMPLICIT_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// Extended resource name → DeviceClass name. A class maps its `extendedResourceName` (when
/// set) and its implicit name; when two classes claim one name, the alphabetically first
/// class wins (upstream's cache keeps whichever event came last; this is deterministic).
pub fn class_mapping<'a>(
    classes: impl IntoIterator<Item = &'a DeviceClass>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut sorted: Vec<&DeviceClass> = classes.into_iter().collect();
    sorted.sort_by(|a, b| b.metadata.name.cmp(&a.metadata.name));
    for c in sorted {
        let Some(name) = c.metadata.name.clone() else {
            continue;
        };
        if let Some(ern) = &c.spec.extended_resource_name {
            out.insert(ern.clone(), name.clone());
        }
        out.insert(format!("{IMPLICIT_PREFIX}{name}"), name);
    }
    out
}

/// Whether `name` is an extended resource name DRA may back (upstream's
/// `IsDRAExtendedResourceName`): a domain-prefixed name outside `kubernetes.io` (but not
/// `requests.`-prefixed), or the implicit DeviceClass name.
pub fn is_extended(name: &str) -> bool {
    if name.starts_with(IMPLICIT_PREFIX) {
        return true;
    }
    let Some((domain, _)) = name.split_once('/') else {
        return false;
    };
    !(domain == "kubernetes.io"
        || domain.ends_with(".kubernetes.io")
        || name.starts_with("requests."))
}

/// The container's requests by name (limits, overridden by requests), as quantity strings.
fn container_requests(c: &Container) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(r) = &c.resources {
        for map in [&r.limits, &r.requests].into_iter().flatten() {
            for (k, v) in map {
                out.insert(k.clone(), v.0.clone());
            }
        }
    }
    out
}

/// The container's whole request of `name` (`None`: absent, zero or not an integer).
fn count(c: &Container, name: &str) -> Option<u64> {
    let q = container_requests(c).remove(name)?;
    quantity::parse(&q).ok().filter(|n| *n > 0)
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The pod's effective request of each extended resource (upstream's `PodRequests`: long-
/// lived containers — app containers and sidecars — add up; each non-sidecar init container
/// counts on its own, with the sidecars started before it).
pub fn pod_requests(pod: &Pod) -> BTreeMap<String, u64> {
    let Some(spec) = &pod.spec else {
        return BTreeMap::new();
    };
    let names: BTreeSet<String> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .flat_map(|c| container_requests(c).into_keys())
        .filter(|n| is_extended(n))
        .collect();
    let mut out = BTreeMap::new();
    for name in names {
        let apps: u64 = spec.containers.iter().filter_map(|c| count(c, &name)).sum();
        let mut sidecars = 0u64;
        let mut init_peak = 0u64;
        for c in spec.init_containers.iter().flatten() {
            let n = count(c, &name).unwrap_or(0);
            if is_sidecar(c) {
                sidecars += n;
            } else {
                init_peak = init_peak.max(sidecars + n);
            }
        }
        let total = (apps + sidecars).max(init_peak);
        if total > 0 {
            out.insert(name, total);
        }
    }
    out
}

/// Of the pod's requests, those a DeviceClass maps (what takes the DRA path somewhere).
pub fn mapped(
    requests: &BTreeMap<String, u64>,
    mapping: &BTreeMap<String, String>,
) -> BTreeMap<String, u64> {
    requests
        .iter()
        .filter(|(n, _)| mapping.contains_key(*n))
        .map(|(n, q)| (n.clone(), *q))
        .collect()
}

/// Why the node cannot serve the mapped requests through DRA: it offers one of them as
/// allocatable (a device plugin serves it there; upstream leaves such a node to
/// NodeResourcesFit). `allocatable` is the node's `status.allocatable` of that name.
pub fn device_plugin_served(
    requests: &BTreeMap<String, u64>,
    allocatable: impl Fn(&str) -> Option<u64>,
) -> Option<&str> {
    requests
        .keys()
        .find(|n| allocatable(n).is_some_and(|a| a > 0))
        .map(String::as_str)
}

/// The special claim's requests (as `resource.k8s.io/v1` JSON, sorted by name) and the pod's
/// request mappings, for the mapped `resources` (see the module doc).
pub fn requests_and_mappings(
    pod: &Pod,
    resources: &BTreeMap<String, u64>,
    mapping: &BTreeMap<String, String>,
) -> (Vec<Value>, Vec<ContainerExtendedResourceRequest>) {
    let Some(spec) = &pod.spec else {
        return (Vec::new(), Vec::new());
    };
    let n_init = spec.init_containers.as_ref().map_or(0, Vec::len);
    let containers: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect();
    let (short, long): (Vec<usize>, Vec<usize>) =
        (0..containers.len()).partition(|&i| i < n_init && !is_sidecar(containers[i]));
    let mut requests: Vec<(String, String, u64)> = Vec::new();
    let mut mappings = Vec::new();
    for resource in resources.keys() {
        let Some(class) = mapping.get(resource) else {
            continue;
        };
        let mut long_reqs: Vec<Option<(String, u64)>> = vec![None; containers.len()];
        let mut long_maps = Vec::new();
        for &i in &long {
            let (r, m) = container_request(i, containers[i], resource, &[]);
            long_reqs[i] = r;
            long_maps.extend(m);
        }
        let mut short_maps: Vec<ContainerExtendedResourceRequest> = Vec::new();
        let mut largest: Option<(String, u64)> = None;
        let mut short_names = BTreeSet::new();
        for &i in &short {
            let (r, m) = container_request(i, containers[i], resource, &long_reqs[i..]);
            if let Some((name, n)) = r {
                short_names.insert(name.clone());
                if largest.as_ref().is_none_or(|(_, l)| *l < n) {
                    largest = Some((name, n));
                }
            }
            short_maps.extend(m);
        }
        if let Some((big, _)) = &largest
            && short_names.len() > 1
        {
            for m in &mut short_maps {
                if short_names.contains(&m.request_name) {
                    m.request_name = big.clone();
                }
            }
        }
        if let Some((name, n)) = largest {
            requests.push((name, class.clone(), n));
        }
        for (name, n) in long_reqs.into_iter().flatten() {
            requests.push((name, class.clone(), n));
        }
        mappings.extend(long_maps);
        mappings.extend(short_maps);
    }
    requests.sort_by(|a, b| a.0.cmp(&b.0));
    let requests = requests
        .into_iter()
        .map(|(name, class, n)| {
            json!({"name": name, "exactly": {"deviceClassName": class,
                "allocationMode": "ExactCount", "count": n}})
        })
        .collect();
    (requests, mappings)
}

/// One container's request of `resource` (`None` when it needs no new one) and its
/// mappings; `reusable` are later long-lived containers' requests an init container may use.
fn container_request(
    index: usize,
    c: &Container,
    resource: &str,
    reusable: &[Option<(String, u64)>],
) -> (Option<(String, u64)>, Vec<ContainerExtendedResourceRequest>) {
    let Some(want) = count(c, resource) else {
        return (None, Vec::new());
    };
    let map = |request: &str| ContainerExtendedResourceRequest {
        container_name: c.name.clone(),
        resource_name: resource.to_owned(),
        request_name: request.to_owned(),
    };
    let mut mappings = Vec::new();
    let mut sum = 0;
    for (name, n) in reusable.iter().flatten() {
        sum += n;
        mappings.push(map(name));
        if sum >= want {
            return (None, mappings);
        }
    }
    let j = container_requests(c)
        .keys()
        .position(|k| k == resource)
        .unwrap_or(0);
    let name = format!("container-{index}-request-{j}");
    mappings.push(map(&name));
    (Some((name, want - sum)), mappings)
}

/// Whether `c` is the pod's extended-resource claim (annotated, the pod its controller).
pub fn is_claim_of(c: &ResourceClaim, pod: &Pod) -> bool {
    c.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXTENDED_RESOURCE_CLAIM))
        .is_some_and(|v| v == "true")
        && c.metadata.owner_references.iter().flatten().any(|o| {
            o.controller == Some(true)
                && Some(&o.name) == pod.metadata.name.as_ref()
                && Some(&o.uid) == pod.metadata.uid.as_ref()
        })
}

/// The special claim to create for the pod with `requests` (from [`requests_and_mappings`]).
pub fn claim_body(pod: &Pod, requests: &[Value]) -> Result<ResourceClaim, String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {
            "generateName": format!("{name}-extended-resources-"),
            "namespace": pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            "annotations": {EXTENDED_RESOURCE_CLAIM: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name,
                "uid": pod.metadata.uid.clone().unwrap_or_default(),
                "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {"devices": {"requests": requests}},
    }))
    .map_err(|e| format!("the extended-resource claim of pod {name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, ern: Option<&str>) -> DeviceClass {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"extendedResourceName": ern}}))
        .unwrap()
    }

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": spec}),
        )
        .unwrap()
    }

    fn ctr(name: &str, limits: Value) -> Value {
        json!({"name": name, "image": "x", "resources": {"limits": limits}})
    }

    fn amd() -> BTreeMap<String, String> {
        class_mapping(&[
            class("amdgpu.hami-rs.io", Some("amd.com/gpu")),
            class("other", None),
        ])
    }

    #[test]
    fn classes_map_their_name_and_the_implicit_one() {
        let m = amd();
        assert_eq!(m["amd.com/gpu"], "amdgpu.hami-rs.io");
        assert_eq!(
            m["deviceclass.resource.kubernetes.io/amdgpu.hami-rs.io"],
            "amdgpu.hami-rs.io"
        );
        assert_eq!(m["deviceclass.resource.kubernetes.io/other"], "other");
        assert_eq!(m.len(), 3);
        // Two classes on one name: deterministic, the first by name.
        let m = class_mapping(&[class("b", Some("x.io/g")), class("a", Some("x.io/g"))]);
        assert_eq!(m["x.io/g"], "a");
    }

    #[test]
    fn extended_names() {
        assert!(is_extended("amd.com/gpu"));
        assert!(is_extended("deviceclass.resource.kubernetes.io/c"));
        assert!(!is_extended("cpu"));
        assert!(!is_extended("hugepages-2Mi"));
        assert!(!is_extended("kubernetes.io/foo"));
        assert!(!is_extended("node.kubernetes.io/foo"));
    }

    #[test]
    fn pod_requests_add_apps_and_take_the_init_peak() {
        let p = pod(json!({
            "initContainers": [ctr("i", json!({"amd.com/gpu": "3"}))],
            "containers": [ctr("a", json!({"amd.com/gpu": "1", "cpu": "1"})),
                           ctr("b", json!({"amd.com/gpu": "1"}))]}));
        assert_eq!(
            pod_requests(&p),
            BTreeMap::from([("amd.com/gpu".into(), 3)])
        );
        let p = pod(
            json!({"containers": [ctr("a", json!({"amd.com/gpu": "2", "example.com/x": "1"}))]}),
        );
        let r = pod_requests(&p);
        assert_eq!(r.len(), 2);
        assert_eq!(
            mapped(&r, &amd()),
            BTreeMap::from([("amd.com/gpu".into(), 2)])
        );
        // Zero asks for nothing.
        let p = pod(json!({"containers": [ctr("a", json!({"amd.com/gpu": "0"}))]}));
        assert!(pod_requests(&p).is_empty());
    }

    #[test]
    fn a_node_with_allocatable_is_the_device_plugins() {
        let r = BTreeMap::from([("amd.com/gpu".to_owned(), 1)]);
        assert_eq!(device_plugin_served(&r, |_| Some(8)), Some("amd.com/gpu"));
        assert_eq!(device_plugin_served(&r, |_| Some(0)), None);
        assert_eq!(device_plugin_served(&r, |_| None), None);
    }

    #[test]
    fn requests_are_named_per_container_and_sorted_resource_index() {
        let p = pod(json!({"containers": [
            ctr("a", json!({"cpu": "1", "amd.com/gpu": "2"})),
            ctr("b", json!({"amd.com/gpu": "1"})),
            ctr("c", json!({"cpu": "1"}))]}));
        let (reqs, maps) = requests_and_mappings(&p, &mapped(&pod_requests(&p), &amd()), &amd());
        assert_eq!(
            reqs,
            vec![
                json!({"name": "container-0-request-0", "exactly": {
                    "deviceClassName": "amdgpu.hami-rs.io", "allocationMode": "ExactCount", "count": 2}}),
                json!({"name": "container-1-request-0", "exactly": {
                    "deviceClassName": "amdgpu.hami-rs.io", "allocationMode": "ExactCount", "count": 1}}),
            ]
        );
        let m: Vec<(&str, &str, &str)> = maps
            .iter()
            .map(|m| {
                (
                    m.container_name.as_str(),
                    m.resource_name.as_str(),
                    m.request_name.as_str(),
                )
            })
            .collect();
        assert_eq!(
            m,
            vec![
                ("a", "amd.com/gpu", "container-0-request-0"),
                ("b", "amd.com/gpu", "container-1-request-0"),
            ]
        );
        // "amd.com/gpu" < "cpu" < "zz.io/x": the index among the container's sorted names.
        let p = pod(json!({"containers": [ctr("a", json!({"cpu": "1", "zz.io/x": "1"}))]}));
        let m = class_mapping(&[class("z", Some("zz.io/x"))]);
        let (reqs, _) = requests_and_mappings(&p, &mapped(&pod_requests(&p), &m), &m);
        assert_eq!(reqs[0]["name"], "container-0-request-1");
    }

    #[test]
    fn init_containers_reuse_later_requests_or_share_the_largest() {
        // The init container needs 1 and the app container's request (2) covers it.
        let p = pod(json!({
            "initContainers": [ctr("i", json!({"amd.com/gpu": "1"}))],
            "containers": [ctr("a", json!({"amd.com/gpu": "2"}))]}));
        let (reqs, maps) = requests_and_mappings(&p, &mapped(&pod_requests(&p), &amd()), &amd());
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0]["name"], "container-1-request-0");
        assert_eq!(maps.len(), 2);
        assert!(
            maps.iter()
                .all(|m| m.request_name == "container-1-request-0")
        );
        // Two init containers needing more than the app: one shared request, the largest.
        let p = pod(json!({
            "initContainers": [ctr("i", json!({"amd.com/gpu": "2"})), ctr("j", json!({"amd.com/gpu": "3"}))],
            "containers": [ctr("a", json!({"amd.com/gpu": "1"}))]}));
        let (reqs, maps) = requests_and_mappings(&p, &mapped(&pod_requests(&p), &amd()), &amd());
        let names: Vec<&str> = reqs.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            vec!["container-1-request-0", "container-2-request-0"]
        );
        // Beyond a's reusable 1, i needs 1 more and j 2: the larger (j's) serves both.
        assert_eq!(reqs[0]["exactly"]["count"], 2);
        let of = |c: &str| -> Vec<&str> {
            maps.iter()
                .filter(|m| m.container_name == c)
                .map(|m| m.request_name.as_str())
                .collect()
        };
        assert_eq!(
            of("i"),
            vec!["container-2-request-0", "container-1-request-0"]
        );
        assert_eq!(
            of("j"),
            vec!["container-2-request-0", "container-1-request-0"]
        );
        assert_eq!(of("a"), vec!["container-2-request-0"]);
    }

    #[test]
    fn the_claim_is_annotated_and_owned_by_the_pod() {
        let p = pod(json!({"containers": [ctr("a", json!({"amd.com/gpu": "1"}))]}));
        let (reqs, _) = requests_and_mappings(&p, &mapped(&pod_requests(&p), &amd()), &amd());
        let c = claim_body(&p, &reqs).unwrap();
        assert_eq!(
            c.metadata.generate_name.as_deref(),
            Some("p-extended-resources-")
        );
        assert_eq!(c.metadata.namespace.as_deref(), Some("ns"));
        assert!(is_claim_of(&c, &p));
        let other = pod(json!({"containers": []}));
        let mut other = other;
        other.metadata.uid = Some("u2".into());
        assert!(!is_claim_of(&c, &other));
        let mut plain = c.clone();
        plain.metadata.annotations = None;
        assert!(!is_claim_of(&plain, &p));
    }
}
