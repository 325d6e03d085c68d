//! The hook must load on glibc 2.34: no versioned symbol it needs may be newer. Reads the
//! built library's dynamic symbol table with `objdump -T` (binutils).

use hami_hook_checks::{dynamic_symbols, exports, glibc_versions};

#[test]
fn the_hook_needs_nothing_newer_than_glibc_2_34_and_exports_its_wrappers() {
    let library = crate::common::hook_library();
    let text = dynamic_symbols(&library);
    let versions = glibc_versions(&text);
    assert!(
        !versions.is_empty(),
        "no GLIBC versions found in {}",
        library.display()
    );
    for (major, minor, symbol) in &versions {
        assert!(
            (*major, *minor) <= (2, 34),
            "needs a symbol newer than GLIBC_2.34: {symbol} (GLIBC_{major}.{minor})"
        );
    }
    for export in [
        "dlsym",
        "cuGetProcAddress_v2",
        "cuMemAlloc_v2",
        "cuGraphLaunch",
        "nvmlDeviceGetMemoryInfo_v2",
    ] {
        assert!(exports(&text, export), "{export} is not exported");
    }
}
