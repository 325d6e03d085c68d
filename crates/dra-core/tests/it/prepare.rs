//! Prepare planning over the real MI210 and MI300X captures.

use std::collections::BTreeMap;

use hami_amd_discovery::discovery::discover;
use hami_amd_discovery::registration::{RegistrationSettings, register};
use hami_dra_core::api::*;
use hami_dra_core::prepare::{PrepareError, PrepareSettings, plan_prepare};
use hami_dra_core::slice;
use hami_protocol::cu_list::CuSet;

fn settings() -> PrepareSettings {
    PrepareSettings {
        driver: hami_dra_core::DRIVER.into(),
        node: "node-a".into(),
        hook_host_path: "/usr/local/vgpu/libamvgpu.so".into(),
        hook_container_path: "/usr/local/vgpu/libamvgpu.so".into(),
        cache_host_root: "/var/lib/hami/vgpu".into(),
    }
}

fn claim(uid: &str, results: Vec<DeviceRequestAllocationResult>, pods: usize) -> ResourceClaim {
    ResourceClaim {
        api_version: API_VERSION.into(),
        kind: "ResourceClaim".into(),
        metadata: ObjectMeta {
            name: Some("c".into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: ResourceClaimSpec::default(),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results,
                    config: vec![],
                }),
                ..Default::default()
            }),
            reserved_for: (0..pods)
                .map(|i| ResourceClaimConsumerReference {
                    api_group: None,
                    resource: "pods".into(),
                    name: format!("p{i}"),
                    uid: format!("pod-{i}"),
                })
                .collect(),
            devices: vec![],
        }),
    }
}

fn result(device: &str, mem: &str, cus: &str) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        request: "gpu".into(),
        driver: hami_dra_core::DRIVER.into(),
        pool: "node-a".into(),
        device: device.into(),
        share_id: Some("s".into()),
        consumed_capacity: [("memory", mem), ("computeUnits", cus), ("shares", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn mi210() -> BTreeMap<String, hami_amd_discovery::registration::RegisteredDevice> {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let d = discover(&tree.sysfs_root()).unwrap();
    let reg = register(&d, &RegistrationSettings::default(), |_| true);
    slice::registered_by_name(&d, &reg)
        .into_iter()
        .map(|(k, v)| (k, v.clone()))
        .collect()
}

#[test]
fn a_slice_gets_disjoint_cus_env_hook_config_dmem_and_cdi() {
    let devs = mi210();
    let first = plan_prepare(
        &claim("u1", vec![result("gpu-0", "4Gi", "40")], 1),
        "u1",
        &settings(),
        &devs,
        &BTreeMap::new(),
    )
    .unwrap();
    assert_eq!(first.pod_uid, "pod-0");
    assert_eq!(first.devices[0].cus, CuSet::range(0, 40));
    assert_eq!(first.env["HIP_DEVICE_MEMORY_LIMIT_0"], "4096m");
    assert!(first.env["HSA_CU_MASK"].starts_with("0:"));
    assert_eq!(first.env["LD_AUDIT"], "/usr/local/vgpu/libamvgpu.so");
    let (path, conf) = first.hook_config.as_ref().unwrap();
    assert!(path.ends_with("/.hook-config/claim_u1.conf"));
    assert_eq!(conf.memory_limits[&0], 4 << 30);
    assert_eq!(first.dmem.len(), 1);
    assert_eq!(first.dmem[0].bytes, 4 << 30);
    assert_eq!(first.cdi_spec["kind"], "k8s.amdgpu.hami-rs.io/claim");
    assert_eq!(
        first.devices[0].cdi_id,
        "k8s.amdgpu.hami-rs.io/claim=u1-gpu-0"
    );
    assert_eq!(first.status[0].data.as_ref().unwrap()["cuRanges"], "0-39");
    // A second claim on the same GPU avoids the first one's CUs.
    let used: BTreeMap<String, CuSet> = [(
        first.devices[0].device_id.clone(),
        first.devices[0].cus.clone(),
    )]
    .into();
    let second = plan_prepare(
        &claim("u2", vec![result("gpu-0", "1Gi", "20")], 1),
        "u2",
        &settings(),
        &devs,
        &used,
    )
    .unwrap();
    assert!(!second.devices[0].cus.overlaps(&first.devices[0].cus));
}

#[test]
fn a_whole_gpu_gets_no_hook() {
    let devs = mi210();
    let d = &devs["gpu-1"];
    let full = format!("{}Mi", d.info.devmem);
    let plan = plan_prepare(
        &claim(
            "u3",
            vec![result("gpu-1", &full, &d.info.devcore.to_string())],
            1,
        ),
        "u3",
        &settings(),
        &devs,
        &BTreeMap::new(),
    )
    .unwrap();
    assert!(plan.whole);
    assert!(
        plan.hook_config.is_none() && plan.dmem.is_empty() && !plan.env.contains_key("LD_AUDIT")
    );
    assert!(plan.env.contains_key("ROCR_VISIBLE_DEVICES"));
}

#[test]
fn refuses_what_it_must_not_prepare() {
    let devs = mi210();
    let s = settings();
    let none = BTreeMap::new();
    let mut unalloc = claim("u", vec![], 1);
    unalloc.status.as_mut().unwrap().allocation = None;
    assert!(matches!(
        plan_prepare(&unalloc, "u", &s, &devs, &none),
        Err(PrepareError::NotAllocated(_))
    ));
    assert!(matches!(
        plan_prepare(
            &claim("u", vec![result("gpu-0", "1Gi", "2")], 0),
            "u",
            &s,
            &devs,
            &none
        ),
        Err(PrepareError::NotReserved(_))
    ));
    assert!(matches!(
        plan_prepare(
            &claim("u", vec![result("gpu-0", "1Gi", "2")], 2),
            "u",
            &s,
            &devs,
            &none
        ),
        Err(PrepareError::Shared { n: 2, .. })
    ));
    assert!(matches!(
        plan_prepare(
            &claim("u", vec![result("gpu-0", "1Gi", "2")], 1),
            "other",
            &s,
            &devs,
            &none
        ),
        Err(PrepareError::UidMismatch { .. })
    ));
    // A UID names the claim's files: one that is not a single path component is refused
    // (whole-GPU claims too: the CDI spec's file name holds it).
    for bad in ["../../etc", "a/b", "..", ".", "x\0y"] {
        let e = plan_prepare(
            &claim(bad, vec![result("gpu-0", "1Gi", "2")], 1),
            bad,
            &s,
            &devs,
            &none,
        )
        .unwrap_err();
        assert!(matches!(e, PrepareError::BadUid { .. }), "{bad:?}: {e}");
        assert!(e.to_string().contains("path component"), "{e}");
    }
    let p = hami_dra_core::prepare::claim_paths(&s, "u-1").unwrap();
    assert_eq!(p.cache_dir, "/var/lib/hami/vgpu/claims/u-1");
    assert!(
        p.hook_config.starts_with("/var/lib/hami/vgpu/")
            && p.hook_config.ends_with("/claim_u-1.conf")
    );
    assert!(matches!(
        plan_prepare(
            &claim("u", vec![result("gpu-9", "1Gi", "2")], 1),
            "u",
            &s,
            &devs,
            &none
        ),
        Err(PrepareError::UnknownDevice { .. })
    ));
    let e = plan_prepare(
        &claim("u", vec![result("gpu-0", "1.5Gi", "2")], 1),
        "u",
        &s,
        &devs,
        &none,
    )
    .unwrap_err();
    assert!(e.to_string().contains("consumedCapacity.memory"), "{e}");
}

/// Issue 26 item 8: two shares of one GPU in one claim are one device for the container —
/// memory summed, CUs joined, one env/hook-config/dmem/CDI entry — and each share keeps its
/// own CUs in its status entry; a GPU whose shares add up to all of it is handed over whole.
#[test]
fn two_shares_of_one_gpu_are_one_device_with_the_summed_slice() {
    let devs = mi210();
    let mut a = result("gpu-0", "4Gi", "20");
    a.share_id = Some("s1".into());
    let mut b = result("gpu-0", "2Gi", "30");
    b.request = "more".into();
    b.share_id = Some("s2".into());
    let other = result("gpu-1", "1Gi", "8");
    let plan = plan_prepare(
        &claim("u1", vec![a, b, other], 1),
        "u1",
        &settings(),
        &devs,
        &BTreeMap::new(),
    )
    .unwrap();
    assert!(!plan.whole);
    // per share: its own CUs, disjoint, each published under its shareID
    assert_eq!(plan.devices.len(), 3);
    let (s1, s2) = (&plan.devices[0].cus, &plan.devices[1].cus);
    assert_eq!((s1.len(), s2.len()), (20, 30));
    assert!(!s1.overlaps(s2));
    assert_eq!(plan.status.len(), 3);
    assert_eq!(plan.status[1].share_id.as_deref(), Some("s2"));
    assert_eq!(
        plan.status[1].data.as_ref().unwrap()["cuRanges"],
        s2.to_string()
    );
    // the container: two GPUs, gpu-0 once with 6 GiB and 50 CUs
    assert_eq!(plan.env["HIP_VISIBLE_DEVICES"], "0,1");
    assert_eq!(plan.env["ROCR_VISIBLE_DEVICES"].split(',').count(), 2);
    assert_eq!(plan.env["HIP_DEVICE_MEMORY_LIMIT_0"], "6144m");
    assert_eq!(plan.env["HIP_DEVICE_MEMORY_LIMIT_1"], "1024m");
    assert!(!plan.env.contains_key("HIP_DEVICE_MEMORY_LIMIT_2"));
    let mask = hami_protocol::cu_list::HsaCuMask::parse(&plan.env["HSA_CU_MASK"]).unwrap();
    assert_eq!(mask.entries().len(), 2, "{}", plan.env["HSA_CU_MASK"]);
    assert_eq!(mask.get(0), Some(&s1.union(s2)));
    let (_, conf) = plan.hook_config.as_ref().unwrap();
    assert_eq!(
        conf.memory_limits.clone().into_iter().collect::<Vec<_>>(),
        [(0, 6 << 30), (1, 1 << 30)]
    );
    assert_eq!(plan.dmem.len(), 2);
    assert_eq!(plan.dmem[0].bytes, 6 << 30);
    let names: Vec<&str> = plan.cdi_spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["u1-gpu-0", "u1-gpu-1"]);

    // Shares adding up to the whole GPU: handed over whole.
    let full = devs["gpu-0"].info.devmem;
    let half = format!("{}Mi", full / 2);
    let mut a = result("gpu-0", &half, "52");
    a.share_id = Some("s1".into());
    let mut b = result("gpu-0", &half, "52");
    b.share_id = Some("s2".into());
    let plan = plan_prepare(
        &claim("u2", vec![a, b], 1),
        "u2",
        &settings(),
        &devs,
        &BTreeMap::new(),
    )
    .unwrap();
    assert!(plan.whole, "{:?}", plan.env);
    assert!(!plan.env.contains_key("HSA_CU_MASK"));
    assert_eq!(plan.env["ROCR_VISIBLE_DEVICES"].split(',').count(), 1);
}
