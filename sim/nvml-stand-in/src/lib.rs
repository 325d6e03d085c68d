//! Stand-in NVML, `libnvidia-ml.so.1` (SPEC §8). See README.md.
// The C ABI this library exports is its public surface: `pub extern "C"` functions with
// `#[no_mangle]`, reached by the dynamic linker, not by Rust paths; their ABI types are
// `pub` for the same reason. `unreachable_pub` cannot see that, so it is off here only.
#![allow(unreachable_pub)]

mod api;
mod events;
#[path = "../../cuda-stand-in/src/fake_state.rs"]
#[allow(dead_code)]
mod fake_state;
