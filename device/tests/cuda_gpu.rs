//! The CUDA backend (feature `cuda`).
//!
//! Here (no GPU, no driver) the probe must answer without panicking and
//! opening a device must be a clear error. On a machine with a GPU the
//! shared device test body runs on it; without one that test prints why it
//! skips, and with `UCM_REQUIRE_GPU=1` it fails instead, so
//! `scripts/gpu-check.sh` cannot pass by skipping.
#![cfg(feature = "cuda")]

use ucm_device::accel::cuda::{self, CudaDevice};
use ucm_device::{conformance, CopyRun, Device, DeviceError, Memory};

fn required() -> bool {
    std::env::var("UCM_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The GPU, or why there is none (a failure when one is required).
fn gpu() -> Option<CudaDevice> {
    let (available, reason) = cuda::probe();
    if !available {
        assert!(
            !required(),
            "UCM_REQUIRE_GPU=1 but no GPU is usable: {reason}"
        );
        eprintln!("skipping: {reason}");
        return None;
    }
    Some(CudaDevice::new(0).expect("open GPU 0"))
}

#[test]
fn probe_and_open_never_panic() {
    let (available, reason) = cuda::probe();
    assert!(!reason.is_empty());
    if !cuda::driver_present() {
        assert!(!available);
        assert!(reason.contains("libcuda"), "{reason}");
        match CudaDevice::new(0) {
            Err(DeviceError::Unsupported {
                backend: "cuda",
                reason,
            }) => {
                assert!(reason.contains("libcuda"), "{reason}")
            }
            Err(e) => panic!("expected Unsupported, got {e}"),
            Ok(_) => panic!("opened a GPU without a driver"),
        }
    }
}

#[test]
fn device_test_body_on_a_real_gpu() {
    let Some(dev) = gpu() else { return };
    // A GPU with unified addressing takes batches through the copy kernel.
    assert_eq!(
        dev.copy_path(),
        cuda::CopyPath::Kernel,
        "{:?}",
        dev.copy_kernel_unavailable()
    );
    conformance::run_all(&dev).unwrap();
    dev.set_copy_kernel(false);
    conformance::run_all(&dev).unwrap();
    if dev.batch_api_available() {
        dev.set_batch_api(true);
        assert!(dev.batch_api());
        conformance::run_all(&dev).unwrap();
        dev.set_batch_api(false);
    } else {
        eprintln!("cuMemcpyBatchAsync not exported by this driver: loop only");
    }
    assert!(dev.take_deferred_errors().is_empty());
}

#[test]
fn registered_host_memory_and_the_layer_kernel_on_a_real_gpu() {
    let Some(dev) = gpu() else { return };
    // A registered region (as the shared-memory pool will be) round-trips.
    let mut region = ucm_device::IoBuf::new(1 << 20);
    region
        .as_mut_slice()
        .copy_from_slice(&conformance::pattern(9, 1 << 20));
    let want = region.as_slice().to_vec();
    // SAFETY: `region` outlives `pinned`, dropped below.
    let pinned: Memory = unsafe { dev.register_host(region.as_mut_ptr(), 1 << 20) }.unwrap();
    let d = dev.alloc_device(1 << 20).unwrap();
    let back = dev.alloc_pinned(1 << 20).unwrap();
    let s = dev.create_stream().unwrap();
    dev.copy_async(&s, &CopyRun::new(&d, 0, &pinned, 0, 1 << 20))
        .unwrap();
    // The layer kernel runs on the data and leaves it finite.
    dev.launch_layer_compute(&s, &d, 16).unwrap();
    dev.copy_async(&s, &CopyRun::new(&back, 0, &d, 0, 1 << 20))
        .unwrap();
    dev.synchronize_stream(&s).unwrap();
    drop(pinned);
    let mut got = vec![0u8; 1 << 20];
    back.read_host(0, &mut got).unwrap();
    assert_ne!(got, want, "the kernel changed the floats");
    assert!(
        dev.launch_layer_compute(&s, &back, 1).is_err(),
        "pinned memory refused"
    );
}

/// The copy kernel on a real GPU: odd-sized runs scattered from registered
/// host memory (as the pool is) to device memory, then gathered back to
/// pinned memory, every byte in its place, in two launches each way.
#[test]
fn the_copy_kernel_scatters_and_gathers_on_a_real_gpu() {
    let Some(dev) = gpu() else { return };
    let runs = cuda::COPY_KERNEL_RUNS + 5;
    for piece in [4096 + 3, 16 << 10, 64 << 10] {
        let total = runs * piece;
        let data = conformance::pattern(piece as u64, total);
        let mut region = ucm_device::IoBuf::new(total);
        region.as_mut_slice().copy_from_slice(&data);
        // SAFETY: `region` outlives `host`, dropped below.
        let host: Memory = unsafe { dev.register_host(region.as_mut_ptr(), total) }.unwrap();
        let d = dev.alloc_device(total).unwrap();
        let back = dev.alloc_pinned(total).unwrap();
        let s = dev.create_stream().unwrap();
        let slot = |i: usize| (i * 7) % runs;
        let scatter: Vec<_> = (0..runs)
            .map(|i| CopyRun::new(&d, slot(i) * piece, &host, i * piece, piece))
            .collect();
        dev.copy_batch_async(&s, &scatter).unwrap();
        let gather: Vec<_> = (0..runs)
            .map(|i| CopyRun::new(&back, i * piece, &d, slot(i) * piece, piece))
            .collect();
        dev.copy_batch_async(&s, &gather).unwrap();
        dev.synchronize_stream(&s).unwrap();
        drop(host);
        conformance::check_scattered(&dev, &d, &data, piece, slot)
            .unwrap_or_else(|e| panic!("{piece} B: {e}"));
        let mut got = vec![0u8; total];
        back.read_host(0, &mut got).unwrap();
        assert!(got == data, "{piece} B: the gather is not the source");
    }
    assert!(dev.take_deferred_errors().is_empty());
}
