//! The device test body on `HostDevice`, with and without ACL's 64-byte
//! copy alignment rule.

use ucm_device::conformance;
use ucm_device::{CopyRun, Device, DeviceError, HostDevice};

#[test]
fn host_device_passes_the_device_test_body() {
    conformance::run_all(&HostDevice::new()).unwrap();
}

#[test]
fn host_device_with_acl_alignment_passes_the_device_test_body() {
    conformance::run_all(&HostDevice::with_copy_alignment(64).unwrap()).unwrap();
}

#[test]
fn misaligned_copy_is_reported_with_the_address() {
    let dev = HostDevice::with_copy_alignment(64).unwrap();
    let h = dev.alloc_pinned(4096).unwrap();
    let d = dev.alloc_device(4096).unwrap();
    let s = dev.create_stream().unwrap();
    let err = dev
        .copy_async(&s, &CopyRun::new(&d, 32, &h, 0, 64))
        .unwrap_err();
    match err {
        DeviceError::Misaligned {
            what: "destination address",
            value,
            align: 64,
        } => assert_eq!(value, d.addr() + 32),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn handles_of_another_device_are_refused() {
    let a = HostDevice::new();
    let b = HostDevice::new();
    let ha = a.alloc_pinned(4096).unwrap();
    let db = b.alloc_device(4096).unwrap();
    let sa = a.create_stream().unwrap();
    let sb = b.create_stream().unwrap();
    let eb = b.create_event().unwrap();
    assert!(a
        .copy_async(&sa, &CopyRun::new(&db, 0, &ha, 0, 64))
        .is_err());
    assert!(a.synchronize_stream(&sb).is_err());
    assert!(a.record_event(&eb, &sa).is_err());
    assert!(a.alloc_device(0).is_err());
}

#[test]
fn memory_outlives_its_handle_while_a_copy_is_queued() {
    let dev = HostDevice::new();
    let s = dev.create_stream().unwrap();
    let tx = conformance::gate(&dev, &s).unwrap();
    let out = dev.alloc_pinned(1 << 16).unwrap();
    {
        let src = dev.alloc_pinned(1 << 16).unwrap();
        src.write_host(0, &[5u8; 1 << 16]).unwrap();
        let d = dev.alloc_device(1 << 16).unwrap();
        dev.copy_async(&s, &CopyRun::new(&d, 0, &src, 0, 1 << 16))
            .unwrap();
        dev.copy_async(&s, &CopyRun::new(&out, 0, &d, 0, 1 << 16))
            .unwrap();
        // `src` and `d` are dropped here, before the copies ran.
    }
    tx.send(()).unwrap();
    dev.synchronize_stream(&s).unwrap();
    let mut got = vec![0u8; 1 << 16];
    out.read_host(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 5));
}

#[test]
fn registered_host_region_is_dma_able() {
    let dev = HostDevice::new();
    let mut region = vec![0u8; 8192];
    region[..4].copy_from_slice(b"ucm!");
    // SAFETY: `region` outlives every use of `pinned` below.
    let pinned = unsafe { dev.register_host(region.as_mut_ptr(), region.len()) }.unwrap();
    let d = dev.alloc_device(8192).unwrap();
    let s = dev.create_stream().unwrap();
    dev.copy_async(&s, &CopyRun::new(&d, 0, &pinned, 0, 8192))
        .unwrap();
    dev.copy_async(&s, &CopyRun::new(&pinned, 4096, &d, 0, 4))
        .unwrap();
    dev.synchronize_stream(&s).unwrap();
    drop(pinned);
    assert_eq!(&region[4096..4100], b"ucm!");
}

#[test]
fn host_streams_skip_work_queued_behind_a_failure() {
    let dev = HostDevice::new();
    let len = 4096;
    let src = dev.alloc_pinned(len).unwrap();
    let out = dev.alloc_pinned(len).unwrap();
    let d = dev.alloc_device(len).unwrap();
    src.write_host(0, &[3u8; 4096]).unwrap();
    let s = dev.create_stream().unwrap();
    dev.launch_host_fn(&s, Box::new(|| Err(DeviceError::Stream("boom".into()))))
        .unwrap();
    dev.copy_async(&s, &CopyRun::new(&d, 0, &src, 0, len))
        .unwrap();
    assert!(dev.synchronize_stream(&s).is_err());
    let c = dev.create_stream().unwrap();
    dev.copy_async(&c, &CopyRun::new(&out, 0, &d, 0, len))
        .unwrap();
    dev.synchronize_stream(&c).unwrap();
    let mut got = vec![1u8; len];
    out.read_host(0, &mut got).unwrap();
    assert!(
        got.iter().all(|&x| x == 0),
        "the copy behind the failure ran"
    );
}
