//! The per-container config file (issue 14 item 7) in real processes: it decides the limit
//! and the cache path whatever the environment says; an unusable one fails closed; without
//! one, a bad SM limit in the environment fails closed too.

use crate::common::*;
use hami_cuda_region::layout::offsets;

#[test]
fn the_config_file_wins_over_the_environment() {
    let s = scratch("podconfig");
    let conf = s.join("hook.conf");
    let region = s.join("from-config.cache");
    std::fs::write(
        &conf,
        format!(
            "hami-hook-config/1\nmemory-limit.0={}\nshared-cache={}\nsm-limit=50\n",
            4u64 << 20,
            region.display()
        ),
    )
    .unwrap();
    // A process that points itself at a private region with a larger limit gets neither.
    let env = vec![
        ("HAMI_HOOK_CONFIG", conf.display().to_string()),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g".to_owned()),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            s.join("private.cache").display().to_string(),
        ),
    ];
    let (out, _) = run(&s, &env, &["alloc", &(8u64 << 20).to_string()]);
    assert!(
        out.contains("rc=2\n"),
        "the config's 4 MiB limit holds: {out}"
    );
    let (out, _) = run(&s, &env, &["alloc", &(4u64 << 20).to_string()]);
    assert!(out.contains("rc=0\n"), "{out}");
    assert!(region.exists() && !s.join("private.cache").exists());
}

#[test]
fn an_unusable_config_file_fails_closed() {
    let s = scratch("podconfig-bad");
    let conf = s.join("hook.conf");
    std::fs::write(&conf, "hami-hook-config/1\nsm-limit=150\n").unwrap();
    let env = vec![("HAMI_HOOK_CONFIG", conf.display().to_string())];
    let (out, err) = run(&s, &env, &["alloc", "4096"]);
    assert!(out.contains("rc=2\n"), "{out}");
    assert!(err.contains("line 2") && err.contains("refuses"), "{err}");
    let env = vec![(
        "HAMI_HOOK_CONFIG",
        s.join("missing.conf").display().to_string(),
    )];
    let (out, err) = run(&s, &env, &["alloc", "4096"]);
    assert!(
        out.contains("rc=2\n") && err.contains("names no file"),
        "{out}{err}"
    );
}

#[test]
fn a_bad_sm_limit_in_the_environment_fails_closed() {
    let s = scratch("sm-bad");
    let env = vec![("CUDA_DEVICE_SM_LIMIT", "half".to_owned())];
    let (out, err) = run(&s, &env, &["alloc", "4096"]);
    assert!(out.contains("rc=2\n"), "{out}");
    assert!(err.contains("CUDA_DEVICE_SM_LIMIT"), "{err}");
}

/// With the plugin's `shared-cache-inode`, a tenant who deletes or replaces the region file
/// (the directory is the container's) gets refusals, not a fresh, empty accounting.
#[test]
fn a_deleted_or_replaced_region_fails_closed() {
    let s = scratch("podconfig-inode");
    let region = s.join("prepared.cache");
    let inode = hami_cuda_region::prepare_file(&region, &s.join("plugin.anchor")).unwrap();
    let conf = s.join("hook.conf");
    std::fs::write(
        &conf,
        format!(
            "hami-hook-config/1\nmemory-limit.0={}\nshared-cache={}\nshared-cache-inode={inode}\n",
            4u64 << 20,
            region.display()
        ),
    )
    .unwrap();
    let env = vec![("HAMI_HOOK_CONFIG", conf.display().to_string())];
    let (out, _) = run(&s, &env, &["alloc", &(4u64 << 20).to_string()]);
    assert!(out.contains("rc=0\n"), "the plugin's file is used: {out}");
    std::fs::remove_file(&region).unwrap();
    let (out, err) = run(&s, &env, &["alloc", "4096"]);
    assert!(
        out.contains("rc=2\n") && err.contains("is missing"),
        "{out}{err}"
    );
    assert!(!region.exists(), "never re-created");
    std::fs::write(&region, vec![0u8; hami_cuda_region::layout::FILE_SIZE]).unwrap();
    let (out, err) = run(&s, &env, &["alloc", "4096"]);
    assert!(
        out.contains("rc=2\n") && err.contains("was replaced"),
        "{out}{err}"
    );
}

/// Issue 26 item 3: every process of the container maps the region read-write, so the limit
/// stored there is the tenant's to change. With the plugin's read-only config, the limit in
/// force is the config's, lowered by the region's but never raised: a second process that
/// writes the region's limit field (as a tenant can) still cannot allocate past the config.
#[test]
fn writing_the_regions_limit_cannot_raise_the_configs() {
    use std::os::unix::fs::FileExt;
    let s = scratch("podconfig-raised");
    let region = s.join("prepared.cache");
    let inode = hami_cuda_region::prepare_file(&region, &s.join("plugin.anchor")).unwrap();
    let conf = s.join("hook.conf");
    std::fs::write(
        &conf,
        format!(
            "hami-hook-config/1\nmemory-limit.0={}\nshared-cache={}\nshared-cache-inode={inode}\n",
            4u64 << 20,
            region.display()
        ),
    )
    .unwrap();
    let env = vec![("HAMI_HOOK_CONFIG", conf.display().to_string())];
    // The first process initialises the region with the config's limit.
    let (out, _) = run(&s, &env, &["alloc", &(4u64 << 20).to_string()]);
    assert!(out.contains("rc=0\n"), "{out}");
    let write_limit = |bytes: u64| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&region)
            .unwrap()
            .write_all_at(&bytes.to_le_bytes(), offsets::LIMIT as u64)
            .unwrap();
    };
    // 0 is "no limit" in this layout; 1 GiB is a raise.
    for raised in [0u64, 1 << 30] {
        write_limit(raised);
        let (out, _) = run(&s, &env, &["alloc", &(8u64 << 20).to_string()]);
        assert!(
            out.contains("rc=2\n"),
            "region limit {raised}: the config's 4 MiB hold: {out}"
        );
        let (out, _) = run(&s, &env, &["alloc", &(4u64 << 20).to_string()]);
        assert!(out.contains("rc=0\n"), "region limit {raised}: {out}");
    }
    // Lowering it is an operator's action the hook honours.
    write_limit(1 << 20);
    let (out, _) = run(&s, &env, &["alloc", &(2u64 << 20).to_string()]);
    assert!(out.contains("rc=2\n"), "lowered to 1 MiB: {out}");
}

/// Issue 26 item 2: `nvidia.com/priority: 0` must reach the region's `priority` field (HAMi's
/// monitor reads it). The plugin pins the container's priority in the config
/// (`hami-nvidia-plugin` `the_containers_task_priority_is_pinned_in_its_config`); where the
/// config pins none (a `valueFrom` in the spec) the process's own `CUDA_TASK_PRIORITY` is
/// used — the landed hook wrote 1 whatever the pod said.
#[test]
fn the_pods_task_priority_reaches_the_region() {
    let cases = [
        // (config's pin, the process's variable, the region's priority)
        (Some("0"), None, 0),
        (Some("0"), Some("1"), 0),
        (None, Some("0"), 0),
        (None, None, 1),
    ];
    for (pinned, variable, expected) in cases {
        let s = scratch("podconfig-priority");
        let region = s.join("from-config.cache");
        let conf = s.join("hook.conf");
        let mut text = format!(
            "hami-hook-config/1\nmemory-limit.0={}\nshared-cache={}\n",
            4u64 << 20,
            region.display()
        );
        if let Some(value) = pinned {
            text.push_str(&format!("pin.CUDA_TASK_PRIORITY={value}\n"));
        }
        std::fs::write(&conf, text).unwrap();
        let mut env = vec![("HAMI_HOOK_CONFIG", conf.display().to_string())];
        if let Some(value) = variable {
            env.push(("CUDA_TASK_PRIORITY", value.to_owned()));
        }
        let (out, _) = run(&s, &env, &["alloc", "4096"]);
        assert!(out.contains("rc=0\n"), "{out}");
        let bytes = std::fs::read(&region).unwrap();
        let priority = i32::from_le_bytes(
            bytes[offsets::PRIORITY..offsets::PRIORITY + 4]
                .try_into()
                .unwrap(),
        );
        assert_eq!(
            priority, expected,
            "config pin {pinned:?}, variable {variable:?}"
        );
    }
}
