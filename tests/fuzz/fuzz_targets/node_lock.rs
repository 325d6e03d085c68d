//! libFuzzer target for node lock annotations and bind phases.
//! The check is `hami_fuzz_checks::node_lock`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::node_lock(data));
