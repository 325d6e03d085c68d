//! libFuzzer target for the web UI's What-if form: the POST body (form encoding) decoded to a
//! scenario, parsed and bounded by `hami_webui::whatif::admit` with the UI's limits. Any
//! body must come back as a scenario within every limit or as a 400/413 saying what to
//! change: no panic, and nothing built by a number the body wrote (libFuzzer's RSS and time
//! limits catch an allocation by a huge count). `crates/webui/tests/it/whatif_corpus.rs`
//! replays the checked-in corpus through the same check.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_webui::whatif::check_form_body(data));
