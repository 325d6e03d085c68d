//! libFuzzer target for RFC 3339 timestamps.
//! The check is `hami_fuzz_checks::rfc3339`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::rfc3339(data));
