//! What one scan of the containers directory does (pure): which tracked directories are
//! forgotten, what happens to each directory present (track it, wait for its pod, remove
//! it, report its name), and which region files of a tracked directory are closed or
//! opened. [`crate::node_monitor::NodeMonitor::refresh`] lists the directory, applies the
//! plan, and does the I/O (removal, listing each directory, opening regions).
//!
//! The rules: the AMD plugin's hook-config directory is not a container's (its files are
//! pruned by [`crate::cache_dirs::hook_config_action`]); a directory no longer present is
//! forgotten; a directory of a pod the
//! informer knows is tracked, whatever its age; one of an unknown pod is kept (and stays
//! tracked if it was) until `mtime + grace` passed, then removed ([`orphan_decision`]); a
//! region file that left the directory is closed, one that appeared is opened, one already
//! open is kept open.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, SystemTime};

use crate::cache_dirs::{HOOK_CONFIG_DIR, Orphan, orphan_decision, parse_dir_name};

/// What to do with one directory present in the containers directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirAction<'a> {
    /// The AMD plugin's hook configs ([`HOOK_CONFIG_DIR`]): its stale files are pruned.
    HookConfigs,
    /// The name is not `<podUID>_<container>`: reported, left alone.
    BadName,
    /// No pod on the node has its UID (yet), within the grace period: reported, kept.
    WaitForPod,
    /// No pod on the node has its UID, past the grace period: removed and forgotten.
    Remove,
    /// Its pod is known: list it and track its regions.
    Track {
        /// The pod's UID.
        pod_uid: &'a str,
        /// The container's name.
        container: &'a str,
    },
}

/// The decision for the directory `name`, last modified at `mtime`, at `now`.
pub fn dir_action<'a>(
    name: &'a str,
    mtime: SystemTime,
    pod_known: impl Fn(&str) -> bool,
    now: SystemTime,
    grace: Duration,
) -> DirAction<'a> {
    if name == HOOK_CONFIG_DIR {
        return DirAction::HookConfigs;
    }
    let Some((pod_uid, container)) = parse_dir_name(name) else {
        return DirAction::BadName;
    };
    match orphan_decision(pod_known(pod_uid), mtime, now, grace) {
        Orphan::Keep => DirAction::Track { pod_uid, container },
        Orphan::Wait => DirAction::WaitForPod,
        Orphan::Remove => DirAction::Remove,
    }
}

/// The tracked directories that are no longer present: forgotten before the scan.
pub fn forgotten<'a>(
    tracked: impl IntoIterator<Item = &'a str>,
    present: &HashSet<&str>,
) -> Vec<&'a str> {
    tracked
        .into_iter()
        .filter(|name| !present.contains(name))
        .collect()
}

/// How a tracked directory's open regions follow its files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionChanges {
    /// Open regions whose file is no longer listed: closed.
    pub close: Vec<String>,
    /// Listed files not open yet: opened (an error is reported and retried next scan).
    pub open: Vec<String>,
}

/// What changes when a directory with regions `open` now lists the region `files`.
pub fn region_changes<'a>(
    open: impl IntoIterator<Item = &'a str>,
    files: &[String],
) -> RegionChanges {
    let open: BTreeSet<&str> = open.into_iter().collect();
    let listed: BTreeSet<&str> = files.iter().map(String::as_str).collect();
    RegionChanges {
        close: open.difference(&listed).map(|s| s.to_string()).collect(),
        open: files
            .iter()
            .filter(|f| !open.contains(f.as_str()))
            .cloned()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GRACE: Duration = Duration::from_secs(300);

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    #[test]
    fn known_pods_are_tracked_unknown_ones_wait_then_go() {
        let known = |uid: &str| uid == "u1";
        assert_eq!(
            dir_action("u1_main", t(0), known, t(10_000), GRACE),
            DirAction::Track {
                pod_uid: "u1",
                container: "main"
            }
        );
        assert_eq!(
            dir_action("u2_main", t(0), known, t(299), GRACE),
            DirAction::WaitForPod
        );
        assert_eq!(
            dir_action("u2_main", t(0), known, t(300), GRACE),
            DirAction::Remove
        );
        assert_eq!(
            dir_action("nounderscore", t(0), known, t(10_000), GRACE),
            DirAction::BadName
        );
        assert_eq!(
            dir_action(".hook-config", t(0), known, t(10_000), GRACE),
            DirAction::HookConfigs
        );
    }

    #[test]
    fn directories_gone_are_forgotten() {
        let present: HashSet<&str> = ["a_x", "c_x"].into();
        assert_eq!(forgotten(["a_x", "b_x", "c_x"], &present), ["b_x"]);
    }

    #[test]
    fn regions_follow_the_files_listed() {
        let files = vec!["a.cache".to_string(), "c.cache".to_string()];
        assert_eq!(
            region_changes(["a.cache", "b.cache"], &files),
            RegionChanges {
                close: vec!["b.cache".into()],
                open: vec!["c.cache".into()],
            }
        );
        assert_eq!(
            region_changes(["a.cache", "c.cache"], &files),
            RegionChanges::default()
        );
    }

    proptest! {
        /// The garbage collection never removes the directory of a pod the informer knows
        /// (a running container keeps its accounting), nor one younger than the grace.
        #[test]
        fn never_removes_a_known_pod_or_a_young_directory(
            uid in "[a-f0-9-]{1,8}", container in "[a-z0-9_-]{1,8}", known in any::<bool>(),
            mtime_s in 0u64..2000, now_s in 0u64..2000,
        ) {
            let name = format!("{uid}_{container}");
            let action = dir_action(&name, t(mtime_s), |u| known && u == uid, t(now_s), GRACE);
            if action == DirAction::Remove {
                prop_assert!(!known);
                prop_assert!(now_s >= mtime_s + GRACE.as_secs());
            }
            if known {
                let tracked = matches!(action, DirAction::Track { .. });
                prop_assert!(tracked, "a known pod's directory is tracked");
            }
        }

        /// Forgotten names are exactly the tracked ones not present; after the changes the
        /// open regions are exactly the files listed.
        #[test]
        fn forgetting_and_region_changes_are_exact(
            tracked in proptest::collection::btree_set("[a-d]", 0..4),
            present in proptest::collection::btree_set("[a-d]", 0..4),
            open in proptest::collection::btree_set("[a-d]\\.cache", 0..4),
            files in proptest::collection::btree_set("[a-d]\\.cache", 0..3),
        ) {
            let present_set: HashSet<&str> = present.iter().map(String::as_str).collect();
            let gone = forgotten(tracked.iter().map(String::as_str), &present_set);
            for name in &tracked {
                prop_assert_eq!(gone.contains(&name.as_str()), !present.contains(name));
            }
            let files: Vec<String> = files.into_iter().collect();
            let changes = region_changes(open.iter().map(String::as_str), &files);
            let mut after: BTreeSet<String> = open.clone();
            for c in &changes.close {
                prop_assert!(after.remove(c));
            }
            for o in &changes.open {
                prop_assert!(after.insert(o.clone()), "opened twice: {}", o);
            }
            prop_assert_eq!(after, files.iter().cloned().collect::<BTreeSet<_>>());
        }
    }
}
