//! ResourceSlices from the real KFD captures.

use hami_amd_discovery::discovery::discover;
use hami_amd_discovery::registration::{RegistrationSettings, register};
use hami_dra_core::slice::{self, NodeRef};

fn node() -> NodeRef {
    NodeRef {
        name: "node-a".into(),
        uid: "uid-a".into(),
    }
}

#[test]
fn mi210_cards_are_sliceable_with_policies_and_xgmi_hive() {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let d = discover(&tree.sysfs_root()).unwrap();
    let reg = register(&d, &RegistrationSettings::default(), |_| true);
    let devs = slice::devices(&d, &reg, &[], "t0").unwrap();
    assert_eq!(devs.len(), d.gpus.len());
    let g = &devs[0];
    assert!(g.allow_multiple_allocations);
    assert_eq!(
        g.attributes["uuid"].string.as_deref(),
        Some(reg.devices[0].info.id.as_str())
    );
    assert!(
        g.attributes["gfxVersion"]
            .version
            .as_deref()
            .unwrap()
            .starts_with("9.0.")
    );
    assert!(g.attributes.contains_key("xgmiHive"));
    let hive = &g.attributes["xgmiHive"];
    let bdfs: Vec<&str> = d.gpus.iter().map(|g| g.bdf.as_str()).collect();
    assert!(bdfs.contains(&hive.string.as_deref().unwrap()));
    let mem = &g.capacity[slice::MEMORY];
    assert_eq!(
        hami_dra_core::quantity::parse(&mem.value).unwrap(),
        reg.devices[0].info.devmem << 20
    );
    let p = mem.request_policy.as_ref().unwrap();
    assert_eq!(p.valid_range.as_ref().unwrap().step.as_deref(), Some("1Mi"));
    let shares = &g.capacity[slice::SHARES];
    assert_eq!(shares.value, reg.devices[0].info.count.to_string());
    assert_eq!(
        shares.request_policy.as_ref().unwrap().default.as_deref(),
        Some("1")
    );
}

#[test]
fn partitions_count_once_and_are_exclusive() {
    let tree = hami_sysfs_fixtures::mi300x_cpx().unwrap();
    let d = discover(&tree.sysfs_root()).unwrap();
    let reg = register(&d, &RegistrationSettings::default(), |_| true);
    let devs = slice::devices(&d, &reg, &[], "t0").unwrap();
    let parts = d.gpus.iter().map(|g| g.partitions.len()).sum::<usize>();
    assert_eq!(devs.len(), parts);
    assert!(
        devs.iter()
            .all(|x| !x.allow_multiple_allocations && x.capacity[slice::SHARES].value == "1")
    );
    assert!(
        devs.iter()
            .all(|x| x.capacity.values().all(|c| c.request_policy.is_none()))
    );
    assert!(devs[1].name.starts_with("gpu-0-cpx-"), "{}", devs[1].name);
    let names: std::collections::BTreeSet<_> = devs.iter().map(|x| &x.name).collect();
    assert_eq!(names.len(), devs.len());
}

#[test]
fn rdna_steps_compute_units_by_wgp() {
    let tree = hami_sysfs_fixtures::rdna_node(&[hami_sysfs_fixtures::Rdna::Gfx11]).unwrap();
    let d = discover(&tree.sysfs_root()).unwrap();
    let reg = register(&d, &RegistrationSettings::default(), |_| true);
    let devs = slice::devices(&d, &reg, &[], "t0").unwrap();
    let cu = devs[0].capacity[slice::COMPUTE_UNITS]
        .request_policy
        .as_ref()
        .unwrap();
    assert_eq!(cu.valid_range.as_ref().unwrap().step.as_deref(), Some("2"));
    assert_eq!(devs[0].attributes["wgpMode"].bool, Some(true));
}

#[test]
fn unhealthy_is_tainted_not_dropped_and_generation_bumps_only_on_change() {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let d = discover(&tree.sysfs_root()).unwrap();
    let healthy = register(&d, &RegistrationSettings::default(), |_| true);
    let s1 = slice::build_slices(
        hami_dra_core::DRIVER,
        &node(),
        slice::devices(&d, &healthy, &[], "t0").unwrap(),
        &[],
    );
    assert_eq!(s1[0].spec.pool.generation, 1);
    let again = slice::build_slices(
        hami_dra_core::DRIVER,
        &node(),
        slice::devices(&d, &healthy, &s1, "t1").unwrap(),
        &s1,
    );
    assert_eq!(again, s1, "no change, no new generation");
    let bad_render = healthy.devices[0].render;
    let sick = register(&d, &RegistrationSettings::default(), |r| r != bad_render);
    let s2 = slice::build_slices(
        hami_dra_core::DRIVER,
        &node(),
        slice::devices(&d, &sick, &s1, "t2").unwrap(),
        &s1,
    );
    assert_eq!(s2[0].spec.pool.generation, 2);
    assert_eq!(s2[0].spec.devices.len(), s1[0].spec.devices.len());
    let t = &s2[0].spec.devices[0].taints;
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].effect, "NoSchedule");
    // The taint keeps its first time while the device stays sick.
    let s3 = slice::build_slices(
        hami_dra_core::DRIVER,
        &node(),
        slice::devices(&d, &sick, &s2, "t3").unwrap(),
        &s2,
    );
    assert_eq!(s3, s2);
    assert_eq!(s3[0].metadata.owner_references[0].kind, "Node");
}
