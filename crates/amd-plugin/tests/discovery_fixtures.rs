//! Discovery and registration on the real KFD captures and synthesized RDNA cards.

use hami_amd_plugin::discover_report::build_report;
use hami_amd_plugin::discovery::discover;
use hami_amd_plugin::registration::{OperatingMode, RegistrationSettings};
use hami_protocol::identity::{amd_smi_uuid, rocr_id};
use hami_protocol::node_register::{DeviceMode, decode_node_devices};
use hami_sysfs_fixtures::{FixtureTree, Rdna, mi210_xgmi, mi300x_cpx, one_gpu, rdna_node};

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
    assert_eq!(
        (p3.devcore, p3.devmem, p3.count, p3.index),
        (38, 196288 / 8, 10, 4)
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
