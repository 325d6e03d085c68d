//! Small readers over a sysfs root that can be relocated for tests (`--sysfs-root`).
//! Every error names the file, so an operator knows what the kernel did not provide.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A sysfs file that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct SysfsError {
    /// The sysfs file or directory.
    pub path: String,
    /// What is wrong with it.
    pub problem: String,
}

impl SysfsError {
    /// An error about `path`.
    pub fn new(path: &Path, problem: impl Into<String>) -> Self {
        Self {
            path: path.display().to_string(),
            problem: problem.into(),
        }
    }
}

/// The most a sysfs attribute may hold: the kernel hands out one page per attribute; KFD
/// `properties` files are about 1.5 KiB. Anything larger is not what the driver wrote.
pub const MAX_ATTRIBUTE_BYTES: u64 = 64 * 1024;

/// Reads a sysfs attribute the way a hostile tree cannot exploit: the last component must
/// not be a symlink (`O_NOFOLLOW`), opening never blocks (`O_NONBLOCK`: a FIFO would wait
/// for a writer forever), it must be a regular file, at most [`MAX_ATTRIBUTE_BYTES`] long
/// and UTF-8. `Ok(None)` when it does not exist.
pub fn read_attribute(path: &Path) -> Result<Option<String>, SysfsError> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(SysfsError::new(
                path,
                "is a symbolic link, not a sysfs attribute: not followed",
            ));
        }
        Err(e) => return Err(SysfsError::new(path, format!("cannot read: {e}"))),
    };
    let meta = file
        .metadata()
        .map_err(|e| SysfsError::new(path, format!("cannot stat: {e}")))?;
    if !meta.is_file() {
        return Err(SysfsError::new(
            path,
            format!("is not a regular file ({:?}): not read", meta.file_type()),
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_ATTRIBUTE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| SysfsError::new(path, format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_ATTRIBUTE_BYTES {
        return Err(SysfsError::new(
            path,
            format!("is longer than {MAX_ATTRIBUTE_BYTES} bytes: not a sysfs attribute"),
        ));
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| SysfsError::new(path, "is not UTF-8 text"))
}

/// Reads a one-value file, trimmed.
pub fn read_trimmed(path: &Path) -> Result<String, SysfsError> {
    read_attribute(path)?
        .map(|s| s.trim().to_owned())
        .ok_or_else(|| SysfsError::new(path, "cannot read: No such file or directory"))
}

/// Reads an optional one-value file: `None` when it does not exist or is empty.
pub fn read_optional(path: &Path) -> Result<Option<String>, SysfsError> {
    Ok(read_attribute(path)?
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty()))
}

/// Parses a decimal or `0x` hexadecimal integer (sysfs uses both).
pub fn parse_int(text: &str) -> Option<i64> {
    let t = text.trim();
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(hex, 16).ok()
    } else {
        t.parse().ok()
    }
}

/// Reads an integer file (decimal or hex).
pub fn read_int(path: &Path) -> Result<i64, SysfsError> {
    let text = read_trimmed(path)?;
    parse_int(&text).ok_or_else(|| SysfsError::new(path, format!("{text:?} is not an integer")))
}

/// A KFD `properties` file: `name value` lines. Values are kept as text because some are
/// u64 (`unique_id`, `hive_id`) and a few are not numbers at all on some kernels.
pub fn read_properties(path: &Path) -> Result<BTreeMap<String, String>, SysfsError> {
    let text = read_attribute(path)?
        .ok_or_else(|| SysfsError::new(path, "cannot read: No such file or directory"))?;
    Ok(parse_properties(&text))
}

/// Parses `name value` lines; blank and value-less lines are ignored.
pub fn parse_properties(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let name = parts.next()?;
            let value = parts.next()?;
            Some((name.to_owned(), value.to_owned()))
        })
        .collect()
}

/// Names of the entries of a directory, sorted; an absent directory is empty.
pub fn list_dir(path: &Path) -> Result<Vec<String>, SysfsError> {
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(SysfsError::new(path, format!("cannot list: {e}"))),
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// The DRM minors named in a device's `drm/` directory: `(card, render)`.
pub fn drm_minors(device_dir: &Path) -> Result<(Option<u32>, Option<u32>), SysfsError> {
    let mut card = None;
    let mut render = None;
    for name in list_dir(&device_dir.join("drm"))? {
        if let Some(n) = name.strip_prefix("renderD").and_then(|n| n.parse().ok()) {
            render = Some(n);
        } else if let Some(n) = name.strip_prefix("card").and_then(|n| n.parse().ok()) {
            card = Some(n);
        }
    }
    Ok((card, render))
}

/// Joins a path below a root, for readability at call sites.
pub fn under(root: &Path, rel: &str) -> PathBuf {
    root.join(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_and_properties() {
        assert_eq!(parse_int("0x1002\n"), Some(0x1002));
        assert_eq!(parse_int("-1"), Some(-1));
        assert_eq!(parse_int("x"), None);
        let props = parse_properties("simd_count 152\n\nunique_id 16404946649897475633\nbad\n");
        assert_eq!(props["simd_count"], "152");
        assert_eq!(props["unique_id"], "16404946649897475633");
        assert!(!props.contains_key("bad"));
    }

    #[test]
    fn hostile_attributes_are_refused_without_hanging() {
        let dir = std::env::temp_dir().join(format!("hami-sysfs-attr-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret"), "hunter2\n").unwrap();
        std::os::unix::fs::symlink(dir.join("secret"), dir.join("product_name")).unwrap();
        let err = read_optional(&dir.join("product_name")).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        let fifo = dir.join("fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        // No writer ever comes: a blocking open would hang here.
        let err = read_trimmed(&fifo).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        std::fs::write(dir.join("big"), vec![b'x'; 1 << 20]).unwrap();
        let err = read_trimmed(&dir.join("big")).unwrap_err();
        assert!(err.to_string().contains("longer than"), "{err}");
        std::fs::write(dir.join("bin"), [0xff, 0xfe]).unwrap();
        assert!(read_trimmed(&dir.join("bin")).is_err());
        assert!(
            read_trimmed(&dir)
                .unwrap_err()
                .to_string()
                .contains(&dir.display().to_string())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_files_name_the_path() {
        let err = read_trimmed(Path::new("/nonexistent/hami/vendor")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/hami/vendor"));
        assert_eq!(read_optional(Path::new("/nonexistent/x")), Ok(None));
        assert_eq!(list_dir(Path::new("/nonexistent")), Ok(vec![]));
    }
}
