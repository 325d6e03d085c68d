//! Checks of what the AMD DRA stack (issue 20) reads from bytes others wrote: the driver's
//! checkpoint file, the webhook's translation of a pod and the driver's ResourceSlices into
//! ResourceClaimTemplates, the CEL selectors of claims and DeviceClasses, the claims'
//! `status.devices` data the monitor and `hami status` read, and kubelet's DRA gRPC messages.

use std::collections::{BTreeSet, HashMap};

use hami_amdgpu_dra_plugin::checkpoint::{Checkpoint, CheckpointError};
use hami_deviceplugin_api::dra_v1::{NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use hami_dra_core::api::{Device, DeviceAttribute, DeviceCapacity};
use hami_dra_core::prepare::{PrepareError, PrepareSettings, plan_prepare};
use hami_protocol::dra::{COMPUTE_UNITS, DRIVER, MAX_FIRST_AVAILABLE, MEMORY};
use hami_protocol::names::AMD;
use hami_protocol::requests::ContainerKind;
use hami_scheduler_core::admission::{Admission, PodReview, WebhookConfig, review_pod_with};
use hami_scheduler_core::dra_claims::{AmdMode, Shape, is_dns_label, shapes};
use hami_structured_allocation::selector::{self, Cmp, Term};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::resource::v1::{
    CapacityRequirements, DeviceSelector, ResourceClaim, ResourceSlice,
};
use prost::Message;
use serde_json::Value;

/// The driver's checkpoint files (`checkpoint.json` and its journal, root-only in the plugin
/// directory; a crash or a full disk may cut them short): decoding is total, what decodes
/// re-encodes to itself, and every strict prefix of an encoding is refused as corrupt (never
/// a partial checkpoint, which would forget CUs prepared claims hold); the same bytes read as
/// a journal replay totally, and a torn record after the last whole line changes nothing.
pub fn dra_checkpoint(data: &[u8]) {
    dra_checkpoint_journal(data);
    let Ok(checkpoint) = Checkpoint::decode(data, "checkpoint.json") else {
        return;
    };
    let bytes = checkpoint.encode().expect("a decoded checkpoint encodes");
    let again = Checkpoint::decode(&bytes, "checkpoint.json").expect("an encoding decodes");
    assert_eq!(again, checkpoint, "checkpoint round trip changed it");
    // Truncations at the end, the middle and a point the input picks.
    let pick = data.first().map_or(0, |b| usize::from(*b));
    for cut in [bytes.len() - 1, bytes.len() / 2, pick % bytes.len()] {
        match Checkpoint::decode(&bytes[..cut], "checkpoint.json") {
            Err(CheckpointError::Corrupt { .. }) => {}
            other => panic!(
                "a checkpoint cut at {cut} of {} read as {other:?}",
                bytes.len()
            ),
        }
    }
    // What the driver derives from it at start: the CUs held and each pod's dmem limits.
    let _ = checkpoint.used_cus(None);
    for claim in checkpoint.claims.values() {
        let _ = checkpoint.pod_dmem(&claim.pod_uid);
    }
}

fn dra_checkpoint_journal(data: &[u8]) {
    use hami_amdgpu_dra_plugin::checkpoint_store::replay;
    let Ok((state, records)) = replay(Checkpoint::empty(), data, "j") else {
        return;
    };
    assert!(records <= data.iter().filter(|b| **b == b'\n').count());
    // The whole lines, then a record a crash cut short: read as the whole lines alone.
    let whole = data.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let mut torn = data[..whole].to_vec();
    torn.extend_from_slice(br#"{"put":{"uid":"torn","claim":{"#);
    let (cut, _) = replay(Checkpoint::empty(), &torn, "j").expect("a torn last record is dropped");
    let (alone, _) = replay(Checkpoint::empty(), &data[..whole], "j").expect("its prefix replays");
    assert_eq!(cut, alone, "a torn record changed the replay");
    if whole == data.len() {
        assert_eq!(alone, state);
    }
}

/// `{"pod": <Pod>, "slices": [<ResourceSlice>...]}`; `amd.com/*` of the pod and its
/// `hami.io/amd-mode` as the webhook reads them (DRA by default).
fn webhook_input(data: &[u8]) -> Option<(Value, Pod, Vec<ResourceSlice>)> {
    let input: Value = serde_json::from_slice(data).ok()?;
    let raw = input.get("pod")?.clone();
    let pod: Pod = serde_json::from_value(raw.clone()).ok()?;
    let slices = input
        .get("slices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| serde_json::from_value(s.clone()).ok())
        .collect();
    Some((raw, pod, slices))
}

/// The pinned shape of a (sub-)request's selectors (`productName`, `memory` and
/// `computeUnits` equal), read back with the model's CEL reader.
fn pinned(selectors: &[DeviceSelector]) -> Option<(String, u64, u64)> {
    let mut product = None;
    let (mut memory, mut cus) = (None, None);
    for s in selectors {
        let expression = &s.cel.as_ref().expect("the webhook writes CEL").expression;
        let terms = selector::parse(expression)
            .unwrap_or_else(|e| panic!("the webhook wrote a selector the model cannot read: {e}"));
        for term in terms {
            match term {
                Term::Attribute { name, value } if name == format!("{DRIVER}/productName") => {
                    product = value.string;
                }
                Term::Capacity {
                    name,
                    cmp: Cmp::Eq,
                    value,
                    ..
                } if name == format!("{DRIVER}/{MEMORY}") => memory = Some(value),
                Term::Capacity {
                    name,
                    cmp: Cmp::Eq,
                    value,
                    ..
                } if name == format!("{DRIVER}/{COMPUTE_UNITS}") => cus = Some(value),
                _ => {}
            }
        }
    }
    Some((product?, memory?, cus?))
}

/// One (sub-)request: a count of at least one, of the driver's class, asking for no more
/// than its pinned shape holds (or, unpinned, than the largest shape holds).
fn check_request(
    count: Option<i64>,
    class: &str,
    selectors: Option<&Vec<DeviceSelector>>,
    capacity: Option<&CapacityRequirements>,
    shapes: &[Shape],
) {
    assert!(count.is_some_and(|c| c >= 1), "count {count:?}");
    assert_eq!(class, DRIVER);
    let amount = |name: &str| {
        capacity
            .and_then(|c| c.requests.as_ref())
            .and_then(|r| r.get(name))
            .map(|q| hami_protocol::capacity::parse(&q.0).expect("the webhook writes quantities"))
    };
    let (memory, cus) = (amount(MEMORY), amount(COMPUTE_UNITS));
    match selectors.and_then(|s| pinned(s)) {
        Some((product, shape_memory, shape_cus)) => {
            assert!(
                shapes
                    .iter()
                    .any(|s| (&s.product_name, s.memory_bytes, s.compute_units)
                        == (&product, shape_memory, shape_cus)),
                "pinned to a shape ({product}, {shape_memory}, {shape_cus}) no slice has"
            );
            assert!(memory.is_none_or(|m| m <= shape_memory));
            assert!(cus.is_none_or(|c| (1..=shape_cus).contains(&c)));
        }
        None => {
            assert!(cus.is_none(), "compute units without a shape");
            if let Some(m) = memory {
                assert!(
                    shapes.is_empty() || shapes.iter().any(|s| m <= s.memory_bytes),
                    "{m} bytes fit no shape"
                );
            }
        }
    }
}

/// The webhook's DRA translation of any pod against any slices: never a panic; an allowed
/// pod's templates are valid ResourceClaimTemplates (DNS-label names, at most
/// [`MAX_FIRST_AVAILABLE`] sub-requests, amounts within the shape they are pinned to) and
/// its patch applies to the pod's JSON, leaving no `amd.com/*` resource in a converted
/// container and each converted container pointing at its template.
pub fn dra_webhook(data: &[u8]) {
    let Some((raw, pod, slices)) = webhook_input(data) else {
        return;
    };
    let shapes = shapes(&slices);
    let config = WebhookConfig {
        amd_mode: AmdMode::Dra,
        ..WebhookConfig::default()
    };
    let review = PodReview {
        operation: "CREATE",
        username: "",
        object: Some(&pod),
        old_object: None,
    };
    let Admission::Allow { patch, claims } = review_pod_with(&review, &config, &shapes) else {
        return;
    };
    for claim in &claims {
        assert!(
            is_dns_label(&claim.template_name),
            "{}",
            claim.template_name
        );
        assert!(is_dns_label(&claim.entry_name), "{}", claim.entry_name);
        let template = claim.template("default");
        let back: Value = serde_json::to_value(&template).expect("a template encodes");
        let _: k8s_openapi::api::resource::v1::ResourceClaimTemplate =
            serde_json::from_value(back).expect("a template decodes");
        let requests = claim
            .spec
            .spec
            .devices
            .as_ref()
            .and_then(|d| d.requests.as_ref())
            .expect("a claim has requests");
        assert_eq!(requests.len(), 1);
        let request = &requests[0];
        assert!(is_dns_label(&request.name));
        match (&request.exactly, &request.first_available) {
            (Some(e), None) => check_request(
                e.count,
                &e.device_class_name,
                e.selectors.as_ref(),
                e.capacity.as_ref(),
                &shapes,
            ),
            (None, Some(subs)) => {
                assert!((2..=MAX_FIRST_AVAILABLE).contains(&subs.len()));
                let names: BTreeSet<&str> = subs.iter().map(|s| s.name.as_str()).collect();
                assert_eq!(names.len(), subs.len(), "sub-request names repeat");
                for s in subs {
                    assert!(is_dns_label(&s.name));
                    assert!(s.selectors.as_ref().and_then(|s| pinned(s)).is_some());
                    check_request(
                        s.count,
                        &s.device_class_name,
                        s.selectors.as_ref(),
                        s.capacity.as_ref(),
                        &shapes,
                    );
                }
            }
            other => panic!("a request is exactly or firstAvailable: {other:?}"),
        }
    }
    let operations: json_patch::Patch =
        serde_json::from_value(Value::Array(patch)).expect("the patch is RFC 6902");
    let mut patched = raw;
    json_patch::patch(&mut patched, &operations)
        .unwrap_or_else(|e| panic!("the patch does not apply to the pod: {e}"));
    let after: Pod = serde_json::from_value(patched).expect("the patched pod decodes");
    let claim_names = |pod: &Pod| -> Vec<(String, Option<String>)> {
        pod.spec
            .iter()
            .flat_map(|s| s.resource_claims.iter().flatten())
            .map(|c| (c.name.clone(), c.resource_claim_template_name.clone()))
            .collect()
    };
    let distinct = |names: &[&str]| names.iter().collect::<BTreeSet<_>>().len() == names.len();
    let (entries, entries_before) = (claim_names(&after), claim_names(&pod));
    let container_names: Vec<&str> = containers(&pod).iter().map(|c| c.name.as_str()).collect();
    let before_names: Vec<&str> = entries_before.iter().map(|(n, _)| n.as_str()).collect();
    if distinct(&container_names) && distinct(&before_names) {
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        assert!(distinct(&names), "pod claim names repeat: {names:?}");
    }
    let spec = after.spec.as_ref().expect("the patched pod has a spec");
    for claim in &claims {
        let container = match claim.kind {
            ContainerKind::App => spec.containers.get(claim.index),
            _ => spec.init_containers.iter().flatten().nth(claim.index),
        }
        .expect("the claimed container is still there");
        assert_eq!(container.name, claim.container);
        let resources = container.resources.as_ref().expect("it has resources");
        for map in [&resources.limits, &resources.requests]
            .into_iter()
            .flatten()
        {
            for name in AMD.resources() {
                assert!(
                    !map.contains_key(name),
                    "{name} left in {}",
                    claim.container
                );
            }
        }
        assert!(
            resources
                .claims
                .iter()
                .flatten()
                .any(|c| c.name == claim.entry_name),
            "{} does not name its claim",
            claim.container
        );
        let entry = (claim.entry_name.clone(), Some(claim.template_name.clone()));
        assert!(
            entries.contains(&entry),
            "spec.resourceClaims lacks {}",
            claim.entry_name
        );
    }
}

/// Every container of a pod: `spec.initContainers`, then `spec.containers`.
fn containers(pod: &Pod) -> Vec<&Container> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect()
}

/// A device with the attributes and capacities the driver publishes, to evaluate on.
fn sample_device() -> Device {
    let mut d = Device {
        name: "gpu-0".into(),
        ..Device::default()
    };
    for (k, v) in [("uuid", "GPU-a"), ("productName", "MI210")] {
        d.attributes.insert(k.into(), DeviceAttribute::string(v));
    }
    d.attributes.insert(
        "resource.kubernetes.io/numaNode".into(),
        DeviceAttribute::int(1),
    );
    for (k, v) in [("memory", "64Gi"), ("computeUnits", "104"), ("shares", "8")] {
        d.capacity.insert(
            k.into(),
            DeviceCapacity {
                value: v.into(),
                request_policy: None,
            },
        );
    }
    d
}

/// CEL device selectors (from claims and DeviceClasses users write): parsing is total,
/// what parses renders to text that parses to the same terms (and renders the same), and
/// evaluation on a device is total.
pub fn dra_selector(data: &[u8]) {
    let Some(text) = crate::text(data) else {
        return;
    };
    let Ok(terms) = selector::parse(text) else {
        return;
    };
    let rendered = selector::render(&terms);
    let again = selector::parse(&rendered)
        .unwrap_or_else(|e| panic!("{text:?} rendered as {rendered:?}, which does not parse: {e}"));
    assert_eq!(again, terms, "{text:?} rendered as {rendered:?}");
    assert_eq!(selector::render(&again), rendered);
    let _ = selector::eval(DRIVER, &sample_device(), &terms);
}

/// `{"pod": <Pod>, "claims": [<ResourceClaim>...], "slices": [<ResourceSlice>...]}` through
/// the monitor's reading of DRA pods and `hami status`'s DRA view: both total; the monitor's
/// regions point into their owners' devices, CU ranges come once per device; the status
/// view's counts add up (shares used = holders, bytes and CUs used = the holders' sums).
pub fn dra_claim_status(data: &[u8]) {
    let Ok(input) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let list = |key: &str| -> Vec<Value> {
        input
            .get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let slices: Vec<ResourceSlice> = list("slices")
        .into_iter()
        .filter_map(|s| serde_json::from_value(s).ok())
        .collect();
    let claims: Vec<ResourceClaim> = list("claims")
        .into_iter()
        .filter_map(|c| serde_json::from_value(c).ok())
        .collect();

    let nodes = hami_report::dra_status::build(DRIVER, &slices, &claims);
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert!(names.is_sorted() && names.windows(2).all(|w| w[0] != w[1]));
    for node in &nodes {
        assert!(node.devices.is_sorted_by(|a, b| a.name <= b.name));
        for device in &node.devices {
            assert_eq!(device.shares_used, device.holders.len() as u64);
            let sum = |f: fn(&hami_report::dra_status::DraHolder) -> u64| {
                let total: u128 = device.holders.iter().map(|h| u128::from(f(h))).sum();
                u64::try_from(total).unwrap_or(u64::MAX)
            };
            assert_eq!(device.memory_used_bytes, sum(|h| h.memory_bytes));
            assert_eq!(device.compute_units_used, sum(|h| h.compute_units));
        }
    }

    let Some(pod) = input
        .get("pod")
        .and_then(|p| serde_json::from_value::<Pod>(p.clone()).ok())
    else {
        return;
    };
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let devices = hami_monitor::dra_claims::slice_devices(DRIVER, &node, &slices);
    let by_name: HashMap<String, ResourceClaim> = claims
        .into_iter()
        .filter_map(|c| Some((c.metadata.name.clone()?, c)))
        .collect();
    let _ = hami_monitor::dra_claims::claim_names(&pod);
    let seen = hami_monitor::dra_claims::dra_pod(&pod, &by_name, DRIVER, &node, &devices);
    for region in seen.regions.values() {
        let owned = seen.containers.get(&region.container);
        for (i, device) in region.devices.iter().enumerate() {
            if let Some(at) = device.vdevice_index {
                let list = owned.unwrap_or_else(|| panic!("region {i} names no container"));
                assert_eq!(list[at].uuid, device.uuid, "region device {i}");
            }
        }
    }
    let uuids: Vec<&str> = seen.cu_allocated.iter().map(|(u, _)| u.as_str()).collect();
    assert!(uuids.is_sorted() && uuids.windows(2).all(|w| w[0] != w[1]));
    assert!(seen.cu_allocated.iter().all(|(_, r)| !r.is_empty()));
}

/// The claim the API server has, for [`dra_kubelet_messages`]: allocated nothing yet.
const SERVER_UID: &str = "3f2c0b9e-5d6a-4e41-9c1f-2b7a8d0e6f13";

/// kubelet's DRA v1 NodePrepareResources and NodeUnprepareResources bodies: protobuf
/// decoding is total and re-encoding is stable; the driver's Prepare check of each claim
/// the kubelet names against the API server's object refuses every UID but the object's.
pub fn dra_kubelet_messages(data: &[u8]) {
    if let Ok(request) = NodePrepareResourcesRequest::decode(data) {
        let again = NodePrepareResourcesRequest::decode(request.encode_to_vec().as_slice())
            .expect("re-encoded NodePrepareResourcesRequest decodes");
        assert_eq!(again, request);
        let settings = PrepareSettings {
            driver: DRIVER.into(),
            node: "node".into(),
            hook_host_path: "/usr/local/hami/libhip_hook.so".into(),
            hook_container_path: "/usr/local/hami/libhip_hook.so".into(),
            cache_host_root: "/usr/local/hami/dra".into(),
        };
        for asked in &request.claims {
            let server: hami_dra_core::api::ResourceClaim =
                serde_json::from_value(serde_json::json!({
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {
                        "namespace": asked.namespace, "name": asked.name, "uid": SERVER_UID,
                    },
                }))
                .expect("a claim");
            let planned = plan_prepare(
                &server,
                &asked.uid,
                &settings,
                &Default::default(),
                &Default::default(),
            );
            match planned {
                Err(PrepareError::UidMismatch { .. }) => assert_ne!(asked.uid, SERVER_UID),
                Err(_) => assert_eq!(asked.uid, SERVER_UID, "an unallocated claim is refused"),
                Ok(plan) => panic!("an unallocated claim was planned: {plan:?}"),
            }
        }
    }
    if let Ok(request) = NodeUnprepareResourcesRequest::decode(data) {
        let again = NodeUnprepareResourcesRequest::decode(request.encode_to_vec().as_slice())
            .expect("re-encoded NodeUnprepareResourcesRequest decodes");
        assert_eq!(again, request);
    }
}
