//! Init and devices: count, selection, attributes, properties, memory info, launches.

use std::ffi::{c_int, c_uint, c_void};

use crate::abi::*;

use crate::cu_mask::exposed_cus;
use crate::runtime::Runtime;

use super::*;

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

pub(super) fn fill_properties(
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
