//! Reading the per-container configuration a device plugin mounts read-only at
//! `hami_protocol::hook_config::CONTAINER_PATH` (issue 14 item 7), the same for both hooks.
//! The file is read first; the environment is used only where no such file exists (a hook
//! without our plugins). Opened with `O_NOFOLLOW | O_NONBLOCK` (no link, no FIFO hang), as a
//! regular file of bounded size; the file at the fixed path must sit on a read-only mount
//! (the plugin's bind mount), so an image cannot ship its own. A file that cannot be used is
//! [`Source::Invalid`]: the hooks then make every limited allocation fail closed.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use hami_protocol::hook_config::{HookConfig, MAX_BYTES, PATH_ENV, decode};

/// Where the settings come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The plugin's file (or `HAMI_HOOK_CONFIG`'s where the fixed path does not exist).
    File {
        /// The file read.
        path: String,
        /// Its settings.
        config: HookConfig,
    },
    /// No file: the environment.
    Absent,
    /// A file exists but cannot be used: fail closed, with the reason.
    Invalid(String),
}

/// Reads `path`; `Ok(None)` when it does not exist.
pub fn read(path: &Path, require_read_only: bool) -> Result<Option<HookConfig>, String> {
    let shown = path.display();
    let file = match std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(format!(
                "hook config {shown} is a symbolic link; refusing it"
            ));
        }
        Err(e) => return Err(format!("cannot open the hook config {shown}: {e}")),
    };
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat the hook config {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("hook config {shown} is not a regular file"));
    }
    if meta.len() > MAX_BYTES as u64 {
        return Err(format!(
            "hook config {shown} is {} bytes, more than {MAX_BYTES}",
            meta.len()
        ));
    }
    if require_read_only {
        // SAFETY: fstatvfs on our own descriptor into a local struct.
        let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let rc = unsafe { libc::fstatvfs(file.as_raw_fd(), &mut fs) };
        if rc != 0 || fs.f_flag & libc::ST_RDONLY == 0 {
            return Err(format!(
                "hook config {shown} is not on a read-only mount (the device plugin mounts it read-only); refusing a file the container could have written"
            ));
        }
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the hook config {shown}: {e}"))?;
    decode(&bytes)
        .map(Some)
        .map_err(|e| format!("{shown}: {e}"))
}

/// Decides the source: the fixed path, else the file `HAMI_HOOK_CONFIG` names (the pod
/// spec's value, else the process's), else none.
pub fn locate(fixed: &Path, env_path: Option<String>) -> Source {
    let found = |path: &Path, read_only| match read(path, read_only) {
        Ok(Some(config)) => Some(Source::File {
            path: path.display().to_string(),
            config,
        }),
        Ok(None) => None,
        Err(reason) => Some(Source::Invalid(reason)),
    };
    if let Some(source) = found(fixed, true) {
        return source;
    }
    match env_path.filter(|p| !p.is_empty()) {
        Some(path) => found(Path::new(&path), false).unwrap_or_else(|| {
            Source::Invalid(format!("{PATH_ENV}={path} names no file; fix or unset it"))
        }),
        None => Source::Absent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("hook-config-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_fixed_path_wins_and_must_be_read_only() {
        let dir = scratch("fixed");
        let fixed = dir.join("hook.conf");
        let other = dir.join("other.conf");
        std::fs::write(&other, "hami-hook-config/1\nmemory-limit=5\n").unwrap();
        let env = Some(other.display().to_string());
        // No fixed file: the variable's file.
        match locate(&fixed, env.clone()) {
            Source::File { config, .. } => assert_eq!(config.default_memory_limit, Some(5)),
            other => panic!("{other:?}"),
        }
        // A fixed file on a writable file system is refused (an image could ship one).
        std::fs::write(&fixed, "hami-hook-config/1\n").unwrap();
        match locate(&fixed, env) {
            Source::Invalid(reason) => assert!(reason.contains("read-only"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(locate(&dir.join("none"), None), Source::Absent);
    }

    #[test]
    fn unusable_files_fail_closed_with_a_reason() {
        let dir = scratch("bad");
        let fixed = dir.join("absent");
        let bad = dir.join("bad.conf");
        std::fs::write(&bad, "hami-hook-config/1\nmemory-limit=4g\n").unwrap();
        let bad_sm = dir.join("bad-sm.conf");
        std::fs::write(&bad_sm, "hami-hook-config/1\nsm-limit=150\n").unwrap();
        let link = dir.join("link.conf");
        std::os::unix::fs::symlink(&bad, &link).unwrap();
        let cases = [
            (bad.display().to_string(), "line 2"),
            (bad_sm.display().to_string(), "line 2"),
            (link.display().to_string(), "symbolic link"),
            (dir.display().to_string(), "not a regular file"),
            (dir.join("missing").display().to_string(), "names no file"),
        ];
        for (path, needle) in cases {
            match locate(&fixed, Some(path.clone())) {
                Source::Invalid(reason) => assert!(reason.contains(needle), "{path}: {reason}"),
                other => panic!("{path}: {other:?}"),
            }
        }
    }
}
