//! The pure Allocate planner on fixture devices: env of SPEC §2.6, run mapping D-5,
//! CU choice, whole cards, and each bad input of the issue.

use hami_amd_plugin::allocate_plan::{
    PlanError, PlanSettings, PodAnnotations, plan_allocate, plan_whole_cards,
};
use hami_amd_plugin::discover_report::build_report;
use hami_amd_plugin::registration::{RegisteredDevice, RegistrationSettings};
use hami_plugin_core::run_mapping::RunError;
use hami_protocol::cu_allocated::CuAllocation;
use hami_protocol::cu_list::HsaCuMask;
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_sysfs_fixtures::{Rdna, mi210_xgmi, mi300x_cpx, rdna_node};

fn devices(tree: &hami_sysfs_fixtures::FixtureTree) -> Vec<RegisteredDevice> {
    devices_with(tree, &RegistrationSettings::default())
}

fn devices_with(
    tree: &hami_sysfs_fixtures::FixtureTree,
    settings: &RegistrationSettings,
) -> Vec<RegisteredDevice> {
    build_report(&tree.sysfs_root(), &tree.dev_root(), settings)
        .unwrap()
        .registration
        .devices
}

/// Partitions sliced by CU masks: only with the explicit opt-in.
fn sliced_partitions(tree: &hami_sysfs_fixtures::FixtureTree) -> Vec<RegisteredDevice> {
    devices_with(
        tree,
        &RegistrationSettings {
            slice_partitions: true,
            ..Default::default()
        },
    )
}

fn entry(d: &RegisteredDevice, mem: u64, cores: u32) -> ContainerDevice {
    ContainerDevice {
        uuid: d.info.id.clone(),
        device_type: d.info.device_type.clone(),
        mem_mib: mem,
        cores,
    }
}

fn pod(runs: &[Vec<ContainerDevice>]) -> PodAnnotations {
    PodAnnotations {
        to_allocate: Some(encode_pod_devices(runs).unwrap()),
        ..Default::default()
    }
}

#[test]
fn four_gpus_on_mi210_in_allocation_order() {
    let tree = mi210_xgmi().unwrap();
    let devs = devices(&tree);
    // Allocation order deliberately not sysfs order.
    let order = [3usize, 0, 2, 1];
    let run: Vec<_> = order.iter().map(|&i| entry(&devs[i], 4096, 26)).collect();
    let plan = plan_allocate(
        &pod(&[run]),
        &devs,
        &CuAllocation::default(),
        4,
        &PlanSettings::default(),
    )
    .unwrap();
    let env = &plan.container.envs;
    let rocr: Vec<String> = order.iter().map(|&i| devs[i].rocr_id.clone()).collect();
    assert_eq!(env["ROCR_VISIBLE_DEVICES"], rocr.join(","));
    assert_eq!(env["HIP_VISIBLE_DEVICES"], "0,1,2,3");
    assert_eq!(env["HSA_CU_MASK"], "0:0-25;1:0-25;2:0-25;3:0-25");
    let mask = HsaCuMask::parse(&env["HSA_CU_MASK"]).unwrap();
    assert_eq!(mask.entries().len(), 4);
    for i in 0..4 {
        assert_eq!(env[&format!("HIP_DEVICE_MEMORY_LIMIT_{i}")], "4096m");
    }
    assert_eq!(env["LD_AUDIT"], "/usr/local/vgpu/libamvgpu.so");
    assert!(!env.contains_key("HIP_OVERSUBSCRIBE"));
    let paths: Vec<_> = plan
        .container
        .devices
        .iter()
        .map(|d| d.path.as_str())
        .collect();
    assert_eq!(paths[0], "/dev/kfd");
    assert_eq!(paths[1], format!("/dev/dri/card{}", devs[3].card));
    assert_eq!(paths[2], format!("/dev/dri/renderD{}", devs[3].render));
    assert_eq!(plan.container.mounts.len(), 1);
    assert!(plan.container.mounts[0].read_only);
    assert!(plan.last);
    assert_eq!(plan.to_allocate, ";");
    assert_eq!(plan.dmem.len(), 4);
    let region = format!("drm/{}/vram0", devs[3].pci_bdf);
    let limit = plan.dmem.iter().find(|l| l.region == region).unwrap();
    assert_eq!(limit.bytes, 4096 << 20);
    let recorded = CuAllocation::parse(&plan.cu_allocated).unwrap();
    assert_eq!(recorded.0.len(), 4);
}

#[test]
fn init_then_two_app_containers_map_in_order() {
    let tree = mi300x_cpx().unwrap();
    let devs = sliced_partitions(&tree);
    let runs = vec![
        vec![entry(&devs[0], 1024, 19)],
        vec![],
        vec![entry(&devs[0], 2048, 9)],
        vec![entry(&devs[1], 4096, 38)],
    ];
    let mut state = pod(&runs);
    let settings = PlanSettings {
        oversubscribe: true,
        ..Default::default()
    };
    let mut plans = Vec::new();
    for want in [0usize, 2, 3] {
        let plan = plan_allocate(&state, &devs, &CuAllocation::default(), 1, &settings).unwrap();
        assert_eq!(plan.run_index, want);
        state.to_allocate = Some(plan.to_allocate.clone());
        state.cu_allocated = Some(plan.cu_allocated.clone());
        plans.push(plan);
    }
    assert_eq!(
        [plans[0].last, plans[1].last, plans[2].last],
        [false, false, true]
    );
    assert_eq!(plans[0].container.envs["HSA_CU_MASK"], "0:0-18");
    assert_eq!(
        plans[1].container.envs["HSA_CU_MASK"], "0:19-27",
        "same pod, same device: disjoint"
    );
    assert_eq!(plans[0].container.envs["HIP_OVERSUBSCRIBE"], "true");
    // cores = devcore but not all memory: still a slice (hook + limit).
    assert_eq!(
        plans[2].container.envs["HIP_DEVICE_MEMORY_LIMIT_0"],
        "4096m"
    );
    assert_eq!(plans[2].to_allocate, ";;;;");
    let err = plan_allocate(&state, &devs, &CuAllocation::default(), 1, &settings).unwrap_err();
    assert!(
        matches!(err, PlanError::Run(RunError::NothingLeft { .. })),
        "{err}"
    );
}

#[test]
fn two_quarter_pods_get_disjoint_masks_and_respect_others() {
    let tree = mi300x_cpx().unwrap();
    let devs = sliced_partitions(&tree);
    let first = plan_allocate(
        &pod(&[vec![entry(&devs[0], 1000, 9)]]),
        &devs,
        &CuAllocation::default(),
        1,
        &PlanSettings::default(),
    )
    .unwrap();
    let used = CuAllocation::parse(&first.cu_allocated).unwrap();
    let second = plan_allocate(
        &pod(&[vec![entry(&devs[0], 1000, 9)]]),
        &devs,
        &used,
        1,
        &PlanSettings::default(),
    )
    .unwrap();
    assert_eq!(first.container.envs["HSA_CU_MASK"], "0:0-8");
    assert_eq!(second.container.envs["HSA_CU_MASK"], "0:9-17");
    // No room: 38 CUs, 18 used, 21 asked.
    let both = CuAllocation::parse(&first.cu_allocated).unwrap();
    let mut both = both;
    both.add(&devs[0].info.id, &second.chosen[0].1).unwrap();
    let err = plan_allocate(
        &pod(&[vec![entry(&devs[0], 1000, 21)]]),
        &devs,
        &both,
        1,
        &PlanSettings::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("need 21, free 20"), "{err}");
}

#[test]
fn rdna_masks_are_whole_wgps() {
    let tree = rdna_node(&[Rdna::Gfx11]).unwrap();
    let devs = devices(&tree);
    let mut used = CuAllocation::default();
    for expected in ["0:0-23", "0:24-47"] {
        let plan = plan_allocate(
            &pod(&[vec![entry(&devs[0], 1000, 24)]]),
            &devs,
            &used,
            1,
            &PlanSettings::default(),
        )
        .unwrap();
        assert_eq!(plan.container.envs["HSA_CU_MASK"], expected);
        plan.chosen[0].1.check_whole_wgps(2).unwrap();
        used.add(&devs[0].info.id, &plan.chosen[0].1).unwrap();
    }
    // 33 % of 96 = 31 CUs: rounded down to 15 whole WGPs.
    let plan = plan_allocate(
        &pod(&[vec![entry(&devs[0], 1000, 31)]]),
        &devs,
        &used,
        1,
        &PlanSettings::default(),
    )
    .unwrap();
    assert_eq!(plan.container.envs["HSA_CU_MASK"], "0:48-77");
}

#[test]
fn whole_card_requests_get_devices_and_rocr_only() {
    let tree = mi210_xgmi().unwrap();
    let devs = devices(&tree);
    let plan = plan_allocate(
        &pod(&[vec![entry(&devs[0], devs[0].info.devmem, 104)]]),
        &devs,
        &CuAllocation::default(),
        1,
        &PlanSettings::default(),
    )
    .unwrap();
    assert!(plan.whole_cards);
    assert_eq!(
        plan.container.envs.keys().collect::<Vec<_>>(),
        vec!["ROCR_VISIBLE_DEVICES"]
    );
    assert!(plan.container.mounts.is_empty());
    assert!(plan.dmem.is_empty());
    assert_eq!(
        plan.cu_allocated,
        format!(r#"{{"{}":"0-103"}}"#, devs[0].info.id),
        "whole cards still hold their CUs"
    );
    // Hand-over for pods the scheduler did not place: one whole card per id.
    let none = std::collections::BTreeSet::new();
    let ids = vec![
        format!("{}#3", devs[1].device_key),
        format!("{}#0", devs[2].device_key),
        format!("{}#9", devs[4].device_key),
    ];
    let plan = plan_whole_cards(&devs, &ids, &none).unwrap();
    assert_eq!(
        plan.envs["ROCR_VISIBLE_DEVICES"],
        format!(
            "{},{},{}",
            devs[1].rocr_id, devs[2].rocr_id, devs[4].rocr_id
        )
    );
    assert_eq!(plan.devices.len(), 7);
    // Three ids naming two cards: kubelet asked for 3 GPUs, so refuse (this used to hand
    // out 2).
    let two_cards = vec![
        format!("{}#3", devs[1].device_key),
        format!("{}#7", devs[1].device_key),
        format!("{}#0", devs[2].device_key),
    ];
    let err = plan_whole_cards(&devs, &two_cards, &none).unwrap_err();
    assert!(
        matches!(
            err,
            PlanError::WholeCardShares {
                asked: 3,
                cards: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("only 2 card(s)"), "{err}");
    // A card holding slices (or reserved by a pending HAMi run) is never handed out.
    let busy: std::collections::BTreeSet<String> = [devs[2].info.id.clone()].into();
    let err = plan_whole_cards(&devs, &ids, &busy).unwrap_err();
    assert!(
        err.to_string().contains(&devs[2].info.id) && err.to_string().contains("holds slices"),
        "{err}"
    );
    assert!(matches!(
        plan_whole_cards(&devs, &["nope#1".into()], &none),
        Err(PlanError::UnknownKubeletId(_))
    ));
    assert!(matches!(
        plan_whole_cards(&devs, &[format!("{}#10", devs[1].device_key)], &none),
        Err(PlanError::UnknownKubeletId(_))
    ));
}

#[test]
fn bad_inputs_fail_with_the_cause_named() {
    let tree = mi210_xgmi().unwrap();
    let devs = devices(&tree);
    let none = CuAllocation::default();
    let s = PlanSettings::default();
    let check = |p: &PodAnnotations, n: usize, expected: &str| {
        let err = plan_allocate(p, &devs, &none, n, &s)
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{expected}: {err}");
    };
    check(&PodAnnotations::default(), 1, "not scheduled by HAMi");
    check(
        &PodAnnotations {
            to_allocate: Some("A,T,1:;".into()),
            ..Default::default()
        },
        1,
        "malformed",
    );
    check(
        &pod(&[vec![entry(&devs[0], 10, 10), entry(&devs[1], 10, 10)]]),
        1,
        "holds 2 device(s) but kubelet asked for 1",
    );
    check(
        &PodAnnotations {
            to_allocate: Some("GPU-gone,AMD X,10,10:;".into()),
            ..Default::default()
        },
        1,
        "GPU-gone",
    );
    check(
        &PodAnnotations {
            to_allocate: pod(&[vec![entry(&devs[0], 10, 10)]]).to_allocate,
            cu_allocated: Some("[1]".into()),
            ..Default::default()
        },
        1,
        "amd-cu-allocated",
    );
    check(&pod(&[vec![entry(&devs[0], 10, 0)]]), 1, "0 CUs");
    check(&pod(&[vec![entry(&devs[0], 10, 105)]]), 1, "only 104");
    check(
        &pod(&[vec![], vec![]]),
        1,
        "no container of the pod is left",
    );
}

#[test]
fn sliced_containers_get_their_own_accounting_directory() {
    let tree = mi210_xgmi().unwrap();
    let devs = devices(&tree);
    let none = CuAllocation::default();
    let settings = PlanSettings {
        cache_host_root: "/var/lib/hami/vgpu/containers".into(),
        ..PlanSettings::default()
    };
    let mut annotations = pod(&[vec![], vec![entry(&devs[0], 1024, 26)]]);
    annotations.pod_uid = Some("uid-1".into());
    annotations.containers = vec!["init".into(), "main".into()];
    let plan = plan_allocate(&annotations, &devs, &none, 1, &settings).unwrap();
    assert_eq!(
        plan.cache_dir.as_deref(),
        Some("/var/lib/hami/vgpu/containers/uid-1_main")
    );
    assert_eq!(
        plan.container
            .envs
            .get("HIP_DEVICE_MEMORY_SHARED_CACHE")
            .map(String::as_str),
        Some("/usr/local/vgpu/cache/hipdevshr.cache")
    );
    assert!(plan.container.mounts.iter().any(|m| m.host_path
        == "/var/lib/hami/vgpu/containers/uid-1_main"
        && m.container_path == "/usr/local/vgpu/cache"
        && !m.read_only));
    // A whole card gets no hook and so no accounting directory.
    let mut whole = pod(&[vec![entry(
        &devs[0],
        devs[0].info.devmem,
        devs[0].info.devcore,
    )]]);
    whole.pod_uid = Some("uid-2".into());
    whole.containers = vec!["main".into()];
    let plan = plan_allocate(&whole, &devs, &none, 1, &settings).unwrap();
    assert_eq!(plan.cache_dir, None);
    assert!(
        !plan
            .container
            .envs
            .contains_key("HIP_DEVICE_MEMORY_SHARED_CACHE")
    );
}

/// What ROCr surfaces in a container given the plan: the KFD topology of the node, only the
/// render nodes the plan mounts, and the plan's ROCR_VISIBLE_DEVICES.
fn rocr_sees(
    tree: &hami_sysfs_fixtures::FixtureTree,
    plan: &hami_amd_plugin::allocate_plan::ContainerPlan,
) -> Vec<u32> {
    use hami_amd_plugin::rocr_visible::{rocr_selects, visible_gpus};
    let (nodes, _) = hami_amd_plugin::kfd_topology::read_topology(&tree.sysfs_root()).unwrap();
    let nodes: Vec<_> = nodes
        .iter()
        .map(|n| {
            (
                n.id,
                n.u64("simd_count").unwrap_or(0),
                n.render_minor(),
                n.u64("unique_id").unwrap_or(0),
            )
        })
        .collect();
    let mounted: Vec<String> = plan.devices.iter().map(|d| d.path.clone()).collect();
    let visible = visible_gpus(&nodes, |r| {
        mounted.contains(&format!("/dev/dri/renderD{r}"))
    });
    rocr_selects(
        &visible,
        plan.envs.get("ROCR_VISIBLE_DEVICES").map(String::as_str),
    )
}

#[test]
fn a_partition_is_a_whole_device_of_count_one() {
    let tree = mi300x_cpx().unwrap();
    let devs = devices(&tree);
    assert!(devs.iter().all(|d| d.info.count == 1));
    // The scheduler wrote a quarter of the partition: the pod still owns all of it.
    let plan = plan_allocate(
        &pod(&[vec![entry(&devs[2], 1024, 9)]]),
        &devs,
        &CuAllocation::default(),
        1,
        &PlanSettings::default(),
    )
    .unwrap();
    assert!(plan.whole_cards);
    assert!(!plan.container.envs.contains_key("HSA_CU_MASK"));
    assert!(!plan.container.envs.contains_key("LD_AUDIT"));
    assert_eq!(
        plan.cu_allocated,
        format!(r#"{{"{}":"0-37"}}"#, devs[2].info.id)
    );
    assert_eq!(rocr_sees(&tree, &plan.container), vec![devs[2].kfd_node]);
}

#[test]
fn two_partitions_of_one_card_in_one_container() {
    let tree = mi300x_cpx().unwrap();
    // Default (whole partitions) and opt-in (sliced partitions) both name exactly the
    // container's partitions, in allocation order.
    for devs in [devices(&tree), sliced_partitions(&tree)] {
        let (p0, p3) = (&devs[0], &devs[3]);
        assert_eq!(
            p0.rocr_id, p3.rocr_id,
            "partitions share the card's unique_id"
        );
        let plan = plan_allocate(
            &pod(&[vec![entry(p3, 4096, 19), entry(p0, 2048, 19)]]),
            &devs,
            &CuAllocation::default(),
            2,
            &PlanSettings::default(),
        )
        .unwrap();
        let env = &plan.container.envs;
        assert_eq!(env["ROCR_VISIBLE_DEVICES"], "1,0");
        assert_eq!(
            rocr_sees(&tree, &plan.container),
            vec![p3.kfd_node, p0.kfd_node]
        );
        // The old form (the card's UUID twice) makes ROCr show no GPU at all.
        let mut old = plan.container.clone();
        old.envs.insert(
            "ROCR_VISIBLE_DEVICES".into(),
            format!("{},{}", p3.rocr_id, p0.rocr_id),
        );
        assert_eq!(rocr_sees(&tree, &old), Vec::<u32>::new());
        if p0.info.count > 1 {
            // Sliced: one VRAM region for both partitions, their limits summed.
            assert_eq!(plan.dmem.len(), 1);
            assert_eq!(plan.dmem[0].region, format!("drm/{}/vram0", p0.pci_bdf));
            assert_eq!(plan.dmem[0].bytes, (4096 + 2048) << 20);
        }
    }
    // Partitions of two cards: distinct UUIDs stay UUIDs.
    let devs = devices(&tree);
    let other = devs.iter().find(|d| d.pci_bdf != devs[0].pci_bdf).unwrap();
    let plan = plan_allocate(
        &pod(&[vec![entry(other, 1, 1), entry(&devs[1], 1, 1)]]),
        &devs,
        &CuAllocation::default(),
        2,
        &PlanSettings::default(),
    )
    .unwrap();
    assert_eq!(
        plan.container.envs["ROCR_VISIBLE_DEVICES"],
        format!("{},{}", other.rocr_id, devs[1].rocr_id)
    );
    assert_eq!(
        rocr_sees(&tree, &plan.container),
        vec![other.kfd_node, devs[1].kfd_node]
    );
}

#[test]
fn four_mi210_cards_rocr_sees_them_in_allocation_order() {
    let tree = mi210_xgmi().unwrap();
    let devs = devices(&tree);
    let order = [3usize, 0, 2, 1];
    let run: Vec<_> = order.iter().map(|&i| entry(&devs[i], 4096, 26)).collect();
    let plan = plan_allocate(
        &pod(&[run]),
        &devs,
        &CuAllocation::default(),
        4,
        &PlanSettings::default(),
    )
    .unwrap();
    assert_eq!(
        rocr_sees(&tree, &plan.container),
        order.iter().map(|&i| devs[i].kfd_node).collect::<Vec<_>>()
    );
}

#[test]
fn app_containers_reuse_the_init_containers_cus_but_not_each_others() {
    use hami_protocol::requests::ContainerKind;
    let tree = mi210_xgmi().unwrap();
    let devs = devices(&tree);
    let d = &devs[0];
    // Another pod holds 26 of the 104 CUs; this pod: an init container of 52 CUs, then
    // two app containers of 26. The scheduler charged it max(52, 26 + 26) = 52, so the
    // card holds 78 of 104: both apps must fit.
    let others = CuAllocation::parse(&format!(r#"{{"{}":"0-25"}}"#, d.info.id)).unwrap();
    let runs = vec![
        vec![entry(d, 1024, 52)],
        vec![entry(d, 1024, 26)],
        vec![entry(d, 1024, 26)],
    ];
    let mut state = pod(&runs);
    state.allocated = state.to_allocate.clone();
    state.kinds = vec![ContainerKind::Init, ContainerKind::App, ContainerKind::App];
    let s = PlanSettings::default();
    let init = plan_allocate(&state, &devs, &others, 1, &s).unwrap();
    assert_eq!(init.container.envs["HSA_CU_MASK"], "0:26-77");
    state.to_allocate = Some(init.to_allocate.clone());
    state.cu_allocated = Some(init.cu_allocated.clone());
    // The init container has finished when the first app starts: its CUs are free again.
    let app1 = plan_allocate(&state, &devs, &others, 1, &s).unwrap();
    assert_eq!(app1.container.envs["HSA_CU_MASK"], "0:26-51");
    state.to_allocate = Some(app1.to_allocate.clone());
    state.cu_allocated = Some(app1.cu_allocated.clone());
    // The second app runs beside the first: never the first one's CUs (nor, since the
    // annotation keeps only the pod's union, the init container's).
    let app2 = plan_allocate(&state, &devs, &others, 1, &s).unwrap();
    assert_eq!(app2.container.envs["HSA_CU_MASK"], "0:78-103");
    assert_eq!(
        app2.cu_allocated,
        format!(r#"{{"{}":"26-103"}}"#, d.info.id)
    );
    // Without the pod's decision (or with misaligned kinds) nothing is reused.
    let mut plain = pod(&runs);
    let init = plan_allocate(&plain, &devs, &others, 1, &s).unwrap();
    plain.to_allocate = Some(init.to_allocate.clone());
    plain.cu_allocated = Some(init.cu_allocated.clone());
    let app1 = plan_allocate(&plain, &devs, &others, 1, &s).unwrap();
    assert_eq!(app1.container.envs["HSA_CU_MASK"], "0:78-103");
    // A sidecar (restartPolicy Always) runs beside the apps: never reused.
    let mut side = pod(&runs[..2]);
    side.allocated = side.to_allocate.clone();
    side.kinds = vec![ContainerKind::Sidecar, ContainerKind::App];
    let sc = plan_allocate(&side, &devs, &others, 1, &s).unwrap();
    side.to_allocate = Some(sc.to_allocate.clone());
    side.cu_allocated = Some(sc.cu_allocated.clone());
    let app = plan_allocate(&side, &devs, &others, 1, &s).unwrap();
    assert_eq!(app.container.envs["HSA_CU_MASK"], "0:78-103");
}
