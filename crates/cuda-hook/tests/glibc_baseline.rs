//! The hook must load on glibc 2.34: no versioned symbol it needs may be newer. Reads the
//! built library's dynamic symbol table with `objdump -T` (binutils).

mod common;

use std::process::Command;

#[test]
fn the_hook_needs_nothing_newer_than_glibc_2_34_and_exports_its_wrappers() {
    let library = common::hook_library();
    let output = Command::new("objdump")
        .arg("-T")
        .arg(&library)
        .output()
        .unwrap_or_else(|e| {
            panic!("objdump (binutils) is needed to check the glibc baseline: {e}")
        });
    assert!(output.status.success(), "objdump -T failed");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut seen = 0;
    for line in text.lines() {
        let Some(start) = line.find("GLIBC_") else {
            continue;
        };
        let version: String = line[start + 6..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let v = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        assert!(v <= (2, 34), "needs a symbol newer than GLIBC_2.34: {line}");
        seen += 1;
    }
    assert!(seen > 0, "no GLIBC versions found in {}", library.display());
    for export in [
        "dlsym",
        "cuGetProcAddress_v2",
        "cuMemAlloc_v2",
        "cuGraphLaunch",
        "nvmlDeviceGetMemoryInfo_v2",
    ] {
        assert!(
            text.lines()
                .any(|l| l.contains(" .text") && l.ends_with(&format!(" {export}"))),
            "{export} is not exported"
        );
    }
}
