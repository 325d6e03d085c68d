use super::*;
use crate::names::Vendor;
use crate::node_lock::PodRef;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

fn pod(spec: serde_json::Value) -> Pod {
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}),
    )
    .unwrap()
}

fn limits(pairs: serde_json::Value) -> serde_json::Value {
    json!({"limits": pairs})
}

fn one(limits_json: serde_json::Value) -> Result<ContainerRequest, RequestError> {
    let p = pod(json!({"containers": [{"name": "c", "resources": limits(limits_json)}]}));
    pod_requests(&p, &RequestDefaults::default()).map(|mut r| r.remove(0))
}

#[test]
fn a_pods_slots_and_kinds_follow_container_slots() {
    let p = pod(json!({
        "initContainers": [{"name": "i"}, {"name": "s", "restartPolicy": "Always"}],
        "containers": [{"name": "a"}]
    }));
    let names: Vec<_> = pod_container_slots(&p)
        .iter()
        .map(|c| c.container.name.clone())
        .collect();
    assert_eq!(names, ["i", "s", "a"]);
    use ContainerKind::{App, Init, Sidecar};
    assert_eq!(container_kinds(&p), [Init, Sidecar, App]);
    let mut bare = p.clone();
    bare.spec = None;
    assert!(pod_container_slots(&bare).is_empty());
    assert!(container_kinds(&bare).is_empty());
}

#[test]
fn init_containers_first_sidecars_marked() {
    let p = pod(json!({
        "initContainers": [{"name": "setup"}, {"name": "proxy", "restartPolicy": "Always"}],
        "containers": [
            {"name": "a", "resources": limits(json!({"amd.com/gpu": "2", "amd.com/gpumem": "8192", "amd.com/gpucores": "25"}))},
            {"name": "b", "resources": limits(json!({"amd.com/gpu": "2"}))}
        ]
    }));
    let reqs = pod_requests(&p, &RequestDefaults::default()).unwrap();
    let shape: Vec<_> = reqs.iter().map(|r| (r.name.as_str(), r.kind)).collect();
    assert_eq!(
        shape,
        vec![
            ("setup", ContainerKind::Init),
            ("proxy", ContainerKind::Sidecar),
            ("a", ContainerKind::App),
            ("b", ContainerKind::App)
        ]
    );
    assert!(reqs[0].is_empty() && reqs[1].is_empty());
    let a = reqs[2].amd.as_ref().unwrap();
    assert_eq!(
        (a.count, a.memory, a.cores_percent),
        (2, MemoryRequest::Mib(8192), 25)
    );
    let b = reqs[3].amd.as_ref().unwrap();
    assert_eq!(
        (b.count, b.memory, b.cores_percent),
        (2, MemoryRequest::Whole, 100)
    );
    assert!(b.added_limits.is_empty());
}

#[test]
fn pod_refs_default_the_namespace() {
    assert_eq!(
        pod_ref(&pod(json!({"containers": []}))).to_string(),
        "default/p"
    );
    let mut p = pod(json!({"containers": []}));
    p.metadata.namespace = Some("ml".into());
    assert_eq!(pod_ref(&p), PodRef::new("ml", "p"));
}

#[test]
fn amd_defaults() {
    // Only memory: every CU reserved (one such pod per GPU), count defaults to 1.
    let r = one(json!({"amd.com/gpumem": "8192"})).unwrap().amd.unwrap();
    assert_eq!(
        (r.count, r.memory, r.cores_percent),
        (1, MemoryRequest::Mib(8192), 100)
    );
    assert_eq!(r.added_limits, vec![("amd.com/gpu", "1".to_string())]);
    // Only a percentage: the webhook adds amd.com/gpu: 1.
    let r = one(json!({"amd.com/gpumem-percentage": "50"}))
        .unwrap()
        .amd
        .unwrap();
    assert_eq!((r.count, r.memory), (1, MemoryRequest::Percent(50)));
    assert_eq!(r.added_limits, vec![("amd.com/gpu", "1".to_string())]);
    // gpu: 0 alone means no GPU.
    assert!(one(json!({"amd.com/gpu": "0"})).unwrap().is_empty());
    assert!(one(json!({"cpu": "1"})).unwrap().is_empty());
}

#[test]
fn nvidia_defaults() {
    let r = one(json!({"nvidia.com/gpu": "1"})).unwrap().nvidia.unwrap();
    assert_eq!(
        (r.count, r.memory, r.cores_percent),
        (1, MemoryRequest::Whole, 100)
    );
    assert_eq!(
        r.added_limits,
        vec![("nvidia.com/gpucores", "100".to_string())]
    );
    let r = one(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}))
        .unwrap()
        .nvidia
        .unwrap();
    assert_eq!((r.memory, r.cores_percent), (MemoryRequest::Mib(3000), 0));
    assert!(r.added_limits.is_empty());
    let r = one(json!({"nvidia.com/gpumem-percentage": "100"}))
        .unwrap()
        .nvidia
        .unwrap();
    assert_eq!(r.cores_percent, 100);
    assert_eq!(
        r.added_limits,
        vec![
            ("nvidia.com/gpu", "1".to_string()),
            ("nvidia.com/gpucores", "100".to_string())
        ]
    );
    let r = one(json!({"nvidia.com/gpucores": "30", "nvidia.com/priority": "1"}))
        .unwrap()
        .nvidia
        .unwrap();
    assert_eq!((r.count, r.cores_percent, r.priority), (1, 30, Some(1)));
    // Requests are read when limits are absent.
    let p = pod(
        json!({"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "2"}}}]}),
    );
    assert_eq!(
        pod_requests(&p, &RequestDefaults::default()).unwrap()[0]
            .nvidia
            .as_ref()
            .unwrap()
            .count,
        2
    );
    let defaults = RequestDefaults {
        nvidia_default_memory_mib: 1024,
        nvidia_default_cores: 10,
        default_gpu_count: 1,
    };
    let p = pod(
        json!({"containers": [{"name": "c", "resources": limits(json!({"nvidia.com/gpu": "1"}))}]}),
    );
    let r = pod_requests(&p, &defaults)
        .unwrap()
        .remove(0)
        .nvidia
        .unwrap();
    assert_eq!((r.memory, r.cores_percent), (MemoryRequest::Mib(1024), 10));
}

/// A real API server stores `gpumem: 3000` as `3k` (canonical quantity form); the webhook,
/// the scheduler and the plugins read the stored form, and must get 3000 MiB from it.
#[test]
fn quantities_in_the_api_servers_canonical_form_read_as_written() {
    for (vendor, prefix) in [(Vendor::Amd, "amd.com"), (Vendor::Nvidia, "nvidia.com")] {
        let r = one(json!({
            format!("{prefix}/gpu"): "1",
            format!("{prefix}/gpumem"): "3k",
            format!("{prefix}/gpucores"): "50",
        }))
        .unwrap();
        let r = match vendor {
            Vendor::Amd => r.amd,
            Vendor::Nvidia => r.nvidia,
        }
        .unwrap();
        assert_eq!(
            (r.count, r.memory, r.cores_percent),
            (1, MemoryRequest::Mib(3000), 50),
            "{prefix}"
        );
    }
    for (text, mib) in [
        ("16k", 16_000),
        ("2M", 2_000_000),
        ("1e3", 1000),
        ("1024", 1024),
    ] {
        let r = one(json!({"amd.com/gpumem": text})).unwrap().amd.unwrap();
        assert_eq!(r.memory, MemoryRequest::Mib(mib), "{text}");
    }
}

#[test]
fn resolution_and_cu_conversion() {
    assert_eq!(MemoryRequest::Percent(50).resolve(196_288), 98_144);
    assert_eq!(MemoryRequest::Percent(33).resolve(100), 33);
    assert_eq!(MemoryRequest::Whole.resolve(65_520), 65_520);
    assert_eq!(MemoryRequest::Mib(4096).resolve(65_520), 4096);
    assert_eq!(amd_cu_count(25, 304, 1), 76);
    assert_eq!(amd_cu_count(33, 304, 1), 100);
    assert_eq!(amd_cu_count(67, 304, 1), 203);
    assert_eq!(amd_cu_count(100, 304, 1), 304);
    assert_eq!(amd_cu_count(1, 38, 1), 1, "clamped up to one CU");
    assert_eq!(amd_cu_count(50, 0, 1), 0);
    assert_eq!(amd_cu_count(25, 304, 0), 76, "cuPerWGP 0 reads as 1");
}

#[test]
fn rdna_cu_counts_are_whole_wgps_rounded_up() {
    // 5 % of 64 = 3 by the floor: one WGP more, 4 CUs = 2 WGPs.
    assert_eq!(amd_cu_count(5, 64, 2), 4);
    assert_eq!(amd_cu_count(1, 64, 2), 2, "at least one WGP");
    assert_eq!(amd_cu_count(25, 96, 2), 24, "already whole WGPs");
    assert_eq!(amd_cu_count(99, 64, 2), 64);
    assert_eq!(amd_cu_count(100, 64, 2), 64);
    // An odd count: the last CU is in no whole WGP, never given, never charged.
    assert_eq!(amd_cu_count(100, 61, 2), 60);
    assert_eq!(amd_cu_count(99, 61, 2), 60);
    assert_eq!(amd_cu_count(50, 1, 2), 0, "less than one WGP");
    for devcore in 1..=320 {
        for pct in 1..=100 {
            let floor = amd_cu_count(pct, devcore, 1);
            let c = amd_cu_count(pct, devcore, 2);
            assert_eq!(c % 2, 0, "{pct} % of {devcore}");
            assert!(c <= devcore, "{pct} % of {devcore}");
            // Rounded up unless the GPU has no whole WGP more.
            assert!(c >= floor || c == devcore / 2 * 2, "{pct} % of {devcore}");
            assert!(c <= floor + 1, "{pct} % of {devcore}");
        }
    }
}

#[test]
fn bad_requests_name_the_field_and_the_fix() {
    let cases = [
        (
            json!({"amd.com/gpu": "1.5"}),
            "limits[amd.com/gpu]",
            "not a whole number",
        ),
        (
            json!({"amd.com/gpu": "-1"}),
            "limits[amd.com/gpu]",
            "negative",
        ),
        (
            json!({"amd.com/gpu": "1Gi"}),
            "limits[amd.com/gpu]",
            "binary suffix Gi: 1Gi is 1073741824",
        ),
        (
            json!({"amd.com/gpu": "many"}),
            "limits[amd.com/gpu]",
            "not a number",
        ),
        (
            json!({"amd.com/gpu": "65"}),
            "limits[amd.com/gpu]",
            "at most 64",
        ),
        (
            json!({"nvidia.com/gpu": "17"}),
            "limits[nvidia.com/gpu]",
            "at most 16",
        ),
        (
            json!({"amd.com/gpu": "1", "amd.com/gpucores": "0"}),
            "limits[amd.com/gpucores]",
            "from 1 to 100",
        ),
        (
            json!({"amd.com/gpu": "1", "amd.com/gpucores": "101"}),
            "limits[amd.com/gpucores]",
            "from 1 to 100",
        ),
        (
            json!({"amd.com/gpu": "1", "amd.com/gpucores": "12.5"}),
            "limits[amd.com/gpucores]",
            "not a whole number",
        ),
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}),
            "limits[nvidia.com/gpucores]",
            "from 1 to 100",
        ),
        (
            json!({"amd.com/gpu": "1", "amd.com/gpumem-percentage": "101"}),
            "limits[amd.com/gpumem-percentage]",
            "from 1 to 100",
        ),
        (
            json!({"nvidia.com/gpumem-percentage": "0"}),
            "limits[nvidia.com/gpumem-percentage]",
            "from 1 to 100",
        ),
        (
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "4Gi"}),
            "limits[amd.com/gpumem]",
            "4096 (not 4Gi)",
        ),
        (
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "0"}),
            "limits[amd.com/gpumem]",
            "out of range",
        ),
        (
            json!({"amd.com/gpu": "0", "amd.com/gpumem": "10"}),
            "limits[amd.com/gpu]",
            "remove amd.com/gpumem",
        ),
        (
            json!({"amd.com/gpumem": "10", "amd.com/gpumem-percentage": "10"}),
            "limits[amd.com/gpumem]",
            "keep one",
        ),
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/priority": "5"}),
            "limits[nvidia.com/priority]",
            "0 (high)",
        ),
    ];
    for (limits_json, field, message) in cases {
        let err = one(limits_json.clone()).unwrap_err();
        let text = err.to_string();
        assert!(err.field.ends_with(field), "{limits_json}: {text}");
        assert!(err.field.starts_with("spec.containers[0]"), "{text}");
        assert!(text.contains(message), "{limits_json}: {text}");
    }
    let p = pod(
        json!({"initContainers": [{"name": "i", "resources": limits(json!({"amd.com/gpu": "x"}))}], "containers": [{"name": "c"}]}),
    );
    let err = pod_requests(&p, &RequestDefaults::default()).unwrap_err();
    assert_eq!(
        err.field,
        "spec.initContainers[0].resources.limits[amd.com/gpu]"
    );
}

proptest::proptest! {
    #[test]
    fn total_on_arbitrary_values(
        values in proptest::collection::vec(".{0,12}", 9),
        in_requests in proptest::bool::ANY,
    ) {
        let names = ["amd.com/gpu", "amd.com/gpumem", "amd.com/gpumem-percentage", "amd.com/gpucores",
            "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores", "nvidia.com/priority"];
        let map: serde_json::Map<String, serde_json::Value> = names.iter().zip(&values)
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.to_string(), json!(v))).collect();
        let section = if in_requests { "requests" } else { "limits" };
        let p = pod(json!({"containers": [{"name": "c", "resources": {section: map}}]}));
        if let Ok(reqs) = pod_requests(&p, &RequestDefaults::default()) {
            for vendor in Vendor::ALL {
                if let Some(r) = reqs[0].get(vendor) {
                    proptest::prop_assert!(r.count >= 1 && r.count <= max_gpus_per_container(vendor));
                    proptest::prop_assert!(r.cores_percent <= 100);
                }
            }
        }
    }
}
