//! Replays the `whatif_scenario` fuzz target's checked-in corpus (tests/fuzz/corpus/) through
//! its check, `hami_webui::whatif::check_form_body`: what the fuzzer once found stays fixed,
//! and the seeds (the example scenario, a model count in the billions, a million nodes,
//! YAML aliases, bad encodings) hold on every `cargo test`.

use std::path::Path;

#[test]
fn every_corpus_input_holds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fuzz/corpus/whatif_scenario");
    let inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("corpus entry").path())
        .collect();
    assert!(
        inputs.len() >= 5,
        "{}: the seed corpus is missing",
        dir.display()
    );
    for path in inputs {
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| hami_webui::whatif::check_form_body(&data));
        assert!(outcome.is_ok(), "{} breaks the check", path.display());
    }
}
