//! The exported HIP entry points (C names, signatures and error codes of ROCm 6).
#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::abi::*;
use crate::allocations::{Allocation, Kind};
use crate::cu_mask::exposed_cus;
use crate::runtime::{Runtime, runtime};

/// Runs an entry point's body; a panic becomes `hipErrorUnknown` instead of crossing into C.
fn entry(body: impl FnOnce(&'static Runtime) -> Result<(), HipError>) -> HipError {
    catch_unwind(AssertUnwindSafe(|| runtime().and_then(body))).map_or(
        HIP_ERROR_UNKNOWN,
        |result| match result {
            Ok(()) => HIP_SUCCESS,
            Err(code) => code,
        },
    )
}

/// Writes through an out-pointer, refusing NULL.
fn put<T>(out: *mut T, value: T) -> Result<(), HipError> {
    if out.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller (C) passed a non-null pointer to a `T` it owns.
    unsafe { out.write(value) };
    Ok(())
}

fn allocate(rt: &Runtime, device: usize, size: u64, kind: Kind) -> Result<usize, HipError> {
    if !rt.memory.take(device, size) {
        return Err(HIP_ERROR_OUT_OF_MEMORY);
    }
    Ok(rt.table().insert(Allocation { device, size, kind }))
}

fn free(rt: &Runtime, address: usize, kind: Kind) -> Result<(), HipError> {
    let allocation = rt
        .table()
        .remove(address, kind)
        .ok_or(if kind == Kind::Linear {
            HIP_ERROR_INVALID_DEVICE_POINTER
        } else {
            HIP_ERROR_INVALID_HANDLE
        })?;
    rt.memory.give_back(allocation.device, allocation.size);
    Ok(())
}

fn linear(rt: &Runtime, out: *mut *mut c_void, device: usize, size: usize) -> Result<(), HipError> {
    if out.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    if size == 0 {
        return put(out, std::ptr::null_mut());
    }
    let address = allocate(rt, device, size as u64, Kind::Linear)?;
    put(out, address as *mut c_void)
}

// --- Calls into itself through the dynamic linker, as the real runtime's internals do ---

type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError;
type MallocPitchFn = unsafe extern "C" fn(*mut *mut c_void, *mut usize, usize, usize) -> HipError;

static SELF_MALLOC: AtomicUsize = AtomicUsize::new(0);
static SELF_MALLOC_PITCH: AtomicUsize = AtomicUsize::new(0);

/// This library's own exported `name`, resolved with `dlsym` so that the binding is made
/// (and audited) with this library as the caller.
fn own_export(cache: &AtomicUsize, name: &CStr) -> Result<usize, HipError> {
    let cached = cache.load(Relaxed);
    if cached != 0 {
        return Ok(cached);
    }
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
    if address == 0 {
        return Err(HIP_ERROR_NOT_FOUND);
    }
    cache.store(address, Relaxed);
    Ok(address)
}

fn internal_malloc(out: *mut *mut c_void, size: usize) -> Result<(), HipError> {
    let address = own_export(&SELF_MALLOC, c"hipMalloc")?;
    // SAFETY: the address is this library's hipMalloc (or a wrapper with its signature).
    let malloc: MallocFn = unsafe { std::mem::transmute::<usize, MallocFn>(address) };
    // SAFETY: calling hipMalloc with the caller's out-pointer.
    match unsafe { malloc(out, size) } {
        HIP_SUCCESS => Ok(()),
        code => Err(code),
    }
}

fn internal_malloc_pitch(
    out: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> Result<(), HipError> {
    let address = own_export(&SELF_MALLOC_PITCH, c"hipMallocPitch")?;
    // SAFETY: the address is this library's hipMallocPitch (or a wrapper with its signature).
    let malloc_pitch: MallocPitchFn =
        unsafe { std::mem::transmute::<usize, MallocPitchFn>(address) };
    // SAFETY: calling hipMallocPitch with valid out-pointers.
    match unsafe { malloc_pitch(out, pitch, width, height) } {
        HIP_SUCCESS => Ok(()),
        code => Err(code),
    }
}

/// Row pitch of the stand-in: rows aligned to 512 bytes.
pub const PITCH_ALIGNMENT: usize = 512;

// --- Init, devices ---

#[unsafe(no_mangle)]
pub extern "C" fn hipInit(_flags: c_uint) -> HipError {
    entry(|_| Ok(()))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipRuntimeGetVersion(version: *mut c_int) -> HipError {
    entry(|rt| put(version, rt.config.runtime_version))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipGetDeviceCount(count: *mut c_int) -> HipError {
    entry(|rt| put(count, rt.config.device_count as c_int))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipSetDevice(device: c_int) -> HipError {
    entry(|rt| {
        let device = rt.check_device(device)?;
        rt.set_current_device(device);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipGetDevice(device: *mut c_int) -> HipError {
    entry(|rt| put(device, rt.current_device()? as c_int))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceSynchronize() -> HipError {
    entry(|_| Ok(()))
}

/// `hipModuleLaunchKernel(f, grid x/y/z, block x/y/z, shared bytes, stream, params,
/// extra)`: a kernel of grid x·y·z blocks on the current device; the caller waits for its
/// device time (blocks × `FAKE_HIP_BLOCK_NS`, at most 10 s), which the driver records as
/// this process's engine time on that device. The function handle is not looked at beyond
/// NULL (no code runs).
#[unsafe(no_mangle)]
pub extern "C" fn hipModuleLaunchKernel(
    function: *mut c_void,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    _block_x: c_uint,
    _block_y: c_uint,
    _block_z: c_uint,
    _shared_bytes: c_uint,
    _stream: *mut c_void,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> HipError {
    entry(|rt| {
        if function.is_null() || grid_x == 0 || grid_y == 0 || grid_z == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let device = rt.current_device()?;
        let blocks = u64::from(grid_x) * u64::from(grid_y) * u64::from(grid_z);
        let ns = blocks
            .saturating_mul(rt.config.block_ns)
            .min(10_000_000_000);
        let start = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_nanos(ns));
        rt.drm
            .record_busy(device, start.elapsed().as_nanos() as u64);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceTotalMem(bytes: *mut usize, device: c_int) -> HipError {
    entry(|rt| {
        rt.check_device(device)?;
        put(bytes, rt.memory.capacity() as usize)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceGetAttribute(
    value: *mut c_int,
    attribute: c_int,
    device: c_int,
) -> HipError {
    entry(|rt| {
        let device = rt.check_device(device)?;
        let answer = match attribute {
            ATTR_TOTAL_GLOBAL_MEM => rt.memory.capacity().min(c_int::MAX as u64) as c_int,
            ATTR_MULTIPROCESSOR_COUNT => exposed_cus(
                rt.cu_mask.as_deref(),
                rt.global_cu_mask.as_deref(),
                device,
                rt.config.cu_count,
            ) as c_int,
            _ => return Err(HIP_ERROR_INVALID_VALUE),
        };
        put(value, answer)
    })
}

fn fill_properties(
    rt: &Runtime,
    props: *mut c_void,
    device: c_int,
    total_at: usize,
    cus_at: usize,
) -> Result<(), HipError> {
    let device = rt.check_device(device)?;
    if props.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    let base = props.cast::<u8>();
    let name = format!("Stand-in HIP device {device}");
    let cus = exposed_cus(
        rt.cu_mask.as_deref(),
        rt.global_cu_mask.as_deref(),
        device,
        rt.config.cu_count,
    ) as c_int;
    // SAFETY: the caller passed a hipDeviceProp_t of the version this symbol serves, which
    // is larger than every offset written here; unaligned writes make no alignment claim.
    unsafe {
        std::ptr::write_bytes(base, 0, 256);
        std::ptr::copy_nonoverlapping(name.as_ptr(), base, name.len().min(255));
        base.add(total_at)
            .cast::<usize>()
            .write_unaligned(rt.memory.capacity() as usize);
        base.add(cus_at).cast::<c_int>().write_unaligned(cus);
    }
    Ok(())
}

/// ROCm 6's `hipGetDeviceProperties` (the header maps the name to this symbol).
#[unsafe(no_mangle)]
pub extern "C" fn hipGetDevicePropertiesR0600(props: *mut c_void, device: c_int) -> HipError {
    entry(|rt| {
        fill_properties(
            rt,
            props,
            device,
            R0600_TOTAL_GLOBAL_MEM,
            R0600_MULTIPROCESSOR_COUNT,
        )
    })
}

/// The legacy symbol (`hipDeviceProp_tR0000` layout), still what `dlsym("hipGetDeviceProperties")` finds.
#[unsafe(no_mangle)]
pub extern "C" fn hipGetDeviceProperties(props: *mut c_void, device: c_int) -> HipError {
    entry(|rt| {
        fill_properties(
            rt,
            props,
            device,
            R0000_TOTAL_GLOBAL_MEM,
            R0000_MULTIPROCESSOR_COUNT,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> HipError {
    entry(|rt| {
        let device = rt.current_device()?;
        let capacity = rt.memory.capacity();
        put(
            free,
            capacity.saturating_sub(rt.memory.used(device)) as usize,
        )?;
        put(total, capacity as usize)
    })
}

// --- Linear memory ---

#[unsafe(no_mangle)]
pub extern "C" fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> HipError {
    entry(|rt| linear(rt, ptr, rt.current_device()?, size))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipExtMallocWithFlags(
    ptr: *mut *mut c_void,
    size: usize,
    _flags: c_uint,
) -> HipError {
    entry(|_| internal_malloc(ptr, size))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocManaged(ptr: *mut *mut c_void, size: usize, _flags: c_uint) -> HipError {
    entry(|rt| linear(rt, ptr, rt.current_device()?, size))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocAsync(
    ptr: *mut *mut c_void,
    size: usize,
    _stream: *mut c_void,
) -> HipError {
    entry(|rt| linear(rt, ptr, rt.current_device()?, size))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocPitch(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> HipError {
    entry(|_| {
        let row = width.max(1).next_multiple_of(PITCH_ALIGNMENT);
        let size = row.checked_mul(height).ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
        put(pitch, row)?;
        internal_malloc(ptr, size)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMalloc3D(pitched: *mut HipPitchedPtr, extent: HipExtent) -> HipError {
    entry(|_| {
        if pitched.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let mut ptr = std::ptr::null_mut();
        let mut pitch = 0usize;
        let rows = extent
            .height
            .max(1)
            .checked_mul(extent.depth.max(1))
            .ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
        internal_malloc_pitch(&mut ptr, &mut pitch, extent.width, rows)?;
        put(
            pitched,
            HipPitchedPtr {
                ptr,
                pitch,
                xsize: extent.width,
                ysize: extent.height,
            },
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipFree(ptr: *mut c_void) -> HipError {
    entry(|rt| {
        if ptr.is_null() {
            Ok(())
        } else {
            free(rt, ptr as usize, Kind::Linear)
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipFreeAsync(ptr: *mut c_void, _stream: *mut c_void) -> HipError {
    entry(|rt| {
        if ptr.is_null() {
            Ok(())
        } else {
            free(rt, ptr as usize, Kind::Linear)
        }
    })
}

// --- Arrays ---

fn element_bytes(desc: *const HipChannelFormatDesc) -> Result<usize, HipError> {
    if desc.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null pointer to the caller's descriptor.
    let desc = unsafe { &*desc };
    let bits = [desc.x, desc.y, desc.z, desc.w]
        .iter()
        .map(|b| usize::try_from(*b).unwrap_or(0))
        .sum::<usize>();
    if bits == 0 || bits % 8 != 0 {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    Ok(bits / 8)
}

fn array(
    rt: &Runtime,
    out: *mut *mut c_void,
    elements: [usize; 3],
    element: usize,
) -> Result<(), HipError> {
    if out.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    let size = elements
        .iter()
        .try_fold(element, |acc, n| acc.checked_mul((*n).max(1)))
        .ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
    let address = allocate(rt, rt.current_device()?, size as u64, Kind::Array)?;
    put(out, address as *mut c_void)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocArray(
    array_out: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    width: usize,
    height: usize,
    _flags: c_uint,
) -> HipError {
    entry(|rt| array(rt, array_out, [width, height, 1], element_bytes(desc)?))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMalloc3DArray(
    array_out: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    extent: HipExtent,
    _flags: c_uint,
) -> HipError {
    entry(|rt| {
        array(
            rt,
            array_out,
            [extent.width, extent.height, extent.depth],
            element_bytes(desc)?,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipFreeArray(array_handle: *mut c_void) -> HipError {
    entry(|rt| free(rt, array_handle as usize, Kind::Array))
}

// --- Driver-API arrays and mipmapped arrays ---

#[unsafe(no_mangle)]
pub extern "C" fn hipMemAllocPitch(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
    _element: c_uint,
) -> HipError {
    entry(|rt| {
        let row = width.max(1).next_multiple_of(PITCH_ALIGNMENT);
        let size = row
            .checked_mul(height.max(1))
            .ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
        put(pitch, row)?;
        linear(rt, ptr, rt.current_device()?, size)
    })
}

fn descriptor_element(format: c_int, channels: c_uint) -> Result<usize, HipError> {
    let bytes = format_bytes(format).ok_or(HIP_ERROR_INVALID_VALUE)?;
    match channels {
        1 | 2 | 4 => Ok(bytes * channels as usize),
        _ => Err(HIP_ERROR_INVALID_VALUE),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn hipArrayCreate(
    array_out: *mut *mut c_void,
    desc: *const HipArrayDescriptor,
) -> HipError {
    entry(|rt| {
        // SAFETY: the caller's descriptor, NULL checked.
        let desc = unsafe { desc.as_ref() }.ok_or(HIP_ERROR_INVALID_VALUE)?;
        let element = descriptor_element(desc.format, desc.channels)?;
        array(rt, array_out, [desc.width, desc.height, 1], element)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipArray3DCreate(
    array_out: *mut *mut c_void,
    desc: *const HipArray3DDescriptor,
) -> HipError {
    entry(|rt| {
        // SAFETY: the caller's descriptor, NULL checked.
        let desc = unsafe { desc.as_ref() }.ok_or(HIP_ERROR_INVALID_VALUE)?;
        let element = descriptor_element(desc.format, desc.channels)?;
        array(
            rt,
            array_out,
            [desc.width, desc.height, desc.depth],
            element,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipArrayDestroy(array_handle: *mut c_void) -> HipError {
    entry(|rt| free(rt, array_handle as usize, Kind::Array))
}

/// Sum of every level's bytes, each dimension halved per level (at least 1).
fn mipmap_size(element: usize, dims: [usize; 3], levels: c_uint) -> Result<usize, HipError> {
    let largest = dims.iter().copied().max().unwrap_or(0).max(1);
    let chain = (usize::BITS - largest.leading_zeros()) as c_uint;
    let mut total = 0usize;
    for level in 0..levels.clamp(1, chain) {
        let size = dims.iter().try_fold(element, |acc, d| {
            let d = if *d == 0 { 1 } else { (*d >> level).max(1) };
            acc.checked_mul(d)
        });
        total = size
            .and_then(|s| total.checked_add(s))
            .ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
    }
    Ok(total)
}

fn mipmapped(
    rt: &Runtime,
    out: *mut *mut c_void,
    element: usize,
    dims: [usize; 3],
    levels: c_uint,
) -> Result<(), HipError> {
    if out.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    let size = mipmap_size(element, dims, levels)?;
    let address = allocate(rt, rt.current_device()?, size as u64, Kind::Mipmapped)?;
    put(out, address as *mut c_void)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocMipmappedArray(
    out: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    extent: HipExtent,
    levels: c_uint,
    _flags: c_uint,
) -> HipError {
    entry(|rt| {
        let element = element_bytes(desc)?;
        mipmapped(
            rt,
            out,
            element,
            [extent.width, extent.height, extent.depth],
            levels,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMipmappedArrayCreate(
    out: *mut *mut c_void,
    desc: *const HipArray3DDescriptor,
    levels: c_uint,
) -> HipError {
    entry(|rt| {
        // SAFETY: the caller's descriptor, NULL checked.
        let desc = unsafe { desc.as_ref() }.ok_or(HIP_ERROR_INVALID_VALUE)?;
        let element = descriptor_element(desc.format, desc.channels)?;
        mipmapped(
            rt,
            out,
            element,
            [desc.width, desc.height, desc.depth],
            levels,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipFreeMipmappedArray(handle: *mut c_void) -> HipError {
    entry(|rt| free(rt, handle as usize, Kind::Mipmapped))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMipmappedArrayDestroy(handle: *mut c_void) -> HipError {
    entry(|rt| free(rt, handle as usize, Kind::Mipmapped))
}

/// A graph memory node: its memory is taken when the graph is launched, which the stand-in
/// does not model; it hands out a node handle and the address the allocation will have.
#[unsafe(no_mangle)]
pub extern "C" fn hipGraphAddMemAllocNode(
    node: *mut *mut c_void,
    _graph: *mut c_void,
    _dependencies: *const *mut c_void,
    _count: usize,
    params: *mut c_void,
) -> HipError {
    entry(|_| {
        if params.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(node, Box::into_raw(Box::new(0u64)).cast())
    })
}

// --- Virtual memory ---

#[unsafe(no_mangle)]
pub extern "C" fn hipMemCreate(
    handle: *mut *mut c_void,
    size: usize,
    prop: *const c_void,
    _flags: c_ulonglong,
) -> HipError {
    entry(|rt| {
        if prop.is_null() || handle.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // The layout of the version this runtime claims to be, as the real ones read it.
        let id = if rt.config.runtime_version >= 60_000_000 {
            // SAFETY: non-null pointer to the caller's ROCm 6 properties.
            unsafe { (*prop.cast::<HipMemAllocationProp>()).location.id }
        } else {
            // SAFETY: non-null pointer to the caller's ROCm 5 properties.
            unsafe { (*prop.cast::<HipMemAllocationPropR5>()).location.id }
        };
        let device = rt.check_device(id)?;
        let address = allocate(rt, device, size as u64, Kind::Physical)?;
        put(handle, address as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemRelease(handle: *mut c_void) -> HipError {
    entry(|rt| free(rt, handle as usize, Kind::Physical))
}

// --- Memory pools ---

/// A pool handle points at one of these (leaked for the process's life, like the runtime's).
pub struct Pool {
    pub device: usize,
}

static DEFAULT_POOLS: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();

fn pool_device(rt: &Runtime, pool: *mut c_void) -> Result<usize, HipError> {
    if pool.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    // SAFETY: pool handles are `Pool`s this library leaked; we only read.
    let device = unsafe { (*pool.cast::<Pool>()).device };
    rt.check_device(device as c_int)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceGetDefaultMemPool(pool: *mut *mut c_void, device: c_int) -> HipError {
    entry(|rt| {
        let device = rt.check_device(device)?;
        let pools = DEFAULT_POOLS.get_or_init(|| {
            (0..rt.config.device_count)
                .map(|device| Box::into_raw(Box::new(Pool { device })) as usize)
                .collect()
        });
        put(pool, pools[device] as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemPoolCreate(
    pool: *mut *mut c_void,
    props: *const HipMemPoolProps,
) -> HipError {
    entry(|rt| {
        if props.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null pointer to the caller's properties.
        let device = rt.check_device(unsafe { (*props).location.id })?;
        put(pool, Box::into_raw(Box::new(Pool { device })).cast())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemPoolDestroy(pool: *mut c_void) -> HipError {
    // The handle stays valid memory (leaked): a late hipMallocFromPoolAsync on it is the
    // caller's bug, not a crash.
    entry(|rt| pool_device(rt, pool).map(drop))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemPoolTrimTo(pool: *mut c_void, _keep: usize) -> HipError {
    entry(|rt| pool_device(rt, pool).map(drop))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocFromPoolAsync(
    ptr: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    _stream: *mut c_void,
) -> HipError {
    entry(|rt| linear(rt, ptr, pool_device(rt, pool)?, size))
}

// --- Errors and entry-point lookup ---

#[unsafe(no_mangle)]
pub extern "C" fn hipGetErrorName(code: HipError) -> *const c_char {
    error_name(code).as_ptr()
}

#[unsafe(no_mangle)]
pub extern "C" fn hipGetErrorString(code: HipError) -> *const c_char {
    error_name(code).as_ptr()
}

/// Every entry point `hipGetProcAddress` hands out.
fn exported(name: &[u8]) -> Option<usize> {
    let address = match name {
        b"hipInit" => hipInit as *const () as usize,
        b"hipGetDeviceCount" => hipGetDeviceCount as *const () as usize,
        b"hipSetDevice" => hipSetDevice as *const () as usize,
        b"hipModuleLaunchKernel" => hipModuleLaunchKernel as *const () as usize,
        b"hipGetDevice" => hipGetDevice as *const () as usize,
        b"hipDeviceTotalMem" => hipDeviceTotalMem as *const () as usize,
        b"hipDeviceGetAttribute" => hipDeviceGetAttribute as *const () as usize,
        b"hipGetDeviceProperties" => hipGetDevicePropertiesR0600 as *const () as usize,
        b"hipGetDevicePropertiesR0600" => hipGetDevicePropertiesR0600 as *const () as usize,
        b"hipMemGetInfo" => hipMemGetInfo as *const () as usize,
        b"hipMalloc" => hipMalloc as *const () as usize,
        b"hipExtMallocWithFlags" => hipExtMallocWithFlags as *const () as usize,
        b"hipMallocManaged" => hipMallocManaged as *const () as usize,
        b"hipMallocAsync" => hipMallocAsync as *const () as usize,
        b"hipMallocPitch" => hipMallocPitch as *const () as usize,
        b"hipMalloc3D" => hipMalloc3D as *const () as usize,
        b"hipFree" => hipFree as *const () as usize,
        b"hipFreeAsync" => hipFreeAsync as *const () as usize,
        b"hipMallocArray" => hipMallocArray as *const () as usize,
        b"hipMalloc3DArray" => hipMalloc3DArray as *const () as usize,
        b"hipFreeArray" => hipFreeArray as *const () as usize,
        b"hipMemCreate" => hipMemCreate as *const () as usize,
        b"hipMemRelease" => hipMemRelease as *const () as usize,
        b"hipMallocFromPoolAsync" => hipMallocFromPoolAsync as *const () as usize,
        b"hipDeviceGetDefaultMemPool" => hipDeviceGetDefaultMemPool as *const () as usize,
        b"hipMemPoolCreate" => hipMemPoolCreate as *const () as usize,
        b"hipMemPoolDestroy" => hipMemPoolDestroy as *const () as usize,
        b"hipGetProcAddress" => hipGetProcAddress as *const () as usize,
        b"hipMemAllocPitch" => hipMemAllocPitch as *const () as usize,
        b"hipArrayCreate" => hipArrayCreate as *const () as usize,
        b"hipArray3DCreate" => hipArray3DCreate as *const () as usize,
        b"hipArrayDestroy" => hipArrayDestroy as *const () as usize,
        b"hipMallocMipmappedArray" => hipMallocMipmappedArray as *const () as usize,
        b"hipFreeMipmappedArray" => hipFreeMipmappedArray as *const () as usize,
        b"hipMipmappedArrayCreate" => hipMipmappedArrayCreate as *const () as usize,
        b"hipMipmappedArrayDestroy" => hipMipmappedArrayDestroy as *const () as usize,
        b"hipGraphAddMemAllocNode" => hipGraphAddMemAllocNode as *const () as usize,
        _ => return None,
    };
    Some(address)
}

/// `hipGetProcAddress(symbol, pfn, hipVersion, flags, symbolStatus)`.
#[unsafe(no_mangle)]
pub extern "C" fn hipGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _hip_version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> HipError {
    entry(|_| {
        if symbol.is_null() || pfn.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null NUL-terminated symbol name from the caller.
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        let found = exported(name);
        if !status.is_null() {
            let code = if found.is_some() {
                PROC_ADDRESS_SUCCESS
            } else {
                PROC_ADDRESS_SYMBOL_NOT_FOUND
            };
            put(status, code)?;
        }
        put(pfn, found.unwrap_or(0) as *mut c_void)?;
        found.map(drop).ok_or(HIP_ERROR_NOT_FOUND)
    })
}
