//! dmem limits on cgroup v2 trees laid out as kubelet + containerd / CRI-O create them
//! (systemd and cgroupfs drivers): the limit is written once, at the pod cgroup, with the
//! pod's peak per VRAM region, and holds for the pause container, the init container, both
//! app containers and an app container's restart (which gets a new cgroup).

use std::path::{Path, PathBuf};
use std::time::Duration;

use hami_amd_plugin::discover_report::build_report;
use hami_amd_plugin::dmem::{DmemJob, apply_job, find_pod_cgroup, write_limits};
use hami_amd_plugin::dmem_plan::{DmemLimit, pod_dmem};
use hami_amd_plugin::kube_shell::pod_limits;
use hami_amd_plugin::registration::{RegisteredDevice, RegistrationSettings};
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::requests::ContainerKind;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

const UID: &str = "8d3e1c2a-5b6f-4a7d-9e0f-1a2b3c4d5e6f";

#[derive(Debug, Clone, Copy)]
enum Layout {
    ContainerdSystemd,
    ContainerdCgroupfs,
    CrioSystemd,
    CrioCgroupfs,
    /// Guaranteed QoS: the pod slice sits directly in kubepods.slice.
    ContainerdSystemdGuaranteed,
}

impl Layout {
    fn pod_dir(self, root: &Path) -> PathBuf {
        let u = UID.replace('-', "_");
        match self {
            Layout::ContainerdSystemd | Layout::CrioSystemd => root.join(format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"
            )),
            Layout::ContainerdSystemdGuaranteed => {
                root.join(format!("kubepods.slice/kubepods-pod{u}.slice"))
            }
            Layout::ContainerdCgroupfs | Layout::CrioCgroupfs => {
                root.join(format!("kubepods/burstable/pod{UID}"))
            }
        }
    }

    /// The cgroups the runtime creates for one container (CRI-O adds conmon's).
    fn container_dirs(self, pod: &Path, id: &str) -> Vec<PathBuf> {
        match self {
            Layout::ContainerdSystemd | Layout::ContainerdSystemdGuaranteed => {
                vec![pod.join(format!("cri-containerd-{id}.scope"))]
            }
            Layout::ContainerdCgroupfs => vec![pod.join(id)],
            Layout::CrioSystemd => vec![
                pod.join(format!("crio-conmon-{id}.scope")),
                pod.join(format!("crio-{id}.scope")),
            ],
            Layout::CrioCgroupfs => vec![
                pod.join(format!("crio-conmon-{id}")),
                pod.join(format!("crio-{id}")),
            ],
        }
    }
}

/// A cgroup as the kernel makes it when dmem is enabled in the parent: with an (unset)
/// `dmem.max`.
fn mkcg(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("dmem.max"), "").unwrap();
}

/// What the kernel enforces for a cgroup: the smallest `dmem.max` on the way to the root.
fn effective_limit(root: &Path, cgroup: &Path, region: &str) -> Option<u64> {
    let mut best: Option<u64> = None;
    let mut dir = Some(cgroup);
    while let Some(d) = dir {
        if let Ok(text) = std::fs::read_to_string(d.join("dmem.max")) {
            for line in text.lines() {
                if let Some((r, v)) = line.split_once(' ')
                    && r == region
                    && let Ok(bytes) = v.trim().parse::<u64>()
                {
                    best = Some(best.map_or(bytes, |b| b.min(bytes)));
                }
            }
        }
        if d == root {
            break;
        }
        dir = d.parent();
    }
    best
}

fn devices() -> (hami_sysfs_fixtures::FixtureTree, Vec<RegisteredDevice>) {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let devs = build_report(
        &tree.sysfs_root(),
        &tree.dev_root(),
        &RegistrationSettings::default(),
    )
    .unwrap()
    .registration
    .devices;
    (tree, devs)
}

fn entry(d: &RegisteredDevice, mem: u64, cores: u32) -> ContainerDevice {
    ContainerDevice {
        uuid: d.info.id.clone(),
        device_type: d.info.device_type.clone(),
        mem_mib: mem,
        cores,
    }
}

/// init (2 GiB on A), app `worker` (4 GiB on A), app `sidekick` (3 GiB on A + 1 GiB on B).
fn pod(devs: &[RegisteredDevice]) -> Pod {
    let (a, b) = (&devs[0], &devs[1]);
    let runs = vec![
        vec![entry(a, 2048, 20)],
        vec![entry(a, 4096, 30)],
        vec![entry(a, 3072, 30), entry(b, 1024, 10)],
    ];
    let list = encode_pod_devices(&runs).unwrap();
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "default", "uid": UID,
            "annotations": {"hami.io/amd-devices-allocated": list, "hami.io/amd-devices-to-allocate": list}},
        "spec": {
            "initContainers": [{"name": "prepare", "image": "x"}],
            "containers": [{"name": "worker", "image": "x"}, {"name": "sidekick", "image": "x"}],
        },
    }))
    .unwrap()
}

#[test]
fn pod_peak_per_region_init_at_peak_apps_summed() {
    let (_tree, devs) = devices();
    let limits = pod_limits(&pod(&devs), &devs).unwrap();
    let region_a = format!("drm/{}/vram0", devs[0].pci_bdf);
    let region_b = format!("drm/{}/vram0", devs[1].pci_bdf);
    assert_eq!(
        limits,
        vec![
            DmemLimit {
                region: region_a,
                bytes: 7 << 30
            },
            DmemLimit {
                region: region_b,
                bytes: 1 << 30
            },
        ]
    );
    // A big init container sets the peak; a whole card is not limited at all.
    let a = &devs[0];
    let peak = pod_dmem(
        &[vec![entry(a, 9000, 10)], vec![entry(a, 1000, 10)], vec![]],
        &[ContainerKind::Init, ContainerKind::App, ContainerKind::App],
        &devs,
    );
    assert_eq!(peak[0].bytes, 9000 << 20);
    let whole = pod_dmem(
        &[vec![entry(a, a.info.devmem, a.info.devcore)]],
        &[ContainerKind::App],
        &devs,
    );
    assert!(whole.is_empty(), "{whole:?}");
    // A native sidecar runs beside the apps: summed.
    let sidecar = pod_dmem(
        &[vec![entry(a, 1000, 10)], vec![entry(a, 1000, 10)]],
        &[ContainerKind::Sidecar, ContainerKind::App],
        &devs,
    );
    assert_eq!(sidecar[0].bytes, 2000 << 20);
}

#[tokio::test]
async fn limit_holds_for_every_container_and_restart_in_each_runtime_layout() {
    let (_tree, devs) = devices();
    let limits = pod_limits(&pod(&devs), &devs).unwrap();
    for layout in [
        Layout::ContainerdSystemd,
        Layout::ContainerdCgroupfs,
        Layout::CrioSystemd,
        Layout::CrioCgroupfs,
        Layout::ContainerdSystemdGuaranteed,
    ] {
        let root =
            std::env::temp_dir().join(format!("hami-dmem-{}-{layout:?}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(
            root.join("cgroup.controllers"),
            "cpuset cpu io memory hugetlb pids rdma misc dmem\n",
        )
        .unwrap();
        // Other pods' cgroups around, one with a uid that shares our prefix.
        mkcg(&root.join("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8d3e1c2a_5b6f_4a7d_9e0f_1a2b3c4d5e60.slice"));
        mkcg(&root.join("kubepods/besteffort/pod8d3e1c2a-5b6f-4a7d-9e0f-1a2b3c4d5e60"));

        // Allocate runs before kubelet creates the pod cgroup: the job waits for it.
        let job = DmemJob {
            pod_uid: UID.into(),
            limits: limits.clone(),
        };
        let writer = tokio::spawn({
            let root = root.clone();
            async move { apply_job(&root, job, Duration::from_secs(10)).await }
        });
        let pod_dir = layout.pod_dir(&root);
        // Deliberate, the case under test: the pod's cgroup appears only after the writer
        // has started waiting for it.
        tokio::time::sleep(Duration::from_millis(120)).await;
        mkcg(&pod_dir);
        let written = writer.await.unwrap().unwrap();
        assert_eq!(written, pod_dir, "{layout:?}");

        // The runtime now creates pause, init, and both app containers; then one restarts.
        let mut containers = Vec::new();
        for id in ["pause0", "init01", "appone", "apptwo"] {
            let id = format!("{id:0>64}");
            for dir in layout.container_dirs(&pod_dir, &id) {
                mkcg(&dir);
                containers.push(dir);
            }
        }
        let restarted = format!("{:0>64}", "apponerestart");
        for old in layout.container_dirs(&pod_dir, &format!("{:0>64}", "appone")) {
            std::fs::remove_dir_all(&old).unwrap();
            containers.retain(|c| c != &old);
        }
        for dir in layout.container_dirs(&pod_dir, &restarted) {
            mkcg(&dir);
            containers.push(dir);
        }
        // A second Allocate of the same pod (next container, or a plugin restart) writes
        // the same values again.
        write_limits(&pod_dir, &limits).unwrap();
        for c in &containers {
            for l in &limits {
                assert_eq!(
                    effective_limit(&root, c, &l.region),
                    Some(l.bytes),
                    "{layout:?}: {} on {}",
                    l.region,
                    c.display()
                );
            }
            assert_eq!(
                std::fs::read_to_string(c.join("dmem.max")).unwrap(),
                "",
                "{layout:?}: container cgroups are never written"
            );
        }
        assert_eq!(find_pod_cgroup(&root, UID), Some(pod_dir.clone()));
        std::fs::remove_dir_all(&root).unwrap();
    }
}

/// The DRA order: kubelet makes the pod cgroup (`pcm.EnsureExists` in `SyncPod`) before it
/// calls NodePrepareResources, so the driver's job finds it already there and writes at
/// once: with no time to wait at all, the limit still lands.
#[tokio::test]
async fn a_pod_cgroup_made_before_the_job_gets_the_limit_without_waiting() {
    let (_tree, devs) = devices();
    let limits = pod_limits(&pod(&devs), &devs).unwrap();
    for layout in [Layout::ContainerdSystemd, Layout::ContainerdCgroupfs] {
        let root =
            std::env::temp_dir().join(format!("hami-dmem-early-{}-{layout:?}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let pod_dir = layout.pod_dir(&root);
        mkcg(&pod_dir);
        let job = DmemJob {
            pod_uid: UID.into(),
            limits: limits.clone(),
        };
        let written = apply_job(&root, job, Duration::ZERO).await.unwrap();
        assert_eq!(written, pod_dir, "{layout:?}");
        for l in &limits {
            assert_eq!(
                effective_limit(&root, &pod_dir, &l.region),
                Some(l.bytes),
                "{layout:?}: {}",
                l.region
            );
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}

/// The writer's two paths: a pod cgroup already there is written before `submit` returns
/// (DRA: the limit is in place when NodePrepareResources answers); one that is not yet
/// there is left to the writer task, which writes once it appears.
#[tokio::test]
async fn submit_writes_an_existing_pod_cgroup_at_once_and_a_late_one_later() {
    let (_tree, devs) = devices();
    let limits = pod_limits(&pod(&devs), &devs).unwrap();
    let layout = Layout::ContainerdSystemd;
    let root = std::env::temp_dir().join(format!("hami-dmem-submit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("cgroup.controllers"), "cpu memory dmem\n").unwrap();
    let writer = hami_amd_plugin::dmem::spawn_writer(root.clone(), Duration::from_secs(10));
    let job = DmemJob {
        pod_uid: UID.into(),
        limits: limits.clone(),
    };
    // Not there yet: handed to the task, nothing written now.
    assert_eq!(writer.submit(job.clone()), None);
    let pod_dir = layout.pod_dir(&root);
    // Appears with its dmem.max in one step, as a cgroup mkdir does in cgroupfs.
    let staged = root.join("staged");
    mkcg(&staged);
    std::fs::create_dir_all(pod_dir.parent().unwrap()).unwrap();
    std::fs::rename(&staged, &pod_dir).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while effective_limit(&root, &pod_dir, &limits[0].region) != Some(limits[0].bytes) {
        assert!(
            std::time::Instant::now() < deadline,
            "the late cgroup never got its limit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // There now: written before submit returns.
    std::fs::write(pod_dir.join("dmem.max"), "").unwrap();
    assert_eq!(writer.submit(job), Some(pod_dir.clone()));
    for l in &limits {
        assert_eq!(
            effective_limit(&root, &pod_dir, &l.region),
            Some(l.bytes),
            "{}",
            l.region
        );
    }
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test]
async fn controller_not_enabled_below_root_is_a_clear_error() {
    let root = std::env::temp_dir().join(format!("hami-dmem-off-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let pod_dir = Layout::ContainerdCgroupfs.pod_dir(&root);
    std::fs::create_dir_all(&pod_dir).unwrap();
    let err = apply_job(
        &root,
        DmemJob {
            pod_uid: UID.into(),
            limits: vec![DmemLimit {
                region: "drm/0000:05:00.0/vram0".into(),
                bytes: 1,
            }],
        },
        Duration::from_secs(2),
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("not enabled") && err.contains("subtree_control"),
        "{err}"
    );
    let err = apply_job(
        &root,
        DmemJob {
            pod_uid: "other".into(),
            limits: vec![],
        },
        Duration::from_millis(150),
    )
    .await
    .unwrap_err();
    assert!(err.contains("dmem limit not applied"), "{err}");
    std::fs::remove_dir_all(&root).unwrap();
}

/// The writer looks where kubelet puts the pod's cgroup, computed from the QoS class and
/// the node's driver (kubelet-sim's model of kubelet's names, both drivers, every class),
/// not by walking the tree: a directory with the pod cgroup's name anywhere else (here a
/// `decoy.slice` one level nearer the root than the real one, which a breadth-first walk
/// met first) is never written.
#[tokio::test]
async fn the_writer_waits_on_the_path_kubelet_gives_the_pod_cgroup_and_nowhere_else() {
    use hami_amd_plugin::dmem::{CgroupDriver, Qos, detect_driver, find_pod_cgroup_at};
    use hami_amd_plugin::pod_cgroup::pod_cgroup_path;
    use hami_kubelet_sim::cgroup_layout::{
        CgroupDriver as SimDriver, Layout as SimLayout, Qos as SimQos,
    };
    use hami_kubelet_sim::pod_cgroups::{CgroupConfig, PodCgroups};

    let classes = [
        (SimQos::Guaranteed, Qos::Guaranteed),
        (SimQos::Burstable, Qos::Burstable),
        (SimQos::BestEffort, Qos::BestEffort),
    ];
    let drivers = [
        (SimDriver::Cgroupfs, CgroupDriver::Cgroupfs),
        (SimDriver::Systemd, CgroupDriver::Systemd),
    ];
    // The names agree with kubelet's for every driver and class.
    for (sim_driver, driver) in drivers {
        for (sim_qos, qos) in classes {
            let want = SimLayout { driver: sim_driver }.pod(sim_qos, UID);
            assert_eq!(
                pod_cgroup_path(driver, qos, UID).map(PathBuf::from),
                Some(want),
                "{driver:?} {qos:?}"
            );
        }
    }
    let limits = vec![DmemLimit {
        region: "drm/0000:05:00.0/vram0".into(),
        bytes: 3 << 30,
    }];
    for (sim_driver, driver) in drivers {
        for (sim_qos, qos) in classes {
            let root = std::env::temp_dir().join(format!(
                "hami-dmem-computed-{}-{driver:?}-{qos:?}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(&root).unwrap();
            std::fs::write(root.join("cgroup.controllers"), "cpu memory dmem\n").unwrap();
            // kubelet at start: kubepods and its QoS levels, with the driver's names.
            let kubelet = PodCgroups::new(&CgroupConfig {
                root: root.clone(),
                driver: sim_driver,
            })
            .unwrap();
            assert_eq!(detect_driver(&root), Some(driver));
            // Decoys with the pod cgroup's name, outside kubelet's place for it.
            let name = pod_cgroup_path(driver, qos, UID).unwrap();
            let name = name.rsplit('/').next().unwrap();
            let decoys = [
                root.join("decoy.slice").join(name),
                root.join("kubepods-x").join(name),
            ];
            for d in &decoys {
                mkcg(d);
            }
            let writer = hami_amd_plugin::dmem::spawn_writer(root.clone(), Duration::from_secs(30));
            let job = DmemJob {
                pod_uid: UID.into(),
                limits: limits.clone(),
            };
            // Allocate comes first: nothing there yet, the job waits.
            assert_eq!(writer.submit_with_qos(job, Some(qos)), None);
            assert_eq!(
                find_pod_cgroup_at(&root, Some(driver), Some(qos), UID),
                None
            );
            // kubelet makes the pod cgroup (dmem.max appears with it: dmem flows down).
            let pod_dir = kubelet.ensure_pod(sim_qos, UID).unwrap();
            assert_eq!(
                pod_dir,
                root.join(pod_cgroup_path(driver, qos, UID).unwrap())
            );
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while effective_limit(&root, &pod_dir, &limits[0].region) != Some(limits[0].bytes) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{driver:?} {qos:?}: the pod cgroup never got its limit"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            for d in &decoys {
                assert_eq!(
                    std::fs::read_to_string(d.join("dmem.max")).unwrap(),
                    "",
                    "{}",
                    d.display()
                );
            }
            assert_eq!(find_pod_cgroup(&root, UID), Some(pod_dir));
            std::fs::remove_dir_all(&root).unwrap();
        }
    }
}
