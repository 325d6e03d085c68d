//! The hook's settings. Each variable comes from the pod spec (pid 1's environment) when it is
//! set there, else from this process's own start-up environment: a child started with a
//! cleaned environment but still under `LD_AUDIT` gets the pod's limits back, and a process
//! cannot point itself at a private accounting file or a larger limit.

use hami_protocol::memory_limit::parse_memory_limit;
use hami_region::Limits;
use hami_region::layout::MAX_DEVICES;

pub const DEFAULT_CACHE: &str = "/tmp/hipdevshr.cache";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookConfig {
    pub limits: Limits,
    /// Limit variables that could not be read (each made its device fail closed).
    pub limit_errors: Vec<String>,
    pub cache_path: String,
    pub log_level: u8,
    /// `HIP_OVERSUBSCRIBE`: hipMalloc allocates managed memory.
    pub oversubscribe: bool,
    /// `ACTIVE_OOM_KILLER`: a process found above its device's limit is terminated.
    pub active_oom_killer: bool,
}

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
        log_level: crate::log::parse_level(get("LIBHIP_LOG_LEVEL").as_deref()),
        oversubscribe: truthy(get("HIP_OVERSUBSCRIBE").as_deref()),
        active_oom_killer: truthy(get("ACTIVE_OOM_KILLER").as_deref()),
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
    fn switches() {
        assert!(truthy(Some("true")));
        assert!(truthy(Some("1")));
        assert!(!truthy(Some("0")));
        assert!(!truthy(None));
    }
}
