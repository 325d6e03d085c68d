use super::*;
use crate::dra_claims::{ClaimRegion, RegionDevice};
use crate::hami_core_region::CoreDevice;
use crate::hip_region::HipDevice;
use crate::pods::{ContainerInfo, PodInfo};
use hami_protocol::device_list::ContainerDevice;

fn granted(uuid: &str) -> ContainerDevice {
    ContainerDevice {
        uuid: uuid.into(),
        device_type: "AMD Instinct MI210".into(),
        mem_mib: 1024,
        cores: 10,
    }
}

fn pod(uid: &str, name: &str, containers: &[(&str, Vec<ContainerDevice>)]) -> Arc<PodInfo> {
    Arc::new(PodInfo {
        uid: uid.into(),
        namespace: "ns".into(),
        name: name.into(),
        containers: containers
            .iter()
            .map(|(c, amd)| ContainerInfo {
                name: (*c).into(),
                kind: "app",
                container_id: None,
                amd: amd.clone(),
                nvidia: Vec::new(),
            })
            .collect(),
        cu_allocated: vec![("G0".into(), "0-9".into())],
        problems: Vec::new(),
    })
}

fn hip(used: &[u64]) -> RegionReading {
    RegionReading::Hip(HipReading {
        minor: 0,
        devices: used
            .iter()
            .enumerate()
            .map(|(index, &used)| HipDevice {
                index,
                used,
                accounted: used,
                limit: Some(4 << 30),
                peak: used,
                sm_util_sum: 0,
            })
            .collect(),
        live_processes: 1,
        dead_processes: 0,
        hostpids: Vec::new(),
    })
}

fn core(last_kernel_time: Option<u64>, sm_util_sum: u64) -> RegionReading {
    let memory = MemoryBreakdown {
        context: 1,
        module: 2,
        data: 3,
        total: 6,
    };
    RegionReading::Core(CoreReading {
        layout: "v1",
        major: 1,
        minor: 2,
        devices: vec![CoreDevice {
            index: 0,
            uuid: "GPU-n0".into(),
            limit: 8 << 30,
            sm_limit: 50,
            memory,
            sm_util_sum,
        }],
        last_kernel_time,
        priority: 1,
        live_processes: 1,
        dead_processes: 0,
        devices_without_uuid: 0,
    })
}

fn util(vdevice_index: Option<usize>, uuid: &str, percent: f64) -> AmdDeviceUtil {
    AmdDeviceUtil {
        vdevice_index,
        uuid: uuid.into(),
        util: DeviceUtilization {
            percent,
            clamped: false,
        },
    }
}

fn dir(
    pod_uid: &str,
    container: &str,
    claim: Option<&str>,
    readings: Vec<RegionReading>,
) -> GatheredDir {
    GatheredDir {
        pod_uid: pod_uid.into(),
        container: container.into(),
        claim: claim.map(Into::into),
        readings,
    }
}

/// A scrape's decisions on plain data: devices named by the grants or by the claim, the
/// AMD utilization joined by device, a busy AMD container without a region reported from
/// its utilization alone, a directory of a pod gone skipped, HAMi-core's kernel time and
/// clamped utilization, the output sorted, and the annotations' allocations beside.
#[test]
fn assemble_names_joins_and_sorts_the_scrapes_samples() {
    let mut pods = PodIndex::default();
    pods.by_uid.insert(
        "u-b".into(),
        pod("u-b", "b", &[("main", vec![granted("G0")])]),
    );
    pods.by_uid.insert(
        "u-a".into(),
        pod("u-a", "a", &[("cuda", Vec::new()), ("busy", Vec::new())]),
    );
    pods.by_uid
        .insert("u-c".into(), pod("u-c", "c", &[("dra", Vec::new())]));
    pods.claims.insert(
        "claim-1".into(),
        ClaimRegion {
            pod_uid: "u-c".into(),
            container: "dra".into(),
            devices: vec![RegionDevice {
                vdevice_index: None,
                uuid: "U-dra".into(),
            }],
        },
    );
    let mut amd_util = AmdUtil::new();
    amd_util.insert(
        ("u-b".into(), "main".into()),
        vec![util(Some(0), "G0", 40.0)],
    );
    amd_util.insert(
        ("u-a".into(), "busy".into()),
        vec![util(None, "0000:03:00.0", 70.0)],
    );
    // A container busy on a GPU whose pod is gone: nothing to label it with.
    amd_util.insert(("u-gone".into(), "x".into()), vec![util(None, "G9", 1.0)]);
    let snapshot = assemble(Gathered {
        node: "node-1".into(),
        pods: Arc::new(pods),
        amd_util: Arc::new(amd_util),
        now_secs: 1_000,
        dirs: vec![
            dir("u-b", "main", None, vec![hip(&[1 << 30, 2 << 30])]),
            dir("u-gone", "main", None, vec![hip(&[5])]),
            dir("u-c", "dra", Some("claim-1"), vec![hip(&[3 << 30])]),
            dir("u-a", "cuda", None, vec![core(Some(990), 130)]),
            dir("u-a", "empty", None, Vec::new()),
        ],
        host: Arc::new(Vec::new()),
        errors: BTreeMap::from([("fdinfo", 2)]),
    });
    assert_eq!(snapshot.node, "node-1");
    assert_eq!(snapshot.errors, BTreeMap::from([("fdinfo", 2)]));
    let seen: Vec<(&str, &str)> = snapshot
        .containers
        .iter()
        .map(|c| (c.pod.as_str(), c.container.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("a", "busy"),
            ("a", "cuda"),
            ("a", "empty"),
            ("b", "main"),
            ("c", "dra")
        ]
    );
    let by = |pod: &str, container: &str| {
        snapshot
            .containers
            .iter()
            .find(|c| c.pod == pod && c.container == container)
            .unwrap()
    };
    // The busy AMD container without a region: utilization only, by its PCI address.
    let busy = &by("a", "busy").devices;
    assert_eq!(busy.len(), 1);
    assert_eq!(
        (busy[0].device_uuid.as_str(), busy[0].memory_used),
        ("0000:03:00.0", None)
    );
    assert_eq!(busy[0].utilization.map(|u| u.percent), Some(70.0));
    // HAMi-core: ten seconds since the last kernel, utilization clamped at 100.
    let cuda = by("a", "cuda");
    assert_eq!(cuda.last_kernel_elapsed, Some(10));
    assert_eq!(cuda.devices[0].memory_used, Some(6));
    assert_eq!(cuda.devices[0].memory_limit, Some(8 << 30));
    let u = cuda.devices[0].utilization.unwrap();
    assert!(u.clamped && u.percent == 100.0);
    // A directory with no region read is still the container's row, empty.
    assert!(by("a", "empty").devices.is_empty());
    // HIP by the grants: device 0 is G0 with its utilization, device 1 not granted.
    let main = &by("b", "main").devices;
    assert_eq!(
        main.iter()
            .map(|d| (d.vdevice_index, d.device_uuid.as_str(), d.memory_used))
            .collect::<Vec<_>>(),
        [
            (Some(0), "G0", Some(1 << 30)),
            (Some(1), "hip-device-1", Some(2 << 30))
        ]
    );
    assert_eq!(main[0].utilization.map(|u| u.percent), Some(40.0));
    assert_eq!(main[1].utilization, None);
    // HIP by the claim.
    let dra = &by("c", "dra").devices;
    assert_eq!(
        (dra[0].vdevice_index, dra[0].device_uuid.as_str()),
        (None, "U-dra")
    );
    // The annotations' allocations, with the pod's CU list.
    assert_eq!(snapshot.allocations.len(), 1);
    assert_eq!(snapshot.allocations[0].cu_mask.as_deref(), Some("0-9"));
    assert_eq!(snapshot.allocations[0].memory_bytes, 1 << 30);
}

#[test]
fn region_devices_by_container_list_or_by_claim() {
    let granted = vec![granted("G0")];
    // A container directory: the position in the granted list.
    assert_eq!(region_device(None, &granted, 0), (Some(0), "G0".into()));
    assert_eq!(
        region_device(None, &granted, 1),
        (Some(1), "hip-device-1".into())
    );
    // A claim directory: the claim's device at that position, whatever the list says.
    let claim = ClaimRegion {
        pod_uid: "p".into(),
        container: "c".into(),
        devices: vec![
            RegionDevice {
                vdevice_index: None,
                uuid: "U0".into(),
            },
            RegionDevice {
                vdevice_index: Some(0),
                uuid: "U1".into(),
            },
        ],
    };
    assert_eq!(
        region_device(Some(Some(&claim)), &granted, 0),
        (None, "U0".into())
    );
    assert_eq!(
        region_device(Some(Some(&claim)), &granted, 1),
        (Some(0), "U1".into())
    );
    assert_eq!(
        region_device(Some(Some(&claim)), &granted, 2),
        (None, "hip-device-2".into())
    );
    // The claim left the index since the scan: no device name is invented.
    assert_eq!(
        region_device(Some(None), &granted, 0),
        (None, "hip-device-0".into())
    );
    let mut pods = PodIndex::default();
    pods.claims.insert("c-1".into(), claim);
    assert!(claim_dir_tracked("c-1", &pods) && !claim_dir_tracked("c-2", &pods));
}
