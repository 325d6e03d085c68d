//! Tests of the stand-in's `cuGetProcAddress` name resolution (kept apart from the FFI file).

use super::*;

#[test]
fn names_follow_version_and_flags() {
    assert_eq!(
        resolve_name("cuMemAlloc", 12000, 0).unwrap(),
        "cuMemAlloc_v2"
    );
    assert_eq!(resolve_name("cuMemAlloc", 3000, 0).unwrap(), "cuMemAlloc");
    assert_eq!(
        resolve_name("cuLaunchKernel", 12000, 2).unwrap(),
        "cuLaunchKernel_ptsz"
    );
    assert_eq!(
        resolve_name("cuLaunchKernel", 12000, 0).unwrap(),
        "cuLaunchKernel"
    );
    assert_eq!(
        resolve_name("cuMemAllocAsync", 11000, 0),
        Err(VERSION_NOT_SUFFICIENT)
    );
    assert_eq!(
        resolve_name("cuGetProcAddress", 12000, 0).unwrap(),
        "cuGetProcAddress_v2"
    );
}
