//! Discovery and registration on the real KFD captures and synthesized RDNA cards.

use hami_amd_plugin::discover_report::build_report;
use hami_amd_plugin::discovery::discover;
use hami_amd_plugin::registration::{OperatingMode, RegistrationSettings};
use hami_protocol::identity::{amd_smi_uuid, rocr_id};
use hami_protocol::node_register::{DeviceMode, decode_node_devices};
use hami_sysfs_fixtures::{
    FixtureTree, Rdna, mi210_xgmi, mi300x_cpx, mi308x_qpx, one_gpu, rdna_node,
};

fn report(
    tree: &FixtureTree,
    settings: &RegistrationSettings,
) -> hami_amd_plugin::discover_report::Report {
    build_report(&tree.sysfs_root(), &tree.dev_root(), settings).unwrap()
}

#[test]
fn mi210_eight_cards_two_xgmi_hives() {
    let tree = mi210_xgmi().unwrap();
    let r = report(&tree, &RegistrationSettings::default());
    assert!(
        r.discovery.warnings.is_empty(),
        "{:?}",
        r.discovery.warnings
    );
    assert_eq!(r.discovery.gpus.len(), 8);
    let g = r
        .discovery
        .gpus
        .iter()
        .find(|g| g.bdf == "0000:63:00.0")
        .unwrap();
    assert_eq!(g.partitions[0].render, 128);
    assert_eq!(g.compute_units(), 104);
    assert_eq!(g.cu_per_wgp, 1);
    assert_eq!(g.compute_queues, 24);
    assert_eq!(g.unique_id, 1801979520617338022);
    // Hive {nodes 2,3,4,5} = buses 0x63, 0x43, 0x03, 0x26.
    assert_eq!(
        g.xgmi_peers,
        vec!["0000:03:00.0", "0000:26:00.0", "0000:43:00.0"]
    );
    let annotation = r.register_annotation.clone().unwrap();
    let devices = decode_node_devices(&annotation).unwrap();
    assert_eq!(devices.len(), 8);
    let d = devices
        .iter()
        .find(|d| d.custom_info.pci_bdf.as_deref() == Some("0000:63:00.0"))
        .unwrap();
    assert_eq!(d.id, amd_smi_uuid(1801979520617338022, 0x740f, 0xff));
    assert_eq!((d.count, d.devmem, d.devcore, d.numa), (10, 65536, 104, 0));
    assert_eq!(d.device_type, "AMD Instinct MI210");
    assert_eq!(d.mode, DeviceMode::HamiCore);
    assert!(d.health);
    assert_eq!(d.device_vendor, "AMD");
    // Byte-exact shape of one entry (SPEC §2.1 field order).
    assert!(annotation.contains(&format!(
        r#"{{"id":"{}","index":1,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","numa":0,"mode":"hami-core","health":true,"devicevendor":"AMD","custominfo":{{"pciBDF":"0000:63:00.0","cuPerWGP":1,"computeQueues":24,"xgmiPeers":["0000:03:00.0","0000:26:00.0","0000:43:00.0"]}}}}"#,
        d.id
    )), "{annotation}");
}

#[test]
fn mi300x_cpx_partitions_get_distinct_ids() {
    let tree = mi300x_cpx().unwrap();
    let r = report(&tree, &RegistrationSettings::default());
    assert_eq!(r.discovery.gpus.len(), 8);
    // 63 KFD partition nodes; GPU 8 lacks its 8th partition and says so.
    assert_eq!(r.registration.devices.len(), 63);
    assert!(
        r.discovery
            .warnings
            .iter()
            .any(|w| w.contains("0000:e5:00.0") && w.contains("7 partition")),
        "{:?}",
        r.discovery.warnings
    );
    let g = &r.discovery.gpus[0];
    assert_eq!(g.bdf, "0000:05:00.0");
    assert_eq!(g.partitions.len(), 8);
    assert_eq!(g.partitions[3].device_key, "amdgpu_xcp_2");
    assert_eq!(g.compute_units(), 8 * 38);
    let devices = decode_node_devices(r.register_annotation.as_deref().unwrap()).unwrap();
    let ids: std::collections::BTreeSet<_> = devices.iter().map(|d| d.id.clone()).collect();
    assert_eq!(ids.len(), 63, "D-8: no two entries share an id");
    let p3 = &devices[3];
    assert_eq!(p3.id, format!("{}-3", rocr_id(16404946649897475633)));
    // The seed's count rule: a hard partition entry counts once, in cu mode too.
    assert_eq!(
        (p3.devcore, p3.devmem, p3.count, p3.index, p3.mode.clone()),
        (38, 196288 / 8, 1, 4, DeviceMode::Xcp)
    );
    assert!(
        devices
            .iter()
            .all(|d| d.count == 1 && d.mode == DeviceMode::Xcp)
    );
    // link-bind: partitions of one die are peers (their pciBDF is in each other's peers).
    assert!(
        p3.custom_info
            .xgmi_peers
            .contains(&"0000:05:00.0".to_owned())
    );
    // Slicing partitions by CU masks only behind the explicit opt-in.
    let sliced = report(
        &tree,
        &RegistrationSettings {
            slice_partitions: true,
            ..Default::default()
        },
    );
    assert!(
        sliced
            .registration
            .devices
            .iter()
            .all(|d| d.info.count == 10 && d.info.mode == DeviceMode::HamiCore)
    );
    assert_eq!(p3.custom_info.compute_partition.as_deref(), Some("CPX"));
    assert_eq!(p3.custom_info.memory_partition.as_deref(), Some("NPS1"));
    assert_eq!(p3.custom_info.pci_bdf.as_deref(), Some("0000:05:00.0"));
    // Partition mode: same ids, one device each, mode xcp.
    let settings = RegistrationSettings {
        mode: OperatingMode::Partition,
        ..Default::default()
    };
    let rp = report(&tree, &settings);
    let devices_p = decode_node_devices(rp.register_annotation.as_deref().unwrap()).unwrap();
    assert_eq!(
        devices_p.iter().map(|d| &d.id).collect::<Vec<_>>(),
        devices.iter().map(|d| &d.id).collect::<Vec<_>>()
    );
    assert!(
        devices_p
            .iter()
            .all(|d| d.count == 1 && d.mode == DeviceMode::Xcp)
    );
    // An expected-mode mismatch is reported.
    let settings = RegistrationSettings {
        expected_compute_partition: Some("SPX".into()),
        ..Default::default()
    };
    assert!(
        report(&tree, &settings)
            .registration
            .warnings
            .iter()
            .any(|w| w.contains("expects SPX"))
    );
}

#[test]
fn one_gpu_capture_without_product_name_or_gfx_version() {
    let tree = one_gpu().unwrap();
    let r = report(
        &tree,
        &RegistrationSettings {
            split_count: Some(4),
            device_memory_scaling: 1.5,
            ..Default::default()
        },
    );
    assert_eq!(r.discovery.gpus.len(), 2);
    let d = &r.registration.devices[0];
    assert_eq!(d.info.device_type, "AMD Radeon Instinct MI25");
    assert_eq!(d.info.numa, -1);
    assert_eq!(d.info.count, 4);
    assert_eq!(d.info.devcore, 64);
    assert_eq!(d.info.devmem, 16384 * 3 / 2);
    assert_eq!(d.rocr_id, "GPU-c34ec50444dd0a6c");
    assert_eq!(r.registration.devices[1].rocr_id, "GPU-c34ec50444dd0a6d");
}

#[test]
fn rdna_cards_have_wgps_and_gfx12_shares_two() {
    let tree = rdna_node(&[Rdna::Gfx11, Rdna::Gfx12]).unwrap();
    let r = report(&tree, &RegistrationSettings::default());
    assert!(
        r.discovery.warnings.is_empty(),
        "{:?}",
        r.discovery.warnings
    );
    let d: Vec<_> = r.registration.devices.iter().map(|d| &d.info).collect();
    assert_eq!(
        (d[0].devcore, d[0].count, d[0].custom_info.cu_per_wgp),
        (96, 10, Some(2))
    );
    assert_eq!(
        (d[1].devcore, d[1].count, d[1].custom_info.cu_per_wgp),
        (64, 2, Some(2))
    );
    assert_eq!(d[1].device_type, "AMD Radeon RX 9070 XT");
}

#[test]
fn broken_cards_are_skipped_with_a_reason_and_the_rest_kept() {
    let tree = mi210_xgmi().unwrap();
    // Card without render node.
    tree.remove("devices/pci0000:00/0000:63:00.0/drm/renderD128")
        .unwrap();
    // CU count 0.
    tree.set_kfd_property(3, "simd_count", "0").unwrap();
    tree.set_kfd_property(3, "simd_per_cu", "0").unwrap();
    // unique_id 0.
    tree.set_kfd_property(4, "unique_id", "0").unwrap();
    // Missing vendor file.
    tree.remove("devices/pci0000:00/0000:26:00.0/vendor")
        .unwrap();
    // Unreadable KFD properties (a directory where the file should be).
    tree.remove("class/kfd/kfd/topology/nodes/6/properties")
        .unwrap();
    std::fs::create_dir(
        tree.sysfs_root()
            .join("class/kfd/kfd/topology/nodes/6/properties"),
    )
    .unwrap();
    let d = discover(&tree.sysfs_root()).unwrap();
    let joined = d.warnings.join("\n");
    assert!(
        joined.contains("0000:63:00.0 skipped: no renderD"),
        "{joined}"
    );
    assert!(joined.contains("0 compute units"), "{joined}");
    assert!(joined.contains("unique_id 0"), "{joined}");
    assert!(
        joined.contains("0000:26:00.0 skipped") && joined.contains("vendor"),
        "{joined}"
    );
    assert!(joined.contains("KFD node 6 skipped"), "{joined}");
    assert_eq!(d.gpus.len(), 3, "{joined}");
}

#[test]
fn missing_render_device_is_unhealthy_and_empty_node_offers_nothing() {
    let tree = rdna_node(&[Rdna::Gfx11]).unwrap();
    tree.remove_dev("dri/renderD128").unwrap();
    let r = report(&tree, &RegistrationSettings::default());
    assert!(!r.registration.devices[0].info.health);
    let empty = FixtureTree::empty().unwrap();
    let r = report(&empty, &RegistrationSettings::default());
    assert!(r.register_annotation.is_none());
    assert!(r.to_text().contains("would remove"));
    let err = build_report(
        std::path::Path::new("/nonexistent-sys"),
        std::path::Path::new("/dev"),
        &RegistrationSettings::default(),
    )
    .unwrap_err();
    assert!(err.contains("no KFD topology"), "{err}");
}

#[test]
fn discover_subcommand_prints_the_exact_annotation() {
    let tree = rdna_node(&[Rdna::Gfx12]).unwrap();
    let bin = env!("CARGO_BIN_EXE_k8s-device-plugin");
    let out = std::process::Command::new(bin)
        .env_remove("NODE_NAME")
        .args(["discover", "--output", "json", "-split_count=3"])
        .arg("--sysfs-root")
        .arg(tree.sysfs_root())
        .arg("--dev-root")
        .arg(tree.dev_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let expected = build_report(
        &tree.sysfs_root(),
        &tree.dev_root(),
        &RegistrationSettings {
            split_count: Some(3),
            ..Default::default()
        },
    )
    .unwrap()
    .register_annotation
    .unwrap();
    assert_eq!(v["registerAnnotation"], expected);
    assert_eq!(v["gpus"][0]["cuPerWGP"], 2);
    assert_eq!(v["devices"][0]["kubeletIds"].as_array().unwrap().len(), 3);
    let text = std::process::Command::new(bin)
        .args(["discover", "--sysfs-root"])
        .arg(tree.sysfs_root())
        .arg("--dev-root")
        .arg(tree.dev_root())
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("hami.io/node-amd-register=[{"), "{text}");
    // Bad input: a wrong root says what to fix, exit 1; a bad flag value exits 2.
    let bad = std::process::Command::new(bin)
        .args(["discover", "--sysfs-root", "/nonexistent"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--sysfs-root"));
    let bad = std::process::Command::new(bin)
        .args(["discover", "-device_memory_scaling=-1"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn mi308x_qpx_nps4_offers_32_partitions_of_count_one() {
    let tree = mi308x_qpx().unwrap();
    let r = report(&tree, &RegistrationSettings::default());
    assert!(
        r.discovery.warnings.is_empty(),
        "{:?}",
        r.discovery.warnings
    );
    assert_eq!(r.discovery.gpus.len(), 8);
    let g = &r.discovery.gpus[0];
    assert_eq!(g.bdf, "0000:0a:00.0");
    assert_eq!(g.market_name, "AMD Instinct MI308X");
    assert_eq!(
        (
            g.compute_partition.as_deref(),
            g.memory_partition.as_deref()
        ),
        (Some("QPX"), Some("NPS4"))
    );
    assert_eq!(g.partitions.len(), 4);
    assert_eq!(g.compute_units(), 80);
    let devices = decode_node_devices(r.register_annotation.as_deref().unwrap()).unwrap();
    assert_eq!(devices.len(), 32);
    assert!(
        devices
            .iter()
            .all(|d| d.count == 1 && d.mode == DeviceMode::Xcp)
    );
    assert!(devices.iter().all(|d| d.devcore == 20));
    // NPS4: each partition's own memory bank, from the capture (48 GiB; the last one of
    // each card is 16 MiB smaller).
    assert_eq!(
        devices[..4].iter().map(|d| d.devmem).collect::<Vec<_>>(),
        [49152, 49152, 49152, 49136]
    );
    let ids: std::collections::BTreeSet<_> = devices.iter().map(|d| &d.id).collect();
    assert_eq!(ids.len(), 32);
    assert_eq!(devices[1].id, format!("{}-1", rocr_id(598046273873802902)));
    assert_eq!(devices.iter().filter(|d| d.numa == 1).count(), 16);
    // The CLI shows the same: 32 entries of count 1.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_k8s-device-plugin"))
        .args(["discover", "--sysfs-root"])
        .arg(tree.sysfs_root())
        .arg("--dev-root")
        .arg(tree.dev_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Devices offered: 32"), "{text}");
    assert_eq!(text.matches(" count 1 ").count(), 32, "{text}");
}

#[test]
fn utilization_maps_a_drm_client_to_its_partition() {
    use hami_amd_discovery::device_locator::{DrmClient, LocateError, drm_minor_of_path, locate};
    let tree = mi300x_cpx().unwrap();
    let devs = report(&tree, &RegistrationSettings::default())
        .registration
        .devices;
    let p3 = &devs[3];
    let by_render = locate(
        &devs,
        DrmClient {
            pdev: Some("0000:05:00.0"),
            minor: drm_minor_of_path(&format!("/dev/dri/renderD{}", p3.render)),
        },
    )
    .unwrap();
    assert_eq!(by_render.info.id, p3.info.id);
    let by_card = locate(
        &devs,
        DrmClient {
            pdev: None,
            minor: Some(p3.card),
        },
    )
    .unwrap();
    assert_eq!(by_card.info.id, p3.info.id);
    // drm-pdev alone cannot tell partitions apart: not credited to partition 0.
    assert!(matches!(
        locate(
            &devs,
            DrmClient {
                pdev: Some("0000:05:00.0"),
                minor: None
            }
        ),
        Err(LocateError::Ambiguous { partitions: 8, .. })
    ));
    assert!(matches!(
        locate(
            &devs,
            DrmClient {
                pdev: Some("0000:15:00.0"),
                minor: Some(p3.render)
            }
        ),
        Err(LocateError::PdevMismatch { .. })
    ));
    assert_eq!(drm_minor_of_path("/dev/dri/renderDx"), None);
    assert_eq!(drm_minor_of_path("/dev/kfd"), None);
    // An unpartitioned card is found by drm-pdev alone.
    let tree = mi210_xgmi().unwrap();
    let devs = report(&tree, &RegistrationSettings::default())
        .registration
        .devices;
    let d = locate(
        &devs,
        DrmClient {
            pdev: Some("0000:63:00.0"),
            minor: None,
        },
    )
    .unwrap();
    assert_eq!(d.pci_bdf, "0000:63:00.0");
}

/// PCI address of KFD node `node` of the MI210 capture.
fn mi210_bdf(node: u32) -> String {
    use hami_sysfs_fixtures::{Capture, bdf_of, capture_properties};
    let props = capture_properties(Capture::Mi210Xgmi, node).unwrap();
    let get = |k: &str| {
        props
            .iter()
            .find(|(n, _)| n == k)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap()
    };
    bdf_of(get("domain"), get("location_id"))
}

#[test]
fn absurd_sysfs_values_are_refused_and_names_sanitized() {
    let tree = mi210_xgmi().unwrap();
    let pci = |node: u32, file: &str| format!("devices/pci0000:00/{}/{file}", mi210_bdf(node));
    // simd_count u64::MAX: would publish 4,294,967,295 CUs.
    tree.set_kfd_property(2, "simd_count", &u64::MAX.to_string())
        .unwrap();
    // 1-byte VRAM: would publish 0 MiB.
    tree.write(&pci(3, "mem_info_vram_total"), "1\n").unwrap();
    // Control characters and a terminal escape in the name.
    tree.write(
        &pci(4, "product_name"),
        "AMD Instinct\nMI210\u{1b}[2J\0evil\n",
    )
    .unwrap();
    // 1 MB name.
    tree.write(&pci(5, "product_name"), &"A".repeat(1 << 20))
        .unwrap();
    // A symlink where the attribute should be (its target's content is not published).
    let secret = tree.sysfs_root().join("secret");
    std::fs::write(&secret, "AMD root:x:0:0\n").unwrap();
    let name6 = tree.sysfs_root().join(pci(6, "product_name"));
    std::fs::remove_file(&name6).unwrap();
    std::os::unix::fs::symlink(&secret, &name6).unwrap();
    // A FIFO as numa_node and as a memory bank: discovery must not wait for a writer.
    for rel in [
        pci(7, "numa_node"),
        "class/kfd/kfd/topology/nodes/7/mem_banks/0/properties".to_owned(),
    ] {
        let path = tree.sysfs_root().join(rel);
        std::fs::remove_file(&path).unwrap();
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&path)
                .status()
                .unwrap()
                .success()
        );
    }
    let started = std::time::Instant::now();
    let r = report(&tree, &RegistrationSettings::default());
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let joined = r.discovery.warnings.join("\n");
    assert!(
        joined.contains(&format!("{} skipped", mi210_bdf(2)))
            && joined.contains("more than any GPU"),
        "{joined}"
    );
    assert!(
        joined.contains(&format!("{} skipped", mi210_bdf(3)))
            && joined.contains("mem_info_vram_total 1 bytes"),
        "{joined}"
    );
    assert!(joined.contains("longer than"), "{joined}");
    assert!(joined.contains("symbolic link"), "{joined}");
    assert!(joined.contains("not a regular file"), "{joined}");
    let devices = decode_node_devices(r.register_annotation.as_deref().unwrap()).unwrap();
    assert_eq!(devices.len(), 6, "{joined}");
    let by_bdf = |node: u32| {
        devices
            .iter()
            .find(|d| d.custom_info.pci_bdf.as_deref() == Some(mi210_bdf(node).as_str()))
            .unwrap()
    };
    assert_eq!(by_bdf(4).device_type, "AMD Instinct MI210 [2J evil");
    assert_eq!(
        by_bdf(5).device_type,
        "AMD Instinct MI210",
        "unreadable name: known market name"
    );
    assert_eq!(
        by_bdf(6).device_type,
        "AMD Instinct MI210",
        "the link is not followed"
    );
    assert_eq!(by_bdf(7).numa, -1);
    for d in &devices {
        assert!(
            d.device_type
                .bytes()
                .all(|b| b.is_ascii_graphic() || b == b' ')
        );
        assert!(d.device_type.len() <= 64);
        assert!(d.devcore <= 1024 && d.devmem > 0);
    }
}

#[test]
fn duplicate_unique_ids_keep_the_node_with_disambiguated_ids_and_a_notice() {
    use hami_amd_plugin::registration::DUPLICATE_UNIQUE_ID;
    let tree = mi210_xgmi().unwrap();
    let uid = hami_sysfs_fixtures::capture_properties(hami_sysfs_fixtures::Capture::Mi210Xgmi, 8)
        .unwrap()
        .into_iter()
        .find(|(k, _)| k == "unique_id")
        .unwrap()
        .1;
    tree.set_kfd_property(9, "unique_id", &uid).unwrap();
    let r = report(&tree, &RegistrationSettings::default());
    let devices = decode_node_devices(r.register_annotation.as_deref().unwrap()).unwrap();
    assert_eq!(devices.len(), 8, "every card is kept");
    let twins: Vec<_> = r
        .registration
        .devices
        .iter()
        .filter(|d| {
            d.info.id.ends_with(&mi210_bdf(8).replace([':', '.'], "-"))
                || d.info.id.ends_with(&mi210_bdf(9).replace([':', '.'], "-"))
        })
        .collect();
    assert_eq!(twins.len(), 2);
    assert_ne!(twins[0].info.id, twins[1].info.id);
    let notices: Vec<_> = r
        .registration
        .notices
        .iter()
        .filter(|n| n.reason == DUPLICATE_UNIQUE_ID)
        .collect();
    assert_eq!(notices.len(), 2, "{notices:?}");
    assert!(notices[0].message.contains(&uid));
    // Both in one container: ROCr would match the shared UUID twice, so indices are used.
    let plan = hami_amd_plugin::allocate_plan::rocr_visible_devices(&[twins[1], twins[0]]);
    assert_eq!(plan, "1,0");
    // And `discover` succeeds (it used to exit 1 on the duplicate id).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_k8s-device-plugin"))
        .args(["discover", "--sysfs-root"])
        .arg(tree.sysfs_root())
        .arg("--dev-root")
        .arg(tree.dev_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
