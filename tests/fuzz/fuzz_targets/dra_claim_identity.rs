//! libFuzzer target for the claim identity the AMD DRA driver takes from kubelet's DRA v1
//! `Claim` messages (namespace, name, UID), checked before any API call or file operation.
//! The check is `hami_fuzz_checks::dra_claim_identity`, kept there so `cargo test` replays
//! the checked-in corpus through it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hami_fuzz_checks::dra_claim_identity(data));
