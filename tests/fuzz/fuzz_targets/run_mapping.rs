//! libFuzzer target for device-list text mapped to Allocate's device runs.
//! The check is `hami_fuzz_checks::run_mapping`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::run_mapping(data));
