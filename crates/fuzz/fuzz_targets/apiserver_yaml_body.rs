#![no_main]
// The check lives in crates/fuzz-checks so cargo test replays the corpus through it.
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::apiserver_yaml_body(data));
