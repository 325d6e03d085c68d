//! libFuzzer target for Pod JSON, read into device requests.
//! The check is `hami_fuzz_checks::pod_requests`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::pod_requests(data));
