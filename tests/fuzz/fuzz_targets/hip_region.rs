//! libFuzzer target for the HIP hook's shared region.
//! The check is `hami_fuzz_checks::hip_region`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::hip_region(data));
