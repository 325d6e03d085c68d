//! The hook must load on glibc 2.34 (SPEC §5): no versioned symbol it needs may be newer.
//! Reads the built library's dynamic symbol table with `objdump -T` (binutils, which any C
//! toolchain installs).

use hami_hook_checks::{dynamic_symbols, exports, glibc_versions};

#[test]
fn the_hook_needs_nothing_newer_than_glibc_2_34() {
    let library = crate::common::hook_library();
    let text = dynamic_symbols(&library);
    let versions = glibc_versions(&text);
    assert!(
        !versions.is_empty(),
        "no GLIBC symbol versions found in {}",
        library.display()
    );
    let too_new: Vec<_> = versions
        .iter()
        .filter(|(major, minor, _)| (*major, *minor) > (2, 34))
        .collect();
    assert!(
        too_new.is_empty(),
        "symbols newer than GLIBC_2.34: {too_new:?}"
    );
    for export in ["la_version", "la_objopen", "la_symbind64"] {
        assert!(exports(&text, export), "{export} is not exported");
    }
}
