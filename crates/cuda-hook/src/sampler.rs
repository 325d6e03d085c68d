//! The utilization sampler (SPEC §6): every 100 ms it asks NVML for process utilization of
//! each container device, stores each sample's `smUtil` (clamped to 100) in the slot whose
//! `hostpid` matches — a new value replaces the old one, never zero-then-fill (D-6) — and
//! drives the SM limiter from the container's sum.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering::{AcqRel, Relaxed};
use std::time::Duration;

use hami_cuda_region::MAX_DEVICES;

use crate::cuda_abi::*;
use crate::limiter::{Refill, next_refill, refill_balance};
use crate::state::State;
use crate::symbols::{Sym, real_fn};

pub const TICK: Duration = Duration::from_millis(100);

pub fn start(state: &'static State) {
    if state.sampler_started.swap(true, AcqRel) || state.region.is_none() {
        return;
    }
    if !crate::state::nvml_init() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("vgpu-sampler".into())
        .spawn(move || {
            loop {
                std::thread::sleep(TICK);
                crate::ffi_guard::guarded("the sampler", (), || tick(state));
            }
        });
    if let Err(err) = spawned {
        crate::log::error(format_args!(
            "cannot start the utilization sampler: {err}; no utilization, no compute limit"
        ));
    }
}

type GetUtil =
    unsafe extern "C" fn(*mut c_void, *mut NvmlProcessUtilizationSample, *mut c_uint, u64) -> c_int;

fn samples(device: usize) -> Option<Vec<NvmlProcessUtilizationSample>> {
    let get = real_fn!(Sym::NvmlDeviceGetProcessUtilization, GetUtil)?;
    let handle = crate::state::nvml_handle(device)?;
    let mut buf = vec![NvmlProcessUtilizationSample::default(); 1024];
    let mut count: c_uint = buf.len() as c_uint;
    // SAFETY: real NVML call with a buffer of `count` samples.
    let rc = unsafe { get(handle, buf.as_mut_ptr(), &mut count, 0) };
    match rc {
        NVML_SUCCESS => {
            buf.truncate((count as usize).min(1024));
            Some(buf)
        }
        // No process ran a kernel in the window: everybody is idle.
        NVML_ERROR_NOT_FOUND => Some(Vec::new()),
        _ => None,
    }
}

fn tick(state: &'static State) {
    let Some(region) = &state.region else { return };
    let shared = region.shared();
    let devices = (shared.device_num.load(Relaxed) as usize).min(MAX_DEVICES);
    let slots = region.occupied_slots();
    for device in 0..devices {
        let Some(found) = samples(device) else {
            continue;
        };
        let mut container = 0u64;
        for (index, _pid, hostpid) in &slots {
            if *hostpid <= 0 {
                continue;
            }
            // The newest sample of this pid (NVML may return several).
            let util = found
                .iter()
                .filter(|s| s.pid as i32 == *hostpid)
                .max_by_key(|s| s.time_stamp)
                .map_or(0, |s| u64::from(s.sm_util.min(100)));
            shared.procs[*index].device_util[device]
                .sm_util
                .store(util, Relaxed);
            container += util;
        }
        steer(state, device, container.min(100));
    }
}

/// Whether compute limiting is on: the policy (config file or environment); without one,
/// the region's switch (HAMi's monitor's), except under the plugin's config, whose SM
/// limit the container's own processes — who can write the region — must not switch off.
fn switch_on(state: &State) -> bool {
    state.config.utilization_policy.unwrap_or_else(|| {
        state.config.from_config
            || state
                .region
                .as_ref()
                .is_none_or(|r| r.shared().utilization_switch.load(Relaxed) != 0)
    })
}

fn steer(state: &State, device: usize, util: u64) {
    let limiter = &state.limiters[device];
    let limit = state.region.as_ref().map_or(100, |r| r.sm_limit(device));
    let limit = if switch_on(state) { limit } else { 100 };
    let consumed = limiter.consumed.swap(0, AcqRel);
    let current = match limiter.refill.load(Relaxed) {
        0 => Refill::Unlimited,
        t => Refill::Tokens(t),
    };
    match next_refill(limit, util, consumed, current) {
        Refill::Unlimited => limiter.refill.store(0, Relaxed),
        Refill::Tokens(t) => {
            limiter.refill.store(t, Relaxed);
            let _ = limiter
                .tokens
                .fetch_update(AcqRel, Relaxed, |b| Some(refill_balance(b, t)));
        }
    }
}

/// Before a launch of `cost` tokens on container device `index`: the priority handshake of
/// HAMi's monitor (`recent_kernel`), `last_kernel_time`, then the token bucket.
pub fn before_launch(state: &'static State, index: usize, cost: u64) {
    if let Some(region) = &state.region {
        let shared = region.shared();
        // The host monitor blocks low-priority containers by setting recent_kernel < 0.
        while shared.recent_kernel.load(Relaxed) < 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
        shared.recent_kernel.store(2, Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if state.last_kernel_second.swap(now, Relaxed) != now {
            shared.last_kernel_time.fetch_max(now, AcqRel);
        }
    }
    let Some(limiter) = state.limiters.get(index) else {
        return;
    };
    limiter.consumed.fetch_add(cost, Relaxed);
    loop {
        if limiter.refill.load(Relaxed) == 0 {
            return;
        }
        let balance = limiter.tokens.load(Relaxed);
        if balance > 0 {
            if limiter
                .tokens
                .compare_exchange(
                    balance,
                    balance - cost.min(i64::MAX as u64) as i64,
                    AcqRel,
                    Relaxed,
                )
                .is_ok()
            {
                return;
            }
            continue;
        }
        std::thread::sleep(TICK / 10);
    }
}

/// Cost of a launch whose block count is unknown (graphs): the average kernel's.
pub fn average_cost(state: &State) -> u64 {
    (state.average_blocks_x16.load(Relaxed) / 16).max(1)
}

pub fn note_kernel(state: &State, blocks: u64) {
    let _ = state
        .average_blocks_x16
        .fetch_update(Relaxed, Relaxed, |avg| {
            Some((avg * 7 + blocks.saturating_mul(16)) / 8)
        });
}
