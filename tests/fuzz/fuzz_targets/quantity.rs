//! libFuzzer target for integer Kubernetes quantities.
//! The check is `hami_fuzz_checks::quantity`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::quantity(data));
