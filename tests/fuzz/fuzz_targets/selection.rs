//! libFuzzer target for steering annotations and scheduling policies.
//! The check is `hami_fuzz_checks::selection`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::selection(data));
