//! The launches: the limiter and the handshake run before the real launch (kernels,
//! cooperative kernels, `cuLaunchKernelEx`, graphs).

use std::ffi::{c_uint, c_void};

use crate::cuda_abi::*;
use crate::ffi_guard::guarded;
use crate::sampler::{average_cost, before_launch, note_kernel};
use crate::state::state;
use crate::symbols::{Sym, real_fn};

/// Limiter and handshake before a launch of `cost` tokens (`None`: a graph).
fn gate(what: &str, blocks: Option<u64>) {
    guarded(what, (), || {
        let st = state();
        let Ok(index) = st.current_index() else {
            return;
        };
        let cost = match blocks {
            Some(b) => {
                note_kernel(st, b);
                b
            }
            None => average_cost(st),
        };
        before_launch(st, index, cost);
    });
}

type LaunchFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;
type CoopFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
) -> CuResult;
type LaunchExFn = unsafe extern "C" fn(
    *const LaunchConfig,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;
type GraphFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> CuResult;

fn blocks(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    u64::from(x) * u64::from(y) * u64::from(z)
}

macro_rules! launch_kernel {
    ($name:ident, $sym:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: *mut c_void,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: *mut c_void,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CuResult {
            guarded(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let Some(real) = real_fn!($sym, LaunchFn) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                gate(stringify!($name), Some(blocks(gx, gy, gz)));
                // SAFETY: the real function with the caller's arguments.
                unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) }
            })
        }
    };
}
launch_kernel!(cuLaunchKernel, Sym::CuLaunchKernel);
launch_kernel!(cuLaunchKernel_ptsz, Sym::CuLaunchKernelPtsz);

macro_rules! launch_coop {
    ($name:ident, $sym:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: *mut c_void,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: *mut c_void,
            params: *mut *mut c_void,
        ) -> CuResult {
            guarded(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let Some(real) = real_fn!($sym, CoopFn) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                gate(stringify!($name), Some(blocks(gx, gy, gz)));
                // SAFETY: the real function with the caller's arguments.
                unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) }
            })
        }
    };
}
launch_coop!(cuLaunchCooperativeKernel, Sym::CuLaunchCooperativeKernel);
launch_coop!(
    cuLaunchCooperativeKernel_ptsz,
    Sym::CuLaunchCooperativeKernelPtsz
);

macro_rules! launch_ex {
    ($name:ident, $sym:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            config: *const LaunchConfig,
            f: *mut c_void,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CuResult {
            guarded(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let Some(real) = real_fn!($sym, LaunchExFn) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                if !config.is_null() {
                    // SAFETY: the caller's launch configuration, non-null.
                    let g = unsafe { (*config).grid };
                    gate(stringify!($name), Some(blocks(g[0], g[1], g[2])));
                }
                // SAFETY: the real function with the caller's arguments.
                unsafe { real(config, f, params, extra) }
            })
        }
    };
}
launch_ex!(cuLaunchKernelEx, Sym::CuLaunchKernelEx);
launch_ex!(cuLaunchKernelEx_ptsz, Sym::CuLaunchKernelExPtsz);

macro_rules! launch_graph {
    ($name:ident, $sym:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(exec: *mut c_void, stream: *mut c_void) -> CuResult {
            guarded(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let Some(real) = real_fn!($sym, GraphFn) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                gate(stringify!($name), None);
                // SAFETY: the real function with the caller's arguments.
                unsafe { real(exec, stream) }
            })
        }
    };
}
launch_graph!(cuGraphLaunch, Sym::CuGraphLaunch);
launch_graph!(cuGraphLaunch_ptsz, Sym::CuGraphLaunchPtsz);
