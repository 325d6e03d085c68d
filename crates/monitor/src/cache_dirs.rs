//! The per-container cache directories `<hook path>/containers/<podUID>_<container>/`:
//! names, which files in them are regions, and when a directory may be removed. The
//! decisions are pure; [`list_dirs`] is the thin shell.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Splits `<podUID>_<container>` at the first `_` (pod UIDs and container names never
/// contain one). `None` when either part is empty or there is no `_`.
pub fn parse_dir_name(name: &str) -> Option<(&str, &str)> {
    let (uid, container) = name.split_once('_')?;
    (!uid.is_empty() && !container.is_empty()).then_some((uid, container))
}

/// The AMD device plugin's directory of hook configs inside the containers directory
/// (`hami_protocol::hook_config::HOST_DIR`: `<uid>_<container>.conf`, mounted read-only
/// into each container; written through a `<uid>_<container>.tmp<pid>` file). Not a
/// container's directory: its stale files are pruned ([`hook_config_action`]).
pub const HOOK_CONFIG_DIR: &str = hami_protocol::hook_config::HOST_DIR;

/// What to do with one entry of [`HOOK_CONFIG_DIR`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookConfig {
    /// Its pod is known, or unknown within the grace period, or it is the DRA driver's
    /// (`claim_<uid>.conf`, removed by the driver at unprepare): left alone.
    Keep,
    /// A file of a pod that is gone, past the grace period: removed.
    Remove,
    /// Not named `<uid>_<container>.<suffix>`: reported, left alone.
    BadName,
}

/// The decision for the entry `name` of [`HOOK_CONFIG_DIR`], last modified at `mtime`:
/// the rule of the containers' directories ([`orphan_decision`]) on the pod UID its name
/// starts with, so a container's hook config goes when its accounting directory goes.
pub fn hook_config_action(
    name: &str,
    mtime: SystemTime,
    pod_known: impl Fn(&str) -> bool,
    now: SystemTime,
    grace: Duration,
) -> HookConfig {
    // Pod UIDs and container names (DNS labels) hold no `.`.
    let Some((stem, _suffix)) = name.split_once('.') else {
        return HookConfig::BadName;
    };
    let Some((uid, _container)) = parse_dir_name(stem) else {
        return HookConfig::BadName;
    };
    if uid == "claim" {
        return HookConfig::Keep;
    }
    match orphan_decision(pod_known(uid), mtime, now, grace) {
        Orphan::Keep | Orphan::Wait => HookConfig::Keep,
        Orphan::Remove => HookConfig::Remove,
    }
}

/// Why a directory's files cannot be used (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheDirError {
    /// More region files than a container can have; how many.
    #[error(
        "{0} cache files; at most 2 are expected (one HAMi-core, one HIP region): remove the stale ones"
    )]
    TooMany(usize),
}

/// The region files of a directory: names ending in `.cache` that are not a bind-mounted
/// hook library (`libvgpu.so`, `libamvgpu.so`), sorted. Empty = nothing yet.
pub fn cache_files(names: &[String]) -> Result<Vec<String>, CacheDirError> {
    let mut files: Vec<String> = names
        .iter()
        .filter(|n| {
            n.ends_with(".cache")
                && !hami_protocol::names::Vendor::ALL
                    .iter()
                    .any(|v| n.contains(v.hook_library()))
        })
        .cloned()
        .collect();
    files.sort();
    if files.len() > 2 {
        return Err(CacheDirError::TooMany(files.len()));
    }
    Ok(files)
}

/// What to do with a directory whose pod the informer does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orphan {
    /// Its pod is known: keep.
    Keep,
    /// Unknown pod, but changed within the grace period (informer lag, a pod being
    /// created): keep for now.
    Wait,
    /// Unknown pod and older than the grace period: remove.
    Remove,
}

/// The reference's rule: remove a directory of an unknown pod once `mtime + grace` passed.
pub fn orphan_decision(
    pod_known: bool,
    mtime: SystemTime,
    now: SystemTime,
    grace: Duration,
) -> Orphan {
    if pod_known {
        return Orphan::Keep;
    }
    match now.duration_since(mtime) {
        Ok(age) if age >= grace => Orphan::Remove,
        _ => Orphan::Wait,
    }
}

/// One entry of the containers directory.
#[derive(Debug, Clone)]
pub struct DirEntry {
    /// File name, `<pod uid>_<container>`.
    pub name: String,
    /// Full path.
    pub path: PathBuf,
    /// Last modification, for the garbage collection grace.
    pub mtime: SystemTime,
}

/// Lists the subdirectories of `containers_dir` (files and vanished entries are skipped).
pub fn list_dirs(containers_dir: &Path) -> std::io::Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(containers_dir)? {
        let Ok(entry) = entry else { continue };
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_dir() {
            continue;
        }
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        out.push(DirEntry {
            name,
            path: entry.path(),
            mtime: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Most entries read from one cache directory: a tenant filling its directory with
/// millions of names costs its own series, not the scan.
pub const MAX_DIR_ENTRIES: usize = 256;

/// File names in a directory (at most [`MAX_DIR_ENTRIES`]; more is an error).
pub fn file_names(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        if names.len() == MAX_DIR_ENTRIES {
            return Err(std::io::Error::other(format!(
                "more than {MAX_DIR_ENTRIES} entries: a cache directory holds at most two region files; remove the rest"
            )));
        }
        if let Some(name) = entry.ok().and_then(|e| e.file_name().into_string().ok()) {
            names.push(name);
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_split_at_the_first_underscore() {
        assert_eq!(parse_dir_name("uid-1_main"), Some(("uid-1", "main")));
        assert_eq!(parse_dir_name("uid_a_b"), Some(("uid", "a_b")));
        assert_eq!(parse_dir_name("nounderscore"), None);
        assert_eq!(parse_dir_name("_main"), None);
        assert_eq!(parse_dir_name("uid_"), None);
    }

    #[test]
    fn picks_cache_files_and_ignores_mounted_libraries() {
        let names: Vec<String> = [
            "b.cache",
            "libvgpu.so",
            "a.cache",
            "x.log",
            "libvgpu.so.cache",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(cache_files(&names).unwrap(), vec!["a.cache", "b.cache"]);
        assert_eq!(cache_files(&[]).unwrap(), Vec::<String>::new());
        let many: Vec<String> = (0..3).map(|i| format!("{i}.cache")).collect();
        assert_eq!(cache_files(&many), Err(CacheDirError::TooMany(3)));
    }

    #[test]
    fn orphans_wait_for_the_grace_period() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let grace = Duration::from_secs(300);
        assert_eq!(
            orphan_decision(true, t0, t0 + grace * 10, grace),
            Orphan::Keep
        );
        assert_eq!(
            orphan_decision(false, t0, t0 + Duration::from_secs(299), grace),
            Orphan::Wait
        );
        assert_eq!(
            orphan_decision(false, t0, t0 + grace, grace),
            Orphan::Remove
        );
        assert_eq!(
            orphan_decision(false, t0 + grace, t0, grace),
            Orphan::Wait,
            "mtime in the future"
        );
    }

    #[test]
    fn hook_configs_of_gone_pods_go_after_the_grace_period() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let grace = Duration::from_secs(300);
        let known = |uid: &str| uid == "u1";
        let at = |name: &str, now: SystemTime| hook_config_action(name, t0, known, now, grace);
        let late = t0 + grace;
        assert_eq!(at("u1_main.conf", t0 + grace * 10), HookConfig::Keep);
        assert_eq!(at("u2_main.conf", t0 + grace / 2), HookConfig::Keep);
        assert_eq!(at("u2_main.conf", late), HookConfig::Remove);
        assert_eq!(at("u2_main.tmp4242", late), HookConfig::Remove);
        assert_eq!(at("u1_main.tmp4242", late), HookConfig::Keep);
        // The DRA driver's own, removed by it at unprepare.
        assert_eq!(at("claim_c-1.conf", late), HookConfig::Keep);
        for bad in [
            "u2_main",
            "nounderscore.conf",
            "_main.conf",
            ".conf",
            "u2_.conf",
        ] {
            assert_eq!(at(bad, late), HookConfig::BadName, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_round_trips(uid in "[a-f0-9-]{1,36}", ctr in "[a-z0-9-]{1,20}") {
            let name = format!("{uid}_{ctr}");
            prop_assert_eq!(parse_dir_name(&name), Some((uid.as_str(), ctr.as_str())));
        }
    }
}
