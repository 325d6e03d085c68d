//! The plugin's read-only per-container config (issue 14 item 7), as a container sees it: a
//! file bind-mounted read-only at `/usr/local/vgpu/hook.conf`, inside a user + mount + PID
//! namespace (`unshare`) where pid 1 is a shell standing in for the pause container of a
//! `shareProcessNamespace` pod (so `/proc/1/environ` holds no limits). The config wins over
//! the process's own environment, over a child's cleaned environment, and fails closed when
//! it cannot be read.

use std::process::{Command, Output};

use crate::common::{Binding, hook_library, lines, probe, scratch, stderr};

/// Runs the probe with `args` and environment `env` in a fresh namespace whose
/// `/usr/local/vgpu/hook.conf` is a read-only bind mount of `config`.
fn in_pod(config: &str, env: &[(&str, String)], args: &[&str]) -> Output {
    let dir = scratch("pod-config");
    let file = dir.join("hook.conf");
    std::fs::write(&file, config).unwrap();
    let mut script = String::from(
        "set -e; mount -t tmpfs none /usr/local; mkdir -p /usr/local/vgpu; \
         : > /usr/local/vgpu/hook.conf; mount --bind \"$CONFIG\" /usr/local/vgpu/hook.conf; \
         mount -o remount,bind,ro /usr/local/vgpu/hook.conf; set +e; env",
    );
    for (key, value) in env {
        script.push_str(&format!(" '{key}={value}'"));
    }
    script.push_str(" \"$PROBE\"");
    for arg in args {
        script.push_str(&format!(" '{arg}'"));
    }
    // Not `exec`: the shell stays pid 1, like a pause container.
    script.push_str("; exit $?");
    let out = Command::new("unshare")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CONFIG", &file)
        .env("PROBE", probe(Binding::Lazy))
        .args([
            "--user",
            "--map-root-user",
            "--mount",
            "--pid",
            "--fork",
            "--mount-proc",
            "sh",
            "-c",
            &script,
        ])
        .output()
        .expect("unshare (util-linux) is needed for this test");
    assert!(
        !stderr(&out).contains("unshare:") && !stderr(&out).contains("mount:"),
        "could not build the container (needs unprivileged user namespaces): {}",
        stderr(&out)
    );
    out
}

#[test]
fn the_read_only_config_wins_over_the_environment_and_reaches_cleaned_children() {
    let dir = scratch("pod-config-cache");
    let cache = dir.join("hipdevshr.cache");
    let private = dir.join("private.cache");
    let config = format!(
        "hami-hook-config/1\nmemory-limit.0=1048576\nshared-cache={}\nhsa-cu-mask=0:0-3\n",
        cache.display()
    );
    let out = in_pod(
        &config,
        &[
            ("LD_AUDIT", hook_library().display().to_string()),
            ("HIP_DEVICE_MEMORY_LIMIT_0", "100g".into()),
            (
                "HIP_DEVICE_MEMORY_SHARED_CACHE",
                private.display().to_string(),
            ),
            ("HSA_CU_MASK", "0:0-63".into()),
            ("FAKE_HIP_CU_COUNT", "64".into()),
        ],
        &[
            "malloc",
            "2097152",
            "malloc",
            "1048576",
            "attr",
            "0",
            "spawn_clean",
            "1",
        ],
    );
    let results = lines(&out);
    assert_eq!(results.len(), 5, "{results:?}\n{}", stderr(&out));
    assert_eq!(results[0], ("malloc".into(), vec![2]), "{}", stderr(&out));
    assert_eq!(results[1], ("malloc".into(), vec![0]));
    assert_eq!(
        results[2].1,
        [0, 1 << 20, 4],
        "the config's CU mask is pinned"
    );
    // The child, with only LD_AUDIT left, is held to the same region: 1 byte more fails.
    assert_eq!(results[3], ("malloc".into(), vec![2]), "{results:?}");
    assert!(cache.exists(), "the config's accounting file is used");
    assert!(!private.exists(), "the process's own path is ignored");
}

#[test]
fn an_unreadable_config_fails_closed_even_without_limit_variables() {
    let out = in_pod(
        "hami-hook-config/1\nmemory-limit=4g\n",
        &[("LD_AUDIT", hook_library().display().to_string())],
        &["malloc", "1", "meminfo"],
    );
    let results = lines(&out);
    assert_eq!(results[0], ("malloc".into(), vec![2]), "{}", stderr(&out));
    assert_eq!(results[1].1, [0, 0, 0]);
    let err = stderr(&out);
    assert!(err.contains("hook.conf") && err.contains("line 2"), "{err}");
}

#[test]
fn on_rocm_5_the_configs_global_cu_mask_reaches_the_hip_layer_through_environ() {
    // ROCm 5.2's ROCr ignores HSA_CU_MASK; HIP's ROC_GLOBAL_CU_MASK, read by walking
    // environ, is the mask there. The process has neither variable, and sets a wide one.
    let config =
        "hami-hook-config/1\nmemory-limit=1073741824\nhsa-cu-mask=0:0-3\nroc-global-cu-mask=0xf\n";
    let out = in_pod(
        config,
        &[
            ("LD_AUDIT", hook_library().display().to_string()),
            ("FAKE_HIP_CU_COUNT", "64".into()),
            ("FAKE_HIP_RUNTIME_VERSION", "50221153".into()),
        ],
        &[
            "setenv",
            "ROC_GLOBAL_CU_MASK",
            "0xffffffffffffffff",
            "attr",
            "0",
        ],
    );
    let results = lines(&out);
    assert_eq!(
        results.get(1).map(|r| r.1.clone()),
        Some(vec![0, 1 << 30, 4]),
        "{results:?}\n{}",
        stderr(&out)
    );
}

#[test]
fn deleting_or_replacing_the_plugins_region_fails_closed() {
    // The plugin creates the region file and names its inode in the config: a tenant who
    // deletes it (to start fresh accounting beside the running processes) or moves it away
    // and puts a copy there gets refusals, not a second full limit.
    let dir = scratch("pinned-region");
    let cache = dir.join("hipdevshr.cache");
    let mut limits = hami_region::Limits::default();
    limits.bytes[0] = 1 << 20;
    let inode = hami_region::prepare_file(&cache, &limits).unwrap();
    let config = format!(
        "hami-hook-config/1\nmemory-limit.0=1048576\nshared-cache={}\nshared-cache-inode={inode}\n",
        cache.display()
    );
    let audit = [("LD_AUDIT", hook_library().display().to_string())];
    let out = in_pod(&config, &audit, &["malloc", "1048576"]);
    assert_eq!(
        lines(&out)[0],
        ("malloc".into(), vec![0]),
        "{}",
        stderr(&out)
    );
    // Moved away and copied back: another inode (the original still exists).
    let moved = dir.join("moved.cache");
    std::fs::rename(&cache, &moved).unwrap();
    std::fs::copy(&moved, &cache).unwrap();
    let out = in_pod(&config, &audit, &["malloc", "1"]);
    assert_eq!(
        lines(&out)[0],
        ("malloc".into(), vec![2]),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("replaced"), "{}", stderr(&out));
    // Deleted: refused, and nothing is created in its place.
    std::fs::remove_file(&cache).unwrap();
    let out = in_pod(&config, &audit, &["malloc", "1"]);
    assert_eq!(
        lines(&out)[0],
        ("malloc".into(), vec![2]),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("missing"), "{}", stderr(&out));
    assert!(
        !cache.exists(),
        "the hook must not create the plugin's file"
    );
}

/// Issue 26 item 3: every process of the container maps the region read-write, so the limit
/// stored there is the tenant's to change. With the plugin's read-only config, the limit in
/// force is the config's, lowered by the region's but never raised: a second process that
/// writes the region's limit field (as a tenant can) still cannot allocate past the config.
#[test]
fn writing_the_regions_limit_cannot_raise_the_configs() {
    use std::os::unix::fs::FileExt;
    let dir = scratch("raised-limit");
    let cache = dir.join("hipdevshr.cache");
    let mut limits = hami_region::Limits::default();
    limits.bytes[0] = 1 << 20;
    let inode = hami_region::prepare_file(&cache, &limits).unwrap();
    let config = format!(
        "hami-hook-config/1\nmemory-limit.0=1048576\nshared-cache={}\nshared-cache-inode={inode}\n",
        cache.display()
    );
    // Device 0's `limit` field (README: devices at 64, `limit` at +16).
    let field = std::mem::offset_of!(hami_region::layout::RegionLayout, devices) as u64 + 16;
    let write_limit = |bytes: u64| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&cache)
            .unwrap()
            .write_all_at(&bytes.to_le_bytes(), field)
            .unwrap();
    };
    let audit = [("LD_AUDIT", hook_library().display().to_string())];
    for raised in [hami_region::layout::LIMIT_NONE, 64 << 20] {
        write_limit(raised);
        let out = in_pod(
            &config,
            &audit,
            &[
                "malloc", "2097152", "malloc", "1048576", "malloc", "1", "meminfo",
            ],
        );
        let results = lines(&out);
        assert_eq!(
            results
                .iter()
                .take(3)
                .map(|r| r.1.clone())
                .collect::<Vec<_>>(),
            [vec![2], vec![0], vec![2]],
            "region limit {raised}: {results:?}\n{}",
            stderr(&out)
        );
        assert_eq!(
            results[3].1[2],
            1 << 20,
            "the total reported is the config's"
        );
    }
    // Lowering it is an operator's action the hook honours.
    write_limit(1 << 19);
    let out = in_pod(&config, &audit, &["malloc", "1048576", "malloc", "524288"]);
    assert_eq!(
        lines(&out).iter().map(|r| r.1.clone()).collect::<Vec<_>>(),
        [vec![2], vec![0]],
        "{}",
        stderr(&out)
    );
}
