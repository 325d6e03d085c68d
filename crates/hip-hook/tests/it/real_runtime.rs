//! The hook against the **real** HIP runtime: Debian's ROCm 5.2.3 `libamdhip64.so.5` with its
//! real headers (`libamdhip64-dev`) and `hipcc`. There is no GPU, so a call that reaches the
//! runtime fails with its own error code (hipErrorInvalidDevice 101, hipErrorNoDevice 100);
//! binding, symbol versions, struct layouts and error paths are the real ones. CI installs the
//! packages; without them these tests fail and say what to install.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::{codes, hook_library, lines, runtime_dir, scratch, stderr};

const INSTALL: &str =
    "the real HIP runtime is needed: apt-get install libamdhip64-dev hipcc (Debian's ROCm 5.2.3)";

fn hip_include() -> PathBuf {
    ["/usr/include", "/opt/rocm/include"]
        .iter()
        .map(PathBuf::from)
        .find(|dir| dir.join("hip/hip_runtime_api.h").exists())
        .unwrap_or_else(|| {
            panic!("no hip/hip_runtime_api.h in /usr/include or /opt/rocm/include: {INSTALL}")
        })
}

fn hip_lib_dir() -> PathBuf {
    ["/usr/lib/x86_64-linux-gnu", "/opt/rocm/lib"]
        .iter()
        .map(PathBuf::from)
        .find(|dir| dir.join("libamdhip64.so").exists())
        .unwrap_or_else(|| {
            panic!("no libamdhip64.so in /usr/lib/x86_64-linux-gnu or /opt/rocm/lib: {INSTALL}")
        })
}

fn compile(out: &Path, args: &[&str]) {
    let result = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(args)
        .arg("-o")
        .arg(out)
        .output()
        .expect("a C compiler (cc) is needed to build the test program");
    assert!(
        result.status.success(),
        "compiling failed: {}",
        stderr(&result)
    );
}

/// `tests/c/real_probe.c` against the real headers and runtime; `now`: `-z now`.
fn real_probe(now: bool) -> PathBuf {
    static LAZY: OnceLock<PathBuf> = OnceLock::new();
    static NOW: OnceLock<PathBuf> = OnceLock::new();
    let cell = if now { &NOW } else { &LAZY };
    cell.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/real_probe.c");
        let out = runtime_dir().join(if now {
            "real_probe_now"
        } else {
            "real_probe_lazy"
        });
        let include = format!("-I{}", hip_include().display());
        let lib = format!("-L{}", hip_lib_dir().display());
        compile(
            &out,
            &[
                "-D__HIP_PLATFORM_AMD__",
                &include,
                source.to_str().unwrap(),
                &lib,
                "-lamdhip64",
                "-ldl",
                if now { "-Wl,-z,now" } else { "-Wl,-z,lazy" },
            ],
        );
        out
    })
    .clone()
}

/// `tests/cpp/real_kernel.cpp` built with the real `hipcc` (a kernel and a launch).
fn hipcc_program() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cpp/real_kernel.cpp");
            let out = runtime_dir().join("real_kernel");
            // An explicit target, so hipcc does not look for a GPU to compile for.
            let result = Command::new("hipcc")
                .args(["--offload-arch=gfx90a", "-o"])
                .arg(&out)
                .arg(&source)
                .output()
                .unwrap_or_else(|e| panic!("cannot run hipcc ({e}): {INSTALL}"));
            assert!(result.status.success(), "hipcc failed: {}", stderr(&result));
            out
        })
        .clone()
}

/// Runs `program` under the hook with a 1 MiB limit on device 0, killing it after 60 s (a
/// hang is a failure, as is a crash).
fn run_hooked(program: &Path, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("LD_AUDIT", hook_library())
        .env("HIP_DEVICE_MEMORY_LIMIT_0", "1m")
        .env(
            "HIP_DEVICE_MEMORY_SHARED_CACHE",
            dir.join("hipdevshr.cache"),
        )
        .env("LIBHIP_LOG_LEVEL", "4")
        .envs(env.iter().copied())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{} hung under the hook", program.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{} crashed or failed under the hook: {:?}\n{}",
        program.display(),
        out.status,
        stderr(&out)
    );
    out
}

#[test]
fn the_real_5_2_header_puts_location_id_where_the_hook_reads_it() {
    let dir = scratch("real-layout");
    let out = run_hooked(&real_probe(false), &dir, &[], &["layout", "version"]);
    let results = lines(&out);
    // hipMemAllocationProp.location.id, .requestedHandleType, hipMemPoolProps.location.id
    assert_eq!(results[0].1, [0, 8, 12, 12], "{results:?}");
    assert_eq!(results[1].1[0], 0);
    let version = results[1].1[1];
    assert!((50_200_000..50_300_000).contains(&version), "{version}");
    // The offsets the hook uses for this version are the header's.
    let err = stderr(&out);
    assert!(
        err.contains("HIP runtime 0: ") && err.contains("libamdhip64.so.5"),
        "{err}"
    );
}

#[test]
fn hip_mem_create_on_the_real_runtime_is_charged_to_the_right_device() {
    let dir = scratch("real-memcreate");
    let out = run_hooked(
        &real_probe(false),
        &dir,
        &[],
        &[
            "memcreate",
            "0",
            "2097152", // device 0, over its 1 MiB limit: refused here
            "memcreate",
            "1",
            "2097152", // device 1, unlimited: reaches the runtime
            "memcreate",
            "0",
            "1048576", // fits: reaches the runtime, which fails...
            "memcreate",
            "0",
            "1048576", // ...so the reservation was released
            "memcreate",
            "0",
            "1048577",
        ],
    );
    assert_eq!(codes(&out), [2, 101, 101, 101, 2], "{}", stderr(&out));
}

/// How a binding is made, the program, its extra environment, its arguments.
type BindingCase = (
    &'static str,
    PathBuf,
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
);

#[test]
fn every_way_of_binding_the_real_runtime_is_caught() {
    // The real runtime's symbols are versioned (hipMalloc@@hip_4.2): the program's references
    // carry the version.
    let lazy = real_probe(false);
    let dump = Command::new("objdump")
        .arg("-T")
        .arg(&lazy)
        .output()
        .expect("objdump (binutils) is needed");
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dump.lines()
            .any(|l| l.contains("hip_4.2") && l.ends_with(" hipMalloc")),
        "the probe does not reference a versioned hipMalloc:\n{dump}"
    );
    let cases: [BindingCase; 5] = [
        ("PLT, lazy", lazy.clone(), &[], &["malloc", "4096"]),
        ("-z now", real_probe(true), &[], &["malloc", "4096"]),
        (
            "LD_BIND_NOW",
            lazy.clone(),
            &[("LD_BIND_NOW", "1")],
            &["malloc", "4096"],
        ),
        ("dlsym", lazy.clone(), &[], &["dlsym", "4096"]),
        ("dlopen + dlsym", lazy.clone(), &[], &["dlopen", "4096"]),
    ];
    for (how, program, env, args) in cases {
        let dir = scratch("real-bindings");
        let out = run_hooked(&program, &dir, env, args);
        let err = stderr(&out);
        assert!(
            err.contains("binding hipMalloc to the hook's wrapper"),
            "{how}: the binding was not caught:\n{err}"
        );
        // The wrapper ran (it asks the runtime for the current device, which there is not)
        // and the runtime's own error comes back unchanged.
        assert!(
            err.contains("the runtime has no current device"),
            "{how}: {err}"
        );
        let code = lines(&out)[0].1[0];
        assert!(code == 100 || code == 101, "{how}: {code}");
    }
}

#[test]
fn without_a_limit_a_call_the_hook_cannot_place_reaches_the_runtime() {
    // No GPU: hipGetDevice fails, so the hook cannot tell the device. With no device
    // limited there is nothing to enforce: the call must reach the runtime, not stop at
    // the hook (a renamed or unrecognised runtime used to get error 3 for everything).
    let dir = scratch("real-unlimited");
    let mut command = Command::new(real_probe(false));
    command
        .env_clear()
        .env("LD_AUDIT", hook_library())
        .env(
            "HIP_DEVICE_MEMORY_SHARED_CACHE",
            dir.join("hipdevshr.cache"),
        )
        .env("LIBHIP_LOG_LEVEL", "3")
        .args(["malloc", "4096"]);
    let out = command.output().unwrap();
    let err = stderr(&out);
    assert!(err.contains("passing the call through"), "{err}");
    assert_eq!(codes(&out), [101], "{err}");
}

#[test]
fn error_codes_of_the_real_runtime_pass_through_unchanged() {
    let dir = scratch("real-errors");
    let program = real_probe(false);
    let args = [
        "count",
        "free",
        "meminfo",
        "pitch",
        "64",
        "64",
        "mipmalloc",
        "8",
        "8",
        "version",
    ];
    let hooked = run_hooked(&program, &dir, &[], &args);
    let plain = Command::new(&program).args(args).output().unwrap();
    assert_eq!(lines(&hooked), lines(&plain), "{}", stderr(&hooked));
}

#[test]
fn a_hipcc_program_with_a_kernel_runs_under_the_hook() {
    let program = hipcc_program();
    let dir = scratch("real-hipcc");
    let out = run_hooked(&program, &dir, &[], &["2097152"]);
    let err = stderr(&out);
    assert!(
        err.contains("binding hipMalloc to the hook's wrapper"),
        "{err}"
    );
    let plain = Command::new(&program).arg("2097152").output().unwrap();
    // Unhooked and hooked see the same runtime answers (no device: 101s).
    assert_eq!(lines(&out), lines(&plain), "{err}");
}

/// Issue 26 item 2: the pod's `AMD_TASK_PRIORITY` as the real runtime's process sees it
/// (after the runtime started: HIP's flag parser walks `environ`, the application and ROCr
/// call `getenv`) under the plugin's config. The plugin pins the container's spec value in
/// the config (`hami-amd-plugin` `the_containers_task_priority_is_pinned_in_its_config`);
/// where the config carries none (a `valueFrom` in the spec, a DRA claim) the value the
/// process started with is kept — the landed hook unset it for the runtime. ROCm 5.2.3
/// itself reads no such variable; the channels are the ones it reads its variables through.
#[test]
fn the_pods_task_priority_reaches_the_real_runtime_under_the_config() {
    let dir = scratch("real-priority");
    let cases = [
        // (config's pin, the process's start-up value, what must be seen)
        (Some("2"), Some("0"), "2"),
        (Some("2"), None, "2"),
        (None, Some("2"), "2"),
        (None, None, "(unset)"),
    ];
    for (n, (pinned, started, expected)) in cases.into_iter().enumerate() {
        let conf = dir.join(format!("hook-{n}.conf"));
        let mut text = format!(
            "hami-hook-config/1\nmemory-limit.0=1048576\nshared-cache={}\n",
            dir.join(format!("r{n}.cache")).display()
        );
        if let Some(value) = pinned {
            text.push_str(&format!("pin.AMD_TASK_PRIORITY={value}\n"));
        }
        std::fs::write(&conf, text).unwrap();
        let conf = conf.display().to_string();
        let mut env = vec![("HAMI_HOOK_CONFIG", conf.as_str())];
        if let Some(value) = started {
            env.push(("AMD_TASK_PRIORITY", value));
        }
        let out = run_hooked(
            &real_probe(false),
            &dir,
            &env,
            &["env", "AMD_TASK_PRIORITY"],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            stdout.trim(),
            format!("env {expected} {expected}"),
            "config pin {pinned:?}, start-up value {started:?}\n{}",
            stderr(&out)
        );
    }
}
