//! `result`: every ACL call we make, returning `Result`.
//!
//! The functions are still `unsafe` (raw handles and pointers); each lists
//! its preconditions. An error carries the API name, the ACL code and the
//! text of `aclGetRecentErrMsg`.

use std::ffi::{c_void, CStr};

use super::sys::{self, AclLib};
use crate::accel::sticky::at_run;
use crate::error::{DeviceError, Result};

/// ACL error codes we name (acl_base_rt.h, CANN 8.x; checked 2026-11-29).
pub mod code {
    /// `ACL_SUCCESS`.
    pub const SUCCESS: i32 = 0;
    /// `ACL_ERROR_INVALID_PARAM`.
    pub const INVALID_PARAM: i32 = 100_000;
    /// `ACL_ERROR_UNINITIALIZE`.
    pub const UNINITIALIZE: i32 = 100_001;
    /// `ACL_ERROR_REPEAT_INITIALIZE`.
    pub const REPEAT_INITIALIZE: i32 = 100_002;
    /// `ACL_ERROR_BAD_ALLOC`.
    pub const BAD_ALLOC: i32 = 200_000;
    /// `ACL_ERROR_INVALID_DEVICE`.
    pub const INVALID_DEVICE: i32 = 200_002;
    /// `ACL_ERROR_MEMORY_ADDRESS_UNALIGNED`.
    pub const MEMORY_ADDRESS_UNALIGNED: i32 = 200_003;
}

/// The runtime's last error text on this thread, if any.
///
/// # Safety
/// 1. `lib` must be a loaded ACL library whose required symbols resolved.
pub unsafe fn recent_message(lib: &AclLib) -> String {
    let Ok(f) = lib.aclGetRecentErrMsg.as_ref() else {
        return String::new();
    };
    let p = f();
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Maps an ACL return code to `Result`.
///
/// # Safety
/// As [`recent_message`].
pub unsafe fn check(lib: &AclLib, api: &'static str, rc: sys::aclError) -> Result<()> {
    if rc == code::SUCCESS {
        return Ok(());
    }
    Err(DeviceError::Driver {
        api,
        code: rc as i64,
        message: recent_message(lib),
    })
}

/// `aclInit(NULL)`; a repeated initialisation is not an error.
///
/// # Safety
/// 1. `lib` must be a loaded ACL library whose required symbols resolved.
pub unsafe fn init(lib: &AclLib) -> Result<()> {
    let rc = lib.aclInit(std::ptr::null());
    if rc == code::REPEAT_INITIALIZE {
        return Ok(());
    }
    check(lib, "aclInit", rc)
}

/// `aclrtGetDeviceCount`.
///
/// # Safety
/// 1. As [`init`], and `aclInit` has succeeded.
pub unsafe fn device_count(lib: &AclLib) -> Result<u32> {
    let mut n = 0u32;
    check(lib, "aclrtGetDeviceCount", lib.aclrtGetDeviceCount(&mut n))?;
    Ok(n)
}

/// `aclrtSetDevice`: binds `device` to the calling thread.
///
/// # Safety
/// 1. As [`device_count`].
pub unsafe fn set_device(lib: &AclLib, device: i32) -> Result<()> {
    check(lib, "aclrtSetDevice", lib.aclrtSetDevice(device))
}

/// `aclrtResetDevice`.
///
/// # Safety
/// 1. As [`device_count`].
/// 2. No stream, event or allocation of `device` is used afterwards.
pub unsafe fn reset_device(lib: &AclLib, device: i32) -> Result<()> {
    check(lib, "aclrtResetDevice", lib.aclrtResetDevice(device))
}

/// `aclrtSynchronizeDevice`.
///
/// # Safety
/// 1. As [`device_count`], with a device set on this thread.
pub unsafe fn synchronize_device(lib: &AclLib) -> Result<()> {
    check(lib, "aclrtSynchronizeDevice", lib.aclrtSynchronizeDevice())
}

/// `aclrtMalloc` with `ACL_MEM_MALLOC_HUGE_FIRST`.
///
/// # Safety
/// 1. As [`synchronize_device`].
pub unsafe fn malloc(lib: &AclLib, size: usize) -> Result<*mut c_void> {
    let mut p = std::ptr::null_mut();
    check(
        lib,
        "aclrtMalloc",
        lib.aclrtMalloc(&mut p, size, sys::ACL_MEM_MALLOC_HUGE_FIRST),
    )?;
    Ok(p)
}

/// `aclrtFree`.
///
/// # Safety
/// 1. As [`synchronize_device`].
/// 2. `p` came from [`malloc`], is freed once, and no queued work uses it.
pub unsafe fn free(lib: &AclLib, p: *mut c_void) -> Result<()> {
    check(lib, "aclrtFree", lib.aclrtFree(p))
}

/// `aclrtMallocHost`.
///
/// # Safety
/// 1. As [`synchronize_device`].
pub unsafe fn malloc_host(lib: &AclLib, size: usize) -> Result<*mut c_void> {
    let mut p = std::ptr::null_mut();
    check(lib, "aclrtMallocHost", lib.aclrtMallocHost(&mut p, size))?;
    Ok(p)
}

/// `aclrtFreeHost`.
///
/// # Safety
/// 1. As [`free`], for a pointer from [`malloc_host`].
pub unsafe fn free_host(lib: &AclLib, p: *mut c_void) -> Result<()> {
    check(lib, "aclrtFreeHost", lib.aclrtFreeHost(p))
}

/// `aclrtHostRegister(ptr, size, ACL_HOST_REGISTER_MAPPED, &dev)`; returns
/// the device-side alias.
///
/// # Safety
/// 1. As [`synchronize_device`].
/// 2. `[ptr, ptr + size)` is valid host memory that stays mapped until
///    [`host_unregister`].
pub unsafe fn host_register(lib: &AclLib, ptr: *mut c_void, size: u64) -> Result<*mut c_void> {
    let mut dev = std::ptr::null_mut();
    check(
        lib,
        "aclrtHostRegister",
        lib.aclrtHostRegister(ptr, size, sys::ACL_HOST_REGISTER_MAPPED, &mut dev),
    )?;
    Ok(dev)
}

/// `aclrtHostUnregister`.
///
/// # Safety
/// 1. As [`synchronize_device`]; `ptr` was registered and no queued work uses it.
pub unsafe fn host_unregister(lib: &AclLib, ptr: *mut c_void) -> Result<()> {
    check(lib, "aclrtHostUnregister", lib.aclrtHostUnregister(ptr))
}

/// Creates a stream, with `ACL_STREAM_FAST_LAUNCH | ACL_STREAM_FAST_SYNC`
/// where the library has `aclrtCreateStreamWithConfig`.
///
/// # Safety
/// 1. As [`synchronize_device`].
pub unsafe fn create_stream(lib: &AclLib) -> Result<sys::aclrtStream> {
    let mut s = std::ptr::null_mut();
    if let Ok(f) = lib.aclrtCreateStreamWithConfig.as_ref() {
        let flags = sys::ACL_STREAM_FAST_LAUNCH | sys::ACL_STREAM_FAST_SYNC;
        check(lib, "aclrtCreateStreamWithConfig", f(&mut s, 0, flags))?;
    } else {
        check(lib, "aclrtCreateStream", lib.aclrtCreateStream(&mut s))?;
    }
    Ok(s)
}

/// `aclrtDestroyStream`.
///
/// # Safety
/// 1. As [`synchronize_device`]; `s` is a live stream, destroyed once.
pub unsafe fn destroy_stream(lib: &AclLib, s: sys::aclrtStream) -> Result<()> {
    check(lib, "aclrtDestroyStream", lib.aclrtDestroyStream(s))
}

/// `aclrtSynchronizeStream`.
///
/// # Safety
/// 1. As [`synchronize_device`]; `s` is a live stream.
pub unsafe fn synchronize_stream(lib: &AclLib, s: sys::aclrtStream) -> Result<()> {
    check(lib, "aclrtSynchronizeStream", lib.aclrtSynchronizeStream(s))
}

/// `aclrtLaunchHostFunc`.
///
/// # Safety
/// 1. As [`synchronize_stream`].
/// 2. `f` may be called with `args` on another thread, once, and must not
///    unwind.
pub unsafe fn launch_host_func(
    lib: &AclLib,
    s: sys::aclrtStream,
    f: unsafe extern "C" fn(*mut c_void),
    args: *mut c_void,
) -> Result<()> {
    let launch = lib
        .aclrtLaunchHostFunc
        .as_ref()
        .map_err(|_| DeviceError::Unsupported {
            backend: "ascend",
            reason: "the loaded libascendcl has no aclrtLaunchHostFunc".into(),
        })?;
    check(lib, "aclrtLaunchHostFunc", launch(s, Some(f), args))
}

/// `aclrtCreateEvent`.
///
/// # Safety
/// 1. As [`synchronize_device`].
pub unsafe fn create_event(lib: &AclLib) -> Result<sys::aclrtEvent> {
    let mut e = std::ptr::null_mut();
    check(lib, "aclrtCreateEvent", lib.aclrtCreateEvent(&mut e))?;
    Ok(e)
}

/// `aclrtDestroyEvent`.
///
/// # Safety
/// 1. As [`synchronize_device`]; `e` is a live event, destroyed once.
pub unsafe fn destroy_event(lib: &AclLib, e: sys::aclrtEvent) -> Result<()> {
    check(lib, "aclrtDestroyEvent", lib.aclrtDestroyEvent(e))
}

/// `aclrtRecordEvent`.
///
/// # Safety
/// 1. As [`synchronize_stream`]; `e` is a live event.
pub unsafe fn record_event(lib: &AclLib, e: sys::aclrtEvent, s: sys::aclrtStream) -> Result<()> {
    check(lib, "aclrtRecordEvent", lib.aclrtRecordEvent(e, s))
}

/// `aclrtQueryEventStatus`: true when complete.
///
/// # Safety
/// 1. As [`destroy_event`] without destroying it.
pub unsafe fn query_event(lib: &AclLib, e: sys::aclrtEvent) -> Result<bool> {
    let mut st = sys::ACL_EVENT_RECORDED_STATUS_NOT_READY;
    check(
        lib,
        "aclrtQueryEventStatus",
        lib.aclrtQueryEventStatus(e, &mut st),
    )?;
    Ok(st == sys::ACL_EVENT_RECORDED_STATUS_COMPLETE)
}

/// `aclrtSynchronizeEvent`.
///
/// # Safety
/// 1. As [`query_event`].
pub unsafe fn synchronize_event(lib: &AclLib, e: sys::aclrtEvent) -> Result<()> {
    check(lib, "aclrtSynchronizeEvent", lib.aclrtSynchronizeEvent(e))
}

/// `aclrtStreamWaitEvent`: a device-side wait, never blocking the caller.
///
/// # Safety
/// 1. As [`record_event`].
pub unsafe fn stream_wait_event(
    lib: &AclLib,
    s: sys::aclrtStream,
    e: sys::aclrtEvent,
) -> Result<()> {
    check(lib, "aclrtStreamWaitEvent", lib.aclrtStreamWaitEvent(s, e))
}

/// `aclrtMemcpyAsync`.
///
/// # Safety
/// 1. As [`synchronize_stream`].
/// 2. `dst` is valid for `dst_max >= count` bytes and `src` for `count`
///    bytes, of the kinds `kind` names, until the copy completes.
/// 3. Both addresses are 64-byte aligned (ACL's documented rule).
pub unsafe fn memcpy_async(
    lib: &AclLib,
    dst: *mut c_void,
    dst_max: usize,
    src: *const c_void,
    count: usize,
    kind: sys::aclrtMemcpyKind,
    s: sys::aclrtStream,
) -> Result<()> {
    check(
        lib,
        "aclrtMemcpyAsync",
        lib.aclrtMemcpyAsync(dst, dst_max, src, count, kind, s),
    )
}

/// True when the loaded library exports `aclrtMemcpyBatchAsync`.
pub fn has_batch_copy(lib: &AclLib) -> bool {
    lib.aclrtMemcpyBatchAsync.is_ok()
}

/// `aclrtMemcpyBatchAsync`. On failure the error names the failing run, as
/// `order[failIndex]` (the caller's index of the submitted position).
///
/// # Safety
/// 1. As [`memcpy_async`], for every run.
/// 2. `dsts`, `dst_maxs`, `srcs` and `sizes` have one entry per run;
///    `attrs` and `attr_indexes` one per attribute entry, `attr_indexes[k]`
///    being the first run `attrs[k]` applies to (`0` first, increasing,
///    below the run count), as ACL documents.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_batch_async(
    lib: &AclLib,
    dsts: &mut [*mut c_void],
    dst_maxs: &mut [usize],
    srcs: &mut [*mut c_void],
    sizes: &mut [usize],
    attrs: &mut [sys::aclrtMemcpyBatchAttr],
    attr_indexes: &mut [usize],
    order: &[usize],
    s: sys::aclrtStream,
) -> Result<()> {
    let f = lib
        .aclrtMemcpyBatchAsync
        .as_ref()
        .map_err(|_| DeviceError::Unsupported {
            backend: "ascend",
            reason: "the loaded libascendcl has no aclrtMemcpyBatchAsync".into(),
        })?;
    let mut fail_index = usize::MAX;
    let rc = f(
        dsts.as_mut_ptr(),
        dst_maxs.as_mut_ptr(),
        srcs.as_mut_ptr(),
        sizes.as_mut_ptr(),
        dsts.len(),
        attrs.as_mut_ptr(),
        attr_indexes.as_mut_ptr(),
        attrs.len(),
        &mut fail_index,
        s,
    );
    // The failing position, as the caller's run index (`order`).
    let run = order.get(fail_index).copied().unwrap_or(fail_index);
    check(lib, "aclrtMemcpyBatchAsync", rc).map_err(|e| at_run(e, run))
}
