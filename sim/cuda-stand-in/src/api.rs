//! The exported driver functions. Signatures follow `cuda.h` (CUDA 12): `CUresult` is `int`,
//! `CUdevice` is `int`, `CUdeviceptr` is `unsigned long long`, handles are pointers.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::driver::{
    self, INVALID_CONTEXT, INVALID_HANDLE, INVALID_VALUE, SUCCESS, context_handle, context_ordinal,
    current_device, current_ordinal, driver, set_current,
};

macro_rules! try_cu {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

/// Writes `value` through `out` (INVALID_VALUE for NULL).
unsafe fn put<T>(out: *mut T, value: T) -> c_int {
    if out.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: non-null and, by the C API contract, valid for a write of T.
    unsafe { out.write(value) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> c_int {
    driver::init()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> c_int {
    // SAFETY: caller's pointer, checked for NULL in put.
    unsafe { put(version, 12040) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> c_int {
    let d = try_cu!(driver());
    // SAFETY: caller's pointer.
    unsafe { put(count, d.visible.len() as c_int) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> c_int {
    let d = try_cu!(driver());
    try_cu!(d.device(ordinal));
    // SAFETY: caller's pointer.
    unsafe { put(device, ordinal) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> c_int {
    let d = try_cu!(driver());
    let index = try_cu!(d.device(dev));
    if name.is_null() || len <= 0 {
        return INVALID_VALUE;
    }
    let text = format!("Stand-in NVIDIA GPU {index}\0");
    let n = text.len().min(len as usize);
    // SAFETY: the caller's buffer holds `len` bytes; we write at most that, NUL included.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast(), n);
        *name.add(n - 1) = 0;
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: c_int) -> c_int {
    let d = try_cu!(driver());
    let index = try_cu!(d.device(dev));
    // SAFETY: caller's 16-byte CUuuid.
    unsafe { put(uuid, crate::fake_state::uuid_bytes(index)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: c_int) -> c_int {
    // SAFETY: same contract.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> c_int {
    let d = try_cu!(driver());
    try_cu!(d.device(dev));
    // SAFETY: caller's pointer.
    unsafe { put(bytes, d.config.device_memory as usize) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attrib: c_int,
    dev: c_int,
) -> c_int {
    let d = try_cu!(driver());
    try_cu!(d.device(dev));
    let v = match attrib {
        16 => d.config.sm_count, // MULTIPROCESSOR_COUNT
        39 => 2048,              // MAX_THREADS_PER_MULTIPROCESSOR
        75 => 9,                 // COMPUTE_CAPABILITY_MAJOR
        76 => 0,                 // COMPUTE_CAPABILITY_MINOR
        _ => 0,
    };
    // SAFETY: caller's pointer.
    unsafe { put(value, v) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut usize, dev: c_int) -> c_int {
    let d = try_cu!(driver());
    d.note_context(try_cu!(d.device(dev)));
    // SAFETY: caller's pointer.
    unsafe { put(ctx, context_handle(dev)) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> c_int {
    let d = try_cu!(driver());
    try_cu!(d.device(dev));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(ctx: *mut usize, _flags: c_uint, dev: c_int) -> c_int {
    let d = try_cu!(driver());
    d.note_context(try_cu!(d.device(dev)));
    set_current(Some(dev));
    // SAFETY: caller's pointer.
    unsafe { put(ctx, context_handle(dev)) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: usize) -> c_int {
    let d = try_cu!(driver());
    match context_ordinal(ctx) {
        Some(o) => {
            if current_ordinal() == Ok(o) {
                set_current(None);
            }
            // As in the real driver, destroying a context frees what was allocated in it
            // (stand-in contexts are one per device: everything on that device).
            if let Ok(device) = d.device(o) {
                d.free_device(device);
            }
            SUCCESS
        }
        None => INVALID_CONTEXT,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: usize) -> c_int {
    try_cu!(driver());
    if ctx == 0 {
        set_current(None);
        return SUCCESS;
    }
    match context_ordinal(ctx) {
        Some(o) => {
            set_current(Some(o));
            SUCCESS
        }
        None => INVALID_CONTEXT,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut usize) -> c_int {
    try_cu!(driver());
    let handle = current_ordinal().map_or(0, context_handle);
    // SAFETY: caller's pointer.
    unsafe { put(ctx, handle) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut c_int) -> c_int {
    let o = try_cu!(current_ordinal());
    // SAFETY: caller's pointer.
    unsafe { put(dev, o) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> c_int {
    try_cu!(current_ordinal());
    SUCCESS
}

fn alloc_on_current(size: usize) -> Result<u64, c_int> {
    let d = driver()?;
    let device = current_device()?;
    d.take(device, size as u64)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> c_int {
    if dptr.is_null() {
        return INVALID_VALUE;
    }
    let address = try_cu!(alloc_on_current(size));
    // SAFETY: checked non-null above.
    unsafe { put(dptr, address) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut u64, size: usize, _flags: c_uint) -> c_int {
    // SAFETY: same contract as cuMemAlloc_v2.
    unsafe { cuMemAlloc_v2(dptr, size) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> c_int {
    if dptr.is_null() || pitch.is_null() || !matches!(element_size, 4 | 8 | 16) || width == 0 {
        return INVALID_VALUE;
    }
    let row = width.next_multiple_of(512);
    let Some(bytes) = row.checked_mul(height) else {
        return INVALID_VALUE;
    };
    let address = try_cu!(alloc_on_current(bytes));
    // SAFETY: both checked non-null above.
    unsafe {
        pitch.write(row);
        put(dptr, address)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut u64,
    size: usize,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: same contract as cuMemAlloc_v2.
    unsafe { cuMemAlloc_v2(dptr, size) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut u64,
    size: usize,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: same contract.
    unsafe { cuMemAllocAsync(dptr, size, stream) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut u64,
    size: usize,
    _pool: *mut c_void,
    _stream: *mut c_void,
) -> c_int {
    // SAFETY: same contract as cuMemAlloc_v2 (stand-in pools live on the current device).
    unsafe { cuMemAlloc_v2(dptr, size) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut u64,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: same contract.
    unsafe { cuMemAllocFromPoolAsync(dptr, size, pool, stream) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: u64) -> c_int {
    let d = try_cu!(driver());
    d.give(dptr)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(dptr: u64, _stream: *mut c_void) -> c_int {
    cuMemFree_v2(dptr)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync_ptsz(dptr: u64, stream: *mut c_void) -> c_int {
    cuMemFreeAsync(dptr, stream)
}

/// `CUmemAllocationProp`: type, requestedHandleTypes, location {type, id}, ...
#[repr(C)]
pub struct MemAllocationProp {
    pub kind: c_int,
    pub handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const MemAllocationProp,
    _flags: u64,
) -> c_int {
    if handle.is_null() || prop.is_null() {
        return INVALID_VALUE;
    }
    let d = try_cu!(driver());
    // SAFETY: non-null CUmemAllocationProp from the caller.
    let (location_type, id) = unsafe { ((*prop).location_type, (*prop).location_id) };
    if location_type != 1 {
        return INVALID_VALUE;
    }
    let device = try_cu!(d.device(id));
    let h = try_cu!(d.take(device, size as u64));
    // SAFETY: checked non-null.
    unsafe { put(handle, h) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: u64) -> c_int {
    let d = try_cu!(driver());
    d.give(handle)
}

/// `CUDA_ARRAY_DESCRIPTOR` and `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

#[repr(C)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

fn format_bytes(format: c_uint) -> Option<usize> {
    Some(match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return None,
    })
}

fn array_bytes(w: usize, h: usize, d: usize, format: c_uint, channels: c_uint) -> Option<usize> {
    if !matches!(channels, 1 | 2 | 4) || w == 0 {
        return None;
    }
    w.checked_mul(h.max(1))?
        .checked_mul(d.max(1))?
        .checked_mul(channels as usize)?
        .checked_mul(format_bytes(format)?)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(array: *mut u64, desc: *const ArrayDescriptor) -> c_int {
    if array.is_null() || desc.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: non-null descriptor from the caller.
    let desc = unsafe { &*desc };
    let Some(bytes) = array_bytes(desc.width, desc.height, 1, desc.format, desc.channels) else {
        return INVALID_VALUE;
    };
    let a = try_cu!(alloc_on_current(bytes));
    // SAFETY: checked non-null.
    unsafe { put(array, a) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    array: *mut u64,
    desc: *const Array3dDescriptor,
) -> c_int {
    if array.is_null() || desc.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: non-null descriptor from the caller.
    let desc = unsafe { &*desc };
    let Some(bytes) = array_bytes(
        desc.width,
        desc.height,
        desc.depth,
        desc.format,
        desc.channels,
    ) else {
        return INVALID_VALUE;
    };
    let a = try_cu!(alloc_on_current(bytes));
    // SAFETY: checked non-null.
    unsafe { put(array, a) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuArrayDestroy(array: u64) -> c_int {
    let d = try_cu!(driver());
    match d.give(array) {
        SUCCESS => SUCCESS,
        _ => INVALID_HANDLE,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> c_int {
    let d = try_cu!(driver());
    let device = try_cu!(current_device());
    if free.is_null() || total.is_null() {
        return INVALID_VALUE;
    }
    // A real driver has already taken back the memory of processes that are gone.
    d.mapped.reclaim_dead(d.owner);
    let used = d.state.devices[device]
        .used
        .load(std::sync::atomic::Ordering::Acquire);
    // SAFETY: both checked non-null.
    unsafe {
        free.write(d.config.device_memory.saturating_sub(used) as usize);
        total.write(d.config.device_memory as usize);
    }
    SUCCESS
}

fn launch(blocks: u64) -> c_int {
    let d = try_cu!(driver());
    let device = try_cu!(current_device());
    d.run_kernel(device, blocks);
    SUCCESS
}

fn grid(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    x as u64 * y as u64 * z as u64
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shared: c_uint,
    _stream: *mut c_void,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> c_int {
    if f.is_null() {
        return INVALID_HANDLE;
    }
    launch(grid(gx, gy, gz))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchKernel_ptsz(
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
) -> c_int {
    cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchCooperativeKernel(
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
) -> c_int {
    cuLaunchKernel(
        f,
        gx,
        gy,
        gz,
        bx,
        by,
        bz,
        shared,
        stream,
        params,
        std::ptr::null_mut(),
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchCooperativeKernel_ptsz(
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
) -> c_int {
    cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params)
}

/// `CUlaunchConfig`: grid and block dims, shared bytes, stream, attrs, numAttrs.
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    pub stream: *mut c_void,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfig,
    f: *mut c_void,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> c_int {
    if config.is_null() || f.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: non-null CUlaunchConfig from the caller.
    let g = unsafe { (*config).grid };
    launch(grid(g[0], g[1], g[2]))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const LaunchConfig,
    f: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> c_int {
    // SAFETY: same contract.
    unsafe { cuLaunchKernelEx(config, f, params, extra) }
}

/// Stand-in graphs are one kernel of this many blocks.
pub const GRAPH_BLOCKS: u64 = 1000;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(graph: *mut usize, _flags: c_uint) -> c_int {
    try_cu!(driver());
    // SAFETY: caller's pointer.
    unsafe { put(graph, 0x9_0000) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut usize,
    graph: usize,
    _flags: u64,
) -> c_int {
    if graph != 0x9_0000 {
        return INVALID_HANDLE;
    }
    // SAFETY: caller's pointer.
    unsafe { put(exec, 0xa_0000) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch(exec: usize, _stream: *mut c_void) -> c_int {
    if exec != 0xa_0000 {
        return INVALID_HANDLE;
    }
    launch(GRAPH_BLOCKS)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch_ptsz(exec: usize, stream: *mut c_void) -> c_int {
    cuGraphLaunch(exec, stream)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecDestroy(_exec: usize) -> c_int {
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphDestroy(_graph: usize) -> c_int {
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: c_int, text: *mut *const c_char) -> c_int {
    let s: &'static [u8] = match error {
        0 => b"no error\0",
        1 => b"invalid argument\0",
        2 => b"out of memory\0",
        3 => b"initialization error\0",
        _ => b"unknown error\0",
    };
    // SAFETY: caller's pointer.
    unsafe { put(text, s.as_ptr().cast()) }
}
