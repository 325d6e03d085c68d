//! libFuzzer target for the webhook's DRA translation of a pod and ResourceSlices into
//! ResourceClaimTemplates.
//! The check is `hami_fuzz_checks::dra_webhook`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::dra_webhook(data));
