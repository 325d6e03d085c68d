//! The books every wrapper keeps: reserve before the real allocation, settle once its real
//! size is known, take a record out before the real free and return its bytes after
//! ([`freed`]), and the one macro ([`free_wrapper`]) every free wrapper is made with.

use std::ffi::c_void;

use hami_region::ReserveError;

use hami_region::layout::LIMIT_NONE;

use super::{current_device, real_fn};
use crate::ffi_guard::guarded;
use crate::hip_abi::*;

use crate::state::{ProcessState, state};
use crate::symbols::Sym;
use crate::tracker::{Record, Space};

/// What a real allocation produced: the address or handle, and the bytes it really holds.
pub(super) struct Allocated {
    pub(super) address: usize,
    pub(super) bytes: u64,
}

/// Reserve `reserve` bytes on `device`, run the real allocation, then settle the books.
/// `undo` frees an allocation that turned out bigger than the limit allows. Runs inside the
/// wrapper's guard, whose fallback (out of memory) is this function's failure too.
pub(super) fn accounted(
    runtime: usize,
    what: &str,
    device: Option<usize>,
    reserve: u64,
    space: Space,
    allocate: impl FnOnce() -> Result<Option<Allocated>, HipError>,
    undo: impl FnOnce(usize),
) -> HipError {
    let state = state();
    let device = match device {
        Some(device) => device,
        None => match current_device(runtime) {
            Ok(device) => device,
            Err(code) => {
                if !state.any_limit() {
                    // Nothing to enforce: the runtime decides (and answers) itself.
                    crate::log::info(format_args!(
                        "{what}: the current device is unknown (hipGetDevice returned {code}); no device is limited, passing the call through"
                    ));
                    return allocate().err().unwrap_or(HIP_SUCCESS);
                }
                crate::log::info(format_args!(
                    "{what}: the runtime has no current device (hipGetDevice returned {code}); returning its error"
                ));
                return code;
            }
        },
    };
    let Some(session) = &state.session else {
        if state.limit(device) == LIMIT_NONE {
            return allocate().err().unwrap_or(HIP_SUCCESS);
        }
        return HIP_ERROR_OUT_OF_MEMORY; // fail closed: the limit cannot be enforced
    };
    match session.reserve(device, reserve) {
        Ok(()) => {}
        Err(ReserveError::OverLimit { over, .. }) => {
            crate::log::info(format_args!(
                "{what}: {} bytes refused on device {device}: {} of {} bytes in use",
                over.requested, over.used, over.limit
            ));
            oom_killer_check(state, device);
            return HIP_ERROR_OUT_OF_MEMORY;
        }
        Err(err @ ReserveError::NoSuchDevice(_)) => {
            crate::log::error(format_args!("{what}: {err}; refusing"));
            return HIP_ERROR_OUT_OF_MEMORY;
        }
    }
    let allocated = match allocate() {
        Ok(Some(allocated)) => allocated,
        Ok(None) => {
            session.release(device, reserve);
            return HIP_SUCCESS;
        }
        Err(code) => {
            session.release(device, reserve);
            return code;
        }
    };
    let mut bytes = reserve;
    if allocated.bytes < reserve {
        session.release(device, reserve - allocated.bytes);
        bytes = allocated.bytes;
    } else if allocated.bytes > reserve {
        match session.reserve(device, allocated.bytes - reserve) {
            Ok(()) => bytes = allocated.bytes,
            Err(err) => {
                crate::log::info(format_args!("{what}: padded allocation refused: {err}"));
                undo(allocated.address);
                session.release(device, reserve);
                return HIP_ERROR_OUT_OF_MEMORY;
            }
        }
    }
    let stale = state
        .tracker()
        .insert(space, allocated.address, Record { device, bytes });
    if let Some(stale) = stale {
        session.release(stale.device, stale.bytes);
    }
    HIP_SUCCESS
}

/// ACTIVE_OOM_KILLER: a process holding bytes on a device whose usage is above its limit
/// (possible only through paths the hook cannot refuse, e.g. a limit lowered live) ends.
pub(super) fn oom_killer_check(state: &ProcessState, device: usize) {
    let Some(session) = &state.session else {
        return;
    };
    if !state.config.active_oom_killer {
        return;
    }
    let Some(usage) = session.device_usage(device) else {
        return;
    };
    if usage.limit != LIMIT_NONE && usage.used > usage.limit && session.own_used(device) > 0 {
        crate::log::error(format_args!(
            "ACTIVE_OOM_KILLER: device {device} holds {} bytes over its limit of {}, {} of them this process's; terminating",
            usage.used,
            usage.limit,
            session.own_used(device)
        ));
        // SAFETY: sends SIGKILL to ourselves; a deliberate, logged termination.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// Takes the record out, runs the real free, then returns the bytes if it succeeded, or puts
/// the record back if it failed.
///
/// The order matters: once the real free returns, the runtime may hand the same address to
/// a concurrent allocation (caching allocators reuse the last freed block first), whose
/// wrapper then records it. Removing our record *after* the free would delete that new
/// record and its bytes would never be counted (issue 14: 1.25–1.5× the limit with 8
/// threads). The bytes stay reserved until the real free succeeded, so the device never
/// holds more than the books say.
pub(super) fn freed(
    what: &str,
    space: Space,
    address: usize,
    free: impl FnOnce() -> HipError,
) -> HipError {
    if address == 0 {
        return free();
    }
    let record = guarded(what, None, || {
        let state = state();
        state.tracker().remove(space, address)
    });
    let code = free();
    let Some(record) = record else {
        return code;
    };
    guarded(what, (), || {
        let state = state();
        if code == HIP_SUCCESS {
            if let Some(session) = &state.session {
                session.release(record.device, record.bytes);
            }
        } else if let Some(stale) = state.tracker().insert(space, address, record) {
            // The free failed, so the address is still ours; nothing else can have been
            // recorded there. Keep the books whole if it somehow was.
            if let Some(session) = &state.session {
                session.release(stale.device, stale.bytes);
            }
        }
    });
    code
}

/// The address a real call wrote through `out` (0 for a NULL `out`).
///
/// # Safety
/// `out` is NULL or valid for reading a pointer (the caller's out-parameter, written by the
/// real call that just succeeded).
pub(super) unsafe fn out_address(out: *mut *mut c_void) -> usize {
    if out.is_null() {
        return 0;
    }
    // SAFETY: non-null, and readable by this function's contract.
    unsafe { *out as usize }
}

pub(super) fn call_ok(
    code: HipError,
    address: usize,
    bytes: u64,
) -> Result<Option<Allocated>, HipError> {
    match code {
        HIP_SUCCESS if address == 0 => Ok(None),
        HIP_SUCCESS => Ok(Some(Allocated { address, bytes })),
        code => Err(code),
    }
}

/// A linear allocation of `size` bytes whose address the real `call` writes through `ptr`.
///
/// # Safety
/// `ptr` is NULL or valid for reading a pointer once `call` has succeeded.
pub(super) unsafe fn linear(
    runtime: usize,
    what: &str,
    device: Option<usize>,
    ptr: *mut *mut c_void,
    size: usize,
    call: impl FnOnce() -> HipError,
) -> HipError {
    if ptr.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    accounted(
        runtime,
        what,
        device,
        size as u64,
        Space::Pointer,
        // SAFETY: ptr is non-null and readable by this function's contract.
        || call_ok(call(), unsafe { out_address(ptr) }, size as u64),
        |_| {},
    )
}

/// Frees a pitched allocation that does not fit once its real size is known.
pub(super) fn undo_linear<const R: usize>(address: usize) {
    if let Some(free) = real_fn::<FreeFn>(R, Sym::HipFree) {
        // SAFETY: the real hipFree on the allocation the real call just made.
        unsafe { free(address as *mut c_void) };
    }
}

/// A free wrapper: `$name` as callers bound to runtime `R` get it. It takes the record of
/// the first argument's address out of `Space::$space`, runs the real function (`$real`, the
/// symbol `Sym::$sym`) with the caller's arguments, and returns the bytes once the real free
/// succeeded ([`freed`]). An internal error answers `hipErrorUnknown`.
macro_rules! free_wrapper {
    ($name:ident, $real:ty, $sym:ident, $space:ident, ($target:ident: $target_ty:ty $(, $arg:ident: $arg_ty:ty)*)) => {
        #[doc = concat!("`", stringify!($name), "` as callers bound to runtime `R` get it.")]
        ///
        /// # Safety
        #[doc = concat!("As HIP's `", stringify!($name), "`: each pointer argument is NULL or valid for what that function reads and writes during the call.")]
        pub unsafe extern "C" fn $name<const R: usize>(
            $target: $target_ty $(, $arg: $arg_ty)*
        ) -> $crate::hip_abi::HipError {
            $crate::ffi_guard::guarded(stringify!($name), $crate::hip_abi::HIP_ERROR_UNKNOWN, || {
                let Some(real) =
                    $crate::wrappers::real_fn::<$real>(R, $crate::symbols::Sym::$sym)
                else {
                    return $crate::hip_abi::HIP_ERROR_NOT_INITIALIZED;
                };
                $crate::wrappers::books::freed(
                    stringify!($name),
                    $crate::tracker::Space::$space,
                    $target as usize,
                    // SAFETY: the real function with the caller's arguments.
                    || unsafe { real($target $(, $arg)*) },
                )
            })
        }
    };
}
pub(super) use free_wrapper;
