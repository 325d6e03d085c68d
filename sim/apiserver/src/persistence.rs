//! Optional persistence (`--data-dir`): an append-only JSON-lines journal of store changes.
//! On start the journal is replayed (objects and resourceVersions survive a restart), then
//! rewritten compacted. A torn last line (crash mid-write) is ignored.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::resources::{RESOURCES, ResourceType};
use crate::store::{EventType, Store, WatchEvent};

const JOURNAL: &str = "objects.jsonl";

/// One journal line for a store event.
pub fn journal_line(ev: &WatchEvent) -> String {
    let mut line = if ev.event_type == EventType::Deleted {
        json!({"rv": ev.rv, "r": ev.resource.id(), "op": "del", "ns": ev.namespace, "name": ev.name}).to_string()
    } else {
        // Reuse the pre-serialised object rather than serialising again.
        format!(
            "{{\"rv\":{},\"r\":{},\"op\":\"put\",\"obj\":{}}}",
            ev.rv,
            Value::String(ev.resource.id()),
            ev.object.json
        )
    };
    line.push('\n');
    line
}

fn resource_by_id(id: &str) -> Option<&'static ResourceType> {
    RESOURCES.iter().find(|r| r.id() == id)
}

/// Applies one journal line to the store; malformed lines are reported as errors.
pub fn replay_line(store: &mut Store, line: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("bad journal line: {e}"))?;
    let r = v
        .get("r")
        .and_then(Value::as_str)
        .and_then(resource_by_id)
        .ok_or("journal line names no served resource")?;
    match v.get("op").and_then(Value::as_str) {
        Some("put") => {
            let obj = v.get("obj").cloned().ok_or("put without obj")?;
            store.restore(r, obj).map_err(|e| e.message)?;
        }
        Some("del") => {
            let ns = v.get("ns").and_then(Value::as_str).unwrap_or("");
            let name = v.get("name").and_then(Value::as_str).unwrap_or("");
            let rv = v.get("rv").and_then(Value::as_u64).unwrap_or(0);
            store.restore_delete(r, ns, name, rv);
        }
        _ => return Err("journal line with unknown op".into()),
    }
    Ok(())
}

/// The open journal of a data directory.
pub struct Persistence {
    path: PathBuf,
    out: BufWriter<File>,
}

impl Persistence {
    /// Loads `dir/objects.jsonl` into `store` (creating `dir` if needed), compacts it and
    /// opens it for appending.
    pub fn open(dir: &Path, store: &mut Store) -> anyhow::Result<Persistence> {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("cannot create data dir {}: {e}", dir.display()))?;
        let path = dir.join(JOURNAL);
        if path.exists() {
            let f = File::open(&path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            let lines: Vec<String> = BufReader::new(f).lines().collect::<Result<_, _>>()?;
            let n = lines.len();
            for (i, line) in lines.iter().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                if let Err(e) = replay_line(store, line) {
                    // Only a line cut short by a crash is torn; a complete line that cannot
                    // be loaded is damage (ignoring it would drop an acknowledged write).
                    let cut_short = serde_json::from_str::<Value>(line)
                        .is_err_and(|e| e.classify() == serde_json::error::Category::Eof);
                    if i + 1 == n && cut_short {
                        tracing::warn!(
                            "ignoring torn last journal line of {}: {e}",
                            path.display()
                        );
                    } else {
                        anyhow::bail!(
                            "{} line {}: {e}; the data dir is damaged (move it away to start empty)",
                            path.display(),
                            i + 1
                        );
                    }
                }
            }
        }
        // Compact: rewrite the journal as one put per live object, then swap it in.
        let tmp = dir.join(format!("{JOURNAL}.tmp"));
        {
            let mut w = BufWriter::new(File::create(&tmp)?);
            for (r, obj) in store.all_objects() {
                // The rv of a put line is informational; the object carries its own.
                writeln!(
                    w,
                    "{{\"rv\":0,\"r\":{},\"op\":\"put\",\"obj\":{}}}",
                    Value::String(r.id()),
                    obj.json
                )?;
            }
            // Record the latest resourceVersion even if the newest change was a delete.
            writeln!(
                w,
                "{}",
                json!({"rv": store.resource_version(), "r": RESOURCES[0].id(), "op": "del", "ns": "", "name": ""})
            )?;
            w.flush()?;
            w.get_ref().sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        let out = BufWriter::new(OpenOptions::new().append(true).open(&path)?);
        Ok(Persistence { path, out })
    }

    /// Appends the events of one write and flushes them to the OS (no fsync per write).
    /// An error means the write is not in the journal (and would be lost on restart).
    pub fn append(&mut self, events: &[std::sync::Arc<WatchEvent>]) -> std::io::Result<()> {
        let mut lines = String::new();
        for ev in events {
            lines.push_str(&journal_line(ev));
        }
        self.out
            .write_all(lines.as_bytes())
            .and_then(|_| self.out.flush())
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", self.path.display())))
    }

    /// Tests: make every later append fail as a full disk does.
    #[cfg(test)]
    pub(crate) fn write_to_dev_full(&mut self) {
        let full = OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        self.out = BufWriter::with_capacity(0, full);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;
    use crate::store::DeleteOptions;

    #[test]
    fn restart_keeps_objects_and_versions() {
        let dir =
            std::env::temp_dir().join(format!("hami-apiserver-persist-{}", crate::meta::new_uid()));
        let cms = lookup("", "v1", "configmaps").unwrap();
        let (rv, uid) = {
            let mut s = Store::default();
            let mut p = Persistence::open(&dir, &mut s).unwrap();
            s.ensure_default_namespaces();
            let c = s
                .create(
                    cms,
                    Some("default"),
                    json!({"metadata": {"name": "a"}, "data": {"k": "v"}}),
                )
                .unwrap();
            s.create(cms, Some("default"), json!({"metadata": {"name": "b"}}))
                .unwrap();
            s.delete(cms, "default", "b", &DeleteOptions::default())
                .unwrap();
            p.append(&s.take_events()).unwrap();
            (s.resource_version(), c["metadata"]["uid"].clone())
        };
        // Simulate a crash in the middle of a line.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join(JOURNAL))
            .unwrap();
        f.write_all(b"{\"rv\": 99, \"r\":").unwrap();
        let mut s = Store::default();
        let _p = Persistence::open(&dir, &mut s).unwrap();
        assert_eq!(s.resource_version(), rv);
        assert_eq!(s.get(cms, "default", "a").unwrap()["metadata"]["uid"], uid);
        assert!(s.get(cms, "default", "b").is_err());
        assert!(
            s.get(lookup("", "v1", "namespaces").unwrap(), "", "kube-system")
                .is_ok()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
