//! A multi-GPU container gets the same CUs on each of its GPUs where some set is free on
//! all of them (issue 26 item 6): ROCm 5.x enforces a CU slice only through
//! `ROC_GLOBAL_CU_MASK`, one mask for every device, so only then is the slice enforced
//! there. Through the real Allocate planner.

use hami_amd_plugin::allocate_plan::{PlanSettings, PodAnnotations, plan_allocate};
use hami_amd_plugin::discover_report::build_report;
use hami_amd_plugin::registration::{RegisteredDevice, RegistrationSettings};
use hami_protocol::cu_allocated::CuAllocation;
use hami_protocol::cu_list::CuSet;
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::hook_config::global_cu_mask;
use hami_sysfs_fixtures::mi210_xgmi;

fn devices(tree: &hami_sysfs_fixtures::FixtureTree) -> Vec<RegisteredDevice> {
    build_report(
        &tree.sysfs_root(),
        &tree.dev_root(),
        &RegistrationSettings::default(),
    )
    .unwrap()
    .registration
    .devices
}

fn quarter(d: &RegisteredDevice) -> ContainerDevice {
    ContainerDevice {
        uuid: d.info.id.clone(),
        device_type: d.info.device_type.clone(),
        mem_mib: 1024,
        cores: d.info.devcore / 4,
    }
}

fn pod(run: Vec<ContainerDevice>) -> PodAnnotations {
    PodAnnotations {
        to_allocate: Some(encode_pod_devices(&[run]).unwrap()),
        pod_uid: Some("uid-1".into()),
        containers: vec!["main".into()],
        ..Default::default()
    }
}

#[test]
fn a_two_gpu_quarter_gets_one_cu_range_and_a_global_mask() {
    let tree = mi210_xgmi().unwrap();
    let devs = devices(&tree);
    assert_eq!(devs[0].info.devcore, 104);
    assert_eq!(devs[1].info.devcore, 104);
    // Both cards have 94 free CUs, in different places: each card's own best fit would be
    // 10-35 on the first and 60-85 on the second (no global mask: no CU limit on ROCm 5.x).
    let mut others = CuAllocation::default();
    others.add(&devs[0].info.id, &CuSet::range(0, 10)).unwrap();
    others.add(&devs[1].info.id, &CuSet::range(50, 10)).unwrap();
    let plan = plan_allocate(
        &pod(vec![quarter(&devs[0]), quarter(&devs[1])]),
        &devs,
        &others,
        2,
        &PlanSettings::default(),
    )
    .unwrap();
    let sets: Vec<String> = plan.chosen.iter().map(|(_, s)| s.to_string()).collect();
    assert_eq!(sets, ["10-35", "10-35"], "the same CU range on both GPUs");
    for (id, set) in &plan.chosen {
        assert!(
            !set.overlaps(&others.0[id]),
            "{id}: {set} overlaps another pod"
        );
    }
    let expected = global_cu_mask(&CuSet::range(10, 26)).unwrap();
    assert_eq!(plan.container.envs["ROC_GLOBAL_CU_MASK"], expected);
    let (_, config) = plan.hook_config.clone().unwrap();
    assert_eq!(
        config.roc_global_cu_mask.as_deref(),
        Some(expected.as_str())
    );
    // The pod's CU map records the range on both devices.
    let recorded = CuAllocation::parse(&plan.cu_allocated).unwrap();
    assert_eq!(recorded.0[&devs[0].info.id].to_string(), "10-35");
    assert_eq!(recorded.0[&devs[1].info.id].to_string(), "10-35");
}

#[test]
fn identical_free_cus_share_a_range_and_disjoint_ones_fall_back() {
    let tree = mi210_xgmi().unwrap();
    let devs = devices(&tree);
    // Identical free CUs (another pod holds 0-25 on both): one range, one global mask.
    let mut others = CuAllocation::default();
    others.add(&devs[0].info.id, &CuSet::range(0, 26)).unwrap();
    others.add(&devs[1].info.id, &CuSet::range(0, 26)).unwrap();
    let plan = plan_allocate(
        &pod(vec![quarter(&devs[0]), quarter(&devs[1])]),
        &devs,
        &others,
        2,
        &PlanSettings::default(),
    )
    .unwrap();
    assert_eq!(plan.chosen[0].1, plan.chosen[1].1);
    assert!(plan.container.envs.contains_key("ROC_GLOBAL_CU_MASK"));
    // No CU free on both cards: each gets its own best fit and no global mask (the
    // documented ROCm 5.x limit), never failing the Allocate.
    let mut others = CuAllocation::default();
    others.add(&devs[0].info.id, &CuSet::range(0, 52)).unwrap();
    others.add(&devs[1].info.id, &CuSet::range(52, 52)).unwrap();
    let plan = plan_allocate(
        &pod(vec![quarter(&devs[0]), quarter(&devs[1])]),
        &devs,
        &others,
        2,
        &PlanSettings::default(),
    )
    .unwrap();
    let sets: Vec<String> = plan.chosen.iter().map(|(_, s)| s.to_string()).collect();
    assert_eq!(sets, ["52-77", "0-25"]);
    assert!(!plan.container.envs.contains_key("ROC_GLOBAL_CU_MASK"));
    assert_eq!(plan.hook_config.unwrap().1.roc_global_cu_mask, None);
}
