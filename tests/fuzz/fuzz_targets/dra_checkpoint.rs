//! libFuzzer target for the AMD DRA driver's checkpoint file.
//! The check is `hami_fuzz_checks::dra_checkpoint`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::dra_checkpoint(data));
