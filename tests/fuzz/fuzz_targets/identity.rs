//! libFuzzer target for ROCr ids and kubelet device ids.
//! The check is `hami_fuzz_checks::identity`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::identity(data));
