//! The region across sessions in one process and across processes: reserve and release
//! against the limit, slots, reclaim of dead processes' bytes (with a model-based property
//! test), hostile files at the region's path, and processes killed with SIGKILL while holding
//! locks (the `region_holder` example). `common` keeps spawning tests apart from the tests
//! that expect a dropped session's locks to be gone.

mod common;
mod hostile_files;
mod sessions;
mod sigkill;
