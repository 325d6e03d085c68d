//! The hook's settings. Each variable comes from the pod spec (pid 1's environment) when it is
//! set there, else from this process's own start-up environment: a child started with a
//! cleaned environment but still under `LD_AUDIT` gets the pod's limits back, and a process
//! cannot point itself at a private accounting file or a larger limit.

use hami_protocol::memory_limit::parse_memory_limit;
use hami_region::Limits;
use hami_region::layout::MAX_DEVICES;

/// The region file when `HIP_DEVICE_MEMORY_SHARED_CACHE` is unset.
pub const DEFAULT_CACHE: &str = "/tmp/hipdevshr.cache";

#[derive(Debug, Clone, PartialEq, Eq)]
/// The hook's settings for this process.
pub struct HookConfig {
    /// Bytes per device (`LIMIT_NONE` where none is set; 0, refusing every allocation, where
    /// the variable could not be read).
    pub limits: Limits,
    /// Limit variables that could not be read (each made its device fail closed).
    pub limit_errors: Vec<String>,
    /// The shared region's file.
    pub cache_path: String,
    /// The inode of the region file the plugin created (config file only): then only that
    /// file is used, never a new one.
    pub cache_inode: Option<u64>,
    /// `LIBHIP_LOG_LEVEL` (see [`crate::log`]).
    pub log_level: u8,
    /// `HIP_OVERSUBSCRIBE`: hipMalloc allocates managed memory.
    pub oversubscribe: bool,
    /// `ACTIVE_OOM_KILLER`: a process found above its device's limit is terminated.
    pub active_oom_killer: bool,
    /// False when the settings could not be read at all (an unusable config file): no
    /// region is attached, so an existing region's limits cannot be borrowed.
    pub attach_region: bool,
    /// The limits come from the plugin's read-only config file: they cap the region's,
    /// which every process of the container can write (issue 26 item 3).
    pub limits_from_config: bool,
}

/// Whether a boolean variable is on (`1`, `true`, `yes`, `on`, any case; unset is off).
pub fn truthy(value: Option<&str>) -> bool {
    matches!(
        value.map(|v| v.trim().to_ascii_lowercase()).as_deref(),
        Some("1" | "true" | "yes" | "on")
    )
}

/// Builds the settings from the pod's variables (`pod`) and the process's own (`own`).
pub fn resolve(
    pod: &dyn Fn(&str) -> Option<String>,
    own: &dyn Fn(&str) -> Option<String>,
) -> HookConfig {
    let get = |key: &str| pod(key).or_else(|| own(key));
    let mut limits = Limits::default();
    let mut limit_errors = Vec::new();
    let all = get("HIP_DEVICE_MEMORY_LIMIT");
    for (device, slot) in limits.bytes.iter_mut().enumerate().take(MAX_DEVICES) {
        let key = format!("HIP_DEVICE_MEMORY_LIMIT_{device}");
        let (name, text) = match get(&key) {
            Some(text) => (key, text),
            None => match &all {
                Some(text) => ("HIP_DEVICE_MEMORY_LIMIT".to_owned(), text.clone()),
                None => continue,
            },
        };
        match parse_memory_limit(&text) {
            Ok(bytes) => *slot = bytes,
            Err(err) => {
                // D-3: fail closed rather than run unlimited.
                *slot = 0;
                limit_errors.push(format!(
                    "{name}: {err}; device {device} refuses every allocation until it is fixed"
                ));
            }
        }
    }
    HookConfig {
        limits,
        limit_errors,
        cache_path: get("HIP_DEVICE_MEMORY_SHARED_CACHE")
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| DEFAULT_CACHE.to_owned()),
        cache_inode: None,
        log_level: crate::log::parse_level(get("LIBHIP_LOG_LEVEL").as_deref()),
        oversubscribe: truthy(get("HIP_OVERSUBSCRIBE").as_deref()),
        active_oom_killer: truthy(get("ACTIVE_OOM_KILLER").as_deref()),
        attach_region: true,
        limits_from_config: false,
    }
}

/// The settings from the plugin's config file: limits, cache path and oversubscription come
/// from it alone (a variable cannot widen them); only the log level and the OOM killer,
/// which cannot widen anything, still come from the environment.
pub fn from_file(
    file: &hami_protocol::hook_config::HookConfig,
    pod: &dyn Fn(&str) -> Option<String>,
    own: &dyn Fn(&str) -> Option<String>,
) -> HookConfig {
    let get = |key: &str| pod(key).or_else(|| own(key));
    let mut limits = Limits::default();
    for (device, slot) in limits.bytes.iter_mut().enumerate() {
        if let Some(bytes) = u32::try_from(device)
            .ok()
            .and_then(|d| file.memory_limit(d))
        {
            *slot = bytes;
        }
    }
    HookConfig {
        limits,
        limit_errors: Vec::new(),
        cache_path: file
            .shared_cache
            .clone()
            .unwrap_or_else(|| DEFAULT_CACHE.to_owned()),
        cache_inode: file.shared_cache_inode,
        log_level: crate::log::parse_level(get("LIBHIP_LOG_LEVEL").as_deref()),
        oversubscribe: truthy(file.pinned.get("HIP_OVERSUBSCRIBE").map(String::as_str)),
        active_oom_killer: truthy(get("ACTIVE_OOM_KILLER").as_deref()),
        attach_region: true,
        limits_from_config: true,
    }
}

/// The settings when a config file exists but cannot be used: every device refuses every
/// allocation (fail closed), with the reason logged.
pub fn unusable(reason: &str, log_level: u8) -> HookConfig {
    HookConfig {
        limits: Limits {
            bytes: [0; MAX_DEVICES],
        },
        limit_errors: vec![format!(
            "{reason}; every device refuses every allocation until it is fixed"
        )],
        cache_path: DEFAULT_CACHE.to_owned(),
        cache_inode: None,
        log_level,
        oversubscribe: false,
        active_oom_killer: false,
        attach_region: false,
        limits_from_config: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_region::layout::LIMIT_NONE;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn per_device_limits_and_a_default_for_the_rest() {
        let config = resolve(
            &env(&[]),
            &env(&[
                ("HIP_DEVICE_MEMORY_LIMIT_0", "4096m"),
                ("HIP_DEVICE_MEMORY_LIMIT_3", "1g"),
            ]),
        );
        assert_eq!(config.limits.bytes[0], 4096 << 20);
        assert_eq!(config.limits.bytes[3], 1 << 30);
        assert_eq!(config.limits.bytes[1], LIMIT_NONE);
        assert_eq!(config.cache_path, DEFAULT_CACHE);
        let config = resolve(&env(&[("HIP_DEVICE_MEMORY_LIMIT", "2g")]), &env(&[]));
        assert!(config.limits.bytes.iter().all(|b| *b == 2 << 30));
    }

    #[test]
    fn the_pod_spec_wins_and_fills_a_cleaned_environment() {
        let pod = env(&[
            ("HIP_DEVICE_MEMORY_LIMIT_0", "1g"),
            ("HIP_DEVICE_MEMORY_SHARED_CACHE", "/pod/cache"),
        ]);
        let own = env(&[
            ("HIP_DEVICE_MEMORY_LIMIT_0", "100g"),
            ("HIP_DEVICE_MEMORY_SHARED_CACHE", "/tmp/mine"),
            ("LIBHIP_LOG_LEVEL", "4"),
        ]);
        let config = resolve(&pod, &own);
        assert_eq!(config.limits.bytes[0], 1 << 30);
        assert_eq!(config.cache_path, "/pod/cache");
        assert_eq!(config.log_level, 4);
        let cleaned = resolve(&pod, &env(&[]));
        assert_eq!(cleaned.limits.bytes[0], 1 << 30);
    }

    #[test]
    fn a_bad_limit_fails_closed_with_a_reason() {
        let config = resolve(&env(&[]), &env(&[("HIP_DEVICE_MEMORY_LIMIT_1", "4 GB")]));
        assert_eq!(config.limits.bytes[1], 0);
        assert_eq!(config.limit_errors.len(), 1);
        assert!(config.limit_errors[0].contains("HIP_DEVICE_MEMORY_LIMIT_1"));
        assert!(config.limit_errors[0].contains("4096m"));
    }

    #[test]
    fn the_config_file_replaces_the_environment() {
        let mut file = hami_protocol::hook_config::HookConfig {
            default_memory_limit: Some(1 << 30),
            shared_cache: Some("/usr/local/vgpu/cache/hipdevshr.cache".into()),
            ..Default::default()
        };
        file.memory_limits.insert(2, 0);
        let own = env(&[
            ("HIP_DEVICE_MEMORY_LIMIT_0", "100g"),
            ("HIP_DEVICE_MEMORY_SHARED_CACHE", "/tmp/mine"),
            ("HIP_OVERSUBSCRIBE", "1"),
            ("LIBHIP_LOG_LEVEL", "4"),
        ]);
        let config = from_file(&file, &env(&[]), &own);
        assert_eq!(config.limits.bytes[0], 1 << 30);
        assert_eq!(config.limits.bytes[2], 0);
        assert_eq!(config.cache_path, "/usr/local/vgpu/cache/hipdevshr.cache");
        assert!(!config.oversubscribe);
        assert_eq!(config.log_level, 4);
        assert!(config.limits_from_config);
        assert!(!resolve(&env(&[]), &own).limits_from_config);
        let broken = unusable("bad file", 2);
        assert!(broken.limits.bytes.iter().all(|b| *b == 0));
        assert!(!broken.attach_region);
    }

    #[test]
    fn switches() {
        assert!(truthy(Some("true")));
        assert!(truthy(Some("1")));
        assert!(!truthy(Some("0")));
        assert!(!truthy(None));
    }
}
