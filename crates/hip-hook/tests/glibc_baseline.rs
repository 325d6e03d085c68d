//! The hook must load on glibc 2.34 (SPEC §5): no versioned symbol it needs may be newer.
//! Reads the built library's dynamic symbol table with `objdump -T` (binutils, which any C
//! toolchain installs).

mod common;

use std::process::Command;

fn glibc_versions(objdump_t: &str) -> Vec<(u32, u32, String)> {
    objdump_t
        .lines()
        .filter_map(|line| {
            let start = line.find("GLIBC_")?;
            let version: String = line[start + 6..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            let symbol = line.split_whitespace().last().unwrap_or("").to_owned();
            Some((parts.next()?, parts.next().unwrap_or(0), symbol))
        })
        .collect()
}

#[test]
fn the_parser_reads_objdump_lines() {
    let sample = "0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.34) pthread_key_create\n\
                  0000000000000000      DF *UND*\t0000000000000000  GLIBC_2.2.5 write\n\
                  0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.38) __isoc23_strtol\n";
    let versions = glibc_versions(sample);
    assert_eq!(versions.len(), 3);
    assert_eq!(versions[2], (2, 38, "__isoc23_strtol".to_owned()));
}

#[test]
fn the_hook_needs_nothing_newer_than_glibc_2_34() {
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
        assert!(
            text.lines()
                .any(|l| l.contains(" .text") && l.ends_with(export)),
            "{export} is not exported"
        );
    }
}
