//! libFuzzer target for AdmissionReview bodies sent to the mutating webhook.
//! The check is `hami_fuzz_checks::admission_review`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::admission_review(data));
