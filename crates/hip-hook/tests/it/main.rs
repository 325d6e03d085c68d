//! libamvgpu.so in real processes: the C probes (`tests/c`) against the stand-in runtime and
//! the real ROCm HIP runtime (`tests/cpp`, built with hipcc), the pod configuration, internal
//! errors behind the fault switch, several runtimes in one process, and the glibc baseline.
//! The helpers (built libraries, compiled probes, scratch directories) are in `common`; every
//! compiled program has its own name in the one runtime directory, built once per process.

mod common;
mod glibc_baseline;
mod internal_errors;
mod pod_config;
mod processes;
mod real_runtime;
mod runtimes;
