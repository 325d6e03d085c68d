use hami_protocol::requests::{RequestDefaults, pod_requests};
use proptest::prelude::*;

use hami_protocol::capacity::format_bytes;
use hami_protocol::dra::{
    AMD_MODE_ANNOTATION, ATTR_NUMA_NODE, CLAIM_PREFIX, COMPUTE_UNITS, DRIVER, EXACT_COUNT,
    MANAGED_BY_LABEL, MANAGED_BY_WEBHOOK, MEMORY,
};
use hami_protocol::requests::{DeviceRequest, MemoryRequest, amd_cu_count};
use k8s_openapi::api::resource::v1::{
    CapacityRequirements, DeviceRequest as ClaimRequest, DeviceSelector as ClaimSelector,
    ResourceSlice,
};
use serde_json::{Value, json};

use super::claim_spec::{amounts_on, needs_shapes};
use super::*;

const GI: u64 = 1 << 30;

/// A device of this driver as its slices publish it (`hami_dra_core::slice`'s shape).
fn device(name: &str, product: &str, memory: u64, cus: u64, step: u64) -> Value {
    json!({
        "name": name,
        "allowMultipleAllocations": true,
        "attributes": {
            "type": {"string": "amdgpu-slice"},
            "uuid": {"string": format!("uuid-{name}")},
            "productName": {"string": product},
        },
        "capacity": {
            "memory": {"value": format_bytes(memory), "requestPolicy": {"default": format_bytes(memory), "validRange": {"min": "1Mi", "max": format_bytes(memory), "step": "1Mi"}}},
            "computeUnits": {"value": cus.to_string(), "requestPolicy": {"default": cus.to_string(), "validRange": {"min": step.to_string(), "max": cus.to_string(), "step": step.to_string()}}},
            "shares": {"value": "10"},
        }
    })
}

fn slice(driver: &str, devices: Vec<Value>) -> ResourceSlice {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("node-{driver}")},
        "spec": {"driver": driver, "nodeName": "node", "pool": {"name": "node", "generation": 1, "resourceSliceCount": 1}, "devices": devices}
    }))
    .unwrap()
}

fn mi300x() -> Shape {
    Shape {
        product_name: "AMD Instinct MI300X".into(),
        memory_bytes: 192 * GI,
        compute_units: 304,
        cu_step: 1,
        shares: 10,
        device_type: "amdgpu-slice".into(),
        devices: 1,
    }
}

fn mi210() -> Shape {
    Shape {
        product_name: "AMD Instinct MI210".into(),
        memory_bytes: 64 * GI,
        compute_units: 104,
        cu_step: 1,
        shares: 10,
        device_type: "amdgpu-slice".into(),
        devices: 1,
    }
}

fn pod(annotations: Value, limits: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}
    }))
    .unwrap()
}

fn claims_of(p: &Pod, shapes: &[Shape]) -> Result<Vec<ContainerClaim>, String> {
    let requests = pod_requests(p, &RequestDefaults::default()).map_err(|e| e.to_string())?;
    pod_claims(p, &requests, shapes)
}

fn request_of(claim: &ContainerClaim) -> &ClaimRequest {
    &claim
        .spec
        .spec
        .devices
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()[0]
}

/// (selectors, capacity requests) of each alternative of the claim's one request.
fn alternatives(claim: &ContainerClaim) -> Vec<(Vec<String>, BTreeMap<String, String>)> {
    let r = request_of(claim);
    let of = |sel: &Option<Vec<ClaimSelector>>, cap: &Option<CapacityRequirements>| {
        (
            sel.iter()
                .flatten()
                .map(|s| s.cel.as_ref().unwrap().expression.clone())
                .collect(),
            cap.as_ref()
                .and_then(|c| c.requests.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect(),
        )
    };
    match (&r.exactly, &r.first_available) {
        (Some(e), None) => vec![of(&e.selectors, &e.capacity)],
        (None, Some(subs)) => subs.iter().map(|s| of(&s.selectors, &s.capacity)).collect(),
        other => panic!("neither exactly nor firstAvailable: {other:?}"),
    }
}

#[test]
fn shapes_come_from_this_drivers_slices_sorted_and_distinct() {
    let ours = slice(
        DRIVER,
        vec![
            device("gpu-0", "AMD Instinct MI300X", 192 * GI, 304, 1),
            device("gpu-1", "AMD Instinct MI300X", 192 * GI, 304, 1),
            device("gpu-2", "AMD Instinct MI210", 64 * GI, 104, 1),
            json!({"name": "odd", "attributes": {}}),
        ],
    );
    let other = slice("gpu.amd.com", vec![device("gpu-0", "Other", 8 * GI, 8, 1)]);
    let found = shapes([&ours, &other]);
    // Smallest first; the two MI300X are one shape of two devices.
    let two = Shape {
        devices: 2,
        ..mi300x()
    };
    assert_eq!(found, vec![mi210(), two]);
    // RDNA: the CU step is the request policy's.
    let rdna = slice(DRIVER, vec![device("gpu-0", "AMD Radeon", 24 * GI, 96, 2)]);
    assert_eq!(shapes([&rdna])[0].cu_step, 2);
}

#[test]
fn percent_of_cores_is_floor_and_clamp_of_the_shapes_cus() {
    // SPEC §2.2: 25 % of 304 → 76, 33 % → 100, 67 % → 203; 1 % of 104 → 1.
    for (pct, shape, cus) in [
        (25, mi300x(), "76"),
        (33, mi300x(), "100"),
        (67, mi300x(), "203"),
        (25, mi210(), "26"),
        (1, mi210(), "1"),
    ] {
        let p = pod(
            json!({}),
            json!({"amd.com/gpu": "1", "amd.com/gpucores": pct.to_string()}),
        );
        let claims = claims_of(&p, std::slice::from_ref(&shape)).unwrap();
        let alts = alternatives(&claims[0]);
        assert_eq!(alts.len(), 1, "one shape: exactly");
        assert_eq!(alts[0].1.get(COMPUTE_UNITS).map(String::as_str), Some(cus));
        assert_eq!(alts[0].1.get(MEMORY), None, "no gpumem: the policy default");
        assert_eq!(alts[0].0[0], shape_selector(&shape));
    }
}

/// The DRA path charges compute units as the device-plugin path does (`fit::demand`):
/// whole WGPs on RDNA (policy step 2), rounded up, so the request is already a valid
/// amount of the policy and the allocator consumes exactly it.
#[test]
fn dra_and_device_plugin_paths_charge_the_same_cus() {
    use crate::snapshot::Gpu;
    use hami_protocol::node_register::{CustomInfo, DeviceInfo};
    for step in [1u64, 2] {
        for cus in [1u64, 2, 3, 32, 60, 61, 64, 96, 104, 304] {
            let shape = Shape {
                product_name: "AMD GPU".into(),
                memory_bytes: 16 * GI,
                compute_units: cus,
                cu_step: step,
                shares: 10,
                device_type: "amdgpu-slice".into(),
                devices: 1,
            };
            let gpu = Gpu {
                vendor: Vendor::Amd,
                info: DeviceInfo {
                    devcore: cus as u32,
                    devmem: 16 << 10,
                    custom_info: CustomInfo {
                        cu_per_wgp: Some(step as u32),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            };
            for pct in 1..100 {
                let request = DeviceRequest {
                    count: 1,
                    memory: MemoryRequest::Mib(1),
                    cores_percent: pct,
                    priority: None,
                    added_limits: Vec::new(),
                };
                let charged = crate::fit::demand(&gpu, &request).1;
                let dra = amounts_on(&request, &shape).and_then(|a| a.compute_units);
                match dra {
                    Some(c) => {
                        assert_eq!(c, charged, "{pct} % of {cus} (step {step})");
                        assert_eq!(c % step, 0, "{pct} % of {cus} (step {step})");
                    }
                    // No whole WGP: neither path has anything to give.
                    None => assert_eq!(charged, 0, "{pct} % of {cus} (step {step})"),
                }
            }
        }
    }
    // 5 % of a 64-CU RDNA GPU: 4 (two WGPs), not the floor's 3.
    let rdna = Shape {
        product_name: "AMD Radeon PRO W7800".into(),
        memory_bytes: 32 * GI,
        compute_units: 64,
        cu_step: 2,
        shares: 10,
        device_type: "amdgpu-slice".into(),
        devices: 1,
    };
    let p = pod(
        json!({}),
        json!({"amd.com/gpu": "1", "amd.com/gpucores": "5"}),
    );
    let claims = claims_of(&p, &[rdna]).unwrap();
    assert_eq!(alternatives(&claims[0])[0].1[COMPUTE_UNITS], "4");
}

#[test]
fn memory_only_reserves_every_cu_and_needs_no_shapes() {
    let p = pod(json!({}), json!({"amd.com/gpumem": "4096"}));
    for shapes in [vec![], vec![mi210()]] {
        let claims = claims_of(&p, &shapes).unwrap();
        let r = request_of(&claims[0]);
        let e = r.exactly.as_ref().unwrap();
        assert_eq!(e.count, Some(1), "count defaulted");
        assert_eq!(e.allocation_mode.as_deref(), Some(EXACT_COUNT));
        assert_eq!(e.device_class_name, DRIVER);
        assert!(
            e.selectors.is_none(),
            "unpinned: no amount depends on the device"
        );
        let caps = alternatives(&claims[0]).remove(0).1;
        assert_eq!(caps.get(MEMORY).map(String::as_str), Some("4Gi"));
        assert!(!caps.contains_key(COMPUTE_UNITS), "{caps:?}");
    }
    // A plain count: the whole GPU (every default).
    let whole = pod(json!({}), json!({"amd.com/gpu": "1"}));
    let claims = claims_of(&whole, &[]).unwrap();
    assert!(alternatives(&claims[0])[0].1.is_empty());
    // gpucores 100 is the default too.
    let hundred = pod(
        json!({}),
        json!({"amd.com/gpu": "1", "amd.com/gpucores": "100"}),
    );
    assert!(
        alternatives(&claims_of(&hundred, &[]).unwrap()[0])[0]
            .1
            .is_empty()
    );
}

#[test]
fn memory_percentage_is_of_each_shapes_memory() {
    let p = pod(
        json!({}),
        json!({"amd.com/gpumem-percentage": "25", "amd.com/gpucores": "50"}),
    );
    let claims = claims_of(&p, &[mi300x(), mi210()]).unwrap();
    let alts = alternatives(&claims[0]);
    // Sorted by product name: MI210 first, then MI300X.
    assert_eq!(alts.len(), 2);
    assert_eq!(alts[0].0[0], shape_selector(&mi210()));
    assert_eq!(alts[0].1[MEMORY], "16Gi");
    assert_eq!(alts[0].1[COMPUTE_UNITS], "52");
    assert_eq!(alts[1].0[0], shape_selector(&mi300x()));
    assert_eq!(alts[1].1[MEMORY], "48Gi");
    assert_eq!(alts[1].1[COMPUTE_UNITS], "152");
    let subs = request_of(&claims[0]).first_available.as_ref().unwrap();
    assert_eq!(subs[0].name, "shape-0");
    assert!(subs.iter().all(|s| s.count == Some(1)));
}

fn junk(i: usize, memory: u64) -> Shape {
    Shape {
        product_name: format!("AMD Aaa {i}"),
        memory_bytes: memory,
        compute_units: 64,
        cu_step: 1,
        shares: 10,
        device_type: "amdgpu-slice".into(),
        devices: 1,
    }
}

/// Issue 26 item 9: more types than a claim may list no longer drop the real GPUs (the
/// landed code cut the name-sorted list at 8, so 9 types sorting before "AMD Instinct
/// MI210" removed it from every claim): the 8 with the most devices are kept, smallest
/// first, and the ones left out are said.
#[test]
fn more_types_than_a_claim_lists_keep_those_with_the_most_devices_and_say_so() {
    let mut shapes: Vec<Shape> = (0..9).map(|i| junk(i, 128 * GI)).collect();
    shapes.push(Shape {
        devices: 2,
        ..mi210()
    });
    shapes.sort();
    let p = pod(
        json!({}),
        json!({"amd.com/gpu": "1", "amd.com/gpucores": "25"}),
    );
    let claims = claims_of(&p, &shapes).unwrap();
    let alts = alternatives(&claims[0]);
    assert_eq!(alts.len(), MAX_FIRST_AVAILABLE);
    // MI210 (2 devices, and the smallest) first, then the Aaa types with the lowest names.
    assert_eq!(alts[0].0[0], shape_selector(&mi210()));
    for (i, alt) in alts[1..].iter().enumerate() {
        assert_eq!(alt.0[0], shape_selector(&junk(i, 128 * GI)));
    }
    let left: Vec<&str> = claims[0]
        .left_out
        .iter()
        .map(|s| s.product_name.as_str())
        .collect();
    assert_eq!(left, ["AMD Aaa 7", "AMD Aaa 8"]);
    let warnings = claims[0].warnings();
    assert_eq!(
        warnings,
        [
            "spec.containers[0] (main): 10 AMD device types can hold the request, more than the 8 a claim may list: kept the 8 with the most devices, left out 2",
            "spec.containers[0] (main): left out AMD Aaa 7 (131072 MiB, 64 CUs, 1 device): the pod cannot land on it",
            "spec.containers[0] (main): left out AMD Aaa 8 (131072 MiB, 64 CUs, 1 device): the pod cannot land on it",
        ]
    );
    assert!(warnings.iter().all(|w| w.len() <= 256), "{warnings:?}");
    // Eight types: every one listed, nothing to say.
    let fewer = claims_of(&p, &shapes[..8]).unwrap();
    assert_eq!(alternatives(&fewer[0]).len(), 8);
    assert!(fewer[0].left_out.is_empty() && fewer[0].warnings().is_empty());

    // Types whose devices cannot hold the request are not candidates (nothing to say):
    // 9 types of 32 GiB and the MI210, for 40 GiB: the MI210 alone, exactly.
    let mut small: Vec<Shape> = (0..9).map(|i| junk(i, 32 * GI)).collect();
    small.push(mi210());
    small.sort();
    let big = pod(
        json!({}),
        json!({"amd.com/gpu": "1", "amd.com/gpumem": "40960", "amd.com/gpucores": "25"}),
    );
    let claims = claims_of(&big, &small).unwrap();
    let alts = alternatives(&claims[0]);
    assert_eq!(alts.len(), 1);
    assert_eq!(alts[0].0[0], shape_selector(&mi210()));
    assert!(claims[0].left_out.is_empty());
    // Many left out: ten named, the rest counted.
    let many: Vec<Shape> = (0..30).map(|i| junk(i, 128 * GI)).collect();
    let mut many = many;
    many.sort();
    let w = claims_of(&p, &many).unwrap()[0].warnings();
    assert_eq!(w.len(), 1 + 10 + 1, "{w:?}");
    assert!(
        w[11].ends_with("and 12 more device types left out"),
        "{w:?}"
    );
}

#[test]
fn bad_inputs_are_refused_naming_what_to_change() {
    let no_slices = claims_of(
        &pod(
            json!({}),
            json!({"amd.com/gpu": "1", "amd.com/gpucores": "25"}),
        ),
        &[],
    )
    .unwrap_err();
    assert!(
        no_slices.contains("no ResourceSlice of amdgpu.hami-rs.io yet")
            && no_slices.contains("spec.containers[0] (main)"),
        "{no_slices}"
    );
    let pct = claims_of(
        &pod(json!({}), json!({"amd.com/gpumem-percentage": "50"})),
        &[],
    )
    .unwrap_err();
    assert!(pct.contains("percentages need the device size"), "{pct}");
    // More memory than any device, with and without a percentage of cores.
    for limits in [
        json!({"amd.com/gpumem": "70000"}),
        json!({"amd.com/gpumem": "70000", "amd.com/gpucores": "10"}),
    ] {
        let big = claims_of(&pod(json!({}), limits), &[mi210()]).unwrap_err();
        assert!(
            big.contains("70000 MiB")
                && big.contains("the largest is AMD Instinct MI210 with 65536 MiB"),
            "{big}"
        );
    }
    let typed = claims_of(
        &pod(
            json!({"amd.com/use-gputype": "MI300"}),
            json!({"amd.com/gpu": "1"}),
        ),
        &[mi210()],
    )
    .unwrap_err();
    assert!(
        typed.contains("amd.com/use-gputype") && typed.contains("MI210"),
        "{typed}"
    );
    let numa = claims_of(
        &pod(
            json!({"amd.com/numa-bind": "maybe"}),
            json!({"amd.com/gpu": "2"}),
        ),
        &[],
    )
    .unwrap_err();
    assert!(numa.contains("amd.com/numa-bind"), "{numa}");
    // A user's claim of the name the webhook would add.
    let mut taken = pod(json!({}), json!({"amd.com/gpu": "1"}));
    taken.spec.as_mut().unwrap().resource_claims = Some(vec![
        serde_json::from_value(json!({"name": "hami-amd-main", "resourceClaimName": "mine"}))
            .unwrap(),
    ]);
    let e = claims_of(&taken, &[]).unwrap_err();
    assert!(
        e.contains("already has a resource claim named hami-amd-main"),
        "{e}"
    );
}

#[test]
fn annotations_become_selectors_and_constraints() {
    let p = pod(
        json!({
            "amd.com/use-gputype": "mi300",
            "amd.com/use-gpu-uuid": "a,b",
            "amd.com/nouse-gpu-uuid": "c\"d",
            "amd.com/numa-bind": "true",
            "amd.com/link-bind": "true",
        }),
        json!({"amd.com/gpu": "2"}),
    );
    let claims = claims_of(&p, &[mi210(), mi300x()]).unwrap();
    let alts = alternatives(&claims[0]);
    assert_eq!(alts.len(), 1, "the type filter leaves the MI300X shape");
    assert_eq!(
        alts[0].0,
        vec![
            shape_selector(&mi300x()),
            format!("device.attributes[\"{DRIVER}\"].uuid in [\"a\", \"b\"]"),
            format!("!(device.attributes[\"{DRIVER}\"].uuid in [\"c\\\"d\"])"),
        ]
    );
    let constraints = claims[0]
        .spec
        .spec
        .devices
        .as_ref()
        .unwrap()
        .constraints
        .clone()
        .unwrap();
    let text: Vec<(Option<String>, Option<String>, Vec<String>)> = constraints
        .into_iter()
        .map(|c| (c.distinct_attribute, c.match_attribute, c.requests.unwrap()))
        .collect();
    assert_eq!(
        text,
        vec![
            (Some(format!("{DRIVER}/uuid")), None, vec!["gpu".into()]),
            (None, Some(ATTR_NUMA_NODE.into()), vec!["gpu".into()]),
            (None, Some(format!("{DRIVER}/xgmiHive")), vec!["gpu".into()]),
        ]
    );
    // One GPU: no constraint (a lone device always matches itself).
    let one = pod(
        json!({"amd.com/numa-bind": "true"}),
        json!({"amd.com/gpu": "1"}),
    );
    let c = claims_of(&one, &[]).unwrap();
    assert!(
        c[0].spec
            .spec
            .devices
            .as_ref()
            .unwrap()
            .constraints
            .is_none()
    );
}

#[test]
fn the_mode_annotation_overrides_the_default_and_refuses_other_values() {
    let p = |v: &str| pod(json!({ AMD_MODE_ANNOTATION: v }), json!({}));
    assert_eq!(
        AmdMode::of_pod(&p("dra"), AmdMode::DevicePlugin),
        Ok(AmdMode::Dra)
    );
    assert_eq!(
        AmdMode::of_pod(&p("device-plugin"), AmdMode::Dra),
        Ok(AmdMode::DevicePlugin)
    );
    assert_eq!(
        AmdMode::of_pod(&pod(json!({}), json!({})), AmdMode::Dra),
        Ok(AmdMode::Dra)
    );
    let e = AmdMode::of_pod(&p("bogus"), AmdMode::Dra).unwrap_err();
    assert!(
        e.contains("hami.io/amd-mode") && e.contains("device-plugin") && e.contains("dra"),
        "{e}"
    );
}

/// Applies RFC 6902 `add` and `remove` operations, failing on a path that does not exist
/// (as the API server does), so the patch is checked against the real document.
fn apply(mut doc: Value, ops: &[Value]) -> Value {
    for op in ops {
        let path = op["path"].as_str().unwrap();
        let (parent, last) = path.rsplit_once('/').unwrap();
        let last = last.replace("~1", "/").replace("~0", "~");
        let target = doc
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("{parent} missing for {op}"));
        match (op["op"].as_str().unwrap(), target) {
            ("add", Value::Array(items)) if last == "-" => items.push(op["value"].clone()),
            ("add", Value::Object(map)) => {
                assert!(!map.contains_key(&last), "add over an existing {path}");
                map.insert(last, op["value"].clone());
            }
            ("remove", Value::Object(map)) => {
                assert!(map.remove(&last).is_some(), "remove of a missing {path}");
            }
            (o, t) => panic!("cannot {o} at {path} in {t}"),
        }
    }
    doc
}

#[test]
fn the_patch_moves_the_request_into_claims() {
    let raw = json!({
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [{"name": "init", "resources": {"requests": {"amd.com/gpu": "1"}, "limits": {"amd.com/gpu": "1", "cpu": "1"}}}],
            "containers": [
                {"name": "a", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "4096", "amd.com/gpucores": "25", "memory": "1Gi"}}},
                {"name": "b", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "4096", "amd.com/gpucores": "25"}, "claims": [{"name": "other"}]}},
                {"name": "c"}
            ],
            "resourceClaims": [{"name": "other", "resourceClaimName": "x"}]
        }
    });
    let p: Pod = serde_json::from_value(raw.clone()).unwrap();
    let claims = claims_of(&p, &[mi210()]).unwrap();
    assert_eq!(claims.len(), 3);
    // Identical requests share one content-addressed template.
    assert_eq!(claims[1].template_name, claims[2].template_name);
    assert_ne!(claims[0].template_name, claims[1].template_name);
    let ops = patch(p.spec.as_ref().unwrap(), &claims);
    let doc = apply(raw, &ops);
    let spec = &doc["spec"];
    assert_eq!(
        spec["initContainers"][0]["resources"]["limits"],
        json!({"cpu": "1"})
    );
    assert_eq!(
        spec["initContainers"][0]["resources"]["requests"],
        json!({})
    );
    assert_eq!(
        spec["initContainers"][0]["resources"]["claims"],
        json!([{"name": "hami-amd-init"}])
    );
    assert_eq!(
        spec["containers"][0]["resources"]["limits"],
        json!({"memory": "1Gi"})
    );
    assert_eq!(
        spec["containers"][1]["resources"]["claims"],
        json!([{"name": "other"}, {"name": "hami-amd-b"}])
    );
    assert!(spec["containers"][2].get("resources").is_none());
    assert_eq!(
        spec["resourceClaims"],
        json!([
            {"name": "other", "resourceClaimName": "x"},
            {"name": "hami-amd-init", "resourceClaimTemplateName": claims[0].template_name},
            {"name": "hami-amd-a", "resourceClaimTemplateName": claims[1].template_name},
            {"name": "hami-amd-b", "resourceClaimTemplateName": claims[2].template_name},
        ])
    );
    assert!(!doc.to_string().contains("amd.com/"), "{doc}");
    // The template carries the managed-by label, in its claims' metadata too.
    let t = claims[1].template("team-a");
    assert_eq!(t.metadata.namespace.as_deref(), Some("team-a"));
    assert_eq!(
        t.metadata.labels.unwrap()[MANAGED_BY_LABEL],
        MANAGED_BY_WEBHOOK
    );
    assert_eq!(
        t.spec.metadata.unwrap().labels.unwrap()[MANAGED_BY_LABEL],
        MANAGED_BY_WEBHOOK
    );
}

#[test]
fn same_spec_compares_quantities_by_value() {
    let p = pod(json!({}), json!({"amd.com/gpumem": "4096"}));
    let ours = claims_of(&p, &[]).unwrap().remove(0).spec;
    let mut written = serde_json::to_value(&ours).unwrap();
    written["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] =
        json!("4096Mi");
    let written: ResourceClaimTemplateSpec = serde_json::from_value(written).unwrap();
    assert!(same_spec(&ours, &written));
    let other = claims_of(&pod(json!({}), json!({"amd.com/gpumem": "4097"})), &[])
        .unwrap()
        .remove(0)
        .spec;
    assert!(!same_spec(&ours, &other));
}

#[test]
fn entry_names_are_dns_labels() {
    assert_eq!(entry_name("main"), "hami-amd-main");
    let long = "a".repeat(63);
    let e = entry_name(&long);
    assert!(is_dns_label(&e) && e.starts_with("hami-amd-aaa"), "{e}");
    assert_ne!(entry_name(&long), entry_name(&"a".repeat(62)));
    assert!(is_dns_label(&entry_name("Main_Container")));
    assert!(is_dns_label(&entry_name("---")));
}

fn arb_shape() -> impl Strategy<Value = Shape> {
    (
        prop::sample::select(vec![
            "AMD Instinct MI210",
            "AMD Instinct MI300X",
            "AMD Radeon PRO W7900",
        ]),
        1u64..=262_144,
        1u64..=320,
        1u64..=2,
        1u64..=4,
    )
        .prop_map(|(p, mib, cus, step, devices)| Shape {
            product_name: p.into(),
            memory_bytes: mib << 20,
            compute_units: cus,
            cu_step: step,
            shares: 10,
            device_type: "amdgpu-slice".into(),
            devices,
        })
}

fn arb_request() -> impl Strategy<Value = DeviceRequest> {
    (
        1u32..=8,
        prop_oneof![
            Just(MemoryRequest::Whole),
            (1u64..=300_000).prop_map(MemoryRequest::Mib),
            (1u32..=100).prop_map(MemoryRequest::Percent),
        ],
        1u32..=100,
    )
        .prop_map(|(count, memory, cores_percent)| DeviceRequest {
            count,
            memory,
            cores_percent,
            priority: None,
            added_limits: Vec::new(),
        })
}

proptest! {
    /// Every emitted alternative is pinned to a shape that holds it, with exactly the
    /// request's amounts on that shape: no percentage lost, nothing above the shape.
    #[test]
    fn amounts_never_exceed_the_shape_and_follow_the_rules(
        shapes in prop::collection::vec(arb_shape(), 0..14),
        request in arb_request(),
    ) {
        let mut shapes = shapes;
        shapes.sort();
        shapes.dedup();
        let selector = DeviceSelector::default();
        match claim_spec(&request, &selector, &shapes) {
            Ok(choice) => {
                let spec = choice.spec;
                let claim = ContainerClaim {
                    kind: ContainerKind::App,
                    index: 0,
                    container: "c".into(),
                    entry_name: entry_name("c"),
                    template_name: String::new(),
                    spec: ResourceClaimTemplateSpec { metadata: None, spec },
                    left_out: choice.left_out.clone(),
                };
                let r = request_of(&claim);
                let count = r.exactly.as_ref().map(|e| e.count).unwrap_or_else(|| r.first_available.as_ref().unwrap()[0].count);
                prop_assert_eq!(count, Some(i64::from(request.count)));
                let alts = alternatives(&claim);
                prop_assert!(alts.len() <= MAX_FIRST_AVAILABLE);
                for (selectors, caps) in &alts {
                    let mem = caps.get(MEMORY).map(|q| hami_protocol::capacity::parse(q).unwrap());
                    let cus = caps.get(COMPUTE_UNITS).map(|q| hami_protocol::capacity::parse(q).unwrap());
                    prop_assert_eq!(cus.is_some(), request.cores_percent < 100);
                    match request.memory {
                        MemoryRequest::Mib(m) => prop_assert_eq!(mem, Some(m << 20)),
                        MemoryRequest::Percent(p) if p < 100 => prop_assert!(mem.is_some()),
                        _ => prop_assert_eq!(mem, None),
                    }
                    let pinned = selectors.first().and_then(|s| shapes.iter().find(|sh| shape_selector(sh) == *s));
                    if needs_shapes(&request, &selector) {
                        let shape = pinned.expect("pinned to a shape");
                        if let Some(m) = mem { prop_assert!(m <= shape.memory_bytes); }
                        if let Some(c) = cus {
                            prop_assert!(c >= 1 && c <= shape.compute_units);
                            prop_assert_eq!(c, u64::from(amd_cu_count(request.cores_percent, shape.compute_units as u32, shape.cu_step as u32)));
                        }
                        if let MemoryRequest::Percent(p) = request.memory && p < 100 {
                            prop_assert_eq!(mem, Some((shape.memory_mib() * u64::from(p) / 100).max(1) << 20));
                        }
                    } else {
                        prop_assert!(pinned.is_none());
                    }
                }
                // Smallest fitting shape first: the alternatives keep the shapes' order.
                let order: Vec<usize> = alts.iter().filter_map(|(s, _)| s.first().and_then(|s| shapes.iter().position(|sh| shape_selector(sh) == *s))).collect();
                prop_assert!(order.windows(2).all(|w| w[0] < w[1]));
                // No shape that holds the request is dropped without a word: each is listed
                // or left out (said), and the limit alone leaves any out.
                if needs_shapes(&request, &selector) {
                    let key = |s: &Shape| (s.memory_bytes, s.compute_units, s.product_name.clone());
                    // Devices per distinct sub-request among the shapes that hold it.
                    let mut fitting: BTreeMap<(u64, u64, String), u64> = BTreeMap::new();
                    for s in shapes.iter().filter(|s| amounts_on(&request, s).is_some()) {
                        *fitting.entry(key(s)).or_default() += s.devices;
                    }
                    let listed = alts.len();
                    prop_assert_eq!(listed + choice.left_out.len(), fitting.len());
                    prop_assert_eq!(listed, fitting.len().min(MAX_FIRST_AVAILABLE));
                    let fewest_kept = order.iter().map(|&i| fitting[&key(&shapes[i])]).min().unwrap_or(0);
                    for s in &choice.left_out {
                        prop_assert_eq!(s.devices, fitting[&key(s)]);
                        prop_assert!(s.devices <= fewest_kept, "left out {:?} with more devices than one kept", s);
                    }
                    prop_assert!(choice.left_out.windows(2).all(|w| w[0] < w[1]), "left out smallest first");
                } else {
                    prop_assert!(choice.left_out.is_empty());
                }
            }
            Err(message) => {
                let fits_one = shapes.iter().any(|s| amounts_on(&request, s).is_some());
                prop_assert!(shapes.is_empty() || !fits_one, "refused although a shape fits: {}", message);
                prop_assert!(needs_shapes(&request, &selector) || !shapes.is_empty(), "{}", message);
            }
        }
    }

    /// Same input, same names; names are DNS labels of at most 63 characters.
    #[test]
    fn names_are_stable_dns_labels(container in "[a-zA-Z0-9_.-]{1,80}", request in arb_request()) {
        let e = entry_name(&container);
        prop_assert!(is_dns_label(&e), "{}", e);
        prop_assert_eq!(&e, &entry_name(&container));
        let spec = |r: &DeviceRequest| ResourceClaimTemplateSpec {
            metadata: None,
            spec: claim_spec(r, &DeviceSelector::default(), &[mi300x()]).map(|c| c.spec).unwrap_or_default(),
        };
        let t = template_name(&spec(&request));
        prop_assert!(is_dns_label(&t) && t.len() == CLAIM_PREFIX.len() + 16, "{}", t);
        prop_assert_eq!(t, template_name(&spec(&request.clone())));
    }
}
