//! Allocate writes each sliced container's hook config (issue 14 item 7): the same limits,
//! accounting file and CU masks as the environment, as a file mounted read-only where the
//! hook reads it first; ROCm 5.x's only CU mask, `ROC_GLOBAL_CU_MASK`, where expressible.

use hami_amd_plugin::allocate_plan::{PlanSettings, PodAnnotations, plan_allocate};
use hami_amd_plugin::discover_report::build_report;
use hami_amd_plugin::registration::{RegisteredDevice, RegistrationSettings};
use hami_protocol::cu_allocated::CuAllocation;
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::hook_config::{CONTAINER_PATH, decode};
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

fn entry(d: &RegisteredDevice, mem: u64, cores: u32) -> ContainerDevice {
    ContainerDevice {
        uuid: d.info.id.clone(),
        device_type: d.info.device_type.clone(),
        mem_mib: mem,
        cores,
    }
}

fn sliced(runs: &[Vec<ContainerDevice>]) -> PodAnnotations {
    PodAnnotations {
        to_allocate: Some(encode_pod_devices(runs).unwrap()),
        pod_uid: Some("uid-1".into()),
        containers: vec!["main".into()],
        ..Default::default()
    }
}

#[test]
fn a_sliced_container_gets_its_settings_as_a_read_only_config_file() {
    let tree = mi210_xgmi().unwrap();
    let devs = devices(&tree);
    let settings = PlanSettings {
        cache_host_root: "/var/lib/hami/vgpu/containers".into(),
        oversubscribe: true,
        ..PlanSettings::default()
    };
    let run = vec![entry(&devs[0], 4096, 26), entry(&devs[1], 2048, 26)];
    let plan = plan_allocate(
        &sliced(&[run]),
        &devs,
        &CuAllocation::default(),
        2,
        &settings,
    )
    .unwrap();
    let (path, config) = plan
        .hook_config
        .clone()
        .expect("a sliced container has a config");
    assert_eq!(
        path,
        "/var/lib/hami/vgpu/containers/.hook-config/uid-1_main.conf"
    );
    assert!(
        plan.container
            .mounts
            .iter()
            .any(|m| m.host_path == path && m.container_path == CONTAINER_PATH && m.read_only)
    );
    // The region file is mounted by itself too, so the container cannot unlink it.
    assert!(plan.container.mounts.iter().any(|m| m.host_path
        == "/var/lib/hami/vgpu/containers/uid-1_main/hipdevshr.cache"
        && m.container_path == "/usr/local/vgpu/cache/hipdevshr.cache"
        && !m.read_only));
    // What the file says is what the environment says, and it round-trips.
    let config = decode(config.encode().unwrap().as_bytes()).unwrap();
    let env = &plan.container.envs;
    assert_eq!(config.memory_limit(0), Some(4096 << 20));
    assert_eq!(config.memory_limit(1), Some(2048 << 20));
    assert_eq!(config.memory_limit(2), None);
    assert_eq!(
        config.hsa_cu_mask.as_deref(),
        Some(env["HSA_CU_MASK"].as_str())
    );
    assert_eq!(
        config.shared_cache.as_deref(),
        Some(env["HIP_DEVICE_MEMORY_SHARED_CACHE"].as_str())
    );
    assert_eq!(
        config.pinned.get("HIP_OVERSUBSCRIBE").map(String::as_str),
        Some("true")
    );
    // Both devices got CUs 0-25: one global mask expresses the slice on ROCm 5.x.
    assert_eq!(config.roc_global_cu_mask.as_deref(), Some("0x3ffffff"));
    assert_eq!(env["ROC_GLOBAL_CU_MASK"], "0x3ffffff");
}

#[test]
fn different_cu_sets_get_no_global_mask_and_whole_cards_no_config() {
    let tree = mi210_xgmi().unwrap();
    let devs = devices(&tree);
    // Other pods hold CUs 26-103 of device 0 and 0-25 of device 1: no CU is free on both,
    // so the slices differ.
    let mut others = CuAllocation::default();
    others
        .add(
            &devs[0].info.id,
            &hami_protocol::cu_list::CuSet::range(26, 78),
        )
        .unwrap();
    others
        .add(
            &devs[1].info.id,
            &hami_protocol::cu_list::CuSet::range(0, 26),
        )
        .unwrap();
    let run = vec![entry(&devs[0], 1024, 26), entry(&devs[1], 1024, 26)];
    let plan = plan_allocate(&sliced(&[run]), &devs, &others, 2, &PlanSettings::default()).unwrap();
    let (_, config) = plan.hook_config.clone().unwrap();
    assert_eq!(config.roc_global_cu_mask, None);
    assert!(!plan.container.envs.contains_key("ROC_GLOBAL_CU_MASK"));
    let whole = vec![entry(&devs[0], devs[0].info.devmem, devs[0].info.devcore)];
    let plan = plan_allocate(
        &sliced(&[whole]),
        &devs,
        &CuAllocation::default(),
        1,
        &PlanSettings::default(),
    )
    .unwrap();
    assert_eq!(plan.hook_config, None);
}

/// Issue 26 item 2: the pod's `AMD_TASK_PRIORITY` reached neither the application nor the
/// runtime once the hook read the config, which did not carry it. Each container's own
/// value, as its spec gives it, is pinned in its config.
#[test]
fn the_containers_task_priority_is_pinned_in_its_config() {
    use hami_amd_plugin::allocate_plan::task_priority;
    use k8s_openapi::api::core::v1::{Container, EnvVar, EnvVarSource, ObjectFieldSelector};
    let tree = mi210_xgmi().unwrap();
    let devs = devices(&tree);
    let container = |name: &str, env: Vec<EnvVar>| Container {
        name: name.into(),
        env: Some(env),
        ..Container::default()
    };
    let plain = |value: &str| EnvVar {
        name: "AMD_TASK_PRIORITY".into(),
        value: Some(value.into()),
        value_from: None,
    };
    let from_field = EnvVar {
        name: "AMD_TASK_PRIORITY".into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.annotations['p']".into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
    };
    let containers = [
        container("a", vec![plain("2")]),
        container("b", vec![]),
        container("c", vec![from_field]),
        container("d", vec![plain("1\nmemory-limit=0")]),
    ];
    let mut pod = sliced(&[
        vec![entry(&devs[0], 1024, 10)],
        vec![entry(&devs[0], 1024, 10)],
        vec![entry(&devs[0], 1024, 10)],
        vec![entry(&devs[0], 1024, 10)],
    ]);
    pod.containers = containers.iter().map(|c| c.name.clone()).collect();
    pod.task_priorities = containers.iter().map(task_priority).collect();
    let mut pinned = Vec::new();
    for _ in &containers {
        let none = CuAllocation::default();
        let plan = plan_allocate(&pod, &devs, &none, 1, &PlanSettings::default()).unwrap();
        let (_, config) = plan.hook_config.clone().unwrap();
        let text = config.encode().unwrap();
        pinned.push(
            decode(text.as_bytes())
                .unwrap()
                .pinned
                .get("AMD_TASK_PRIORITY")
                .cloned(),
        );
        pod.to_allocate = Some(plan.to_allocate);
        pod.cu_allocated = Some(plan.cu_allocated.clone());
    }
    assert_eq!(
        pinned,
        [Some("2".to_owned()), None, None, None],
        "a: its value; b: none; c: valueFrom, d: a line break — left to the hook, which keeps the process's start-up value"
    );
}
