//! The hook's settings: from the plugin's per-container config file when one exists
//! ([`from_file`]), else from the process environment (names as HAMi-core's, [`resolve`]).

use hami_cuda_region::MAX_DEVICES;
use hami_protocol::memory_limit::parse_memory_limit;
use hami_protocol::names::env;

/// The region file when `CUDA_DEVICE_MEMORY_SHARED_CACHE` is unset (HAMi-core's default).
pub const DEFAULT_CACHE: &str = "/tmp/cudevshr.cache";

#[derive(Debug, Clone, PartialEq, Eq)]
/// The hook's settings for this process.
pub struct HookConfig {
    /// Bytes per container device, 0 = no limit.
    pub limits: [u64; MAX_DEVICES],
    /// Devices whose limit variable could not be read: they refuse every allocation (D-3).
    pub fail_closed: [bool; MAX_DEVICES],
    /// Why each unreadable limit was refused, logged once at start-up.
    pub limit_errors: Vec<String>,
    /// Percent per device (1..=100).
    pub sm_limits: [u64; MAX_DEVICES],
    /// The shared region's file.
    pub cache_path: String,
    /// Inode of the region file the plugin created (config `shared-cache-inode`): only that
    /// file is used, never a re-created one.
    pub cache_inode: Option<u64>,
    /// `CUDA_TASK_PRIORITY`, written to this process's slot for the limiter.
    pub priority: i32,
    /// `LIBCUDA_LOG_LEVEL` (see [`crate::log`]).
    pub log_level: u8,
    /// `GPU_CORE_UTILIZATION_POLICY`: Some(true) force, Some(false) disable, None = region
    /// (without a config file) or on (with one).
    pub utilization_policy: Option<bool>,
    /// The settings come from the plugin's read-only config file: its limits cap the
    /// region's, which every process of the container can write (issue 26 item 3).
    pub from_config: bool,
}

/// Builds the settings from `get` (the environment in production).
pub fn resolve(get: &dyn Fn(&str) -> Option<String>) -> HookConfig {
    let mut limits = [0u64; MAX_DEVICES];
    let mut fail_closed = [false; MAX_DEVICES];
    let mut limit_errors = Vec::new();
    let mut sm_limits = [100u64; MAX_DEVICES];
    // A variable that is set but empty is a malformed limit like any other (SPEC §2.7, D-3):
    // it fails closed, as in the HIP hook; the reference runs it unlimited.
    let all = get(env::CUDA_DEVICE_MEMORY_LIMIT);
    let all_sm = get(env::CUDA_DEVICE_SM_LIMIT);
    for device in 0..MAX_DEVICES {
        let key = format!("{}_{device}", env::CUDA_DEVICE_MEMORY_LIMIT);
        let chosen = match get(&key) {
            Some(text) => Some((key, text)),
            None => all
                .clone()
                .map(|t| (env::CUDA_DEVICE_MEMORY_LIMIT.to_owned(), t)),
        };
        if let Some((name, text)) = chosen {
            match parse_memory_limit(&text) {
                Ok(0) => {
                    fail_closed[device] = true;
                    limit_errors.push(format!(
                        "{name}=0: a limit of 0 bytes refuses every allocation of device {device}; unset the variable for no limit"
                    ));
                }
                Ok(bytes) => limits[device] = bytes,
                Err(err) => {
                    fail_closed[device] = true;
                    limit_errors.push(format!(
                        "{name}: {err}; device {device} refuses every allocation until it is fixed"
                    ));
                }
            }
        }
        let sm_key = format!("{}_{device}", env::CUDA_DEVICE_SM_LIMIT);
        if let Some(text) = get(&sm_key).or_else(|| all_sm.clone()) {
            match text.trim().parse::<u64>() {
                Ok(0) => {}
                Ok(pct) if pct <= 100 => sm_limits[device] = pct,
                // Fail closed, as for memory: an unreadable compute limit is not "no limit".
                _ => {
                    fail_closed[device] = true;
                    limit_errors.push(format!(
                        "{sm_key}={text:?}: write a percentage from 1 to 100 (0 for none); device {device} refuses every allocation until it is fixed"
                    ));
                }
            }
        }
    }
    let utilization_policy = utilization_policy(get("GPU_CORE_UTILIZATION_POLICY").as_deref());
    HookConfig {
        limits,
        fail_closed,
        limit_errors,
        sm_limits,
        cache_path: get(env::CUDA_DEVICE_MEMORY_SHARED_CACHE)
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| DEFAULT_CACHE.to_owned()),
        cache_inode: None,
        priority: get(env::CUDA_TASK_PRIORITY)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(1),
        log_level: crate::log::parse_level(get("LIBCUDA_LOG_LEVEL").as_deref()),
        utilization_policy,
        from_config: false,
    }
}

/// `GPU_CORE_UTILIZATION_POLICY`, from the environment or the config file alike: `force`
/// (true) or `disable` (false), any case, spaces around ignored; anything else is the default.
fn utilization_policy(value: Option<&str>) -> Option<bool> {
    match value.map(|p| p.trim().to_ascii_lowercase()).as_deref() {
        Some("force") => Some(true),
        Some("disable") => Some(false),
        _ => None,
    }
}

/// The settings from the plugin's config file: limits, cache path, SM limit and the
/// utilization policy come from it alone (no variable can widen them); the log level, which
/// cannot, and the task priority where the config pins none (`CUDA_TASK_PRIORITY`, the
/// user's) still come from the environment.
pub fn from_file(
    file: &hami_protocol::hook_config::HookConfig,
    get: &dyn Fn(&str) -> Option<String>,
) -> HookConfig {
    let mut limits = [0u64; MAX_DEVICES];
    let mut fail_closed = [false; MAX_DEVICES];
    let mut limit_errors = Vec::new();
    for device in 0..MAX_DEVICES {
        match file.memory_limit(device as u32) {
            Some(0) => {
                fail_closed[device] = true;
                limit_errors.push(format!(
                    "the hook config gives device {device} a limit of 0 bytes: it refuses every allocation"
                ));
            }
            Some(bytes) => limits[device] = bytes,
            None => {}
        }
    }
    let sm = match file.sm_limit {
        Some(pct) if pct > 0 => u64::from(pct),
        _ => 100,
    };
    let pinned = |name: &str| file.pinned.get(name).map(String::as_str);
    let utilization_policy = utilization_policy(pinned("GPU_CORE_UTILIZATION_POLICY"));
    HookConfig {
        limits,
        fail_closed,
        limit_errors,
        sm_limits: [sm; MAX_DEVICES],
        cache_path: file
            .shared_cache
            .clone()
            .unwrap_or_else(|| DEFAULT_CACHE.to_owned()),
        cache_inode: file.shared_cache_inode,
        // The config's (the plugin pins the container's); else the process's own, as the
        // spec's `valueFrom` gave it (issue 26 item 2: the region read 1 for `priority: 0`).
        priority: pinned(env::CUDA_TASK_PRIORITY)
            .map(str::to_owned)
            .or_else(|| get(env::CUDA_TASK_PRIORITY))
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(1),
        log_level: crate::log::parse_level(get("LIBCUDA_LOG_LEVEL").as_deref()),
        utilization_policy,
        from_config: true,
    }
}

/// The settings when a config file exists but cannot be used: every device refuses every
/// allocation (fail closed), with the reason logged.
pub fn unusable(reason: &str, log_level: u8) -> HookConfig {
    HookConfig {
        limits: [0; MAX_DEVICES],
        fail_closed: [true; MAX_DEVICES],
        limit_errors: vec![format!(
            "{reason}; every device refuses every allocation until it is fixed"
        )],
        sm_limits: [100; MAX_DEVICES],
        cache_path: DEFAULT_CACHE.to_owned(),
        cache_inode: None,
        priority: 1,
        log_level,
        utilization_policy: None,
        from_config: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn per_device_limits_then_the_global_one() {
        let c = resolve(&env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
            ("CUDA_DEVICE_SM_LIMIT", "30"),
        ]));
        assert_eq!(c.limits[0], 1 << 30);
        assert_eq!(c.limits[1], 2 << 30);
        assert_eq!(c.sm_limits[3], 30);
        assert_eq!(c.cache_path, DEFAULT_CACHE);
        assert!(c.limit_errors.is_empty());
        let none = resolve(&env(&[]));
        assert_eq!(none.limits, [0; MAX_DEVICES]);
        assert_eq!(none.sm_limits, [100; MAX_DEVICES]);
        assert_eq!(none.priority, 1);
    }

    #[test]
    fn bad_limits_fail_closed_with_a_reason() {
        // The reference reads "4gb" as 4 bytes and "0" as unlimited; both are refused here.
        let c = resolve(&env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "4gb"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "0"),
            ("CUDA_DEVICE_SM_LIMIT", "150"),
        ]));
        assert!(c.fail_closed[0] && c.fail_closed[1]);
        assert!(c.limit_errors[0].contains("CUDA_DEVICE_MEMORY_LIMIT_0"));
        // A bad SM limit fails closed too (the reference and our first version ran the
        // device without a compute limit).
        assert!(c.fail_closed[2], "an SM limit of 150 refuses");
        assert_eq!(
            c.limit_errors
                .iter()
                .filter(|e| e.contains("CUDA_DEVICE_SM_LIMIT") && e.contains("refuses"))
                .count(),
            16
        );
        assert_eq!(c.sm_limits[0], 100);
        let c = resolve(&env(&[("CUDA_DEVICE_SM_LIMIT_1", "half")]));
        assert!(!c.fail_closed[0] && c.fail_closed[1]);
    }

    #[test]
    fn the_config_file_alone_decides() {
        let file = hami_protocol::hook_config::decode(
            b"hami-hook-config/1\nmemory-limit.0=1048576\nmemory-limit.1=0\nshared-cache=/usr/local/vgpu/cache/cudevshr.cache\nsm-limit=30\npin.CUDA_TASK_PRIORITY=0\n",
        )
        .unwrap();
        // The environment asks for more: it is not read (but the log level is).
        let c = from_file(
            &file,
            &env(&[
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "64g"),
                ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/private.cache"),
                ("GPU_CORE_UTILIZATION_POLICY", "disable"),
                ("LIBCUDA_LOG_LEVEL", "4"),
            ]),
        );
        assert_eq!(c.limits[0], 1 << 20);
        assert!(c.fail_closed[1] && !c.fail_closed[0] && !c.fail_closed[2]);
        assert_eq!(
            c.limits[2], 0,
            "a device the config does not name has no limit"
        );
        assert_eq!(c.cache_path, "/usr/local/vgpu/cache/cudevshr.cache");
        assert_eq!(c.sm_limits, [30; MAX_DEVICES]);
        assert_eq!(
            (c.priority, c.utilization_policy, c.log_level),
            (0, None, 4)
        );
        assert!(c.from_config && !resolve(&env(&[])).from_config);
        // No pin (a `valueFrom` in the spec): the process's own priority.
        let unpinned =
            hami_protocol::hook_config::decode(b"hami-hook-config/1\nsm-limit=30\n").unwrap();
        assert_eq!(
            from_file(&unpinned, &env(&[("CUDA_TASK_PRIORITY", "0")])).priority,
            0
        );
        assert_eq!(from_file(&unpinned, &env(&[])).priority, 1);
        let bad = unusable("x", 2);
        assert!(bad.fail_closed.iter().all(|f| *f));
    }

    #[test]
    fn an_empty_limit_fails_closed() {
        let c = resolve(&env(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "")]));
        assert!(c.fail_closed[0] && !c.fail_closed[1]);
        assert!(c.limit_errors[0].contains("CUDA_DEVICE_MEMORY_LIMIT_0"));
        let c = resolve(&env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", " "),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "1g"),
        ]));
        assert!(c.fail_closed[0] && !c.fail_closed[1] && c.fail_closed[2]);
        assert_eq!(c.limits[1], 1 << 30);
    }

    #[test]
    fn policy_switch() {
        assert_eq!(
            resolve(&env(&[("GPU_CORE_UTILIZATION_POLICY", "FORCE")])).utilization_policy,
            Some(true)
        );
        assert_eq!(
            resolve(&env(&[("GPU_CORE_UTILIZATION_POLICY", "disable")])).utilization_policy,
            Some(false)
        );
        assert_eq!(
            resolve(&env(&[("GPU_CORE_UTILIZATION_POLICY", "default")])).utilization_policy,
            None
        );
    }
}
