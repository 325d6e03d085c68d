//! The frees: one macro for every free export, all through [`counted_free`].

use std::ffi::c_void;

use crate::cuda_abi::*;
use crate::ffi_guard::guarded;

use crate::state::{Kind, state};
use crate::symbols::{Sym, real_fn};

pub(super) type FreeFn = unsafe extern "C" fn(u64) -> CuResult;
type FreeAsyncFn = unsafe extern "C" fn(u64, *mut c_void) -> CuResult;

/// The record is taken out first (a racing allocation handed the same address by the
/// driver records its own), then the real free; the bytes go back only once the driver has
/// freed them, so the device never holds more than the container's accounting says. A failed
/// free puts the record back. Unknown pointers pass through untouched (the reference
/// returns -1 and leaks them).
fn counted_free(what: &str, kind: Kind, key: u64, free: impl FnOnce() -> CuResult) -> CuResult {
    let record = guarded(what, None, || state().forget(kind, key));
    let rc = free();
    if let Some((index, bytes)) = record {
        guarded(what, (), || {
            let st = state();
            if rc == CUDA_SUCCESS {
                st.release(index, bytes);
            } else {
                st.restore(kind, key, (index, bytes));
            }
        });
    }
    rc
}

/// A free export: `$name` takes the record of its first argument out of `Kind::$kind`
/// before the real free (`$sym`, of type `$real`) and returns the bytes after
/// ([`counted_free`]). An internal error answers `CUDA_ERROR_UNKNOWN`. `[unsafe]` marks the
/// exports taking a pointer.
macro_rules! free_export {
    ($name:ident [$($qual:tt)*], $sym:expr, $real:ty, $kind:ident, ($key:ident $(, $arg:ident: $arg_ty:ty)*)) => {
        #[unsafe(no_mangle)]
        pub $($qual)* extern "C" fn $name($key: u64 $(, $arg: $arg_ty)*) -> CuResult {
            guarded(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let Some(real) = real_fn!($sym, $real) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                // SAFETY: the real function with the caller's arguments.
                counted_free(stringify!($name), Kind::$kind, $key, || unsafe {
                    real($key $(, $arg)*)
                })
            })
        }
    };
}
free_export!(cuMemFree_v2 [], Sym::CuMemFreeV2, FreeFn, Pointer, (dptr));
free_export!(cuMemFreeAsync [unsafe], Sym::CuMemFreeAsync, FreeAsyncFn, Pointer, (dptr, stream: *mut c_void));
free_export!(cuMemFreeAsync_ptsz [unsafe], Sym::CuMemFreeAsyncPtsz, FreeAsyncFn, Pointer, (dptr, stream: *mut c_void));
free_export!(cuMemRelease [], Sym::CuMemRelease, FreeFn, Handle, (handle));
free_export!(cuArrayDestroy [], Sym::CuArrayDestroy, FreeFn, Array, (array));
