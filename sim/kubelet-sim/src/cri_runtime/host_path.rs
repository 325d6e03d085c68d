//! hostPath volumes as kubelet sets them up before it creates the sandbox (its hostPath
//! plugin's type checker): `DirectoryOrCreate` and `FileOrCreate` are made when missing
//! (mode 0755, and 0644 for a file, as kubelet makes them), `Directory`, `File`, `Socket`,
//! `CharDevice` and `BlockDevice` must already be one, and no type (or `""`) is not checked
//! (containerd then makes a missing source an empty directory). A failure leaves the pod
//! waiting with kubelet's `MountVolume.SetUp failed` message, retried as kubelet retries.
//! The chart's DaemonSets name these types (`Directory` for `/sys` and `/dev`,
//! `DirectoryOrCreate` for the hook directory).

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

use k8s_openapi::api::core::v1::PodSpec;

/// Sets up every hostPath volume of the pod, or says why one cannot be.
pub(super) fn set_up(spec: &PodSpec) -> Result<(), String> {
    for volume in spec.volumes.iter().flatten() {
        let Some(host) = &volume.host_path else {
            continue;
        };
        check(Path::new(&host.path), host.type_.as_deref().unwrap_or("")).map_err(|e| {
            format!(
                "MountVolume.SetUp failed for volume \"{}\" : {e}",
                volume.name
            )
        })?;
    }
    Ok(())
}

fn check(path: &Path, kind: &str) -> Result<(), String> {
    let shown = path.display();
    let meta = std::fs::metadata(path);
    let is =
        |want: fn(&std::fs::FileType) -> bool| meta.as_ref().is_ok_and(|m| want(&m.file_type()));
    let failed = |what: &str| Err(format!("hostPath type check failed: {shown} is not {what}"));
    match kind {
        "" => Ok(()),
        "DirectoryOrCreate" if meta.is_err() => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(path)
            .map_err(|e| format!("cannot create directory {shown}: {e}")),
        "FileOrCreate" if meta.is_err() => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(path)
            .map(drop)
            .map_err(|e| format!("cannot create file {shown}: {e}")),
        "Directory" | "DirectoryOrCreate" if !is(std::fs::FileType::is_dir) => {
            failed("a directory")
        }
        "File" | "FileOrCreate" if !is(std::fs::FileType::is_file) => failed("a file"),
        "Socket" if !is(FileTypeExt::is_socket) => failed("a socket file"),
        "CharDevice" if !is(FileTypeExt::is_char_device) => failed("a character device"),
        "BlockDevice" if !is(FileTypeExt::is_block_device) => failed("a block device"),
        "Directory" | "DirectoryOrCreate" | "File" | "FileOrCreate" | "Socket" | "CharDevice"
        | "BlockDevice" => Ok(()),
        other => Err(format!("invalid HostPathType {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(volumes: serde_json::Value) -> PodSpec {
        serde_json::from_value(json!({"containers": [], "volumes": volumes})).unwrap()
    }

    fn host(name: &str, path: &Path, kind: &str) -> serde_json::Value {
        json!({"name": name, "hostPath": {"path": path.display().to_string(), "type": kind}})
    }

    #[test]
    fn types_are_checked_and_the_or_create_ones_made_as_kubelet_does() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("kubelet-sim-hostpath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, "x").unwrap();
        let socket = dir.join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();

        // What exists as its type passes; no type is never checked.
        set_up(&spec(json!([
            host("d", &dir, "Directory"),
            host("f", &file, "File"),
            host("s", &socket, "Socket"),
            host("c", Path::new("/dev/null"), "CharDevice"),
            host("none", &dir.join("missing"), ""),
            {"name": "untyped", "hostPath": {"path": "/nowhere/at/all"}},
            {"name": "scratch", "emptyDir": {}},
        ])))
        .unwrap();
        assert!(
            !dir.join("missing").exists(),
            "an untyped path is left alone"
        );

        let refused = |v: serde_json::Value| set_up(&spec(json!([v]))).unwrap_err();
        let missing = dir.join("gone");
        assert_eq!(
            refused(host("sys", &missing, "Directory")),
            format!(
                "MountVolume.SetUp failed for volume \"sys\" : hostPath type check failed: {} is not a directory",
                missing.display()
            )
        );
        assert!(refused(host("x", &file, "Directory")).ends_with("is not a directory"));
        assert!(refused(host("x", &dir, "File")).ends_with("is not a file"));
        assert!(refused(host("x", &file, "Socket")).ends_with("is not a socket file"));
        assert!(refused(host("x", &file, "CharDevice")).ends_with("is not a character device"));
        assert!(refused(host("x", &file, "BlockDevice")).ends_with("is not a block device"));
        assert!(refused(host("x", &file, "FileOrCreate ")).contains("invalid HostPathType"));
        assert!(refused(host("x", &file, "DirectoryOrCreate")).ends_with("is not a directory"));
        assert!(!missing.exists(), "nothing made for a plain Directory");

        // The OrCreate types make what is missing, with kubelet's modes.
        let made = dir.join("hook/vgpu");
        let new_file = dir.join("new.conf");
        set_up(&spec(json!([
            host("hook", &made, "DirectoryOrCreate"),
            host("conf", &new_file, "FileOrCreate"),
        ])))
        .unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert!(made.is_dir() && new_file.is_file());
        // The umask may take bits away, never add them.
        assert_eq!(mode(&made) & !0o755, 0);
        assert_eq!(mode(&new_file) & !0o644, 0);
        assert_eq!(std::fs::read(&new_file).unwrap(), b"");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
