//! Creating a region file the hook or plugin then owns, the same for both regions: a new
//! file only (never one already there, never through a link), mode 0600 until its creator
//! has sized it and set the mode it shares, close-on-exec.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Creates `path` read-write with `O_CREAT | O_EXCL` (fails if anything is there, a link
/// included), `O_NOFOLLOW`, `O_CLOEXEC` and mode 0600.
pub fn create_new(path: &Path) -> io::Result<File> {
    File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_once_private_and_refuses_what_is_there() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("hami-private-file-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("region");
        let file = create_new(&path).unwrap();
        let mode = file.metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & !0o600, 0, "mode {mode:o} is more than 0600");
        let again = create_new(&path).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
        let link = dir.join("link");
        std::os::unix::fs::symlink(dir.join("nowhere"), &link).unwrap();
        assert!(
            create_new(&link).is_err(),
            "created through a dangling link"
        );
        assert!(!dir.join("nowhere").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
