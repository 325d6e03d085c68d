//! libFuzzer target for kubelet's DRA v1 NodePrepareResources and NodeUnprepareResources
//! messages.
//! The check is `hami_fuzz_checks::dra_kubelet_messages`, kept there so `cargo test` replays the
//! checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::dra_kubelet_messages(data));
