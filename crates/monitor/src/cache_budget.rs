//! How much disk a container may fill through its cache directory (issue 27 item 10).
//!
//! The plugins mount a container's cache directory (`containers/<podUID>_<container>/`,
//! or a DRA claim's `dra/claims/<uid>/`) read-write into it, so that the hook finds its
//! region file there; whatever else the tenant writes through that mount lands on the
//! node's disk. Each scan measures what a directory holds besides its region files —
//! allocated blocks, so a sparse file costs what it really costs, and entries, since
//! inodes run out too — and, above [`CACHE_DIR_BUDGET`] or [`MAX_ENTRIES`], takes it back: every other entry is removed and a region file
//! grown past [`REGION_ALLOWANCE`] is cut back to it (no hook maps past its layout, so a
//! region is never damaged). The bound is the budget plus what the tenant writes within
//! one scan interval; a regular file is emptied before it is unlinked, so one the tenant
//! keeps open does not hold its blocks. A hard bound needs the file system to enforce one:
//! a size-limited file system (a tmpfs with `size=`) or a project quota under the hook
//! path's `containers/` and `dra/claims/`, which an operator sets up on the node.
//!
//! [`budget_plan`] decides over plain data; [`measure`] and [`reclaim`] are the shells.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Bytes a cache directory may hold besides its region files' allowance. Nothing the
/// hooks write needs any (they only map the region the plugin made); the room covers a
/// temporary file of a region being linked into place, left by a crash.
pub const CACHE_DIR_BUDGET: u64 = 16 << 20;

/// Bytes one region file may hold: the larger layout (ours, or HAMi-core's file of
/// 2,008,953 bytes), rounded up to MiB, plus a MiB for the file system's own blocks.
pub const REGION_ALLOWANCE: u64 = {
    let ours = hami_region::layout::REGION_SIZE as u64;
    let core = crate::hami_core_region::V1.size as u64 + 1;
    let larger = if ours > core { ours } else { core };
    (larger.div_ceil(1 << 20) + 1) << 20
};

/// Entries a directory may hold, nested ones included (as many as
/// [`crate::cache_dirs::file_names`] reads).
pub const MAX_ENTRIES: usize = crate::cache_dirs::MAX_DIR_ENTRIES;

// Either region file fits with room for the file system's blocks, and the allowance stays
// small next to the budget.
const _: () = assert!(REGION_ALLOWANCE >= hami_region::layout::REGION_SIZE as u64 + (1 << 20));
const _: () = assert!(REGION_ALLOWANCE >= 2_008_953 + (1 << 20));
const _: () = assert!(REGION_ALLOWANCE <= CACHE_DIR_BUDGET / 2);

/// Region files a directory may hold (one HAMi-core and one of ours), as
/// [`crate::cache_dirs::cache_files`] allows.
pub const MAX_REGION_FILES: usize = 2;

/// Entries (and nested entries) [`measure`] looks at in one directory per scan; more is
/// over the budget whatever their size.
pub const MAX_MEASURED: usize = 4096;

/// The region file names the plugins create (the AMD plugin and the DRA driver's
/// `hipdevshr.cache`, the NVIDIA plugin's `cudevshr.cache`): region files first.
pub const PLUGIN_REGION_NAMES: [&str; 2] = ["hipdevshr.cache", "cudevshr.cache"];

/// One top-level entry of a cache directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its name (any bytes: a tenant's).
    pub name: OsString,
    /// A regular file (not a link, FIFO or directory).
    pub regular: bool,
    /// Allocated bytes (`st_blocks` × 512), a directory's with everything in it.
    pub bytes: u64,
}

/// What a directory holds, as [`measure`] found it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Measured {
    /// Its top-level entries.
    pub entries: Vec<Entry>,
    /// Entries seen, nested ones included.
    pub count: usize,
    /// More than [`MAX_MEASURED`] entries: not all were seen.
    pub incomplete: bool,
}

/// What to do with a directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetPlan {
    /// Bytes beyond the region files' allowance.
    pub over: u64,
    /// Whether `over` exceeds the budget (or the directory could not be measured whole).
    pub exceeded: bool,
    /// Entries to remove (everything but the region files), when exceeded.
    pub remove: Vec<OsString>,
    /// Region files to cut back to [`REGION_ALLOWANCE`], when exceeded.
    pub shrink: Vec<OsString>,
}

/// The region files of `entries`: regular `.cache` files, the plugins' names first, then
/// by name, at most [`MAX_REGION_FILES`].
fn regions(entries: &[Entry]) -> Vec<&str> {
    let mut names: Vec<&str> = entries
        .iter()
        .filter(|e| e.regular)
        .filter_map(|e| e.name.to_str())
        .filter(|n| n.ends_with(".cache"))
        .collect();
    names.sort_by_key(|n| (!PLUGIN_REGION_NAMES.contains(n), *n));
    names.truncate(MAX_REGION_FILES);
    names
}

/// The decision for a directory holding `measured`, allowed `budget` bytes besides its
/// region files.
pub fn budget_plan(measured: &Measured, budget: u64) -> BudgetPlan {
    let regions = regions(&measured.entries);
    let mut plan = BudgetPlan::default();
    for e in &measured.entries {
        if e.name.to_str().is_some_and(|n| regions.contains(&n)) {
            let excess = e.bytes.saturating_sub(REGION_ALLOWANCE);
            plan.over = plan.over.saturating_add(excess);
            if excess > 0 {
                plan.shrink.push(e.name.clone());
            }
        } else {
            plan.over = plan.over.saturating_add(e.bytes);
            plan.remove.push(e.name.clone());
        }
    }
    plan.exceeded = plan.over > budget || measured.count > MAX_ENTRIES || measured.incomplete;
    if !plan.exceeded {
        plan.remove.clear();
        plan.shrink.clear();
    }
    plan
}

fn allocated(meta: &std::fs::Metadata) -> u64 {
    meta.blocks().saturating_mul(512)
}

/// Allocated bytes under directory `dir` (links not followed), counting entries into
/// `seen`; `None` once `seen` passes [`MAX_MEASURED`].
fn tree_bytes(dir: &Path, seen: &mut usize) -> Option<u64> {
    let mut total = 0u64;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Some(0);
    };
    for entry in entries.flatten() {
        *seen += 1;
        if *seen > MAX_MEASURED {
            return None;
        }
        // `DirEntry::metadata` does not follow a link.
        let Ok(meta) = entry.metadata() else { continue };
        total = total.saturating_add(allocated(&meta));
        if meta.is_dir() {
            total = total.saturating_add(tree_bytes(&entry.path(), seen)?);
        }
    }
    Some(total)
}

/// Measures directory `dir`: its entries' allocated bytes, subdirectories with all they
/// hold, at most [`MAX_MEASURED`] entries in all.
pub fn measure(dir: &Path) -> io::Result<Measured> {
    let mut out = Measured::default();
    let mut seen = 0usize;
    for entry in std::fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        seen += 1;
        if seen > MAX_MEASURED {
            out.incomplete = true;
            break;
        }
        let Ok(meta) = entry.metadata() else { continue };
        let name = entry.file_name();
        let mut bytes = allocated(&meta);
        if meta.is_dir() {
            match tree_bytes(&entry.path(), &mut seen) {
                Some(b) => bytes = bytes.saturating_add(b),
                None => out.incomplete = true,
            }
        }
        out.entries.push(Entry {
            name,
            regular: meta.is_file(),
            bytes,
        });
        if out.incomplete {
            break;
        }
    }
    out.count = seen;
    Ok(out)
}

/// Opens `path` for writing without following a link or blocking on a FIFO; only a
/// regular file is returned.
fn open_regular(path: &Path) -> io::Result<Option<File>> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    Ok(file.metadata()?.is_file().then_some(file))
}

/// Empties the regular file at `path` when it has no other name (a hard link elsewhere
/// may be a region, which is never emptied), so its blocks are freed even while a process
/// keeps it open; then unlinks it.
fn remove_file_emptied(path: &Path) -> io::Result<()> {
    if let Ok(Some(file)) = open_regular(path)
        && file.metadata()?.nlink() == 1
    {
        file.set_len(0)?;
    }
    std::fs::remove_file(path)
}

/// Removes `path` (a directory with all it holds, depth first), emptying regular files
/// first, at most `left` entries; returns false when `left` ran out first (the rest goes
/// at the next scan).
fn remove_tree(path: &Path, left: &mut usize) -> io::Result<bool> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        if *left == 0 {
            return Ok(false);
        }
        *left -= 1;
        return if meta.is_file() {
            remove_file_emptied(path)
        } else {
            std::fs::remove_file(path)
        }
        .map(|()| true);
    }
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        match remove_tree(&entry.path(), left) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    if *left == 0 {
        return Ok(false);
    }
    *left -= 1;
    std::fs::remove_dir(path).map(|()| true)
}

/// Carries out an exceeded `plan` in `dir`: removes its entries to remove (at most
/// [`MAX_MEASURED`] files per call) and cuts its region files back to
/// [`REGION_ALLOWANCE`]. Returns the first error; entries that vanished meanwhile count
/// as removed.
pub fn reclaim(dir: &Path, plan: &BudgetPlan) -> io::Result<()> {
    let mut left = MAX_MEASURED;
    let mut first_error = None;
    for name in &plan.remove {
        match remove_tree(&dir.join(name), &mut left) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    for name in &plan.shrink {
        let path = dir.join(name);
        let cut = open_regular(&path).and_then(|file| match file {
            Some(file) if file.metadata()?.len() > REGION_ALLOWANCE => {
                file.set_len(REGION_ALLOWANCE)
            }
            _ => Ok(()),
        });
        match cut {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn file(name: &str, bytes: u64) -> Entry {
        Entry {
            name: name.into(),
            regular: true,
            bytes,
        }
    }

    fn measured(entries: Vec<Entry>) -> Measured {
        Measured {
            count: entries.len(),
            entries,
            incomplete: false,
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn region_files_and_a_little_else_are_within_the_budget() {
        let m = measured(vec![
            file("hipdevshr.cache", 2 * MIB),
            file("cudevshr.cache", 2 * MIB),
            file("hipdevshr.cache.tmp.41", 2 * MIB),
        ]);
        let plan = budget_plan(&m, CACHE_DIR_BUDGET);
        assert_eq!(plan.over, 2 * MIB);
        assert!(!plan.exceeded && plan.remove.is_empty() && plan.shrink.is_empty());
    }

    #[test]
    fn past_the_budget_all_but_the_regions_goes_and_a_grown_region_is_cut_back() {
        let m = measured(vec![
            file("hipdevshr.cache", REGION_ALLOWANCE + 5 * MIB),
            file("a.cache", MIB),
            file("b.cache", MIB),
            file("movie.mkv", 12 * MIB),
            Entry {
                name: "dir".into(),
                regular: false,
                bytes: 4096,
            },
        ]);
        let plan = budget_plan(&m, CACHE_DIR_BUDGET);
        assert_eq!(plan.over, 5 * MIB + MIB + 12 * MIB + 4096);
        assert!(plan.exceeded);
        // The plugin's name first, then by name: b.cache is the third `.cache`.
        assert_eq!(plan.shrink, ["hipdevshr.cache"]);
        assert_eq!(plan.remove, ["b.cache", "movie.mkv", "dir"]);
        // A directory too large to measure is over whatever it held so far.
        let mut m = measured(vec![file("hipdevshr.cache", MIB)]);
        m.incomplete = true;
        assert!(budget_plan(&m, CACHE_DIR_BUDGET).exceeded);
        // So is one of more entries than a directory may hold, however small.
        let mut many: Vec<Entry> = (0..=MAX_ENTRIES)
            .map(|i| file(&format!("e{i}"), 0))
            .collect();
        many.push(file("hipdevshr.cache", MIB));
        let plan = budget_plan(&measured(many), CACHE_DIR_BUDGET);
        assert!(plan.exceeded && plan.over == 0);
        assert_eq!(plan.remove.len(), MAX_ENTRIES + 1);
    }

    proptest! {
        /// Whatever a directory holds: the plugins' region files are never removed, at
        /// most two `.cache` files are kept, and once exceeded nothing but region files
        /// (each within its allowance after the cut) stays.
        #[test]
        fn regions_are_kept_and_the_rest_is_bounded(
            entries in proptest::collection::btree_map(
                prop_oneof!["[a-c]\\.cache", "[a-c]", Just("hipdevshr.cache".to_string()), Just("cudevshr.cache".to_string())],
                (any::<bool>(), 0u64..64 * MIB),
                0..8,
            ),
            budget in 0u64..32 * MIB,
        ) {
            let entries: Vec<Entry> = entries
                .into_iter()
                .map(|(name, (regular, bytes))| Entry { name: name.into(), regular, bytes })
                .collect();
            let plan = budget_plan(&measured(entries.clone()), budget);
            for name in PLUGIN_REGION_NAMES {
                let regular = entries.iter().any(|e| e.name == name && e.regular);
                prop_assert!(!(regular && plan.remove.iter().any(|r| r == name)));
            }
            if plan.exceeded {
                let kept: Vec<&Entry> = entries.iter().filter(|e| !plan.remove.contains(&e.name)).collect();
                prop_assert!(kept.len() <= MAX_REGION_FILES);
                prop_assert!(kept.iter().all(|e| e.regular && e.name.to_string_lossy().ends_with(".cache")));
                for e in kept {
                    prop_assert_eq!(e.bytes > REGION_ALLOWANCE, plan.shrink.contains(&e.name));
                }
            } else {
                prop_assert!(plan.over <= budget && entries.len() <= MAX_ENTRIES);
                prop_assert!(plan.remove.is_empty() && plan.shrink.is_empty());
            }
        }
    }
}
