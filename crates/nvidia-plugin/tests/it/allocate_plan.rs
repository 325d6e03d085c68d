//! The pure NVIDIA Allocate planner: env and mounts per container (reference §5.5-§5.6),
//! run mapping D-5, whole cards, and each bad input.

use hami_nvidia_plugin::allocate_plan::{
    ContainerInfo, PlanError, PlanSettings, PodState, plan_allocate, plan_whole_cards,
};
use hami_nvidia_plugin::nvml::NvmlGpu;
use hami_nvidia_plugin::registration::{NvidiaSettings, RegisteredGpu, register};
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use proptest::prelude::*;

fn gpus(n: u32) -> Vec<RegisteredGpu> {
    let found: Vec<NvmlGpu> = (0..n)
        .map(|i| NvmlGpu {
            index: i,
            uuid: format!("GPU-{i:08x}-0000-0000-0000-000000000000"),
            name: "NVIDIA A100".into(),
            memory_bytes: 40 << 30,
        })
        .collect();
    register(&found, &NvidiaSettings::default()).devices
}

fn dev(g: &RegisteredGpu, mem: u64, cores: u32) -> ContainerDevice {
    ContainerDevice {
        uuid: g.info.id.clone(),
        device_type: "NVIDIA".into(),
        mem_mib: mem,
        cores,
    }
}

fn pod(runs: &[Vec<ContainerDevice>], names: &[&str]) -> PodState {
    PodState {
        to_allocate: Some(encode_pod_devices(runs).unwrap()),
        pod_uid: Some("uid-1".into()),
        containers: names
            .iter()
            .map(|n| ContainerInfo {
                name: (*n).into(),
                disable_control: false,
                task_priority: None,
            })
            .collect(),
    }
}

#[test]
fn env_mounts_and_oversubscription() {
    let g = gpus(2);
    let state = pod(
        &[vec![], vec![dev(&g[1], 5000, 25), dev(&g[0], 6000, 35)]],
        &["init", "app"],
    );
    let settings = PlanSettings {
        oversubscribe: true,
        ..Default::default()
    };
    let plan = plan_allocate(&state, &g, 2, &settings).unwrap();
    assert_eq!(plan.run_index, 1);
    assert!(plan.last);
    assert_eq!(plan.to_allocate, ";;");
    let env = &plan.container.envs;
    assert_eq!(
        env["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", g[1].info.id, g[0].info.id)
    );
    assert_eq!(env["CUDA_DEVICE_MEMORY_LIMIT_0"], "5000m");
    assert_eq!(env["CUDA_DEVICE_MEMORY_LIMIT_1"], "6000m");
    assert_eq!(env["CUDA_DEVICE_SM_LIMIT"], "25");
    assert_eq!(env["CUDA_OVERSUBSCRIBE"], "true");
    assert_eq!(
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"],
        "/usr/local/vgpu/cache/cudevshr.cache"
    );
    assert_eq!(
        plan.cache_dir.as_deref(),
        Some("/usr/local/vgpu/containers/uid-1_app")
    );
    let paths: Vec<(&str, &str, bool)> = plan
        .container
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        paths,
        [
            (
                "/usr/local/vgpu/libvgpu.so",
                "/usr/local/vgpu/libvgpu.so",
                true
            ),
            ("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", true),
            (
                "/usr/local/vgpu/cache",
                "/usr/local/vgpu/containers/uid-1_app",
                false
            ),
            (
                "/usr/local/vgpu/hook.conf",
                "/usr/local/vgpu/configs/uid-1_app.conf",
                true
            ),
        ]
    );
    // The hook's read-only config carries the same slice, in bytes (issue 14 item 7).
    let (file, config) = plan.hook_config.as_ref().unwrap();
    assert_eq!(file, "/usr/local/vgpu/configs/uid-1_app.conf");
    assert_eq!(config.memory_limit(0), Some(5000 << 20));
    assert_eq!(config.memory_limit(1), Some(6000 << 20));
    assert_eq!(config.memory_limit(2), None);
    assert_eq!(config.sm_limit, Some(25));
    assert_eq!(
        config.shared_cache.as_deref(),
        Some("/usr/local/vgpu/cache/cudevshr.cache")
    );
    assert_eq!(config.pinned["CUDA_OVERSUBSCRIBE"], "true");
    assert!(
        plan.container.devices.is_empty(),
        "the NVIDIA runtime adds the device nodes"
    );
}

#[test]
fn bad_inputs_name_what_is_wrong() {
    let g = gpus(1);
    let mut state = pod(&[vec![dev(&g[0], 100, 10)]], &["c"]);
    let s = PlanSettings::default();
    state.to_allocate = None;
    assert!(
        plan_allocate(&state, &g, 1, &s)
            .unwrap_err()
            .to_string()
            .contains("hami.io/vgpu-devices-to-allocate annotation")
    );
    state.to_allocate = Some("GPU-x,NVIDIA,1:;".into());
    assert!(
        plan_allocate(&state, &g, 1, &s)
            .unwrap_err()
            .to_string()
            .contains("malformed")
    );
    let state = pod(&[vec![dev(&g[0], 100, 10)]], &["c"]);
    assert!(
        plan_allocate(&state, &g, 2, &s)
            .unwrap_err()
            .to_string()
            .contains("holds 1 device(s) but kubelet asked for 2")
    );
    let too_big = pod(&[vec![dev(&g[0], 40_961, 10)]], &["c"]);
    assert_eq!(
        plan_allocate(&too_big, &g, 1, &s),
        Err(PlanError::TooMuchMemory {
            id: g[0].info.id.clone(),
            mem: 40_961,
            devmem: 40_960
        })
    );
    let mut sick = g.clone();
    sick[0].info.health = false;
    assert!(matches!(
        plan_allocate(&state, &sick, 1, &s),
        Err(PlanError::Unhealthy { .. })
    ));
    assert!(matches!(
        plan_allocate(&state, &[], 1, &s),
        Err(PlanError::UnknownDevice { .. })
    ));
    assert_eq!(plan_whole_cards(&g, &[]), Err(PlanError::EmptyRequest));
    for bad in ["nonsense", "GPU-other#0", &format!("{}#10", g[0].info.id)] {
        assert_eq!(
            plan_whole_cards(&g, &[bad.to_string()]),
            Err(PlanError::UnknownKubeletId(bad.to_string()))
        );
    }
}

#[test]
fn whole_cards_are_deduplicated_in_request_order() {
    let g = gpus(2);
    let ids = [
        format!("{}#3", g[1].info.id),
        format!("{}#0", g[0].info.id),
        format!("{}#1", g[1].info.id),
    ];
    let plan = plan_whole_cards(&g, &ids).unwrap();
    assert_eq!(
        plan.envs["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", g[1].info.id, g[0].info.id)
    );
    assert_eq!(plan.envs.len(), 1);
    assert!(plan.mounts.is_empty());
}

proptest! {
    /// Any split of containers: each Allocate gets its own run's memory limits in order,
    /// and the pod is complete exactly after the last run.
    #[test]
    fn every_container_gets_its_own_run(sizes in proptest::collection::vec(0usize..3, 1..5), mem in 1u64..40_000) {
        let g = gpus(3);
        let runs: Vec<Vec<ContainerDevice>> = sizes.iter().enumerate()
            .map(|(i, &n)| (0..n).map(|k| dev(&g[(i + k) % 3], mem + k as u64, 10)).collect())
            .collect();
        let names: Vec<String> = (0..sizes.len()).map(|i| format!("c{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut state = pod(&runs, &refs);
        let wanted: Vec<usize> = (0..sizes.len()).filter(|&i| sizes[i] > 0).collect();
        for (step, &i) in wanted.iter().enumerate() {
            let plan = plan_allocate(&state, &g, sizes[i], &PlanSettings::default()).unwrap();
            prop_assert_eq!(plan.run_index, i);
            prop_assert_eq!(plan.last, step + 1 == wanted.len());
            for k in 0..sizes[i] {
                prop_assert_eq!(&plan.container.envs[&format!("CUDA_DEVICE_MEMORY_LIMIT_{k}")], &format!("{}m", mem + k as u64));
            }
            let expected_dir = format!("/usr/local/vgpu/containers/uid-1_c{i}");
            prop_assert_eq!(plan.cache_dir.as_deref(), Some(expected_dir.as_str()));
            state.to_allocate = Some(plan.to_allocate);
        }
    }
}

/// Issue 26 item 2: `nvidia.com/priority: 0` became `CUDA_TASK_PRIORITY=0` in the env, but
/// the hook took its settings from the config alone, which carried no priority: the region's
/// `priority` read 1. Each container's priority, from its env (the webhook's) or its
/// `nvidia.com/priority` limit, is pinned in its config (read from the pod as the shell does).
#[test]
fn the_containers_task_priority_is_pinned_in_its_config() {
    use hami_nvidia_plugin::kube_shell::pod_state;
    let g = gpus(1);
    let runs = vec![vec![dev(&g[0], 1024, 30)]; 3];
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "uid-1", "annotations": {
            "hami.io/vgpu-devices-to-allocate": encode_pod_devices(&runs).unwrap()}},
        "spec": {"containers": [
            {"name": "env", "env": [{"name": "CUDA_TASK_PRIORITY", "value": "0"}],
             "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/priority": "0"}}},
            {"name": "limit", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/priority": "0"}}},
            {"name": "none", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]}
    }))
    .unwrap();
    let mut state = pod_state(&pod);
    let mut pinned = Vec::new();
    for _ in 0..3 {
        let plan = plan_allocate(&state, &g, 1, &PlanSettings::default()).unwrap();
        let (_, config) = plan.hook_config.as_ref().unwrap();
        let text = config.encode().unwrap();
        let decoded = hami_protocol::hook_config::decode(text.as_bytes()).unwrap();
        pinned.push(decoded.pinned.get("CUDA_TASK_PRIORITY").cloned());
        state.to_allocate = Some(plan.to_allocate);
    }
    assert_eq!(pinned, [Some("0".to_owned()), Some("0".to_owned()), None]);
}
