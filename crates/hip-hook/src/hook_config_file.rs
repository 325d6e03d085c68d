//! This hook's [`Source`] of settings: the shared reader of `hami-kernel-locks`, with the
//! `HAMI_HOOK_CONFIG` path looked up in the pod's environment first (see `environ`).

use std::path::Path;
use std::sync::OnceLock;

use hami_protocol::hook_config::{CONTAINER_PATH, PATH_ENV};

pub use hami_kernel_locks::hook_config_file::{Source, locate};

static SOURCE: OnceLock<Source> = OnceLock::new();

/// This process's source, decided once.
pub fn source() -> &'static Source {
    SOURCE.get_or_init(|| {
        let env_path = crate::environ::pod_environ()
            .and_then(|pairs| crate::environ::lookup(&pairs, PATH_ENV).map(str::to_owned))
            .or_else(|| std::env::var(PATH_ENV).ok());
        locate(Path::new(CONTAINER_PATH), env_path)
    })
}
