//! Prepare and unprepare, around the pure Prepare core: idempotent (a prepared claim
//! answers from the checkpoint; an unknown claim unprepares as done), files first and the
//! checkpoint last, so a crash in between leaves at worst files a retry overwrites. Only
//! the checkpoint is synced (one journal line and one `fdatasync` per call,
//! `checkpoint_store`); it holds the CDI spec and hook config texts, and a repeated prepare
//! restores those files if a crash lost them (one durable write per call keeps prepare in
//! a few milliseconds).
//! Prepare also writes the claim's `status.devices` (CU ranges, bytes), alongside the files
//! and before the checkpoint, and takes it back when the prepare fails after that write;
//! unprepare leaves it: the claim's deallocation clears it.
//!
//! Serialisation: each claim UID has a lock of its own (one prepare or unprepare of a
//! claim at a time, as upstream's helper serialises), and the driver's one state lock
//! (checkpoint + CU reservations) is held only for decisions and checkpoint writes, never
//! across an API call: a claim GET that hangs delays only its own claim. CUs a prepare
//! chose are reserved from its plan until the checkpoint records them or its undo has
//! taken its status back, so no other claim is planned onto them meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hami_amd_discovery::registration::RegisteredDevice;
use hami_amd_plugin::dmem::{DmemJob, DmemLimit, DmemWriter};
use hami_dra_core::api::ResourceClaim;
use hami_dra_core::cdi_claim;
use hami_dra_core::claim_identity::claim_identity;
use hami_dra_core::prepare::{PrepareSettings, claim_paths, plan_prepare};
use hami_protocol::cu_list::CuSet;
use tokio::sync::Mutex;

use crate::checkpoint::{self, Checkpoint, CheckpointError, PreparedClaim};
use crate::checkpoint_store::CheckpointStore;
use crate::claims::ClaimSource;
use crate::dra_v1::{Claim, Device};
use crate::files::{ensure, remove_if_present, write_atomic, write_unpublished};

/// What the driver prepares with.
pub struct DriverConfig {
    /// How claims become devices, env and hook configs.
    pub settings: PrepareSettings,
    /// Slice device name → registered device.
    pub devices: BTreeMap<String, RegisteredDevice>,
    /// Where CDI spec files are written (`--cdi-dir`, `/var/run/cdi` by default).
    pub cdi_dir: PathBuf,
    /// The checkpoint file.
    pub checkpoint: PathBuf,
    /// The dmem writer (absent when the node has no dmem controller).
    pub dmem: Option<DmemWriter>,
}

/// CUs of prepares in flight: claim UID → registered device id → CUs.
type Reserved = BTreeMap<String, BTreeMap<String, CuSet>>;

/// The DRA driver: prepares and unprepares claims, recording each in the checkpoint.
pub struct Driver<C> {
    config: DriverConfig,
    claims: C,
    state: Mutex<CheckpointStore>,
    /// CUs chosen by prepares not yet recorded or undone (a plain mutex: never held
    /// across an await, and released on drop of a cancelled prepare's [`Reservation`]).
    reserved: Arc<std::sync::Mutex<Reserved>>,
    claim_locks: ClaimLocks,
}

impl<C: ClaimSource> Driver<C> {
    /// A driver resuming from the checkpoint on disk (fails rather than guess when it is corrupt).
    pub fn new(config: DriverConfig, claims: C) -> Result<Self, CheckpointError> {
        let state = CheckpointStore::open(&config.checkpoint)?;
        Ok(Self {
            config,
            claims,
            state: Mutex::new(state),
            reserved: Arc::default(),
            claim_locks: ClaimLocks::default(),
        })
    }

    /// A copy of what is prepared now.
    pub async fn checkpoint(&self) -> Checkpoint {
        self.state.lock().await.state().clone()
    }

    /// Prepares each claim; every claim gets an entry (`Err` = its error string).
    pub async fn prepare(&self, claims: &[Claim]) -> BTreeMap<String, Result<Vec<Device>, String>> {
        let mut out = BTreeMap::new();
        for c in claims {
            let r = self.prepare_one(c).await;
            if let Err(e) = &r {
                tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid, "prepare failed: {e}");
            }
            out.insert(c.uid.clone(), r);
        }
        out
    }

    async fn prepare_one(&self, c: &Claim) -> Result<Vec<Device>, String> {
        // Before anything uses them: the namespace and name become URL path segments.
        let id = claim_identity(&c.namespace, &c.name, &c.uid).map_err(|e| e.to_string())?;
        let _claim = self.claim_locks.lock(&id.uid).await;
        let done = self.state.lock().await.state().claims.get(&id.uid).cloned();
        if let Some(done) = done {
            let devices = devices_of(&done);
            // Outside the state lock: the claim's own lock keeps its files to this call.
            let restored = tokio::task::spawn_blocking(move || restore_files(&done))
                .await
                .map_err(|e| format!("restoring the claim's files: {e}"))??;
            if let Some(restored) = restored {
                // A new region file (a crash lost it): the hook config names its inode.
                self.state
                    .lock()
                    .await
                    .insert(&id.uid, restored)
                    .map_err(|e| self.checkpoint_error(e))?;
            }
            return Ok(devices);
        }
        let claim = self.claims.get(&id.namespace, &id.name).await?;
        let (plan, reservation) = {
            let state = self.state.lock().await;
            let mut reserved = lock(&self.reserved);
            let mut used = state.state().used_cus(None);
            for cus in reserved.values() {
                for (device, set) in cus {
                    let e = used.entry(device.clone()).or_default();
                    *e = e.union(set);
                }
            }
            let plan = plan_prepare(
                &claim,
                &id.uid,
                &self.config.settings,
                &self.config.devices,
                &used,
            )
            .map_err(|e| e.to_string())?;
            let mut mine: BTreeMap<String, CuSet> = BTreeMap::new();
            for d in &plan.devices {
                let e = mine.entry(d.device_id.clone()).or_default();
                *e = e.union(&d.cus);
            }
            reserved.insert(id.uid.clone(), mine);
            let reservation = Reservation {
                reserved: self.reserved.clone(),
                uid: id.uid.clone(),
            };
            (plan, reservation)
        };
        // The files (on a blocking thread: 4–5 creations on the node's disk) and the claim's
        // status write (the monitor's and UI's source of CU ranges) at once: neither reads
        // the other, and both are done before the checkpoint records the claim as prepared
        // (a failure of either fails this prepare; kubelet's retry plans and writes again).
        let driver = &self.config.settings.driver;
        let status = plan.status.clone();
        let cdi_dir = self.config.cdi_dir.clone();
        let files = tokio::task::spawn_blocking(move || {
            let written = write_claim_files(&plan, &cdi_dir);
            (plan, written)
        });
        let (files, status_written) = tokio::join!(
            files,
            self.claims.set_device_status(&claim, driver, &status)
        );
        let (plan, written) = match files {
            Ok(done) => done,
            Err(e) => {
                let e = format!("writing the claim's files: {e}");
                return Err(self.undo(c, &claim, e, reservation).await);
            }
        };
        let written = match (written, status_written) {
            (Ok(w), Ok(())) => w,
            (Err(e), _) | (Ok(_), Err(e)) => {
                return Err(self.undo(c, &claim, e, reservation).await);
            }
        };
        let entry = PreparedClaim {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            pod_uid: plan.pod_uid.clone(),
            devices: plan
                .devices
                .iter()
                .map(|d| checkpoint::PreparedDevice {
                    request: d.request.clone(),
                    pool: d.pool.clone(),
                    device: d.device.clone(),
                    device_id: d.device_id.clone(),
                    cus: if plan.whole {
                        String::new()
                    } else {
                        d.cus.to_string()
                    },
                    cdi_id: d.cdi_id.clone(),
                })
                .collect(),
            cdi_file: written.cdi_file.display().to_string(),
            cdi_spec: written.cdi_spec,
            hook_config_file: plan.hook_config.as_ref().map(|(p, _)| p.clone()),
            hook_config: written.hook_config,
            cache_dir: plan.cache_dir.clone(),
            dmem: plan
                .dmem
                .iter()
                .map(|l| (l.region.clone(), l.bytes))
                .collect(),
        };
        let devices = devices_of(&entry);
        let mut state = self.state.lock().await;
        if let Err(e) = state.insert(&c.uid, entry) {
            drop(state);
            let e = self.checkpoint_error(e);
            return Err(self.undo(c, &claim, e, reservation).await);
        }
        // Recorded: the checkpoint holds the CUs now.
        drop(reservation);
        if let Some(writer) = &self.config.dmem
            && !plan.dmem.is_empty()
        {
            let limits = state
                .state()
                .pod_dmem(&plan.pod_uid)
                .into_iter()
                .map(|(region, bytes)| DmemLimit { region, bytes })
                .collect();
            // The pod cgroup exists by now (kubelet makes it before this call): the limit
            // is written before the answer, so no container of the pod starts without it.
            // Submitted under the state lock: the pod's jobs go in the order of its sums.
            writer.submit(DmemJob {
                pod_uid: plan.pod_uid.clone(),
                limits,
            });
        }
        Ok(devices)
    }

    /// Unprepares each claim from the checkpoint alone (the claim may be gone).
    pub async fn unprepare(&self, claims: &[Claim]) -> BTreeMap<String, Result<(), String>> {
        let mut out = BTreeMap::new();
        for c in claims {
            let _claim = self.claim_locks.lock(&c.uid).await;
            let mut state = self.state.lock().await;
            out.insert(c.uid.clone(), self.unprepare_one(&mut state, &c.uid));
        }
        out
    }

    fn unprepare_one(&self, state: &mut CheckpointStore, uid: &str) -> Result<(), String> {
        match state.state().claims.get(uid) {
            Some(entry) => remove_claim_files(
                Path::new(&entry.cdi_file),
                entry.hook_config_file.as_deref(),
                entry.cache_dir.as_deref(),
            )?,
            // Unknown: its prepare failed, or never answered (kubelet unprepares every claim
            // it asked for). Remove whatever such a prepare left, by the paths it would have
            // used, and record the removal all the same: an append that reported failure
            // may still have reached the disk, and must not bring the claim back at restart.
            None => self.remove_unrecorded_files(uid)?,
        }
        state.remove(uid).map_err(|e| self.checkpoint_error(e))
    }

    /// After a failed prepare of a claim the checkpoint does not hold: this driver's
    /// `status.devices` entries taken back and the files removed, best effort, then the
    /// CUs' reservation released (the status must not name CUs another claim may get
    /// next); returns `error`.
    async fn undo(
        &self,
        c: &Claim,
        claim: &ResourceClaim,
        error: String,
        reservation: Reservation,
    ) -> String {
        let what = format!("{}/{}", c.namespace, c.name);
        // Against the claim as it is now, not as read before the write (whose status has
        // none of our entries: merged with nothing, it sent nothing): without a
        // resourceVersion the source reads it first. Also after a write that reported an
        // error: it may have landed all the same; when nothing of ours is there, nothing
        // is sent.
        let mut now = claim.clone();
        now.metadata.resource_version = None;
        now.status = None;
        if let Err(e) = self
            .claims
            .set_device_status(&now, &self.config.settings.driver, &[])
            .await
        {
            tracing::warn!(claim = %what, "clearing status.devices after a failed prepare: {e}");
        }
        if let Err(e) = self.remove_unrecorded_files(&c.uid) {
            tracing::warn!(claim = %what, "removing the files of a failed prepare: {e}");
        }
        drop(reservation);
        error
    }

    /// The files a prepare of `uid` writes, by their paths (no checkpoint entry needed).
    fn remove_unrecorded_files(&self, uid: &str) -> Result<(), String> {
        // A UID that is no path component names no file of ours (prepare refuses it).
        let Some(paths) = claim_paths(&self.config.settings, uid) else {
            return Ok(());
        };
        remove_claim_files(
            &self.config.cdi_dir.join(cdi_claim::file_name(uid)),
            Some(&paths.hook_config),
            Some(&paths.cache_dir),
        )
    }

    fn checkpoint_error(&self, e: std::io::Error) -> String {
        format!(
            "saving checkpoint {}: {e}",
            self.config.checkpoint.display()
        )
    }
}

/// The reserved CUs, also after a panic elsewhere (the map stays consistent: every change
/// is one insert or remove).
fn lock(m: &std::sync::Mutex<Reserved>) -> std::sync::MutexGuard<'_, Reserved> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A prepare's CU reservation; released when dropped (also when the prepare is cancelled).
struct Reservation {
    reserved: Arc<std::sync::Mutex<Reserved>>,
    uid: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        lock(&self.reserved).remove(&self.uid);
    }
}

/// One lock per claim UID, made on first use and dropped with its last holder.
#[derive(Default)]
struct ClaimLocks(Arc<std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>>);

/// Holds a claim's lock.
struct ClaimGuard {
    locks: Arc<std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>>,
    uid: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl ClaimLocks {
    async fn lock(&self, uid: &str) -> ClaimGuard {
        let mutex = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(uid.to_owned())
            .or_default()
            .clone();
        ClaimGuard {
            locks: self.0.clone(),
            uid: uid.to_owned(),
            guard: Some(mutex.lock_owned().await),
        }
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // The map's handle and this guard's: nobody else waits (clones are made under the
        // map's lock), so the entry goes.
        if let Some(guard) = &self.guard
            && Arc::strong_count(tokio::sync::OwnedMutexGuard::mutex(guard)) == 2
        {
            map.remove(&self.uid);
        }
        self.guard = None;
    }
}

/// Removes a claim's files, each attempted even when one fails (the first error is
/// returned); absent ones are fine (unprepare is idempotent).
fn remove_claim_files(
    cdi_file: &Path,
    hook_config: Option<&str>,
    cache_dir: Option<&str>,
) -> Result<(), String> {
    let cdi =
        remove_if_present(cdi_file).map_err(|e| format!("removing {}: {e}", cdi_file.display()));
    let hook = hook_config.map_or(Ok(()), |p| {
        remove_if_present(Path::new(p)).map_err(|e| format!("removing {p}: {e}"))
    });
    // remove_dir_all does not follow links a tenant planted inside.
    let cache = cache_dir.map_or(Ok(()), |dir| match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("removing {dir}: {e}")),
        _ => Ok(()),
    });
    cdi.and(hook).and(cache)
}

/// What [`write_claim_files`] wrote: the texts the checkpoint keeps to restore them.
struct WrittenFiles {
    cdi_file: PathBuf,
    cdi_spec: String,
    hook_config: Option<String>,
}

/// A planned claim's files, none durable (the checkpoint holds their texts): the cache
/// directory and its region file before the hook config — the config names the region's
/// inode (the hook then uses only that file), and the CDI spec bind-mounts the file, so a
/// missing one would fail the container's start — and the CDI spec last, atomically: the
/// container runtime watches its directory, and only the spec makes the others reachable.
fn write_claim_files(
    plan: &hami_dra_core::prepare::PreparePlan,
    cdi_dir: &Path,
) -> Result<WrittenFiles, String> {
    if let Some(dir) = &plan.cache_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {dir}: {e}"))?;
    }
    let hook_config = match &plan.hook_config {
        Some((path, config)) => {
            let mut config = config.clone();
            if let Some(dir) = &plan.cache_dir {
                config.shared_cache_inode = Some(prepare_region(dir, &config)?);
            }
            let text = config.encode().map_err(|e| format!("hook config: {e}"))?;
            write_unpublished(Path::new(path), text.as_bytes(), 0o444)
                .map_err(|e| format!("writing {path}: {e}"))?;
            Some(text)
        }
        None => None,
    };
    let cdi_file = cdi_dir.join(cdi_claim::file_name(&plan.claim_uid));
    let cdi_spec = serde_json::to_string_pretty(&plan.cdi_spec).map_err(|e| e.to_string())?;
    write_atomic(&cdi_file, cdi_spec.as_bytes(), 0o644, false)
        .map_err(|e| format!("writing {}: {e}", cdi_file.display()))?;
    Ok(WrittenFiles {
        cdi_file,
        cdi_spec,
        hook_config,
    })
}

/// The non-durable files of a prepared claim, as the checkpoint says they must be (after a
/// crash a file may be missing or empty). A missing region file is made anew, and then the
/// hook config must name the new inode: the entry to record is returned.
fn restore_files(c: &PreparedClaim) -> Result<Option<PreparedClaim>, String> {
    ensure(Path::new(&c.cdi_file), c.cdi_spec.as_bytes(), 0o644)
        .map_err(|e| format!("restoring {}: {e}", c.cdi_file))?;
    if let Some(dir) = &c.cache_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {dir}: {e}"))?;
    }
    let (Some(p), Some(text)) = (&c.hook_config_file, &c.hook_config) else {
        return Ok(None);
    };
    let lost = match &c.cache_dir {
        Some(dir) => {
            hami_region::plugin_file::check(&Path::new(dir).join(REGION_FILE))
                .map_err(|e| e.to_string())?
                == hami_region::plugin_file::RegionFile::Absent
        }
        None => false,
    };
    if !lost {
        ensure(Path::new(p), text.as_bytes(), 0o444).map_err(|e| format!("restoring {p}: {e}"))?;
        return Ok(None);
    }
    let dir = c.cache_dir.as_deref().unwrap_or_default();
    let mut config = hami_protocol::hook_config::decode(text.as_bytes())
        .map_err(|e| format!("the checkpoint's hook config for {p}: {e}"))?;
    config.shared_cache_inode = Some(prepare_region(dir, &config)?);
    let text = config.encode().map_err(|e| format!("hook config: {e}"))?;
    write_atomic(Path::new(p), text.as_bytes(), 0o444, false)
        .map_err(|e| format!("restoring {p}: {e}"))?;
    Ok(Some(PreparedClaim {
        hook_config: Some(text),
        ..c.clone()
    }))
}

/// The region file's name in a claim's cache directory (the device plugin's, so the hook
/// and the monitor find it the same way).
const REGION_FILE: &str = hami_amd_plugin::allocate_plan::CACHE_FILE;

/// The claim's region file with the hook config's limits, or the usable one an earlier
/// prepare made, under the rule both regions share (`hami_region::plugin_file`); its inode
/// goes into the hook config.
fn prepare_region(
    dir: &str,
    config: &hami_protocol::hook_config::HookConfig,
) -> Result<u64, String> {
    let limits = hami_region::plugin_file::limits_of(|d| config.memory_limit(d));
    hami_region::plugin_file::prepare(&Path::new(dir).join(REGION_FILE), &limits)
        .map_err(|e| e.to_string())
}

fn devices_of(c: &PreparedClaim) -> Vec<Device> {
    c.devices
        .iter()
        .map(|d| Device {
            // kubelet matches a container's `resources.claims[].request` (a top-level name)
            // against these exactly; a firstAvailable result is `<request>/<sub>`, so send
            // the parent, as upstream's kubeletplugin helper does (stripSubrequestNames).
            request_names: vec![hami_dra_core::api::parent_request(&d.request).to_string()],
            pool_name: d.pool.clone(),
            device_name: d.device.clone(),
            cdi_device_ids: vec![d.cdi_id.clone()],
        })
        .collect()
}
