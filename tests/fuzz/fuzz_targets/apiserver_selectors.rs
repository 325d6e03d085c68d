//! libFuzzer target for label and field selectors given to the embedded API server.
//! The check is `hami_fuzz_checks::apiserver_selectors`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::apiserver_selectors(data));
