//! Stand-in NVML, `libnvidia-ml.so.1` (SPEC §8). See README.md.

mod api;
mod events;
#[path = "../../cuda-stand-in/src/fake_state.rs"]
#[allow(dead_code)]
mod fake_state;
