//! libFuzzer target for ResourceClaims' status.devices data as the monitor and `hami status`
//! read it.
//! The check is `hami_fuzz_checks::dra_claim_status`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::dra_claim_status(data));
