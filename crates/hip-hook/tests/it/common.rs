//! Shared by the process tests: finds the built libraries, compiles the C test program
//! against the stand-in runtime (as ROCm applications link), and runs it under LD_AUDIT.
//!
//! `cargo test` builds both libraries into `target/<profile>/deps/` before any test runs: the
//! hook because this crate's lib is also an rlib the tests link, the stand-in because it is a
//! dev-dependency. The tests find them next to their own executable.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) fn deps_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

pub(crate) fn hook_library() -> PathBuf {
    let path = deps_dir().join("libamvgpu.so");
    assert!(path.exists(), "{} was not built", path.display());
    path
}

pub(crate) fn stand_in_library() -> PathBuf {
    let path = deps_dir().join("libamdhip64.so");
    assert!(path.exists(), "{} was not built", path.display());
    path
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binding {
    /// `-z lazy`: HIP symbols are bound on first call.
    Lazy,
    /// `-z now`: bound at start-up (what Rust and many distributions build).
    Now,
}

/// A directory laid out like ROCm's lib dir: `libamdhip64.so.6` and `libamdhip64.so`.
pub(crate) fn runtime_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_string_lossy().into_owned();
        let dir = deps_dir().join(format!("hip-tests-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for link in ["libamdhip64.so.6", "libamdhip64.so"] {
            std::os::unix::fs::symlink(stand_in_library(), dir.join(link)).unwrap();
        }
        dir
    })
    .clone()
}

/// The C test program, compiled once per binding.
pub(crate) fn probe(binding: Binding) -> PathBuf {
    static LAZY: OnceLock<PathBuf> = OnceLock::new();
    static NOW: OnceLock<PathBuf> = OnceLock::new();
    let cell = if binding == Binding::Lazy {
        &LAZY
    } else {
        &NOW
    };
    cell.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let source = manifest.join("tests/c/hip_probe.c");
        let include = manifest.join("../../sim/hip-stand-in/include");
        let dir = runtime_dir();
        let out = dir.join(match binding {
            Binding::Lazy => "hip_probe_lazy",
            Binding::Now => "hip_probe_now",
        });
        let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .arg("-O1")
            .arg("-o")
            .arg(&out)
            .arg(&source)
            .arg("-I")
            .arg(&include)
            .arg(format!("-L{}", dir.display()))
            .arg("-lamdhip64")
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg(match binding {
                Binding::Lazy => "-Wl,-z,lazy",
                Binding::Now => "-Wl,-z,now",
            })
            .args(["-lpthread", "-ldl"])
            .status()
            .expect("a C compiler (cc) is needed to build the test program");
        assert!(status.success(), "compiling {} failed", source.display());
        out
    })
    .clone()
}

/// `tests/c/hip_dlopen.c`: links no runtime, opens runtimes by path.
pub(crate) fn dlopen_probe() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/hip_dlopen.c");
            let out = runtime_dir().join("hip_dlopen");
            let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
                .args(["-O1", "-o"])
                .arg(&out)
                .arg(&source)
                .arg("-ldl")
                .status()
                .expect("a C compiler (cc) is needed to build the test program");
            assert!(status.success(), "compiling {} failed", source.display());
            out
        })
        .clone()
}

/// `tests/c/rocr_part.c` as a shared object: a runtime part (it defines `hsa_init`) whose
/// `getenv`/`secure_getenv` calls the hook answers.
pub(crate) fn runtime_part() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/rocr_part.c");
            let out = runtime_dir().join("librocr_part.so");
            let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
                .args(["-O1", "-shared", "-fPIC", "-o"])
                .arg(&out)
                .arg(&source)
                .status()
                .expect("a C compiler (cc) is needed to build the test program");
            assert!(status.success(), "compiling {} failed", source.display());
            out
        })
        .clone()
}

/// A copy (its own inode, so the linker loads it as a separate object) of the stand-in
/// runtime at `dir/name`.
pub(crate) fn runtime_copy(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::copy(stand_in_library(), &path).unwrap();
    path
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A fresh scratch directory for one test.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("amvgpu-{}-{name}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A probe invocation with a clean environment.
pub(crate) struct Run {
    pub command: Command,
}

impl Run {
    /// `hooked`: with `LD_AUDIT` set to the hook. The region lives in `dir`.
    pub(crate) fn new(binding: Binding, dir: &Path, hooked: bool) -> Run {
        let mut command = Command::new(probe(binding));
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env(
                "HIP_DEVICE_MEMORY_SHARED_CACHE",
                dir.join("hipdevshr.cache"),
            );
        if hooked {
            command.env("LD_AUDIT", hook_library());
        }
        Run { command }
    }

    pub(crate) fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Run {
        self.command.env(key, value);
        self
    }

    pub(crate) fn run(mut self, args: &[&str]) -> Output {
        self.command.args(args).output().unwrap()
    }
}

/// The probe's result lines, `(operation, values)`.
pub(crate) fn lines(output: &Output) -> Vec<(String, Vec<i64>)> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let op = words.next()?.to_owned();
            Some((op, words.filter_map(|w| w.parse().ok()).collect()))
        })
        .collect()
}

/// The first value (the HIP error code) of each line, in order.
pub(crate) fn codes(output: &Output) -> Vec<i64> {
    lines(output)
        .iter()
        .map(|(_, values)| values.first().copied().unwrap_or(-1))
        .collect()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The stand-in's device counters (`FAKE_HIP_SHARED_STATE`): `(used, peak)` of `device`.
pub(crate) fn stand_in_counters(state: &Path, device: usize) -> (u64, u64) {
    let bytes = std::fs::read(state).unwrap();
    let at = device * 16;
    (
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()),
        u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap()),
    )
}
