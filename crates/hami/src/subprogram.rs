//! Subcommands that are other programs, git-style: `hami demo ARGS` runs `hami-demo ARGS`.
//!
//! The demo, the embedded API server, the simulated kubelet and the workload process are
//! stand-ins (`sim/`): linking them into `hami` made the operator tool carry the whole
//! test machinery (48 MB) into every install. They are separate programs of the `hami-demo`
//! package, installed beside `hami` by whoever wants the demo; `hami` only finds and runs
//! them, so `kubectl hami status` stays a small binary with no simulator in it.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Exit status when the program is not installed (what shells use for "command not found").
const NOT_FOUND: u8 = 127;

/// Replaces this process with `program` (beside this executable first, then on PATH) run
/// with `args`; returns only when that cannot be done, having said why.
pub(crate) fn run(program: &str, args: Vec<OsString>) -> ExitCode {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(program)));
    let Some(path) = find(program, beside.as_deref(), std::env::var_os("PATH")) else {
        let subcommand = program.trim_start_matches("hami-");
        eprintln!(
            "error: `hami {subcommand}` runs the `{program}` program, which is not installed \
             beside {} or on PATH. It is part of the stand-ins (sim/demo), not of the operator \
             tools: install it beside hami with `cargo install --path sim/demo --root <dir>` \
             (from a checkout of hami-rs) or put its directory on PATH.",
            beside
                .as_deref()
                .and_then(Path::parent)
                .map_or_else(|| "this program".to_owned(), |d| d.display().to_string())
        );
        return ExitCode::from(NOT_FOUND);
    };
    // `exec` only returns on failure; on success `program`'s exit status is ours.
    let error = Command::new(&path).args(args).exec();
    eprintln!("error: cannot run {}: {error}", path.display());
    ExitCode::from(1)
}

/// Where `program` is: `beside` if it is an executable file, else the first executable
/// `program` in the directories of `path` (a PATH value).
fn find(program: &str, beside: Option<&Path>, path: Option<OsString>) -> Option<PathBuf> {
    let on_path = path
        .iter()
        .flat_map(std::env::split_paths)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(program));
    beside
        .map(Path::to_path_buf)
        .into_iter()
        .chain(on_path)
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn executable(dir: &Path, name: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn beside_wins_then_path_in_order_skipping_what_cannot_run() {
        let root = std::env::temp_dir().join(format!("hami-subprogram-{}", std::process::id()));
        let (here, first, second) = (root.join("here"), root.join("a"), root.join("b"));
        for d in [&here, &first, &second] {
            std::fs::create_dir_all(d).unwrap();
        }
        let path = std::env::join_paths([&first, &second]).unwrap();
        // Not executable in the first PATH directory: the second one's is taken.
        executable(&first, "hami-demo", 0o644);
        let in_second = executable(&second, "hami-demo", 0o755);
        let beside = here.join("hami-demo");
        assert_eq!(
            find("hami-demo", Some(&beside), Some(path.clone())),
            Some(in_second)
        );
        // A directory of that name is not a program either.
        std::fs::create_dir_all(&beside).unwrap();
        assert_ne!(
            find("hami-demo", Some(&beside), Some(path.clone())),
            Some(beside.clone())
        );
        std::fs::remove_dir(&beside).unwrap();
        let beside = executable(&here, "hami-demo", 0o755);
        assert_eq!(find("hami-demo", Some(&beside), Some(path)), Some(beside));
        assert_eq!(find("hami-nothing", None, None), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
