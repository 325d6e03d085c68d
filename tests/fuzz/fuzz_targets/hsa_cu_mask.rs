//! libFuzzer target for `HSA_CU_MASK` environment values.
//! The check is `hami_fuzz_checks::hsa_cu_mask`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::hsa_cu_mask(data));
