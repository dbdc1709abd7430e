//! The Ascend backend through its real FFI path (bindgen table, libloading,
//! `result` layer, safe types) against the host-memory ACL double that
//! `build.rs` compiles. Run with `--features ascend`.
#![cfg(feature = "ascend")]

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use ucm_device::accel::ascend::{self, result, AscendDevice, Runtime};
use ucm_device::{conformance, CopyRun, Device, DeviceError};

/// The double keeps global counters: run these tests one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn double() -> PathBuf {
    ascend::double_path().expect("build.rs built the ACL double (is a C compiler installed?)")
}

fn runtime() -> Arc<Runtime> {
    ascend::load_library(&double()).unwrap()
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    init_calls: i64,
    finalize_calls: i64,
    set_device_calls: i64,
    reset_device_calls: i64,
    live_streams: i64,
    live_events: i64,
    live_device_allocs: i64,
    live_host_allocs: i64,
    live_registrations: i64,
}

/// The double's test controls, opened from the same file (same instance).
struct Controls {
    lib: libloading::Library,
}

impl Controls {
    fn open() -> Self {
        // SAFETY: the double has no initialisers with preconditions.
        let lib = unsafe { libloading::Library::new(double()) }.unwrap();
        Controls { lib }
    }

    fn stats(&self) -> Stats {
        let mut s = Stats::default();
        // SAFETY: the symbol has this signature in acl_double.c.
        unsafe {
            let f: libloading::Symbol<'_, unsafe extern "C" fn(*mut Stats)> =
                self.lib.get(b"ucm_acl_double_stats").unwrap();
            f(&mut s);
        }
        s
    }

    fn fail_next(&self, api: &str, code: i32) {
        let api = CString::new(api).unwrap();
        // SAFETY: the symbol has this signature in acl_double.c.
        unsafe {
            let f: libloading::Symbol<'_, unsafe extern "C" fn(*const c_char, c_int)> =
                self.lib.get(b"ucm_acl_double_fail_next").unwrap();
            f(api.as_ptr(), code);
        }
    }
}

#[test]
fn device_test_body_passes_through_the_ffi_with_the_batch_api() {
    let _g = serial();
    let dev = AscendDevice::with_runtime(runtime(), 0).unwrap();
    assert!(dev.batch_api(), "the double exports aclrtMemcpyBatchAsync");
    conformance::run_all(&dev).unwrap();
}

#[test]
fn device_test_body_passes_through_the_ffi_with_a_copy_loop() {
    let _g = serial();
    let dev = AscendDevice::with_runtime(runtime(), 0).unwrap();
    dev.set_batch_api(false);
    assert!(!dev.batch_api());
    conformance::run_all(&dev).unwrap();
}

#[test]
fn acl_errors_map_with_code_api_and_message() {
    let _g = serial();
    let ctl = Controls::open();
    let rt = runtime();
    let dev = AscendDevice::with_runtime(Arc::clone(&rt), 0).unwrap();

    // Allocation failure, as the runtime reports it (207001).
    ctl.fail_next("aclrtMalloc", 207_001);
    match dev.alloc_device(4096) {
        Err(DeviceError::Driver { api, code, message }) => {
            assert_eq!((api, code), ("aclrtMalloc", 207_001));
            assert!(message.contains("injected"), "{message}");
        }
        other => panic!("expected a driver error, got {other:?}"),
    }
    dev.alloc_device(4096).unwrap();

    // A misaligned address reaching the runtime: the result layer maps the
    // runtime's code and text (the safe layer refuses it before the call).
    let h = dev.alloc_pinned(4096).unwrap();
    let d = dev.alloc_device(4096).unwrap();
    let s = dev.create_stream().unwrap();
    assert!(matches!(
        dev.copy_async(&s, &CopyRun::new(&d, 32, &h, 0, 64)),
        Err(DeviceError::Misaligned { align: 64, .. })
    ));
    // SAFETY: both regions are live allocations of this device; the call is
    // rejected by the runtime before any copy is queued.
    let raw_stream = unsafe { raw_stream_of(&dev) };
    // SAFETY: as above.
    let err = unsafe {
        result::memcpy_async(
            rt_lib(&rt),
            (d.addr() + 32) as *mut c_void,
            4096 - 32,
            h.addr() as *const c_void,
            64,
            1,
            raw_stream,
        )
    }
    .unwrap_err();
    // SAFETY: the stream is live, unused, and destroyed once.
    unsafe { result::destroy_stream(rt_lib(&rt), raw_stream) }.unwrap();
    match err {
        DeviceError::Driver { code, message, .. } => {
            assert_eq!(code, result::code::MEMORY_ADDRESS_UNALIGNED as i64);
            assert!(message.contains("64-byte"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    dev.synchronize_stream(&s).unwrap();
}

/// A stream of the double for raw calls: the double's streams are opaque
/// pointers, so one made through the result layer is as good as any.
unsafe fn raw_stream_of(dev: &AscendDevice) -> *mut c_void {
    let lib = rt_lib(dev.runtime());
    unsafe { result::create_stream(lib) }.unwrap()
}

fn rt_lib(rt: &Runtime) -> &ucm_device::accel::ascend::sys::AclLib {
    rt.lib()
}

#[test]
fn a_missing_library_is_a_clear_unsupported_error() {
    let err = ascend::load_library(std::path::Path::new("/nonexistent/libascendcl.so"))
        .err()
        .unwrap();
    match err {
        DeviceError::Unsupported { backend, reason } => {
            assert_eq!(backend, "ascend");
            assert!(reason.contains("/nonexistent/libascendcl.so"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // A library without the ACL symbols is refused too, without a panic.
    let err = ascend::load_library(std::path::Path::new("libc.so.6"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("lacks required symbols"), "{err}");
}

#[test]
fn init_once_and_teardown_in_order() {
    let _g = serial();
    let ctl = Controls::open();
    let rt = runtime();
    ascend::take_deferred_errors(&rt);
    let before = ctl.stats();
    {
        let a = AscendDevice::with_runtime(Arc::clone(&rt), 0).unwrap();
        let b = AscendDevice::with_runtime(runtime(), 0).unwrap();
        let sa = a.create_stream().unwrap();
        let eb = b.create_event().unwrap();
        let m = a.alloc_device(1 << 16).unwrap();
        let p = b.alloc_pinned(1 << 16).unwrap();
        let mut region = ucm_device::IoBuf::new(8192);
        // SAFETY: `region` (page-aligned) outlives `r`, dropped in this scope.
        let r = unsafe { a.register_host(region.as_mut_ptr(), region.len()) }.unwrap();
        let mid = ctl.stats();
        assert_eq!(mid.live_streams - before.live_streams, 1);
        assert_eq!(mid.live_events - before.live_events, 1);
        assert_eq!(mid.live_registrations - before.live_registrations, 1);
        // Use the device from another thread: it binds itself there.
        std::thread::scope(|s| {
            s.spawn(|| {
                let s2 = a.create_stream().unwrap();
                a.copy_async(&s2, &CopyRun::new(&m, 0, &r, 0, 4096))
                    .unwrap();
                a.synchronize_stream(&s2).unwrap();
            });
        });
        drop((sa, eb, m, p, r, a, b));
        drop(region);
    }
    let after = ctl.stats();
    assert_eq!(after.init_calls, 1, "aclInit runs once per process");
    assert_eq!(
        after.set_device_calls - before.set_device_calls,
        after.reset_device_calls - before.reset_device_calls,
        "every aclrtSetDevice is matched by a reset"
    );
    assert_eq!(after.live_streams, 0);
    assert_eq!(after.live_events, 0);
    assert_eq!(after.live_device_allocs, 0);
    assert_eq!(after.live_host_allocs, 0);
    assert_eq!(after.live_registrations, 0);
    // The double refuses a last reset while resources live: none was refused.
    assert!(ascend::take_deferred_errors(&rt).is_empty());
    // And a device can be opened again afterwards.
    let again = AscendDevice::with_runtime(rt, 0).unwrap();
    conformance::round_trip(&again).unwrap();
}

#[test]
fn a_device_that_does_not_exist_is_refused() {
    let _g = serial();
    assert!(AscendDevice::with_runtime(runtime(), 7).is_err());
    assert!(AscendDevice::with_runtime(runtime(), -1).is_err());
}
