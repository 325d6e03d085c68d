//! libFuzzer target for HAMi-core shared regions (every layout version).
//! The check is `hami_fuzz_checks::hami_core_region`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::hami_core_region(data));
