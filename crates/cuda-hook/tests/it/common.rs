//! Shared by the process tests: finds the built libraries (`cargo test` builds the hook — an
//! rlib the tests link — and the stand-ins — dev-dependencies — into `target/<profile>/deps/`),
//! lays them out like a driver install (`libcuda.so.1`, `libnvidia-ml.so.1`: the NVML
//! stand-in's file is `libnvidia_ml.so` since Rust names cannot hold '-'), compiles the C
//! probe with `cc -lcuda`, and runs it under `LD_PRELOAD`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) fn deps_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

fn built(name: &str) -> PathBuf {
    let path = deps_dir().join(name);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// `libvgpu.so` of this build; `VGPU_HOOK_LIBRARY` names another one (the benchmark's
/// "before" figures run an older build against the same stand-in driver).
pub(crate) fn hook_library() -> PathBuf {
    match std::env::var_os("VGPU_HOOK_LIBRARY") {
        Some(path) => PathBuf::from(path),
        None => built("libvgpu.so"),
    }
}

/// A directory laid out like the driver's lib dir.
pub(crate) fn driver_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_string_lossy().into_owned();
        let dir = deps_dir().join(format!("cuda-tests-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for link in ["libcuda.so.1", "libcuda.so"] {
            std::os::unix::fs::symlink(built("libcuda.so"), dir.join(link)).unwrap();
        }
        for link in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
            std::os::unix::fs::symlink(built("libnvidia_ml.so"), dir.join(link)).unwrap();
        }
        dir
    })
    .clone()
}

/// Compiles `tests/c/<name>.c` into the driver directory as `<name>`, linked against the
/// stand-in driver with `libs`.
fn compile_probe(name: &str, libs: &[&str]) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let dir = driver_dir();
    let out = dir.join(name);
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O1", "-o"])
        .arg(&out)
        .arg(&source)
        .arg(format!("-L{}", dir.display()))
        .args(libs)
        .status()
        .unwrap_or_else(|e| panic!("a C compiler (cc) is needed for the process tests: {e}"));
    assert!(status.success(), "compiling {} failed", source.display());
    out
}

/// The C probe, linked against the stand-in driver like a CUDA application.
pub(crate) fn probe() -> PathBuf {
    static PROBE: OnceLock<PathBuf> = OnceLock::new();
    PROBE
        .get_or_init(|| compile_probe("cuda_probe", &["-lcuda", "-ldl", "-lpthread"]))
        .clone()
}

/// A fresh directory per test (region file, stand-in device state).
pub(crate) fn scratch(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "vgpu-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `tests/c/fault_probe.c`: calls one export by name (tests/it/internal_errors.rs).
pub(crate) fn fault_probe() -> PathBuf {
    static PROBE: OnceLock<PathBuf> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // Linked like a CUDA application, though it calls the driver only by name.
            compile_probe("fault_probe", &["-Wl,--no-as-needed", "-lcuda", "-ldl"])
        })
        .clone()
}

/// The probe under the hook, with the stand-in devices of `scratch` and `env`.
pub(crate) fn command(scratch: &Path, env: &[(&str, String)], args: &[&str]) -> Command {
    command_for(&probe(), scratch, env, args)
}

/// `program` under the hook, as [`command`] runs the probe.
pub(crate) fn command_for(
    program: &Path,
    scratch: &Path,
    env: &[(&str, String)],
    args: &[&str],
) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LD_LIBRARY_PATH", driver_dir())
        .env("LD_PRELOAD", hook_library())
        .env("FAKE_CUDA_SHARED_STATE", scratch.join("devices.state"))
        .env(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            scratch.join("cudevshr.cache"),
        )
        .env("FAKE_CUDA_DEVICE_MEMORY", "1g")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// The probe on the stand-in driver alone (no hook).
pub(crate) fn plain_command(scratch: &Path, args: &[&str]) -> Command {
    let mut cmd = command(scratch, &[], args);
    cmd.env_remove("LD_PRELOAD");
    cmd
}

pub(crate) fn run(scratch: &Path, env: &[(&str, String)], args: &[&str]) -> (String, String) {
    finish(command(scratch, env, args), args)
}

pub(crate) fn run_plain(scratch: &Path, args: &[&str]) -> (String, String) {
    finish(plain_command(scratch, args), args)
}

fn finish(mut command: Command, args: &[&str]) -> (String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    );
    assert!(
        status.success(),
        "probe {args:?} failed: {status}\n{out}\n{err}"
    );
    (out, err)
}

/// Bytes the stand-in device 0 has in use (its own counter, not the hook's).
pub(crate) fn device_used(scratch: &Path) -> u64 {
    let bytes = std::fs::read(scratch.join("devices.state")).unwrap_or_default();
    bytes
        .get(0..8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
}

pub(crate) fn device_peak(scratch: &Path) -> u64 {
    let bytes = std::fs::read(scratch.join("devices.state")).unwrap_or_default();
    bytes
        .get(8..16)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
}

/// The stand-in driver's kernel side: answers each connection with the peer's pid in this
/// (the host's) PID namespace, as the kernel tells a driver (`SO_PEERCRED`); a real driver
/// reports host pids. Stops when the returned flag is set.
pub(crate) fn serve_driver_socket(path: &Path) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok((mut stream, _)) = listener.accept() else {
                std::thread::sleep(std::time::Duration::from_millis(5));
                continue;
            };
            let mut cred = libc::ucred {
                pid: 0,
                uid: 0,
                gid: 0,
            };
            let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
            // SAFETY: SO_PEERCRED writes a ucred of `len` bytes into `cred`.
            let rc = unsafe {
                libc::getsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&stream),
                    libc::SOL_SOCKET,
                    libc::SO_PEERCRED,
                    (&mut cred as *mut libc::ucred).cast(),
                    &mut len,
                )
            };
            if rc == 0 {
                let _ = std::io::Write::write_all(&mut stream, cred.pid.to_string().as_bytes());
            }
        }
    });
    stop
}
