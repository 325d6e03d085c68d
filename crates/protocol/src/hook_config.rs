//! The per-container hook configuration (issue 14 item 7): what the device plugin decided
//! for one container — memory limits, the accounting file, CU masks, the SM limit and other
//! pinned runtime variables — written by the plugin into a file that is bind-mounted
//! **read-only** at [`CONTAINER_PATH`]. Both hooks read it first and fall back to the
//! environment only where no such file exists (hooks used without our plugins), so a process
//! cannot start a child with a private cache path or no limit.
//!
//! The hooks link this crate without default features, so the format is hand-written text
//! (no serde): UTF-8, `\n`-terminated lines, at most [`MAX_BYTES`] bytes.
//!
//! ```text
//! hami-hook-config/1
//! memory-limit=1073741824
//! memory-limit.0=4294967296
//! shared-cache=/usr/local/vgpu/cache/hipdevshr.cache
//! shared-cache-inode=1234567
//! sm-limit=50
//! hsa-cu-mask=0:0-3;1:8-11
//! roc-global-cu-mask=0xf
//! pin.AMD_TASK_PRIORITY=1
//! ```
//!
//! - line 1 is the header; its number is the major version ([`VERSION`]), a reader refuses
//!   any other (fail closed), so an incompatible change bumps it;
//! - `#` lines and empty lines are ignored; every other line is `key=value`;
//! - `memory-limit.<i>` (device `i` < [`MAX_DEVICES`]) and `memory-limit` (every device
//!   without its own line) are plain decimal **bytes**; `0` means "refuse everything";
//! - `shared-cache` is an absolute path; `shared-cache-inode` (only with `shared-cache`) the
//!   inode of the region file the plugin created there: a hook then uses that file only and
//!   never creates one, so deleting or replacing it (the directory is the container's)
//!   fails closed instead of starting fresh accounting; `sm-limit` is 0..=100 (percent);
//! - `hsa-cu-mask` is an `HSA_CU_MASK` value (SPEC §2.5); `roc-global-cu-mask` a
//!   `ROC_GLOBAL_CU_MASK` value (`0x` + hex digits, one mask for every device);
//! - `pin.<NAME>` pins environment variable `NAME` (`[A-Z0-9_]+`) to the value as the
//!   runtime reads it (e.g. `AMD_TASK_PRIORITY`, `HIP_OVERSUBSCRIBE`, `CUDA_TASK_PRIORITY`);
//!   the plugins pin a container's task priority from its spec (a plain `value`, or NVIDIA's
//!   `nvidia.com/priority` limit); without that pin the hooks keep the priority the process
//!   started with (the user's own, not part of the slice);
//! - a key that is unknown, repeated or malformed is an error naming the line: the hooks
//!   fail closed on it rather than guess.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::cu_list::{CuSet, HsaCuMask};

/// Directory under the AMD plugin's cache root holding each sliced container's hook config
/// (`<uid>_<container>.conf`, written through a `<uid>_<container>.tmp<pid>` file), mounted
/// read-only at [`CONTAINER_PATH`]. Not inside the container's own directory, which is
/// mounted read-write; the monitor knows it as the plugin's and prunes its stale files.
pub const HOST_DIR: &str = ".hook-config";

/// Where sliced containers see their configuration (a read-only bind mount).
pub const CONTAINER_PATH: &str = "/usr/local/vgpu/hook.conf";
/// Where a hook looks **only when [`CONTAINER_PATH`] does not exist** (hooks used without
/// our plugins, tests): an environment variable naming the file.
pub const PATH_ENV: &str = "HAMI_HOOK_CONFIG";
/// The variable HIP reads its process-wide CU mask from ([`global_cu_mask`] values).
pub const ROC_GLOBAL_CU_MASK: &str = "ROC_GLOBAL_CU_MASK";
/// The major version this module reads and writes.
pub const VERSION: u32 = 1;
/// Header line without its version.
pub const HEADER_PREFIX: &str = "hami-hook-config/";
/// Largest file a reader accepts (a real one is a few hundred bytes).
pub const MAX_BYTES: usize = 64 * 1024;
/// Devices a configuration can name (the HIP region's 64; CUDA's 16 fits).
pub const MAX_DEVICES: u32 = 64;

/// One container's hook configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookConfig {
    /// Per-device limit in bytes (`memory-limit.<i>`).
    pub memory_limits: BTreeMap<u32, u64>,
    /// Limit of every device without its own entry (`memory-limit`).
    pub default_memory_limit: Option<u64>,
    /// The accounting file (`shared-cache`), absolute.
    pub shared_cache: Option<String>,
    /// Inode of the accounting file the plugin created (`shared-cache-inode`).
    pub shared_cache_inode: Option<u64>,
    /// Percent of the SMs (`sm-limit`), 0..=100.
    pub sm_limit: Option<u8>,
    /// `HSA_CU_MASK` value (`hsa-cu-mask`), validated.
    pub hsa_cu_mask: Option<String>,
    /// `ROC_GLOBAL_CU_MASK` value (`roc-global-cu-mask`), `0x` + hex.
    pub roc_global_cu_mask: Option<String>,
    /// Other pinned variables (`pin.<NAME>`).
    pub pinned: BTreeMap<String, String>,
}

/// Why a configuration file was refused; each names the line and what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookConfigError {
    /// The file is larger than [`MAX_BYTES`]; its size.
    #[error("hook config is {0} bytes, more than the {MAX_BYTES} a reader accepts")]
    TooLarge(usize),
    /// The file is not UTF-8.
    #[error("hook config is not UTF-8 text")]
    NotUtf8,
    /// The first line is not the format's header.
    #[error("hook config does not start with the line {HEADER_PREFIX}{VERSION}")]
    MissingHeader,
    /// The header names another format version; that version.
    #[error(
        "hook config has version {0}; this hook reads version {VERSION}: upgrade the hook or the plugin so they match"
    )]
    UnsupportedVersion(String),
    /// A line cannot be read: not `key=value`, a key given twice or unknown, a bad value.
    #[error("hook config line {line}: {reason}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// [`HookConfig::validate`] refused a field (or an inode came without its path); which and why.
    #[error("hook config field refused: {0}")]
    Field(String),
}

impl HookConfig {
    /// The limit in force for `device`: its own entry, else the default, else none.
    pub fn memory_limit(&self, device: u32) -> Option<u64> {
        self.memory_limits
            .get(&device)
            .copied()
            .or(self.default_memory_limit)
    }

    /// Checks every field against the rules [`decode`] applies, so a writer cannot produce
    /// a file its readers refuse.
    pub fn validate(&self) -> Result<(), HookConfigError> {
        let bad = HookConfigError::Field;
        if let Some(device) = self.memory_limits.keys().find(|d| **d >= MAX_DEVICES) {
            return Err(bad(format!(
                "memory-limit.{device}: device index must be below {MAX_DEVICES}"
            )));
        }
        if let Some(path) = &self.shared_cache {
            check_path(path).map_err(bad)?;
        }
        if self.shared_cache_inode.is_some() && self.shared_cache.is_none() {
            return Err(bad(INODE_WITHOUT_PATH.to_owned()));
        }
        if let Some(limit) = self.sm_limit {
            check_sm_limit(u64::from(limit)).map_err(bad)?;
        }
        if let Some(mask) = &self.hsa_cu_mask {
            check_hsa_cu_mask(mask).map_err(bad)?;
        }
        if let Some(mask) = &self.roc_global_cu_mask {
            check_global_mask(mask).map_err(bad)?;
        }
        for (name, value) in &self.pinned {
            check_env_name(name).map_err(bad)?;
            check_value(value).map_err(bad)?;
        }
        Ok(())
    }

    /// The file's text. Fails only when a field breaks the rules of [`validate`](Self::validate).
    pub fn encode(&self) -> Result<String, HookConfigError> {
        self.validate()?;
        let mut out = format!("{HEADER_PREFIX}{VERSION}\n");
        // Writing to a String cannot fail.
        if let Some(bytes) = self.default_memory_limit {
            let _ = writeln!(out, "memory-limit={bytes}");
        }
        for (device, bytes) in &self.memory_limits {
            let _ = writeln!(out, "memory-limit.{device}={bytes}");
        }
        if let Some(path) = &self.shared_cache {
            let _ = writeln!(out, "shared-cache={path}");
        }
        if let Some(inode) = self.shared_cache_inode {
            let _ = writeln!(out, "shared-cache-inode={inode}");
        }
        if let Some(limit) = self.sm_limit {
            let _ = writeln!(out, "sm-limit={limit}");
        }
        if let Some(mask) = &self.hsa_cu_mask {
            let _ = writeln!(out, "hsa-cu-mask={mask}");
        }
        if let Some(mask) = &self.roc_global_cu_mask {
            let _ = writeln!(out, "roc-global-cu-mask={mask}");
        }
        for (name, value) in &self.pinned {
            let _ = writeln!(out, "pin.{name}={value}");
        }
        Ok(out)
    }
}

/// The `ROC_GLOBAL_CU_MASK` value (`0x` + hex, most significant digit first, CU `n` = bit
/// `n`) of a CU set; `None` for an empty set or one beyond 256 CUs (the hex cap here).
///
/// ROCm 5.x's ROCr does not read `HSA_CU_MASK`; the HIP layer's `ROC_GLOBAL_CU_MASK` is its
/// only CU mask, and it applies to **every** device of the process. A container whose
/// devices have different CU sets cannot be expressed in it: see [`shared_cu_set`].
pub fn global_cu_mask(set: &CuSet) -> Option<String> {
    let max = set.max()?;
    if max >= 256 {
        return None;
    }
    let digits = (max / 4 + 1) as usize;
    let mut out = String::with_capacity(digits + 2);
    out.push_str("0x");
    for digit in (0..digits).rev() {
        let nibble = (0..4u32)
            .filter(|bit| set.contains(digit as u32 * 4 + bit))
            .fold(0u32, |acc, bit| acc | (1 << bit));
        out.push(char::from_digit(nibble, 16).unwrap_or('0'));
    }
    Some(out)
}

/// The one CU set all of a container's devices share, if they do (then
/// [`global_cu_mask`] can express the slice on ROCm 5.x).
pub fn shared_cu_set<'a>(sets: impl IntoIterator<Item = &'a CuSet>) -> Option<&'a CuSet> {
    let mut sets = sets.into_iter();
    let first = sets.next()?;
    sets.all(|s| s == first).then_some(first)
}

/// Parses a configuration file's bytes.
pub fn decode(bytes: &[u8]) -> Result<HookConfig, HookConfigError> {
    if bytes.len() > MAX_BYTES {
        return Err(HookConfigError::TooLarge(bytes.len()));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| HookConfigError::NotUtf8)?;
    let mut lines = text.split('\n').enumerate();
    let header = lines.next().map(|(_, l)| l).unwrap_or_default();
    let Some(version) = header.strip_prefix(HEADER_PREFIX) else {
        return Err(HookConfigError::MissingHeader);
    };
    if version != VERSION.to_string() {
        return Err(HookConfigError::UnsupportedVersion(version.to_owned()));
    }
    let mut config = HookConfig::default();
    let mut seen: Vec<&str> = Vec::new();
    for (index, line) in lines {
        let number = index + 1;
        let err = |reason: String| HookConfigError::Line {
            line: number,
            reason,
        };
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(err(format!("{line:?} is not key=value")));
        };
        if seen.contains(&key) {
            return Err(err(format!("{key} is given twice")));
        }
        seen.push(key);
        check_value(value).map_err(err)?;
        if key == "memory-limit" {
            config.default_memory_limit = Some(parse_decimal(key, value).map_err(err)?);
        } else if let Some(device) = key.strip_prefix("memory-limit.") {
            let device = parse_decimal(key, device)
                .ok()
                .and_then(|d| u32::try_from(d).ok())
                .filter(|d| *d < MAX_DEVICES)
                .ok_or_else(|| {
                    err(format!(
                        "{key}: the device index must be a number below {MAX_DEVICES}"
                    ))
                })?;
            let bytes = parse_decimal(key, value).map_err(err)?;
            config.memory_limits.insert(device, bytes);
        } else if key == "shared-cache" {
            check_path(value).map_err(err)?;
            config.shared_cache = Some(value.to_owned());
        } else if key == "shared-cache-inode" {
            config.shared_cache_inode = Some(parse_decimal(key, value).map_err(err)?);
        } else if key == "sm-limit" {
            let limit = parse_decimal(key, value).map_err(err)?;
            check_sm_limit(limit).map_err(err)?;
            config.sm_limit = u8::try_from(limit).ok();
        } else if key == "hsa-cu-mask" {
            check_hsa_cu_mask(value).map_err(err)?;
            config.hsa_cu_mask = Some(value.to_owned());
        } else if key == "roc-global-cu-mask" {
            check_global_mask(value).map_err(err)?;
            config.roc_global_cu_mask = Some(value.to_owned());
        } else if let Some(name) = key.strip_prefix("pin.") {
            check_env_name(name).map_err(err)?;
            config.pinned.insert(name.to_owned(), value.to_owned());
        } else {
            return Err(err(format!(
                "unknown key {key:?} (known: memory-limit, memory-limit.<i>, shared-cache, shared-cache-inode, sm-limit, hsa-cu-mask, roc-global-cu-mask, pin.<NAME>)"
            )));
        }
    }
    if config.shared_cache_inode.is_some() && config.shared_cache.is_none() {
        return Err(HookConfigError::Field(INODE_WITHOUT_PATH.to_owned()));
    }
    Ok(config)
}

const INODE_WITHOUT_PATH: &str = "shared-cache-inode is given without shared-cache";

fn parse_decimal(key: &str, text: &str) -> Result<u64, String> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) || text.len() > 20 {
        return Err(format!("{key}: {text:?} is not a decimal number"));
    }
    text.parse::<u64>()
        .map_err(|_| format!("{key}: {text:?} does not fit in 64 bits"))
}

fn check_value(value: &str) -> Result<(), String> {
    if value.chars().any(|c| c == '\0' || c == '\n' || c == '\r') {
        return Err("values may not hold NUL, CR or LF".to_owned());
    }
    Ok(())
}

fn check_path(path: &str) -> Result<(), String> {
    check_value(path)?;
    if !path.starts_with('/') || path.len() < 2 || path.ends_with('/') {
        return Err(format!(
            "shared-cache {path:?} must be an absolute path of a file"
        ));
    }
    Ok(())
}

fn check_sm_limit(limit: u64) -> Result<(), String> {
    if limit > 100 {
        return Err(format!("sm-limit {limit} is above 100 (percent)"));
    }
    Ok(())
}

fn check_hsa_cu_mask(mask: &str) -> Result<(), String> {
    check_value(mask)?;
    match HsaCuMask::parse(mask) {
        Ok(parsed) if !parsed.entries().is_empty() => Ok(()),
        Ok(_) => Err("hsa-cu-mask is empty".to_owned()),
        Err(e) => Err(format!("hsa-cu-mask {mask:?}: {e}")),
    }
}

fn check_global_mask(mask: &str) -> Result<(), String> {
    let digits = mask
        .strip_prefix("0x")
        .filter(|d| !d.is_empty() && d.len() <= 64 && d.bytes().all(|b| b.is_ascii_hexdigit()));
    match digits {
        Some(d) if d.bytes().any(|b| b != b'0') => Ok(()),
        _ => Err(format!(
            "roc-global-cu-mask {mask:?} must be 0x followed by hex digits with at least one bit set"
        )),
    }
}

fn check_env_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "pin.{name}: a variable name is upper-case letters, digits and _"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> HookConfig {
        let mut config = HookConfig {
            default_memory_limit: Some(1 << 30),
            shared_cache: Some("/usr/local/vgpu/cache/hipdevshr.cache".into()),
            shared_cache_inode: Some(1234567),
            sm_limit: Some(50),
            hsa_cu_mask: Some("0:0-3;1:8-11".into()),
            roc_global_cu_mask: Some("0xf".into()),
            ..HookConfig::default()
        };
        config.memory_limits.insert(0, 4 << 30);
        config.pinned.insert("AMD_TASK_PRIORITY".into(), "1".into());
        config
    }

    #[test]
    fn the_documented_example_decodes() {
        let text = "hami-hook-config/1\n# written by the AMD plugin\n\nmemory-limit=1073741824\nmemory-limit.0=4294967296\nshared-cache=/usr/local/vgpu/cache/hipdevshr.cache\nshared-cache-inode=1234567\nsm-limit=50\nhsa-cu-mask=0:0-3;1:8-11\nroc-global-cu-mask=0xf\npin.AMD_TASK_PRIORITY=1\n";
        let config = decode(text.as_bytes()).unwrap();
        assert_eq!(config, sample());
        assert_eq!(config.memory_limit(0), Some(4 << 30));
        assert_eq!(config.memory_limit(7), Some(1 << 30));
        assert_eq!(decode(config.encode().unwrap().as_bytes()).unwrap(), config);
    }

    #[test]
    fn bad_files_are_refused_with_the_line() {
        let cases: &[(&str, &str)] = &[
            ("", "does not start"),
            ("hami-hook-config/2\n", "version 2"),
            ("hami-hook-config/1\nmemory-limit=4g\n", "line 2"),
            ("hami-hook-config/1\nmemory-limit.64=1\n", "below 64"),
            (
                "hami-hook-config/1\nmemory-limit=1\nmemory-limit=2\n",
                "twice",
            ),
            ("hami-hook-config/1\nshared-cache=relative\n", "absolute"),
            ("hami-hook-config/1\nsm-limit=101\n", "above 100"),
            ("hami-hook-config/1\nhsa-cu-mask=zero\n", "hsa-cu-mask"),
            ("hami-hook-config/1\nroc-global-cu-mask=f\n", "0x"),
            ("hami-hook-config/1\nroc-global-cu-mask=0x0\n", "one bit"),
            ("hami-hook-config/1\npin.lower=1\n", "upper-case"),
            ("hami-hook-config/1\nlimit=1\n", "unknown key"),
            ("hami-hook-config/1\nmemory-limit\n", "key=value"),
            ("hami-hook-config/1\nshared-cache=/a\r\n", "CR"),
            (
                "hami-hook-config/1\nshared-cache-inode=5\n",
                "without shared-cache",
            ),
        ];
        for (text, needle) in cases {
            let err = decode(text.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
        assert!(matches!(
            decode(&vec![b'#'; MAX_BYTES + 1]),
            Err(HookConfigError::TooLarge(_))
        ));
        assert_eq!(decode(b"\xff"), Err(HookConfigError::NotUtf8));
    }

    #[test]
    fn encode_refuses_what_decode_would() {
        let mut config = sample();
        config.shared_cache = Some("/a\nmemory-limit=0".into());
        assert!(config.encode().is_err());
        let mut config = sample();
        config.memory_limits.insert(64, 1);
        assert!(config.encode().is_err());
        let mut config = sample();
        config.pinned.insert("A=B".into(), "1".into());
        assert!(config.encode().is_err());
    }

    #[test]
    fn global_cu_masks_put_cu_n_at_bit_n() {
        assert_eq!(global_cu_mask(&CuSet::range(0, 4)).as_deref(), Some("0xf"));
        assert_eq!(global_cu_mask(&CuSet::range(4, 4)).as_deref(), Some("0xf0"));
        assert_eq!(global_cu_mask(&CuSet::range(0, 1)).as_deref(), Some("0x1"));
        let mut set = CuSet::range(0, 2);
        set.insert_run(9, 9);
        assert_eq!(global_cu_mask(&set).as_deref(), Some("0x203"));
        assert_eq!(global_cu_mask(&CuSet::new()), None);
        assert_eq!(global_cu_mask(&CuSet::range(300, 1)), None);
        let a = CuSet::range(0, 8);
        let b = CuSet::range(8, 8);
        assert_eq!(shared_cu_set([&a, &a]), Some(&a));
        assert_eq!(shared_cu_set([&a, &b]), None);
    }

    fn arb_config() -> impl Strategy<Value = HookConfig> {
        (
            proptest::collection::btree_map(0u32..MAX_DEVICES, any::<u64>(), 0..5),
            proptest::option::of(any::<u64>()),
            proptest::option::of("/[a-z0-9_./-]{0,30}[a-z0-9]"),
            proptest::option::of(0u8..=100),
            proptest::option::of((0u32..8, 0u32..100, 0u32..20)),
            proptest::option::of("0x[0-9a-f]{0,15}[1-9a-f]"),
            proptest::collection::btree_map("[A-Z_][A-Z0-9_]{0,12}", "[ -~]{0,20}", 0..4),
        )
            .prop_map(
                |(limits, default, cache, sm, mask, global, pinned)| HookConfig {
                    memory_limits: limits,
                    default_memory_limit: default,
                    shared_cache_inode: cache.as_ref().map(|c| c.len() as u64 * 7919),
                    shared_cache: cache,
                    sm_limit: sm,
                    hsa_cu_mask: mask.map(|(i, first, len)| format!("{i}:{first}-{}", first + len)),
                    roc_global_cu_mask: global,
                    pinned,
                },
            )
    }

    proptest! {
        #[test]
        fn encode_then_decode_is_identity(config in arb_config()) {
            let text = config.encode().unwrap();
            prop_assert_eq!(decode(text.as_bytes()).unwrap(), config);
        }

        #[test]
        fn a_global_mask_round_trips_and_is_accepted(first in 0u32..200, len in 1u32..56) {
            let set = CuSet::range(first, len);
            let mask = global_cu_mask(&set).unwrap();
            prop_assert!(check_global_mask(&mask).is_ok());
            let value = u128::from_str_radix(&mask[2..], 16).ok();
            if first + len <= 128 {
                let expected = ((1u128 << len) - 1) << first;
                prop_assert_eq!(value, Some(expected));
            }
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes);
            let mut with_header = b"hami-hook-config/1\n".to_vec();
            with_header.extend_from_slice(&bytes);
            let _ = decode(&with_header);
        }

        #[test]
        fn every_line_stands_alone(config in arb_config(), drop in 1usize..12) {
            // Removing any line but the header of a valid file still decodes (the inode
            // line needs its path line).
            let text = config.encode().unwrap();
            let lines: Vec<&str> = text.lines().collect();
            let dropped = lines.get(drop).copied().unwrap_or("");
            prop_assume!(!(dropped.starts_with("shared-cache=") && config.shared_cache_inode.is_some()));
            let kept: Vec<&str> = lines.iter().enumerate().filter(|(i, _)| *i != drop).map(|(_, l)| *l).collect();
            prop_assert!(decode(kept.join("\n").as_bytes()).is_ok());
        }
    }
}
