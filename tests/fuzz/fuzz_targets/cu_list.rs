//! libFuzzer target for CU id lists.
//! The check is `hami_fuzz_checks::cu_list`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::cu_list(data));
