//! Replays every checked-in corpus input (seeds from real captures and examples, plus what
//! fuzzing kept) through its target's check: a crash the fuzzer found stays fixed.

use std::path::{Path, PathBuf};

fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}

#[test]
fn every_target_has_a_seed_corpus_and_its_inputs_hold() {
    let root = corpus_root();
    let mut replayed = 0usize;
    for (name, check) in hami_fuzz_checks::TARGETS {
        let dir = root.join(name);
        let entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: no corpus for target {name}: {e}", dir.display()))
            .map(|entry| entry.expect("corpus entry").path())
            .collect();
        assert!(
            !entries.is_empty(),
            "{}: the seed corpus is empty",
            dir.display()
        );
        for path in entries {
            let data = std::fs::read(&path).expect("corpus file");
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(
                outcome.is_ok(),
                "{name}: {} breaks the check",
                path.display()
            );
            replayed += 1;
        }
    }
    assert!(replayed >= hami_fuzz_checks::TARGETS.len());
}

/// `tests/fuzz/run.sh` fuzzes one target per corpus folder, through the one binary that
/// dispatches on the folder's name: a folder no target answers to would fail CI's fuzz stage
/// only after the whole fuzz build, so it fails here first.
#[test]
fn every_corpus_folder_is_a_target_the_fuzz_binary_runs() {
    // The fuzz binary's targets: these checks, plus the web UI's form body (replayed by
    // `crates/webui/tests/it/whatif_corpus.rs`).
    let mut known: Vec<&str> = hami_fuzz_checks::TARGETS.iter().map(|(n, _)| *n).collect();
    known.push("whatif_scenario");
    let mut folders: Vec<String> = std::fs::read_dir(corpus_root())
        .expect("tests/fuzz/corpus")
        .map(|entry| {
            entry
                .expect("corpus entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    folders.sort();
    for folder in &folders {
        assert!(
            known.contains(&folder.as_str()),
            "tests/fuzz/corpus/{folder} names no target of tests/fuzz/src/main.rs"
        );
    }
    assert_eq!(
        folders.len(),
        known.len(),
        "every target has its corpus folder"
    );
    let source =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/src/main.rs"))
            .expect("tests/fuzz/src/main.rs");
    assert!(
        source.contains("hami_fuzz_checks::TARGETS")
            && source.contains("hami_webui::whatif::check_form_body"),
        "the fuzz binary dispatches over every check"
    );
}
