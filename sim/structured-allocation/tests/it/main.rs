//! The structured-allocation model's integration tests, one binary: the allocator against
//! hand-built slices and claims and its properties (`allocator`), and the selector subset
//! against a real CEL, cel-python (`selector_cel_peer`).

mod allocator;
mod selector_cel_peer;
