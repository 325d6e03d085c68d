//! What the plugin prepared, on disk: unprepare must work after a plugin or kubelet restart
//! and after the claim is deleted from the API server, and the CUs prepared claims hold
//! must survive a restart (else a new claim could be given the same CUs). This is the
//! snapshot's format; `checkpoint_store` journals the changes between snapshots.

use std::collections::BTreeMap;
use std::path::Path;

use hami_protocol::cu_list::CuSet;
use serde::{Deserialize, Serialize};

use crate::files::write_atomic;

/// The checkpoint format version this plugin reads and writes.
pub const VERSION: u32 = 1;

/// Everything prepared on this node (`checkpoint.json` in the plugin directory).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Always [`VERSION`].
    pub version: u32,
    /// Claim UID → what was prepared.
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// What one claim's Prepare did, enough to undo it without the API server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The pod the claim is reserved for.
    pub pod_uid: String,
    /// The devices prepared.
    pub devices: Vec<PreparedDevice>,
    /// The CDI spec file written.
    pub cdi_file: String,
    /// The CDI spec's text (re-written from here if a crash lost the file).
    pub cdi_spec: String,
    /// The hook config file written, if the claim is sliced.
    pub hook_config_file: Option<String>,
    /// The hook config's text, likewise.
    pub hook_config: Option<String>,
    /// The hook's cache directory created, if any.
    pub cache_dir: Option<String>,
    /// dmem region → bytes of this claim.
    pub dmem: BTreeMap<String, u64>,
}

/// One allocated device of a prepared claim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim request it was allocated for.
    pub request: String,
    /// The ResourceSlice pool.
    pub pool: String,
    /// The device's name in the slice.
    pub device: String,
    /// The registered device id (what the CU accounting is keyed by).
    pub device_id: String,
    /// CU list (`0-37`), empty for whole devices handed over without a mask.
    pub cus: String,
    /// Its CDI device id, as answered to kubelet.
    pub cdi_id: String,
}

/// Why the checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file exists but cannot be read.
    #[error("reading checkpoint {path}: {source}")]
    Io {
        /// The checkpoint file.
        path: String,
        /// The read error.
        source: std::io::Error,
    },
    /// Something other than a regular file at the checkpoint's or journal's path (a FIFO
    /// would block the start forever, a link is not followed).
    #[error(
        "checkpoint {path} is {kind}, not a regular file; the plugin does not read or write through it: remove it (the plugin's files there are regular files it writes itself)"
    )]
    NotAFile {
        /// The path.
        path: String,
        /// What is there (`a FIFO`, `a symbolic link`, …).
        kind: &'static str,
    },
    /// Not JSON of this version: the plugin refuses to guess what is prepared.
    #[error(
        "checkpoint {path} is not a version-{VERSION} checkpoint ({problem}); it records which CUs prepared claims hold, so the plugin will not guess: restore it, or drain the node's DRA pods and delete it"
    )]
    Corrupt {
        /// The checkpoint file.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl Checkpoint {
    /// Nothing prepared (a first start).
    pub fn empty() -> Self {
        Self {
            version: VERSION,
            claims: BTreeMap::new(),
        }
    }

    /// Reads a checkpoint file's bytes (`path` names the file in errors): a whole
    /// version-[`VERSION`] checkpoint, or [`CheckpointError::Corrupt`] (a file a crash cut
    /// short is refused, never read in part).
    pub fn decode(bytes: &[u8], path: &str) -> Result<Self, CheckpointError> {
        let corrupt = |problem: String| CheckpointError::Corrupt {
            path: path.to_owned(),
            problem,
        };
        let cp: Self = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
        if cp.version != VERSION {
            return Err(corrupt(format!("version {}", cp.version)));
        }
        Ok(cp)
    }

    /// The file's bytes, as [`Checkpoint::save`] writes them.
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec_pretty(self)
    }

    /// Writes the checkpoint as a snapshot, atomically (owner-only, fsynced); the plugin
    /// writes through [`crate::checkpoint_store::CheckpointStore`], which also empties the
    /// journal.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let bytes = self.encode().map_err(std::io::Error::other)?;
        write_atomic(path, &bytes, 0o600, true)
    }

    /// CUs held by prepared claims, by registered device id (the Prepare core's input).
    pub fn used_cus(&self, except: Option<&str>) -> BTreeMap<String, CuSet> {
        let mut out: BTreeMap<String, CuSet> = BTreeMap::new();
        for (uid, c) in &self.claims {
            if Some(uid.as_str()) == except {
                continue;
            }
            for d in &c.devices {
                if let Ok(set) = CuSet::parse(&d.cus, u32::MAX) {
                    let e = out.entry(d.device_id.clone()).or_default();
                    *e = e.union(&set);
                }
            }
        }
        out
    }

    /// The pod's dmem limits: its prepared claims' bytes summed per region.
    pub fn pod_dmem(&self, pod_uid: &str) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        for c in self.claims.values().filter(|c| c.pod_uid == pod_uid) {
            for (region, bytes) in &c.dmem {
                // Saturating: a hand-edited checkpoint must not panic (debug) or wrap to a
                // tiny limit (release); u64::MAX reads as "no limit narrower than the card".
                let e = out.entry(region.clone()).or_default();
                *e = e.saturating_add(*bytes);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        let device = PreparedDevice {
            request: "gpu/shape-0".into(),
            pool: "node".into(),
            device: "gpu-0".into(),
            device_id: "GPU-a".into(),
            cus: "0-25".into(),
            cdi_id: "k8s.amdgpu.hami-rs.io/claim=u1-gpu-0".into(),
        };
        let claim = PreparedClaim {
            namespace: "ml".into(),
            name: "c".into(),
            pod_uid: "pod-1".into(),
            devices: vec![device],
            cdi_file: "/var/run/cdi/c.json".into(),
            cdi_spec: "{}".into(),
            dmem: BTreeMap::from([("drm/0000:03:00.0/vram0".into(), 1 << 30)]),
            ..Default::default()
        };
        Checkpoint {
            version: VERSION,
            claims: BTreeMap::from([("u1".into(), claim)]),
        }
    }

    #[test]
    fn decode_reads_what_encode_wrote_and_refuses_any_part_of_it() {
        let bytes = sample().encode().unwrap();
        assert_eq!(Checkpoint::decode(&bytes, "cp").unwrap(), sample());
        for cut in 0..bytes.len() {
            match Checkpoint::decode(&bytes[..cut], "cp") {
                Err(CheckpointError::Corrupt { path, .. }) => assert_eq!(path, "cp"),
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_pods_dmem_sum_saturates_instead_of_overflowing() {
        let mut cp = sample();
        let mut second = cp.claims["u1"].clone();
        second.dmem = BTreeMap::from([("drm/0000:03:00.0/vram0".into(), u64::MAX - 5)]);
        cp.claims.insert("u2".into(), second);
        let sums = cp.pod_dmem("pod-1");
        assert_eq!(sums["drm/0000:03:00.0/vram0"], u64::MAX);
        assert_eq!(
            sample().pod_dmem("pod-1")["drm/0000:03:00.0/vram0"],
            1 << 30
        );
    }

    #[test]
    fn a_version_it_does_not_know_is_named() {
        let other = br#"{"version": 2, "claims": {}}"#;
        let error = Checkpoint::decode(other, "cp").unwrap_err().to_string();
        assert!(error.contains("version 2"), "{error}");
    }
}
