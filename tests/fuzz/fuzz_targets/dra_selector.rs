//! libFuzzer target for CEL device selectors of ResourceClaims and DeviceClasses.
//! The check is `hami_fuzz_checks::dra_selector`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::dra_selector(data));
