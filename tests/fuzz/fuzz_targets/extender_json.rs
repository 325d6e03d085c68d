//! libFuzzer target for scheduler-extender filter and bind arguments.
//! The check is `hami_fuzz_checks::extender_json`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::extender_json(data));
