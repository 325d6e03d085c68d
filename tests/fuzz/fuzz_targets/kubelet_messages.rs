//! libFuzzer target for kubelet's Allocate, GetPreferredAllocation and PreStartContainer messages.
//! The check is `hami_fuzz_checks::kubelet_messages`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::kubelet_messages(data));
