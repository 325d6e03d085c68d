//! The checkpoint on disk, durable at one `fdatasync` per change: `checkpoint.json` is a
//! snapshot ([`Checkpoint::save`]: temporary file, fsync, rename, directory fsync) and
//! `checkpoint.json.journal` the changes since, a JSON line each, appended and fdatasynced
//! before prepare or unprepare answers. Rewriting the whole snapshot on every call made the
//! checkpoint most of a prepare's time (all prepared claims' CDI specs, ~200 KB on a busy
//! node, synced each time; BENCHMARKS.md, DRA prepare latency); one appended line is ~3 KB.
//!
//! Every [`COMPACT_AFTER`] records, and when the plugin starts with a journal, the state is
//! written as a new snapshot and the journal replaced by an empty one (never truncated: a
//! reader may hold it). A crash between the two is harmless:
//! the journal is the whole history since the previous snapshot, so replaying it onto the
//! new one gives every claim it names its last value, which the new snapshot already holds.
//! A crash mid-append leaves a torn last line: that record was never acknowledged (its call
//! failed or never answered, and kubelet retries it), so it is dropped; any other line that
//! does not parse is corruption, refused like a corrupt snapshot.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::checkpoint::{Checkpoint, CheckpointError, PreparedClaim};

/// Records appended before the journal is folded into a new snapshot (~3 KB each).
pub const COMPACT_AFTER: usize = 256;

/// One change, a line of the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Record {
    /// The claim `uid` is prepared as `claim`.
    Put {
        /// Claim UID.
        uid: String,
        /// What was prepared.
        claim: Box<PreparedClaim>,
    },
    /// The claim `uid` is unprepared.
    Remove {
        /// Claim UID.
        uid: String,
    },
}

/// The journal beside the snapshot at `checkpoint`.
pub fn journal_path(checkpoint: &Path) -> PathBuf {
    let mut name = checkpoint.as_os_str().to_owned();
    name.push(".journal");
    PathBuf::from(name)
}

/// `snapshot` with the journal's records applied in order; also the number of records read.
/// A torn last line is dropped (see the module doc); `path` names the journal in errors.
pub fn replay(
    mut snapshot: Checkpoint,
    journal: &[u8],
    path: &str,
) -> Result<(Checkpoint, usize), CheckpointError> {
    let mut lines: Vec<&[u8]> = journal.split(|b| *b == b'\n').collect();
    // The piece after the last newline: empty, or a record a crash cut short (dropped).
    lines.pop();
    let mut records = 0;
    let count = lines.len();
    for (i, line) in lines.into_iter().enumerate() {
        match serde_json::from_slice::<Record>(line) {
            Ok(record) => {
                apply(&mut snapshot, record);
                records += 1;
            }
            // A last whole line of zeros: a crash left them where the append's data never
            // landed (the size did); also unacknowledged.
            Err(_) if i + 1 == count && line.iter().all(|b| *b == 0) => {}
            Err(e) => {
                return Err(CheckpointError::Corrupt {
                    path: path.to_owned(),
                    problem: format!("journal line {}: {e}", i + 1),
                });
            }
        }
    }
    Ok((snapshot, records))
}

fn apply(state: &mut Checkpoint, record: Record) {
    match record {
        Record::Put { uid, claim } => {
            state.claims.insert(uid, *claim);
        }
        Record::Remove { uid } => {
            state.claims.remove(&uid);
        }
    }
}

impl Checkpoint {
    /// Loads the snapshot and replays its journal; no files is an empty checkpoint (first
    /// start). Safe while the plugin writes: a compaction between reading the snapshot and
    /// the journal (both files replaced) is seen and read again.
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        Ok(load_counted(path)?.0)
    }
}

/// A file's (device, inode).
type FileId = (u64, u64);

/// What kind of thing `m` describes, for a message (`None`: a regular file).
pub fn not_regular(m: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_file() {
        None
    } else if t.is_symlink() {
        Some("a symbolic link")
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_block_device() || t.is_char_device() {
        Some("a device node")
    } else {
        Some("not a file")
    }
}

/// The checkpoint's files are regular files or absent: checked by `lstat` before any open,
/// so a FIFO planted there never blocks the start and a link is never followed.
fn check_regular(path: &Path) -> Result<(), CheckpointError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => match not_regular(&m) {
            None => Ok(()),
            Some(kind) => Err(CheckpointError::NotAFile {
                path: path.display().to_string(),
                kind,
            }),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CheckpointError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

fn load_counted(path: &Path) -> Result<(Checkpoint, usize), CheckpointError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let p = path.display().to_string();
    let journal = journal_path(path);
    let jp = journal.display().to_string();
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| CheckpointError::Io { path, source }
    };
    // Each file is read through a handle held until the check below: the identity of a
    // file held open cannot be reused by a later one, so "the same (dev, inode) at the path
    // after the read" means no compaction replaced it meanwhile. The writer replaces both
    // files and never shortens one a reader may hold (only a failed append's unacknowledged
    // tail, which replay drops as torn).
    let open = |path: &Path| -> Result<Option<(File, FileId)>, CheckpointError> {
        check_regular(path)?;
        match File::open(path) {
            Ok(f) => {
                let m = f.metadata().map_err(io(path))?;
                if let Some(kind) = not_regular(&m) {
                    // Replaced between the check and the open.
                    return Err(CheckpointError::NotAFile {
                        path: path.display().to_string(),
                        kind,
                    });
                }
                Ok(Some((f, (m.dev(), m.ino()))))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(io(path)(source)),
        }
    };
    let identity = |path: &Path| match std::fs::metadata(path) {
        Ok(m) => Ok(Some((m.dev(), m.ino()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(io(path)(source)),
    };
    let read_all = |file: &mut Option<(File, FileId)>, path: &Path| {
        let mut bytes = Vec::new();
        if let Some((f, _)) = file {
            f.read_to_end(&mut bytes).map_err(io(path))?;
        }
        Ok::<_, CheckpointError>(bytes)
    };
    for _ in 0..16 {
        // The journal first: one opened after the snapshot could follow a newer snapshot.
        let mut journal_file = open(&journal)?;
        let mut snapshot_file = open(path)?;
        let snapshot_bytes = read_all(&mut snapshot_file, path)?;
        let journal_bytes = read_all(&mut journal_file, &journal)?;
        if identity(path)? != snapshot_file.as_ref().map(|(_, id)| *id)
            || identity(&journal)? != journal_file.as_ref().map(|(_, id)| *id)
        {
            continue; // compacted meanwhile: this journal may not follow that snapshot
        }
        let snapshot = match snapshot_file {
            Some(_) => Checkpoint::decode(&snapshot_bytes, &p)?,
            None => Checkpoint::empty(),
        };
        return replay(snapshot, &journal_bytes, &jp);
    }
    Err(CheckpointError::Corrupt {
        path: p,
        problem: "the snapshot kept being replaced while it was read".into(),
    })
}

/// The checkpoint and its files: every change is durable before the call returns, and a
/// change that could not be made durable is not made.
#[derive(Debug)]
pub struct CheckpointStore {
    path: PathBuf,
    state: Checkpoint,
    /// The journal, opened for appending at its first record.
    journal: Option<File>,
    /// Its length after the last whole record (a failed append is cut back to it).
    good_len: u64,
    /// Records since the last snapshot.
    records: usize,
    /// The journal's tail is in doubt (a failed append): the next change snapshots.
    compact_next: bool,
    /// Records between snapshots ([`COMPACT_AFTER`]; tests make it small to compact often).
    compact_after: usize,
}

impl CheckpointStore {
    /// Resumes from the files at `path` (fails rather than guess when they are corrupt);
    /// a journal left by the last run is folded into a new snapshot first, so that no
    /// record is ever appended after a torn one.
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        let (state, records) = load_counted(path)?;
        let journal = journal_path(path);
        let mut store = Self {
            path: path.to_owned(),
            state,
            journal: None,
            good_len: 0,
            records,
            compact_next: false,
            compact_after: COMPACT_AFTER,
        };
        let left = std::fs::metadata(&journal).map(|m| m.len()).unwrap_or(0);
        if left > 0 {
            store.compact().map_err(|source| CheckpointError::Io {
                path: journal.display().to_string(),
                source,
            })?;
        }
        Ok(store)
    }

    /// What is prepared now.
    pub fn state(&self) -> &Checkpoint {
        &self.state
    }

    /// Records `uid` as prepared with `claim`, durably; on error nothing changed.
    pub fn insert(&mut self, uid: &str, claim: PreparedClaim) -> std::io::Result<()> {
        let previous = self.state.claims.insert(uid.to_owned(), claim.clone());
        let record = Record::Put {
            uid: uid.to_owned(),
            claim: Box::new(claim),
        };
        self.persist(&record).inspect_err(|_| match previous {
            Some(p) => {
                self.state.claims.insert(uid.to_owned(), p);
            }
            None => {
                self.state.claims.remove(uid);
            }
        })
    }

    /// Records `uid` as unprepared, durably; on error nothing changed. A claim this state
    /// does not hold is recorded too: an append that reported failure may have reached the
    /// disk all the same, and would bring the claim back at the next start.
    pub fn remove(&mut self, uid: &str) -> std::io::Result<()> {
        let previous = self.state.claims.remove(uid);
        self.persist(&Record::Remove {
            uid: uid.to_owned(),
        })
        .inspect_err(|_| {
            if let Some(p) = previous {
                self.state.claims.insert(uid.to_owned(), p);
            }
        })
    }

    /// Makes the state (already changed by `record`) durable: the record appended, or a
    /// new snapshot when it is time to compact.
    fn persist(&mut self, record: &Record) -> std::io::Result<()> {
        if self.compact_next || self.records >= self.compact_after {
            return self.compact();
        }
        let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let appended = self.append(&line);
        if appended.is_err() {
            // Cut a partial line back off; if even that fails, the next change rewrites
            // everything (a record after a torn one would be read as corruption).
            let cut = self
                .journal
                .as_ref()
                .map(|f| f.set_len(self.good_len).and_then(|()| f.sync_data()));
            if !matches!(cut, Some(Ok(()))) {
                self.compact_next = true;
            }
        }
        appended
    }

    fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        let file = match &mut self.journal {
            Some(f) => f,
            None => {
                use std::os::unix::fs::OpenOptionsExt;
                let path = journal_path(&self.path);
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                // Only ever a regular file of ours: a link planted there is not followed.
                let existed = match std::fs::symlink_metadata(&path) {
                    Ok(m) => match not_regular(&m) {
                        None => true,
                        Some(kind) => {
                            return Err(std::io::Error::other(format!(
                                "{} is {kind}, not a regular file: remove it",
                                path.display()
                            )));
                        }
                    },
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                    Err(e) => return Err(e),
                };
                let f = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .mode(0o600)
                    .open(&path)?;
                if !existed && let Some(dir) = path.parent() {
                    // A new file's name is durable only with its directory synced.
                    File::open(dir)?.sync_all()?;
                }
                self.good_len = f.metadata()?.len();
                self.journal.insert(f)
            }
        };
        file.write_all(line)?;
        file.sync_data()?;
        self.good_len += line.len() as u64;
        self.records += 1;
        Ok(())
    }

    /// A new snapshot of the state, then a new empty journal in the old one's place (both
    /// durable). Replaced, not truncated: a reader holding the old journal reads it whole,
    /// and sees by its identity that it no longer follows the snapshot (truncating it under
    /// the reader handed it the first records of a history whose rest it never saw).
    fn compact(&mut self) -> std::io::Result<()> {
        self.state.save(&self.path)?;
        let journal = journal_path(&self.path);
        if self.journal.is_some() || journal.exists() {
            use std::os::unix::fs::OpenOptionsExt;
            let name = journal
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("journal");
            let fresh = journal.with_file_name(format!(".{name}.new"));
            // Made anew, never opened as found: whatever is at the temporary name (a left
            // over file, a planted link to truncate and write through) is removed first, and
            // O_EXCL never follows a link.
            match std::fs::remove_file(&fresh) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            drop(
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&fresh)?,
            );
            std::fs::rename(&fresh, &journal)?;
            if let Some(dir) = journal.parent() {
                File::open(dir)?.sync_all()?;
            }
            // The next append opens the new file.
            self.journal = None;
        }
        self.good_len = 0;
        self.records = 0;
        self.compact_next = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str) -> PreparedClaim {
        PreparedClaim {
            namespace: "ml".into(),
            name: name.into(),
            pod_uid: format!("pod-{name}"),
            cdi_file: format!("/var/run/cdi/{name}.json"),
            cdi_spec: "{}".into(),
            ..Default::default()
        }
    }

    fn line(r: &Record) -> Vec<u8> {
        let mut l = serde_json::to_vec(r).unwrap();
        l.push(b'\n');
        l
    }

    #[test]
    fn replay_applies_in_order_and_drops_only_a_torn_tail() {
        let put = |u: &str| Record::Put {
            uid: u.into(),
            claim: Box::new(claim(u)),
        };
        let mut j = [
            line(&put("a")),
            line(&put("b")),
            line(&Record::Remove { uid: "a".into() }),
        ]
        .concat();
        let (cp, n) = replay(Checkpoint::empty(), &j, "j").unwrap();
        assert_eq!(n, 3);
        assert_eq!(cp.claims.keys().collect::<Vec<_>>(), ["b"]);
        // every cut of a last record: the records before it, never an error
        let whole = j.len();
        j.extend(line(&put("c")));
        for cut in whole..j.len() {
            let (cp, n) = replay(Checkpoint::empty(), &j[..cut], "j").unwrap();
            assert_eq!((n, cp.claims.len()), (3, 1), "cut at {cut}");
        }
        let (cp, _) = replay(Checkpoint::empty(), &j, "j").unwrap();
        assert_eq!(cp.claims.len(), 2);
        // a zeroed whole last line is an unacknowledged append too
        let mut zeros = j.clone();
        zeros.extend([0u8; 40]);
        zeros.push(b'\n');
        assert_eq!(replay(Checkpoint::empty(), &zeros, "j").unwrap().1, 4);
    }

    #[test]
    fn a_bad_line_before_the_last_is_corruption_named_by_line() {
        let good = line(&Record::Remove { uid: "x".into() });
        let j = [good.clone(), b"{\"put\": 7}\n".to_vec(), good].concat();
        let e = replay(Checkpoint::empty(), &j, "cp.journal").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("cp.journal") && text.contains("journal line 2"),
            "{text}"
        );
    }

    #[test]
    fn every_change_survives_a_reopen_and_compaction_keeps_them() {
        let dir = std::env::temp_dir().join(format!("cp-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("plugin/checkpoint.json");
        let mut store = CheckpointStore::open(&path).unwrap();
        for i in 0..(COMPACT_AFTER + 10) {
            store
                .insert(&format!("u{i}"), claim(&format!("c{i}")))
                .unwrap();
            if i % 3 == 0 {
                store.remove(&format!("u{i}")).unwrap();
            }
        }
        let expected = store.state().clone();
        // compacted once on the way: the journal holds only the records since
        let records = std::fs::read(journal_path(&path)).unwrap();
        assert!(records.split(|b| *b == b'\n').count() < COMPACT_AFTER);
        assert_eq!(Checkpoint::load(&path).unwrap(), expected);
        drop(store);
        // a torn append from a crash: dropped, and the reopen folds the journal away
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(journal_path(&path))
            .unwrap();
        f.write_all(b"{\"put\":{\"uid\":\"torn\"").unwrap();
        drop(f);
        let store = CheckpointStore::open(&path).unwrap();
        assert_eq!(store.state(), &expected);
        assert_eq!(std::fs::metadata(journal_path(&path)).unwrap().len(), 0);
        assert_eq!(Checkpoint::load(&path).unwrap(), expected);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A reader beside the writer (the chaos ledger's, a restart's) only ever sees a
    /// state the writer had, and never an older one than it saw before: compactions every
    /// other record race each read. The writer's states are {c_k} then {c_k, c_k+1}.
    #[test]
    fn a_load_racing_compactions_sees_only_states_the_writer_had() {
        let dir = std::env::temp_dir().join(format!("cp-store-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("checkpoint.json");
        let mut store = CheckpointStore::open(&path).unwrap();
        store.compact_after = 2;
        store.insert("c0000", claim("c0")).unwrap();
        const CHANGES: usize = 1500;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (path, done) = (path.clone(), done.clone());
            std::thread::spawn(move || {
                let (mut last, mut loads) = (0usize, 0usize);
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    let state = Checkpoint::load(&path).expect("a load beside the writer");
                    loads += 1;
                    let ks: Vec<usize> = state
                        .claims
                        .keys()
                        .map(|k| k[1..].parse().unwrap())
                        .collect();
                    let valid = match ks[..] {
                        [k] => Some(k),
                        [k, next] if next == k + 1 => Some(k),
                        _ => None,
                    };
                    let k = valid.unwrap_or_else(|| {
                        panic!("load {loads} saw {ks:?}: not a state the writer had")
                    });
                    assert!(k >= last, "load {loads} went back from c{last} to {ks:?}");
                    last = k;
                }
                loads
            })
        };
        for k in 1..CHANGES {
            store.insert(&format!("c{k:04}"), claim("c")).unwrap();
            store.remove(&format!("c{:04}", k - 1)).unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let loads = reader.join().expect("the reader's checks held");
        assert!(loads > 10, "only {loads} loads raced the writer");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue 27 item 6: links planted at the journal's temporary name (or at the journal)
    /// are never followed: the file they point at is neither truncated nor written, and
    /// the journal stays a regular file of the store's own.
    #[test]
    fn links_planted_at_the_journals_names_are_never_followed() {
        let dir = std::env::temp_dir().join(format!("cp-store-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("checkpoint.json");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let journal = journal_path(&path);
        let tmp = dir.join(".checkpoint.json.journal.new");
        let mut store = CheckpointStore::open(&path).unwrap();
        store.compact_after = 2;
        store.insert("u0", claim("c0")).unwrap();
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        // the third change compacts: the journal is replaced through the temporary name
        for i in 1..4 {
            store.insert(&format!("u{i}"), claim("c")).unwrap();
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let m = std::fs::symlink_metadata(&journal).unwrap();
        assert!(m.file_type().is_file(), "the journal is a link: {m:?}");
        assert_eq!(&Checkpoint::load(&path).unwrap(), store.state());

        // a link at the journal itself: the next append refuses it, naming it
        drop(store);
        std::fs::remove_file(&journal).unwrap();
        let mut store = CheckpointStore::open(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &journal).unwrap();
        let e = store.insert("u9", claim("c9")).unwrap_err().to_string();
        assert!(e.contains("a symbolic link, not a regular file"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(!store.state().claims.contains_key("u9"));
        // ... and a start refuses it too, before reading through it
        drop(store);
        let e = CheckpointStore::open(&path).unwrap_err().to_string();
        assert!(e.contains("is a symbolic link, not a regular file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_change_that_cannot_be_made_durable_is_not_made() {
        let dir = std::env::temp_dir().join(format!("cp-store-ro-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("checkpoint.json");
        let mut store = CheckpointStore::open(&path).unwrap();
        store.insert("u0", claim("c0")).unwrap();
        // the journal's place is taken (a directory): the append fails
        std::fs::remove_file(journal_path(&path)).unwrap();
        store.journal = None;
        std::fs::create_dir(journal_path(&path)).unwrap();
        assert!(store.insert("u1", claim("c1")).is_err());
        assert!(store.remove("u0").is_err());
        assert_eq!(store.state().claims.keys().collect::<Vec<_>>(), ["u0"]);
        // the place free again: the next change snapshots, and nothing was lost
        std::fs::remove_dir(journal_path(&path)).unwrap();
        store.insert("u2", claim("c2")).unwrap();
        assert_eq!(
            store.state().claims.keys().collect::<Vec<_>>(),
            ["u0", "u2"]
        );
        assert_eq!(&Checkpoint::load(&path).unwrap(), store.state());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
