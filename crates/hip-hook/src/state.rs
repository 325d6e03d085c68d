//! The process's hook state, created on the first wrapped call (never inside the linker's
//! callbacks) and re-created in a forked child, which must not account into its parent's slot.

use std::mem::ManuallyDrop;
use std::sync::atomic::{
    AtomicPtr, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Mutex, MutexGuard};

use hami_region::Session;
use hami_region::layout::LIMIT_NONE;

use crate::config::{HookConfig, from_file, resolve, unusable};
use crate::hook_config_file::Source;
use crate::tracker::Tracker;
use hami_kernel_locks::fork_mark::{ForkMark, Mark, own_pid};

pub struct ProcessState {
    pid: i32,
    pub config: HookConfig,
    /// `None` when the region could not be used: limited devices then fail closed.
    pub session: Option<ManuallyDrop<Session>>,
    tracker: Mutex<Tracker>,
    /// Milliseconds (monotonic) of the last reclaim pass run from hipMemGetInfo.
    last_reclaim_ms: AtomicU64,
}

static STATE: AtomicPtr<ProcessState> = AtomicPtr::new(std::ptr::null_mut());
static INIT: Mutex<()> = Mutex::new(());

/// Set once STATE holds this process's state; wiped in a forked child, so the hot path needs
/// no `getpid` system call on every HIP call.
static FORK_MARK: ForkMark = ForkMark::new();

/// The state of this process, creating it on first use.
pub fn state() -> &'static ProcessState {
    let current = STATE.load(Acquire);
    let mark = FORK_MARK.read();
    if mark == Mark::Set {
        // SAFETY: STATE only ever holds leaked, never-freed ProcessStates, and the mark is
        // set only after STATE.
        if let Some(state) = unsafe { current.as_ref() } {
            return state;
        }
    }
    let pid = own_pid();
    // SAFETY: as above.
    if let Some(state) = unsafe { current.as_ref() }
        && state.pid == pid
        && mark == Mark::Absent
    {
        return state;
    }
    let _init = INIT.lock().unwrap_or_else(|p| p.into_inner());
    let current = STATE.load(Acquire);
    // SAFETY: as above.
    if let Some(state) = unsafe { current.as_ref() } {
        if state.pid == pid {
            return state;
        }
        // A forked child: leave the parent's slot to the parent. The inherited copies of its
        // descriptors and mapping are closed; the parent's own stay as they are.
        // SAFETY: the old state is never used again in this process (STATE is replaced
        // below), so moving its session out once is sound.
        if let Some(inherited) = unsafe { std::ptr::read(&state.session) } {
            ManuallyDrop::into_inner(inherited).abandon();
        }
    }
    let fresh: &'static ProcessState = Box::leak(Box::new(ProcessState::create(pid)));
    STATE.store(std::ptr::from_ref(fresh).cast_mut(), Release);
    FORK_MARK.set();
    fresh
}

fn now_ms() -> u64 {
    // SAFETY: clock_gettime into a local timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid clock id and pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

impl ProcessState {
    fn create(pid: i32) -> ProcessState {
        let pod = crate::environ::pod_environ();
        if pod.is_none() {
            crate::log::info(format_args!(
                "/proc/1/environ is unreadable; using this process's environment only"
            ));
        }
        let from_pod = |key: &str| {
            pod.as_deref()
                .and_then(|pairs| crate::environ::lookup(pairs, key))
                .map(str::to_owned)
        };
        let own = |key: &str| std::env::var(key).ok();
        let config = match crate::hook_config_file::source() {
            Source::File { path, config } => {
                crate::log::debug(format_args!("settings from {path}"));
                from_file(config, &from_pod, &own)
            }
            Source::Absent => resolve(&from_pod, &own),
            Source::Invalid(reason) => unusable(reason, resolve(&from_pod, &own).log_level),
        };
        crate::log::set_level(config.log_level);
        for problem in &config.limit_errors {
            crate::log::error(format_args!("{problem}"));
        }
        let attached = if config.attach_region {
            Session::attach_expecting(
                config.cache_path.as_ref(),
                &config.limits,
                config.cache_inode,
            )
        } else {
            Err(hami_region::RegionError::Unsafe {
                path: config.cache_path.clone().into(),
                reason: "not opened: the hook's settings are unusable".to_owned(),
            })
        };
        let session = match attached {
            Ok(mut session) => {
                for (device, stored, wanted) in session.limit_mismatches(&config.limits) {
                    if config.limits_from_config {
                        crate::log::warn(format_args!(
                            "device {device}: the region's limit {stored} differs from the hook config's {wanted}; the lower one, {}, is in force",
                            stored.min(wanted)
                        ));
                    } else {
                        crate::log::warn(format_args!(
                            "device {device}: the region's limit {stored} is in force, not this process's {wanted} (the first process of the container set it)"
                        ));
                    }
                }
                // The region is writable by every process of the container: the read-only
                // config's limits are the most it can hold (issue 26 item 3).
                if config.limits_from_config {
                    session.cap_limits(&config.limits);
                }
                crate::log::debug(format_args!(
                    "attached {} as slot {}",
                    config.cache_path,
                    session.slot_index()
                ));
                Some(ManuallyDrop::new(session))
            }
            Err(err) => {
                crate::log::error(format_args!(
                    "{err}; allocations on limited devices will be refused"
                ));
                None
            }
        };
        ProcessState {
            pid,
            config,
            session,
            tracker: Mutex::new(Tracker::default()),
            last_reclaim_ms: AtomicU64::new(0),
        }
    }

    /// The allocation records. A panic while they are held (a bug) poisons the lock; the
    /// next caller takes them as they are (every change to them is a single insert or remove).
    pub fn tracker(&self) -> MutexGuard<'_, Tracker> {
        let tracker = self.tracker.lock().unwrap_or_else(|p| p.into_inner());
        // Test builds only: `tracker` in AMVGPU_TEST_PANIC_IN panics here, lock held.
        crate::ffi_guard::fault_point("tracker");
        tracker
    }

    /// The limit in force on `device`: the region's, capped by the config file's
    /// (`Session::cap_limits`); without a region, the configured one.
    pub fn limit(&self, device: usize) -> u64 {
        match &self.session {
            Some(session) => session.device_usage(device).map_or(0, |usage| usage.limit),
            None => self
                .config
                .limits
                .bytes
                .get(device)
                .copied()
                .unwrap_or(LIMIT_NONE),
        }
    }

    /// Whether any device has a limit (the region's when attached, else the configured).
    pub fn any_limit(&self) -> bool {
        match &self.session {
            Some(session) => (0..hami_region::layout::MAX_DEVICES).any(|d| {
                session
                    .device_usage(d)
                    .is_some_and(|u| u.limit != LIMIT_NONE)
            }),
            None => self.config.limits.bytes.iter().any(|b| *b != LIMIT_NONE),
        }
    }

    /// Runs a reclaim pass at most every 100 ms (for hipMemGetInfo, so reported free memory
    /// does not count processes that have exited).
    pub fn reclaim_now_and_then(&self) {
        let Some(session) = &self.session else {
            return;
        };
        let now = now_ms();
        let last = self.last_reclaim_ms.load(Relaxed);
        if now.saturating_sub(last) >= 100
            && self
                .last_reclaim_ms
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            let reclaimed = session.reclaim_dead();
            if reclaimed.slots > 0 {
                crate::log::info(format_args!(
                    "reclaimed {} bytes of {} exited processes",
                    reclaimed.bytes, reclaimed.slots
                ));
            }
        }
    }
}
