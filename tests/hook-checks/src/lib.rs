//! Tests-only: what both hooks' tests (`crates/cuda-hook/tests`, `crates/hip-hook/tests`)
//! read from a built hook library's dynamic symbol table, as `objdump -T` (binutils, which
//! any C toolchain installs) prints it: the functions it exports and the glibc symbol
//! versions it needs (the glibc 2.34 baseline of SPEC §5).

use std::path::Path;
use std::process::Command;

/// `objdump -T library`'s output.
///
/// # Panics
/// If objdump is missing or fails (the message says what to install).
pub fn dynamic_symbols(library: &Path) -> String {
    let output = Command::new("objdump")
        .arg("-T")
        .arg(library)
        .output()
        .unwrap_or_else(|e| panic!("objdump (binutils) is needed to read the hook's symbols: {e}"));
    assert!(
        output.status.success(),
        "objdump -T {} failed",
        library.display()
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The functions `library` exports (defined, in `.text`).
///
/// # Panics
/// As [`dynamic_symbols`].
pub fn exported_functions(library: &Path) -> Vec<String> {
    dynamic_symbols(library)
        .lines()
        .filter(|line| line.contains(" DF .text"))
        .filter_map(|line| line.split_whitespace().last().map(str::to_owned))
        .collect()
}

/// Whether the symbol table `objdump_t` defines `name` in `.text`.
pub fn exports(objdump_t: &str, name: &str) -> bool {
    objdump_t
        .lines()
        .any(|l| l.contains(" .text") && l.ends_with(&format!(" {name}")))
}

/// `(major, minor, symbol)` of every `GLIBC_<major>.<minor>[.<patch>]` version in the symbol
/// table `objdump_t`.
pub fn glibc_versions(objdump_t: &str) -> Vec<(u32, u32, String)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.34) pthread_key_create\n\
                          0000000000000000      DF *UND*\t0000000000000000  GLIBC_2.2.5 write\n\
                          0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.38) __isoc23_strtol\n\
                          0000000000012340 g    DF .text\t0000000000000042  Base        la_version\n";

    #[test]
    fn the_parser_reads_objdump_lines() {
        let versions = glibc_versions(SAMPLE);
        assert_eq!(versions.len(), 3);
        assert_eq!(versions[1], (2, 2, "write".to_owned()));
        assert_eq!(versions[2], (2, 38, "__isoc23_strtol".to_owned()));
    }

    #[test]
    fn exports_are_defined_text_symbols_by_whole_name() {
        assert!(exports(SAMPLE, "la_version"));
        assert!(!exports(SAMPLE, "version"));
        assert!(!exports(SAMPLE, "write"));
    }
}
