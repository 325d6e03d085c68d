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

#[test]
fn every_target_has_a_fuzz_binary() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/fuzz_targets");
    for (name, _) in hami_fuzz_checks::TARGETS {
        let file = dir.join(format!("{name}.rs"));
        let source = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: missing fuzz target: {e}", file.display()));
        assert!(
            source.contains(&format!("hami_fuzz_checks::{name}(")),
            "{} does not call its check",
            file.display()
        );
    }
}
