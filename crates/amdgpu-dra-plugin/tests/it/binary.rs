//! The binary: `slices` prints the node's ResourceSlices from a real capture; a missing
//! node name is a clear usage error.

use std::process::Command;

use hami_dra_core::api::ResourceSlice;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_amdgpu-dra-plugin"))
}

#[test]
fn slices_subcommand_prints_the_pool_of_a_real_capture() {
    let tree = hami_sysfs_fixtures::mi300x_cpx().unwrap();
    let out = bin()
        .args(["--node-name", "node-a", "--sysfs-root"])
        .arg(tree.sysfs_root())
        .arg("--dev-root")
        .arg(tree.dev_root())
        .arg("slices")
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let slices: Vec<ResourceSlice> = serde_json::from_slice(&out.stdout).unwrap();
    let devices: usize = slices.iter().map(|s| s.spec.devices.len()).sum();
    assert!(devices > 8, "one device per CPX partition, got {devices}");
    for s in &slices {
        assert_eq!(s.spec.pool.name, "node-a");
        assert_eq!(s.spec.pool.resource_slice_count, slices.len() as i64);
        assert!(s.spec.devices.len() <= 64);
        assert_eq!(s.spec.driver, "amdgpu.hami-rs.io");
    }
}

#[test]
fn no_node_name_is_a_usage_error_naming_the_fix() {
    let out = bin()
        .arg("slices")
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--node-name or set NODE_NAME"));
}
