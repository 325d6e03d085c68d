//! The whole pipeline with nothing written by hand: the webhook, the simulated
//! kube-scheduler, filter and bind, the AMD device plugin's Allocate through the simulated
//! kubelet. A pod with an init container and two GPU app containers gets the right env per
//! container, in device-list order. Its memory asks are multiples of 1000 MiB, which the
//! API server stores in canonical form (`16000` as `16k`, `3000` as `3k`): every reader
//! must take those as the MiB they are.

use crate::common;

use std::time::Duration;

use common::{once_args, scratch};
use hami_demo::{Cluster, Progress};
use hami_protocol::cu_list::HsaCuMask;
use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::memory_limit::parse_memory_limit;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: three
  annotations:
    amd.com/use-gputype: MI210
spec:
  initContainers:
  - name: prepare
    image: busybox
    resources:
      limits: {amd.com/gpu: 1, amd.com/gpumem: 2048, amd.com/gpucores: 50}
  containers:
  - name: trainer
    image: rocm/pytorch
    resources:
      limits: {amd.com/gpu: 2, amd.com/gpumem: 16000, amd.com/gpucores: 25}
  - name: evaluator
    image: rocm/pytorch
    resources:
      limits: {amd.com/gpu: 1, amd.com/gpumem: 3000, amd.com/gpucores: 50}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_and_two_app_containers_get_their_own_env() {
    let _one_cluster = common::ONE_CLUSTER.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = scratch("pipeline");
    std::fs::write(dir.join("three.yaml"), POD).unwrap();
    let args = once_args(dir.clone(), &dir);
    let mut sink = Vec::new();
    let mut progress = Progress::new(&mut sink);
    let cluster = Cluster::start(&args, &mut progress).await.unwrap();
    let submitted = cluster.submit_examples(&dir, &mut progress).await.unwrap();
    cluster
        .settle(&submitted, Duration::from_secs(20), &mut progress)
        .await;
    let pod = Api::<Pod>::namespaced(cluster.client.clone(), "default")
        .get("three")
        .await
        .unwrap();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running"),
        "{}",
        String::from_utf8_lossy(&sink)
    );
    assert_eq!(annotations["hami.io/bind-phase"], "success");

    let stored: Vec<String> = pod
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .map(|c| {
            c.resources.as_ref().unwrap().limits.as_ref().unwrap()["amd.com/gpumem"]
                .0
                .clone()
        })
        .collect();
    assert_eq!(
        stored,
        ["16k", "3k"],
        "as the API server stores 16000 and 3000"
    );
    let runs = decode_pod_devices(&annotations["hami.io/amd-devices-allocated"]).unwrap();
    let mem: Vec<Vec<u64>> = runs
        .iter()
        .map(|r| r.iter().map(|d| d.mem_mib).collect())
        .collect();
    assert_eq!(
        mem,
        [vec![2048], vec![16000, 16000], vec![3000]],
        "MiB per GPU"
    );
    assert_eq!(
        runs.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![1, 2, 1],
        "init first, then apps"
    );
    let record = &annotations[hami_kubelet_sim::records::RECORD_ANNOTATION];
    for (name, run) in [
        ("prepare", &runs[0]),
        ("trainer", &runs[1]),
        ("evaluator", &runs[2]),
    ] {
        let envs = hami_kubelet_sim::records::envs_of(record, name)
            .unwrap_or_else(|| panic!("no Allocate record for {name}: {record}"));
        let env = |k: &str| {
            envs.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_else(|| panic!("{name}: {k} missing in {envs:?}"))
                .to_owned()
        };
        let rocr: Vec<String> = env("ROCR_VISIBLE_DEVICES")
            .split(',')
            .map(str::to_owned)
            .collect();
        assert_eq!(rocr.len(), run.len(), "{name}");
        let visible: Vec<String> = (0..run.len()).map(|i| i.to_string()).collect();
        assert_eq!(env("HIP_VISIBLE_DEVICES"), visible.join(","), "{name}");
        let mask = HsaCuMask::parse(&env("HSA_CU_MASK")).unwrap();
        for (i, dev) in run.iter().enumerate() {
            // The mask of GPU i has exactly the CU count the scheduler decided for it.
            assert_eq!(
                mask.get(i as u32).unwrap().len(),
                u64::from(dev.cores),
                "{name} GPU {i}"
            );
            assert_eq!(
                parse_memory_limit(&env(&format!("HIP_DEVICE_MEMORY_LIMIT_{i}"))).unwrap(),
                dev.mem_mib << 20,
                "{name} GPU {i}"
            );
        }
        assert_eq!(env("LD_AUDIT"), "/usr/local/vgpu/libamvgpu.so");
        assert_eq!(
            env("HIP_DEVICE_MEMORY_SHARED_CACHE"),
            "/usr/local/vgpu/cache/hipdevshr.cache"
        );
    }
    cluster.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
