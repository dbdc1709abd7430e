//! The CUDA backend through cudarc's real loading path (dlopen of
//! `libcuda.so`, its symbol table, the `result` layer, our safe types)
//! against the host-memory double of the driver that `build.rs` compiles
//! (`cuda/cuda_double.c`, soname `libcuda.so`, preloaded by path). Run with
//! `--features cuda`.
//!
//! What this proves: the backend's logic (context binding, stream and event
//! ordering, sticky errors, pinned and registered memory, batched copies and
//! their attribute table, the kernel launch and its parameters, `Drop`
//! order) against the driver's documented semantics. What it cannot: real
//! DMA, real concurrency between engines, real kernel timing, driver bugs.
#![cfg(feature = "cuda")]

use std::ffi::{c_char, c_int, CString};
use std::sync::{Mutex, MutexGuard, OnceLock};

use ucm_device::accel::cuda::{self, CudaDevice};
use ucm_device::{conformance, CopyRun, Device, DeviceError, IoBuf, Memory};

/// The double keeps global counters and injections: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The double, preloaded once so cudarc's `dlopen("libcuda.so")` finds it.
fn controls() -> &'static libloading::Library {
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    LIB.get_or_init(|| {
        let path = cuda::double_path().expect("build.rs built the CUDA double (is cc installed?)");
        // SAFETY: the double has no initialisers; no other libcuda is loaded
        // in this test process.
        unsafe { cuda::preload_library(&path) }.unwrap();
        // SAFETY: the same file, already loaded: its test controls.
        unsafe { libloading::Library::new(&path) }.unwrap()
    })
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
struct Stats {
    init_calls: i64,
    retains: i64,
    releases: i64,
    live_streams: i64,
    live_events: i64,
    live_device_allocs: i64,
    live_host_allocs: i64,
    live_registrations: i64,
    live_modules: i64,
    copies: i64,
    batch_calls: i64,
    kernel_launches: i64,
    host_fns: i64,
}

fn stats() -> Stats {
    let mut s = Stats::default();
    // SAFETY: the symbol has this signature in cuda_double.c.
    unsafe {
        let f: libloading::Symbol<'_, unsafe extern "C" fn(*mut Stats)> =
            controls().get(b"ucm_cuda_double_stats").unwrap();
        f(&mut s);
    }
    s
}

fn fail_next(api: &str, code: i32) {
    let api = CString::new(api).unwrap();
    // SAFETY: the symbol has this signature in cuda_double.c.
    unsafe {
        let f: libloading::Symbol<'_, unsafe extern "C" fn(*const c_char, c_int)> =
            controls().get(b"ucm_cuda_double_fail_next").unwrap();
        f(api.as_ptr(), code);
    }
}

fn fail_stream(code: i32) {
    // SAFETY: the symbol has this signature in cuda_double.c.
    unsafe {
        let f: libloading::Symbol<'_, unsafe extern "C" fn(c_int)> =
            controls().get(b"ucm_cuda_double_fail_stream").unwrap();
        f(code);
    }
}

fn device() -> CudaDevice {
    controls();
    CudaDevice::new(0).expect("the double opens GPU 0")
}

fn live(s: &Stats) -> [i64; 6] {
    [
        s.live_streams,
        s.live_events,
        s.live_device_allocs,
        s.live_host_allocs,
        s.live_registrations,
        s.live_modules,
    ]
}

#[test]
fn the_probe_finds_the_double_through_cudarcs_loading_path() {
    let _g = serial();
    controls();
    assert!(cuda::driver_present());
    let (ok, why) = cuda::probe();
    assert!(ok, "{why}");
    assert_eq!(why, "1 CUDA device(s); batched copies: kernel");
    assert!(matches!(
        CudaDevice::new(1),
        Err(DeviceError::InvalidArgument(_))
    ));
    // The same path again is fine; another one is refused.
    // SAFETY: nothing is loaded by these calls beyond what is loaded.
    unsafe {
        cuda::preload_library(&cuda::double_path().unwrap()).unwrap();
        assert!(cuda::preload_library(std::path::Path::new("/nonexistent/libcuda.so")).is_err());
    }
}

#[test]
fn device_test_body_with_a_copy_loop_and_with_the_batch_api() {
    let _g = serial();
    let before = stats();
    {
        let dev = device();
        assert!(
            dev.batch_api_available(),
            "the double exports cuMemcpyBatchAsync"
        );
        // The copy kernel by default (unified addressing is reported).
        assert_eq!(dev.copy_path(), cuda::CopyPath::Kernel);
        assert_eq!(dev.copy_kernel_unavailable(), None);
        let launches = stats().kernel_launches;
        conformance::run_all(&dev).unwrap();
        assert!(stats().kernel_launches > launches, "the kernel ran");
        // Without it, a call per run, then the batch API.
        dev.set_copy_kernel(false);
        assert_eq!(dev.copy_path(), cuda::CopyPath::PerRun);
        let copies = stats().copies;
        conformance::run_all(&dev).unwrap();
        assert!(stats().copies > copies);
        let copies = stats().copies;
        dev.set_batch_api(true);
        assert_eq!(dev.copy_path(), cuda::CopyPath::BatchApi);
        assert!(dev.batch_api());
        conformance::run_all(&dev).unwrap();
        assert!(
            stats().batch_calls > before.batch_calls,
            "the batch path ran"
        );
        assert!(stats().copies > copies);
        assert!(dev.take_deferred_errors().is_empty());
    }
    // Every stream, event and allocation was released, the context too.
    let after = stats();
    assert_eq!(live(&after), live(&before), "{after:?}");
    assert_eq!(
        after.retains - before.retains,
        after.releases - before.releases
    );
}

#[test]
fn a_batch_mixing_directions_names_each_runs_memory_correctly() {
    let _g = serial();
    let dev = device();
    dev.set_copy_kernel(false);
    dev.set_batch_api(true);
    let len = 64 << 10;
    let h = dev.alloc_pinned(4 * len).unwrap();
    let d = dev.alloc_device(4 * len).unwrap();
    let data = conformance::pattern(11, 2 * len);
    h.write_host(0, &data).unwrap();
    let s = dev.create_stream().unwrap();
    // Seed device [0, len) with the second half, then in one batch:
    // H2D, D2H, D2D and H2D again, interleaved (the double checks that each
    // run's location hints name where its memory is).
    dev.copy_async(&s, &CopyRun::new(&d, 0, &h, len, len))
        .unwrap();
    dev.synchronize_stream(&s).unwrap();
    let batch = [
        CopyRun::new(&d, len, &h, 0, len),
        CopyRun::new(&h, 2 * len, &d, 0, len),
        CopyRun::new(&d, 2 * len, &d, 0, len),
        CopyRun::new(&d, 3 * len, &h, 0, 1024),
    ];
    let batches = stats().batch_calls;
    dev.copy_batch_async(&s, &batch).unwrap();
    dev.synchronize_stream(&s).unwrap();
    assert_eq!(stats().batch_calls, batches + 1);
    let back = dev.alloc_pinned(4 * len).unwrap();
    dev.copy_async(&s, &CopyRun::new(&back, 0, &d, 0, 4 * len))
        .unwrap();
    dev.synchronize_stream(&s).unwrap();
    let mut got = vec![0u8; 4 * len];
    back.read_host(0, &mut got).unwrap();
    assert_eq!(&got[len..2 * len], &data[..len]);
    assert_eq!(&got[2 * len..3 * len], &data[len..]);
    assert_eq!(&got[3 * len..3 * len + 1024], &data[..1024]);
    let mut h2 = vec![0u8; len];
    h.read_host(2 * len, &mut h2).unwrap();
    assert_eq!(h2, &data[len..]);
}

/// The copy kernel takes every run of a batch shorter than
/// `COPY_KERNEL_MAX_RUN`, in any direction and at any alignment, in
/// launches of at most `COPY_KERNEL_RUNS` runs; longer runs go to the copy
/// engines. Each run lands where it was asked to (a plan that swapped two
/// runs' destinations fails here and in the conformance suite).
#[test]
fn the_copy_kernel_moves_each_run_to_its_place() {
    let _g = serial();
    let dev = device();
    let s = dev.create_stream().unwrap();
    let runs = cuda::COPY_KERNEL_RUNS + 5;
    let piece = 4096 + 3;
    let total = runs * piece;
    let data = conformance::pattern(23, total);
    let h = dev.alloc_pinned(total).unwrap();
    h.write_host(0, &data).unwrap();
    let d = dev.alloc_device(total).unwrap();
    // Run i of the host goes to slot (i * 7) % runs of the device: a
    // scatter with odd lengths and offsets.
    let slot = |i: usize| (i * 7) % runs;
    let batch: Vec<_> = (0..runs)
        .map(|i| CopyRun::new(&d, slot(i) * piece, &h, i * piece, piece))
        .collect();
    let (launches, copies) = (stats().kernel_launches, stats().copies);
    dev.copy_batch_async(&s, &batch).unwrap();
    dev.synchronize_stream(&s).unwrap();
    assert_eq!(stats().kernel_launches, launches + 2, "two launches");
    assert_eq!(stats().copies, copies, "no copy-engine call");
    conformance::check_scattered(&dev, &d, &data, piece, slot).unwrap();
    // Gather back in order (device to host, through the kernel again),
    // plus one long run that goes to the copy engines.
    let back = dev.alloc_pinned(total + cuda::COPY_KERNEL_MAX_RUN).unwrap();
    let big = dev.alloc_device(cuda::COPY_KERNEL_MAX_RUN).unwrap();
    let mut gather: Vec<_> = (0..runs)
        .map(|i| CopyRun::new(&back, i * piece, &d, slot(i) * piece, piece))
        .collect();
    gather.push(CopyRun::new(
        &back,
        total,
        &big,
        0,
        cuda::COPY_KERNEL_MAX_RUN,
    ));
    let copies = stats().copies;
    dev.copy_batch_async(&s, &gather).unwrap();
    dev.synchronize_stream(&s).unwrap();
    assert_eq!(stats().copies, copies + 1, "the long run took the engines");
    let mut got = vec![0u8; total];
    back.read_host(0, &mut got).unwrap();
    assert!(got == data, "a run landed in the wrong place");
    assert!(dev.take_deferred_errors().is_empty());
}

#[test]
fn registered_memory_round_trips_and_is_unregistered_on_drop() {
    let _g = serial();
    let before = stats();
    {
        let dev = device();
        let mut region = IoBuf::new(1 << 20);
        region
            .as_mut_slice()
            .copy_from_slice(&conformance::pattern(9, 1 << 20));
        let want = region.as_slice().to_vec();
        // SAFETY: `region` outlives `pinned`, dropped at the end of the block.
        let pinned: Memory = unsafe { dev.register_host(region.as_mut_ptr(), 1 << 20) }.unwrap();
        assert_eq!(stats().live_registrations, before.live_registrations + 1);
        // The same range twice is the driver's error, mapped.
        // SAFETY: refused by the driver before anything is recorded.
        match unsafe { dev.register_host(region.as_mut_ptr(), 4096) } {
            Err(DeviceError::Driver { api, code, .. }) => {
                assert_eq!((api, code), ("cuMemHostRegister", 712))
            }
            other => panic!("expected a driver error, got {other:?}"),
        }
        let d = dev.alloc_device(1 << 20).unwrap();
        let back = dev.alloc_pinned(1 << 20).unwrap();
        let s = dev.create_stream().unwrap();
        dev.copy_async(&s, &CopyRun::new(&d, 0, &pinned, 0, 1 << 20))
            .unwrap();
        dev.copy_async(&s, &CopyRun::new(&back, 0, &d, 0, 1 << 20))
            .unwrap();
        dev.synchronize_stream(&s).unwrap();
        let mut got = vec![0u8; 1 << 20];
        back.read_host(0, &mut got).unwrap();
        assert_eq!(got, want);
        drop(pinned);
        assert!(dev.take_deferred_errors().is_empty());
    }
    assert_eq!(live(&stats()), live(&before));
}

#[test]
fn the_layer_kernel_runs_its_host_equivalent_with_the_right_parameters() {
    let _g = serial();
    let dev = device();
    let n = 10_000usize;
    let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let h = dev.alloc_pinned(n * 4).unwrap();
    h.write_host(0, &bytes).unwrap();
    let d = dev.alloc_device(n * 4).unwrap();
    let s = dev.create_stream().unwrap();
    dev.copy_async(&s, &CopyRun::new(&d, 0, &h, 0, n * 4))
        .unwrap();
    let launches = stats().kernel_launches;
    dev.launch_layer_compute(&s, &d, 7).unwrap();
    dev.copy_async(&s, &CopyRun::new(&h, 0, &d, 0, n * 4))
        .unwrap();
    dev.synchronize_stream(&s).unwrap();
    assert_eq!(stats().kernel_launches, launches + 1);
    let mut got = vec![0u8; n * 4];
    h.read_host(0, &mut got).unwrap();
    for (i, c) in got.chunks(4).enumerate() {
        let mut want = xs[i];
        for _ in 0..7 {
            want = want.mul_add(0.9999, 0.5);
        }
        assert_eq!(
            f32::from_ne_bytes(c.try_into().unwrap()),
            want,
            "element {i}"
        );
    }
    // Host memory is not a kernel argument the backend accepts.
    assert!(dev.launch_layer_compute(&s, &h, 1).is_err());
}

#[test]
fn driver_errors_map_with_their_api_code_and_message() {
    let _g = serial();
    let dev = device();
    fail_next("cuMemAlloc", 2);
    match dev.alloc_device(4096) {
        Err(DeviceError::Driver { api, code, message }) => {
            assert_eq!((api, code), ("cuMemAlloc", 2));
            assert!(message.contains("out of memory"), "{message}");
        }
        other => panic!("expected a driver error, got {other:?}"),
    }
    dev.alloc_device(4096).unwrap();
    fail_next("cuStreamCreate", 400);
    assert!(matches!(
        dev.create_stream(),
        Err(DeviceError::Driver {
            api: "cuStreamCreate",
            code: 400,
            ..
        })
    ));
    fail_next("cuEventRecord", 400);
    let (s, e) = (dev.create_stream().unwrap(), dev.create_event().unwrap());
    assert!(matches!(
        dev.record_event(&e, &s),
        Err(DeviceError::Driver {
            api: "cuEventRecord",
            ..
        })
    ));
    // A handle of another device is refused before the driver sees it.
    let other = CudaDevice::new(0).unwrap();
    let s2 = other.create_stream().unwrap();
    assert!(matches!(
        dev.record_event(&e, &s2),
        Err(DeviceError::InvalidArgument(_))
    ));
}

#[test]
fn a_stream_error_is_sticky_until_the_context_goes() {
    let _g = serial();
    let before = stats();
    {
        let dev = device();
        let len = 64 << 10;
        let h = dev.alloc_pinned(len).unwrap();
        let d = dev.alloc_device(len).unwrap();
        let s = dev.create_stream().unwrap();
        fail_stream(719);
        dev.copy_async(&s, &CopyRun::new(&d, 0, &h, 0, len))
            .unwrap();
        match dev.synchronize_stream(&s) {
            Err(DeviceError::Driver { api, code, .. }) => {
                assert_eq!((api, code), ("cuStreamSynchronize", 719))
            }
            other => panic!("expected the stream's error, got {other:?}"),
        }
        // Sticky: every later call of the context reports it.
        assert!(dev.create_stream().is_err());
        assert!(dev.alloc_device(4096).is_err());
    }
    // The releases that failed on the sticky context were kept, not
    // panicked on; a fresh context is healthy.
    let dev = device();
    conformance::round_trip(&dev).unwrap();
    let _ = before;
}

#[test]
fn copies_the_driver_refuses_are_errors() {
    let _g = serial();
    let dev = device();
    let h = dev.alloc_pinned(4096).unwrap();
    let d = dev.alloc_device(4096).unwrap();
    let s = dev.create_stream().unwrap();
    // An address outside every device allocation, as a device side.
    // SAFETY: only wraps the address; the driver refuses the copy.
    let bogus = unsafe { dev.import_device(h.addr(), 4096) }.unwrap();
    assert!(matches!(
        dev.copy_async(&s, &CopyRun::new(&bogus, 0, &h, 0, 64)),
        Err(DeviceError::Driver {
            api: "cuMemcpyHtoDAsync",
            code: 1,
            ..
        })
    ));
    // The host side pointing into device memory (a host-to-host or
    // device-to-device copy through the wrong call).
    // SAFETY: as above.
    let hostish = unsafe { dev.register_host(d.addr() as *mut u8, 4096) };
    assert!(
        hostish.is_err(),
        "device memory cannot be registered as host memory"
    );
    dev.synchronize_stream(&s).unwrap();
}

#[test]
fn memory_dropped_while_work_still_uses_it_waits_for_the_work() {
    // The double refuses to free memory that queued work uses (CUDA leaves it
    // undefined); the backend drains the context before it releases, so the
    // drop waits for the gate instead of leaving a deferred error.
    let _g = serial();
    let dev = device();
    let len = 1 << 20;
    let h = dev.alloc_pinned(len).unwrap();
    let d = dev.alloc_device(len).unwrap();
    let s = dev.create_stream().unwrap();
    let open = conformance::gate(&dev, &s).unwrap();
    dev.copy_async(&s, &CopyRun::new(&d, 0, &h, 0, len))
        .unwrap();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(open);
    });
    let t = std::time::Instant::now();
    drop(d);
    drop(h);
    assert!(
        t.elapsed() >= std::time::Duration::from_millis(40),
        "the drop did not wait"
    );
    opener.join().unwrap();
    assert!(dev.take_deferred_errors().is_empty());
    dev.synchronize_stream(&s).unwrap();
}
