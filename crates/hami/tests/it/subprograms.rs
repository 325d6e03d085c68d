//! `hami demo`, `hami apiserver`, `hami kubelet-sim`, `hami workload` run programs of the
//! stand-ins package found beside `hami` (or on PATH), git-style: arguments and exit status
//! pass through untouched, and a missing program is named with how to install it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

/// Held while a test writes an executable and while one forks: a child forked (by another
/// test's thread) while a write descriptor of an executable is open holds it until its own
/// exec, and running that executable meanwhile fails with ETXTBSY ("Text file busy"; seen
/// in CI). The other modules of this test binary fork too, without this lock: so the
/// executables are written by a child process ([`write_executable`]), and no descriptor
/// that writes one is ever open in this process for their forks to inherit.
static FORK_OR_WRITE: Mutex<()> = Mutex::new(());

/// Writes `bytes` to `path` as an executable (mode 755) from a child `sh`, fed through a
/// pipe: see [`FORK_OR_WRITE`].
fn write_executable(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut child = {
        let _held = FORK_OR_WRITE.lock().unwrap_or_else(|e| e.into_inner());
        Command::new("sh")
            .args(["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh"])
            .arg(path)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(bytes).unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "cannot write {}: {status}",
        path.display()
    );
}

/// Runs `cmd` to its end; only the fork and exec happen under [`FORK_OR_WRITE`].
fn run(cmd: &mut Command) -> Output {
    let child = {
        let _held = FORK_OR_WRITE.lock().unwrap_or_else(|e| e.into_inner());
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    child.wait_with_output().unwrap()
}

/// A directory holding a copy of the real `hami` binary, and nothing else yet.
fn install_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hami-sub-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let hami = std::fs::read(env!("CARGO_BIN_EXE_hami")).unwrap();
    write_executable(&dir.join("hami"), &hami);
    dir
}

/// A program that records its arguments one per line and exits 7.
fn recorder(dir: &Path, program: &str) -> PathBuf {
    let record = dir.join(format!("{program}.args"));
    let path = dir.join(program);
    let script = format!(
        "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > '{}'\nexit 7\n",
        record.display()
    );
    write_executable(&path, script.as_bytes());
    record
}

#[test]
fn each_subcommand_runs_its_program_with_the_arguments_and_status() {
    let dir = install_dir("pass");
    for (subcommand, program) in [
        ("demo", "hami-demo"),
        ("apiserver", "hami-apiserver"),
        ("kubelet-sim", "hami-kubelet-sim"),
        ("workload", "hami-workload"),
    ] {
        let record = recorder(&dir, program);
        // `--help` is the program's, not hami's; hyphenated values and spaces survive.
        let out = run(Command::new(dir.join("hami"))
            .args([subcommand, "--once", "--help", "-x", "a b"])
            .env("PATH", "/nonexistent"));
        assert_eq!(out.status.code(), Some(7), "{subcommand}: {out:?}");
        assert_eq!(
            std::fs::read_to_string(&record).unwrap(),
            "--once\n--help\n-x\na b\n",
            "{subcommand}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_program_on_path_is_used_when_none_is_beside_hami() {
    let dir = install_dir("path");
    let bin = dir.join("elsewhere");
    std::fs::create_dir_all(&bin).unwrap();
    let record = recorder(&bin, "hami-demo");
    let out = run(Command::new(dir.join("hami"))
        .args(["demo", "--once"])
        .env("PATH", &bin));
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(std::fs::read_to_string(&record).unwrap(), "--once\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_program_is_named_with_how_to_install_it() {
    let dir = install_dir("missing");
    let out = run(Command::new(dir.join("hami"))
        .args(["demo", "--once"])
        .env("PATH", "/nonexistent"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{stderr}");
    assert!(
        stderr.contains("`hami demo` runs the `hami-demo` program")
            && stderr.contains(&dir.display().to_string())
            && stderr.contains("cargo install --path sim/demo"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_lists_the_operator_commands_and_the_demo() {
    let out = run(Command::new(env!("CARGO_BIN_EXE_hami")).arg("--help"));
    let text = String::from_utf8_lossy(&out.stdout);
    for command in ["status", "inspect", "plan", "manifests", "ui", "demo"] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{command} "))),
            "{command} missing from:\n{text}"
        );
    }
}
