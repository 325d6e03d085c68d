//! libFuzzer target for hook configuration files.
//! The check is `hami_fuzz_checks::hook_config`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::hook_config(data));
