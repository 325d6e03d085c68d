//! How the hook finds HIP runtimes: by what an object defines, not by its file name, and
//! with each binding routed to the runtime that defines it when several are loaded. Real
//! processes under `LD_AUDIT`, opening copies of the stand-in runtime with `dlopen`.

use std::process::{Command, Output};

use crate::common::{codes, dlopen_probe, hook_library, lines, runtime_copy, scratch, stderr};

fn run(dir: &std::path::Path, limit: &str, args: &[&str]) -> Output {
    Command::new(dlopen_probe())
        .env_clear()
        .env("LD_AUDIT", hook_library())
        .env(
            "HIP_DEVICE_MEMORY_SHARED_CACHE",
            dir.join("hipdevshr.cache"),
        )
        .env("HIP_DEVICE_MEMORY_LIMIT_0", limit)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_renamed_runtime_is_recognised_by_what_it_defines() {
    // Wheels vendor renamed copies (auditwheel): the hook must limit them all the same.
    let dir = scratch("renamed");
    let runtime = runtime_copy(&dir, "libamdhip64-1a2b3c4d.so.5");
    let out = run(
        &dir,
        "1m",
        &[
            "open",
            runtime.to_str().unwrap(),
            "malloc",
            "2097152",
            "malloc",
            "1048576",
            "meminfo",
            "free",
        ],
    );
    assert_eq!(
        codes(&out),
        [0, 2, 0, 0, 0],
        "{:?}\n{}",
        lines(&out),
        stderr(&out)
    );
    assert_eq!(lines(&out)[3].1, [0, 0, 1 << 20]);
}

#[test]
fn a_renamed_runtime_without_a_limit_reaches_the_runtime() {
    let dir = scratch("renamed-unlimited");
    let runtime = runtime_copy(&dir, "libamdhip64-ffff.so.6");
    let out = Command::new(dlopen_probe())
        .env_clear()
        .env("LD_AUDIT", hook_library())
        .env(
            "HIP_DEVICE_MEMORY_SHARED_CACHE",
            dir.join("hipdevshr.cache"),
        )
        .args([
            "open",
            runtime.to_str().unwrap(),
            "malloc",
            "1048576",
            "free",
        ])
        .output()
        .unwrap();
    assert_eq!(codes(&out), [0, 0, 0], "{}", stderr(&out));
}

#[test]
fn two_runtimes_in_one_process_each_get_their_own_calls() {
    // Two copies loaded side by side. A pointer from the first is unknown to the second, so
    // freeing it through the second must reach the second (hipErrorInvalidDevicePointer,
    // 17) and the bytes stay charged; through the first it succeeds.
    let dir = scratch("two-runtimes");
    let a_dir = dir.join("a");
    let b_dir = dir.join("b");
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    let a = runtime_copy(&a_dir, "libamdhip64.so.6");
    let b = runtime_copy(&b_dir, "libamdhip64.so.6");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let out = run(
        &dir,
        "1m",
        &[
            "open", a, "malloc", "700000", "open", b, "free", "meminfo", "malloc", "700000",
            "open", a, "malloc", "100000", "free", "free", "meminfo",
        ],
    );
    let results = lines(&out);
    assert_eq!(
        codes(&out),
        [0, 0, 0, 17, 0, 2, 0, 0, 0, 0, 0],
        "{results:?}\n{}",
        stderr(&out)
    );
    // b's own hipMemGetInfo: its device holds nothing; the limit still counts a's bytes.
    assert_eq!(results[4].1, [0, (1 << 20) - 700_000, 1 << 20]);
    assert_eq!(results[10].1, [0, 1 << 20, 1 << 20]);
}

#[test]
fn a_program_with_its_own_copy_of_environ_gets_the_pinned_values_there() {
    let dir = scratch("copy-environ");
    let config = dir.join("hook.conf");
    std::fs::write(&config, "hami-hook-config/1\nroc-global-cu-mask=0x3\n").unwrap();
    let out = Command::new(dlopen_probe())
        .env_clear()
        .env("LD_AUDIT", hook_library())
        .env("HAMI_HOOK_CONFIG", &config)
        .env("ROC_GLOBAL_CU_MASK", "0xf")
        .args([
            "walkenv",
            "ROC_GLOBAL_CU_MASK",
            "setenv",
            "ROC_GLOBAL_CU_MASK",
            "0xffff",
            "walkenv",
            "ROC_GLOBAL_CU_MASK",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let walks: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("walkenv 0 "))
        .collect();
    assert_eq!(walks, ["0x3", "0x3"], "{text}\n{}", stderr(&out));
}

#[test]
fn an_object_named_like_the_runtime_that_is_not_one_is_logged_at_every_level() {
    // It defines hipMalloc but not hipRuntimeGetVersion: the hook cannot treat it as a
    // runtime, so its calls are not limited; it says so even at the quietest log level.
    let dir = scratch("not-a-runtime");
    let source = dir.join("shim.c");
    std::fs::write(
        &source,
        "int hipMalloc(void **p, unsigned long n) { (void)n; *p = (void *)0x1000; return 0; }\n\
         int hipFree(void *p) { (void)p; return 0; }\n\
         int hipMemGetInfo(unsigned long *f, unsigned long *t) { *f = *t = 0; return 0; }\n",
    )
    .unwrap();
    let shim = dir.join("libamdhip64-shim.so.5");
    let built = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-o"])
        .arg(&shim)
        .arg(&source)
        .status()
        .expect("a C compiler (cc) is needed");
    assert!(built.success());
    let out = Command::new(dlopen_probe())
        .env_clear()
        .env("LD_AUDIT", hook_library())
        .env(
            "HIP_DEVICE_MEMORY_SHARED_CACHE",
            dir.join("hipdevshr.cache"),
        )
        .env("HIP_DEVICE_MEMORY_LIMIT_0", "1m")
        .env("LIBHIP_LOG_LEVEL", "1")
        .args(["open", shim.to_str().unwrap(), "malloc", "2097152"])
        .output()
        .unwrap();
    assert_eq!(codes(&out), [0, 0], "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("is named like a HIP runtime but defines neither")
            && err.contains("libamdhip64-shim.so.5"),
        "{err}"
    );
}
