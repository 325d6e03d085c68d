//! Labels from the fixtures, and the patch that keeps them current.

use std::collections::BTreeMap;

use hami_amd_discovery::discovery::discover;
use hami_node_labeller::{label_patch, label_value, labels};
use hami_sysfs_fixtures::{Rdna, mi300x_cpx, rdna_node};

#[test]
fn mi300x_labels() {
    let tree = mi300x_cpx().unwrap();
    let l = labels(&discover(&tree.sysfs_root()).unwrap());
    assert_eq!(l["amd.com/gpu.family"], "AI");
    assert_eq!(l["amd.com/gpu.device-id"], "74a1");
    assert_eq!(l["amd.com/gpu.product-name"], "AMD_Instinct_MI300X_OAM");
    assert_eq!(l["amd.com/gpu.vram"], "192G");
    assert_eq!(l["amd.com/gpu.compute-memory-partition"], "cpx_nps1");
    assert_eq!(l["amd.com/gpu.compute-partitioning-supported"], "true");
    assert_eq!(l["amd.com/gpu.driver-version"], "6.12.12");
    // GPU 8 has 7 partitions found: two distinct CU counts → counted labels.
    assert_eq!(l["amd.com/gpu.cu-count.304"], "7");
    assert_eq!(l["amd.com/gpu.cu-count.266"], "1");
}

#[test]
fn mixed_rdna_node_and_patch() {
    let tree = rdna_node(&[Rdna::Gfx11, Rdna::Gfx12]).unwrap();
    let desired = labels(&discover(&tree.sysfs_root()).unwrap());
    assert_eq!(desired["amd.com/gpu.family.GC_11_0_0"], "1");
    assert_eq!(desired["amd.com/gpu.family.GC_12_0_0"], "1");
    assert_eq!(
        desired["amd.com/gpu.compute-partitioning-supported"],
        "false"
    );
    let current: BTreeMap<String, String> = [
        ("amd.com/gpu.family", "AI"),
        ("amd.com/gpu.cu-count.304", "8"),
        ("kubernetes.io/hostname", "n1"),
        ("amd.com/gpu.simd-count.192", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let patch = label_patch(&current, &desired);
    assert_eq!(patch["amd.com/gpu.family"], serde_json::Value::Null);
    assert_eq!(patch["amd.com/gpu.cu-count.304"], serde_json::Value::Null);
    assert!(
        !patch.contains_key("kubernetes.io/hostname"),
        "foreign labels untouched"
    );
    assert!(
        !patch.contains_key("amd.com/gpu.simd-count.192"),
        "unchanged labels not re-sent"
    );
    assert_eq!(
        label_value("AMD Radeon (TM) RX, 7900"),
        "AMD_Radeon_TM_RX__7900"
    );
}
