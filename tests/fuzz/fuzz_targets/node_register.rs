//! libFuzzer target for node register annotations (JSON).
//! The check is `hami_fuzz_checks::node_register`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::node_register(data));
