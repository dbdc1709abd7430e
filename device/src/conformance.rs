//! The device test body: one set of checks that every [`Device`] backend
//! must pass (host, CUDA, Ascend). Backends' test suites call these with
//! their own device; a failed check is an `Err` naming what broke.
//!
//! It lives in the library (not under `tests/`) so that the CUDA and Ascend
//! test targets run the very same code.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::accel::{CopyRun, Device, MemKind, Memory};
use crate::error::{DeviceError, Result};

fn fail(msg: impl Into<String>) -> DeviceError {
    DeviceError::InvalidArgument(format!("conformance: {}", msg.into()))
}

/// Deterministic test bytes (splitmix64 stream).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Copies `bytes` from the host into `mem` at `at` (through pinned memory
/// and a stream), and waits.
pub fn upload<D: Device>(dev: &D, mem: &Memory, at: usize, bytes: &[u8]) -> Result<()> {
    let h = dev.alloc_pinned(bytes.len())?;
    h.write_host(0, bytes)?;
    let st = dev.create_stream()?;
    dev.copy_async(&st, &CopyRun::new(mem, at, &h, 0, bytes.len()))?;
    dev.synchronize_stream(&st)
}

/// Copies `len` bytes of `mem` at `at` back to the host.
pub fn download<D: Device>(dev: &D, mem: &Memory, at: usize, len: usize) -> Result<Vec<u8>> {
    let h = dev.alloc_pinned(len)?;
    let st = dev.create_stream()?;
    dev.copy_async(&st, &CopyRun::new(&h, 0, mem, at, len))?;
    dev.synchronize_stream(&st)?;
    let mut v = vec![0u8; len];
    h.read_host(0, &mut v)?;
    Ok(v)
}

/// Checks the layout a scatter by `slot` leaves: device memory `mem` holds
/// run `i` of `data` (runs of `piece` bytes) at `slot(i) * piece`, read back
/// in one plain copy.
pub fn check_scattered<D: Device>(
    dev: &D,
    mem: &Memory,
    data: &[u8],
    piece: usize,
    slot: impl Fn(usize) -> usize,
) -> Result<()> {
    let got = download(dev, mem, 0, data.len())?;
    for i in 0..data.len() / piece.max(1) {
        let at = slot(i) * piece;
        if got.get(at..at + piece) != Some(&data[i * piece..(i + 1) * piece]) {
            return Err(fail(format!("run {i} landed in the wrong place")));
        }
    }
    Ok(())
}

/// Runs every check in order.
pub fn run_all<D: Device>(dev: &D) -> Result<()> {
    round_trip(dev)?;
    copies_wait_for_earlier_work(dev)?;
    sync_copies_keep_the_stream_order(dev)?;
    two_streams_ordered_by_event(dev)?;
    scatter_gather(dev)?;
    wait_event_does_not_block_host(dev)?;
    errors_surface_from_stream(dev)?;
    a_panicking_host_fn_fails_its_stream(dev)?;
    invalid_arguments_are_errors(dev)?;
    Ok(())
}

/// H2D, D2D and D2H round trip of one buffer.
pub fn round_trip<D: Device>(dev: &D) -> Result<()> {
    let len = 1 << 20;
    let data = pattern(1, len);
    let host = dev.alloc_pinned(len)?;
    let back = dev.alloc_pinned(len)?;
    let d1 = dev.alloc_device(len)?;
    let d2 = dev.alloc_device(len)?;
    host.write_host(0, &data)?;
    let s = dev.create_stream()?;
    dev.copy_async(&s, &CopyRun::new(&d1, 0, &host, 0, len))?;
    dev.copy_async(&s, &CopyRun::new(&d2, 0, &d1, 0, len))?;
    dev.copy_async(&s, &CopyRun::new(&back, 0, &d2, 0, len))?;
    dev.synchronize_stream(&s)?;
    let mut got = vec![0u8; len];
    back.read_host(0, &mut got)?;
    if got != data {
        return Err(fail("round trip H2D -> D2D -> D2H changed the bytes"));
    }
    Ok(())
}

/// A copy queued behind a blocked host function does not run before it:
/// another stream still reads the old bytes, and `synchronize_stream` waits
/// for the copy (a copy submitted to another stream than the one given
/// fails this).
pub fn copies_wait_for_earlier_work<D: Device>(dev: &D) -> Result<()> {
    let len = 64 << 10;
    let data = pattern(5, len);
    let src = dev.alloc_pinned(len)?;
    let back = dev.alloc_pinned(len)?;
    let d = dev.alloc_device(len)?;
    src.write_host(0, &data)?;
    let (s, other) = (dev.create_stream()?, dev.create_stream()?);
    let open = gate(dev, &s)?;
    dev.copy_batch_async(
        &s,
        &[
            CopyRun::new(&d, 0, &src, 0, len / 2),
            CopyRun::new(&d, len / 2, &src, len / 2, len / 2),
        ],
    )?;
    thread::sleep(Duration::from_millis(20));
    dev.copy_async(&other, &CopyRun::new(&back, 0, &d, 0, len))?;
    dev.synchronize_stream(&other)?;
    let mut got = vec![0u8; len];
    back.read_host(0, &mut got)?;
    if got == data {
        return Err(fail("a copy ran before the work queued ahead of it"));
    }
    drop(open);
    dev.synchronize_stream(&s)?;
    dev.copy_async(&other, &CopyRun::new(&back, 0, &d, 0, len))?;
    dev.synchronize_stream(&other)?;
    back.read_host(0, &mut got)?;
    if got != data {
        return Err(fail("synchronize_stream returned before the stream's copy"));
    }
    Ok(())
}

/// [`Device::copy_batch_sync`]: on an idle stream it returns with the
/// bytes in place; behind queued work it runs after that work (a host
/// function queued first writes the source, so a copy that jumps the queue
/// moves the old bytes); on a stream whose earlier work failed it fails.
pub fn sync_copies_keep_the_stream_order<D: Device>(dev: &D) -> Result<()> {
    let len = 256 << 10;
    let (first, second) = (pattern(6, len), pattern(7, len));
    let src = dev.alloc_pinned(len)?;
    let back = dev.alloc_pinned(len)?;
    let d = dev.alloc_device(len)?;
    src.write_host(0, &first)?;
    let s = dev.create_stream()?;
    fn runs<'a>(dst: &'a Memory, from: &'a Memory, len: usize) -> Vec<CopyRun<'a>> {
        vec![
            CopyRun::new(dst, 0, from, 0, len / 2),
            CopyRun::new(dst, len / 2, from, len / 2, len / 2),
        ]
    }
    dev.copy_batch_sync(&s, &runs(&d, &src, len))?;
    dev.copy_batch_sync(&s, &runs(&back, &d, len))?;
    let mut got = vec![0u8; len];
    back.read_host(0, &mut got)?;
    if got != first {
        return Err(fail(
            "a sync copy on an idle stream returned without its bytes",
        ));
    }
    // Behind a gate and a host function that rewrites the source.
    let open = gate(dev, &s)?;
    let writer = src.clone();
    let next = second.clone();
    dev.launch_host_fn(&s, Box::new(move || writer.write_host(0, &next)))?;
    let opener = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        drop(open);
    });
    dev.copy_batch_sync(&s, &runs(&d, &src, len))?;
    let _ = opener.join();
    dev.copy_batch_sync(&s, &runs(&back, &d, len))?;
    back.read_host(0, &mut got)?;
    if got != second {
        return Err(fail("a sync copy ran before the work queued ahead of it"));
    }
    // Behind a failure.
    let f = dev.create_stream()?;
    dev.launch_host_fn(
        &f,
        Box::new(|| Err(DeviceError::Stream("injected failure".into()))),
    )?;
    let _ = dev.synchronize_stream(&f);
    if dev.copy_batch_sync(&f, &runs(&d, &src, len)).is_ok() {
        return Err(fail("a sync copy on a failed stream reported success"));
    }
    Ok(())
}

/// Queues a host function that blocks `stream` until the returned sender
/// fires (or is dropped).
pub fn gate<D: Device>(dev: &D, stream: &D::Stream) -> Result<mpsc::Sender<()>> {
    let (tx, rx) = mpsc::channel::<()>();
    dev.launch_host_fn(
        stream,
        Box::new(move || {
            let _ = rx.recv();
            Ok(())
        }),
    )?;
    Ok(tx)
}

/// Stream B reads what stream A wrote, ordered only by an event: A is held
/// back by a gate, so without the wait B would read stale bytes.
pub fn two_streams_ordered_by_event<D: Device>(dev: &D) -> Result<()> {
    let len = 256 << 10;
    let data = pattern(2, len);
    let src = dev.alloc_pinned(len)?;
    let out = dev.alloc_pinned(len)?;
    let mid = dev.alloc_device(len)?;
    src.write_host(0, &data)?;
    let (a, b) = (dev.create_stream()?, dev.create_stream()?);
    let ev = dev.create_event()?;
    let open = gate(dev, &a)?;
    dev.copy_async(&a, &CopyRun::new(&mid, 0, &src, 0, len))?;
    dev.record_event(&ev, &a)?;
    dev.stream_wait_event(&b, &ev)?;
    dev.copy_async(&b, &CopyRun::new(&out, 0, &mid, 0, len))?;
    let done_b = dev.create_event()?;
    dev.record_event(&done_b, &b)?;
    if dev.query_event(&done_b)? {
        return Err(fail("stream B finished before the event it waits on"));
    }
    drop(open);
    dev.synchronize_event(&done_b)?;
    if !dev.query_event(&ev)? {
        return Err(fail("event A not complete after B, which waited on it"));
    }
    let mut got = vec![0u8; len];
    out.read_host(0, &mut got)?;
    if got != data {
        return Err(fail("stream B did not see stream A's copy"));
    }
    Ok(())
}

/// Scatters many runs of uneven lengths from pinned memory to scattered
/// device offsets, gathers them back in another order, and checks every byte.
pub fn scatter_gather<D: Device>(dev: &D) -> Result<()> {
    let align = dev.copy_alignment().max(64);
    let runs = 257usize;
    let lens: Vec<usize> = (0..runs).map(|i| align * (1 + (i * 7) % 23)).collect();
    let total: usize = lens.iter().sum();
    let stride = align * 32;
    let data = pattern(3, total);
    let host = dev.alloc_pinned(total)?;
    let back = dev.alloc_pinned(total)?;
    let dmem = dev.alloc_device(stride * runs)?;
    host.write_host(0, &data)?;
    // Run i goes to device slot perm(i): a bijection on 0..runs (257 prime).
    let slot = |i: usize| (i * 101 + 13) % runs;
    let mut src_offs = Vec::with_capacity(runs);
    let mut off = 0;
    for l in &lens {
        src_offs.push(off);
        off += l;
    }
    let s = dev.create_stream()?;
    let scatter: Vec<CopyRun<'_>> = (0..runs)
        .map(|i| CopyRun::new(&dmem, slot(i) * stride, &host, src_offs[i], lens[i]))
        .collect();
    dev.copy_batch_async(&s, &scatter)?;
    // Gather in reverse order into the same layout.
    let gather: Vec<CopyRun<'_>> = (0..runs)
        .rev()
        .map(|i| CopyRun::new(&back, src_offs[i], &dmem, slot(i) * stride, lens[i]))
        .collect();
    dev.copy_batch_async(&s, &gather)?;
    dev.synchronize_stream(&s)?;
    let mut got = vec![0u8; total];
    back.read_host(0, &mut got)?;
    if let Some(pos) = got.iter().zip(&data).position(|(a, b)| a != b) {
        return Err(fail(format!("scatter-gather mismatch at byte {pos}")));
    }
    Ok(())
}

/// `stream_wait_event` returns at once while the awaited work is blocked,
/// and the waiting stream's later work runs only after the event.
pub fn wait_event_does_not_block_host<D: Device>(dev: &D) -> Result<()> {
    let (a, b) = (dev.create_stream()?, dev.create_stream()?);
    let ev = dev.create_event()?;
    let open = gate(dev, &a)?;
    dev.record_event(&ev, &a)?;
    // A watchdog opens the gate after a while, so a blocking implementation
    // fails this check instead of hanging the test.
    let returned = Arc::new(AtomicBool::new(false));
    let blocked = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (returned, blocked) = (Arc::clone(&returned), Arc::clone(&blocked));
        thread::spawn(move || {
            for _ in 0..500 {
                if returned.load(Ordering::SeqCst) {
                    return open;
                }
                thread::sleep(Duration::from_millis(10));
            }
            blocked.store(true, Ordering::SeqCst);
            drop(open);
            mpsc::channel().0
        })
    };
    dev.stream_wait_event(&b, &ev)?;
    returned.store(true, Ordering::SeqCst);
    let open = watchdog
        .join()
        .map_err(|_| fail("watchdog thread panicked"))?;
    if blocked.load(Ordering::SeqCst) {
        return Err(fail("stream_wait_event blocked the calling thread"));
    }
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let o = Arc::clone(&order);
    dev.launch_host_fn(
        &b,
        Box::new(move || {
            o.lock().map(|mut v| v.push("b")).ok();
            Ok(())
        }),
    )?;
    thread::sleep(Duration::from_millis(20));
    if !order.lock().map(|v| v.is_empty()).unwrap_or(false) {
        return Err(fail("work after stream_wait_event ran before the event"));
    }
    order.lock().map(|mut v| v.push("a")).ok();
    drop(open);
    dev.synchronize_stream(&b)?;
    let got = order.lock().map(|v| v.clone()).unwrap_or_default();
    if got != ["a", "b"] {
        return Err(fail(format!("wrong order {got:?}")));
    }
    Ok(())
}

/// An error in queued work surfaces at `synchronize_stream`, at events
/// recorded after it, and in a stream that waits on such an event; a fresh
/// stream is unaffected. (Whether work queued behind the failure still runs
/// is backend-specific: real runtimes cannot cancel it. The host device's
/// own tests check that it skips it.)
pub fn errors_surface_from_stream<D: Device>(dev: &D) -> Result<()> {
    let len = 64 << 10;
    let src = dev.alloc_pinned(len)?;
    let out = dev.alloc_pinned(len)?;
    let d = dev.alloc_device(len)?;
    src.write_host(0, &pattern(4, len))?;
    let (a, b) = (dev.create_stream()?, dev.create_stream()?);
    let ev = dev.create_event()?;
    dev.launch_host_fn(
        &a,
        Box::new(|| Err(DeviceError::Stream("injected failure".into()))),
    )?;
    dev.copy_async(&a, &CopyRun::new(&d, 0, &src, 0, len))?;
    dev.record_event(&ev, &a)?;
    match dev.synchronize_stream(&a) {
        Err(e) if e.to_string().contains("injected failure") => {}
        other => return Err(fail(format!("sync after failure gave {other:?}"))),
    }
    if dev.synchronize_event(&ev).is_ok() || dev.query_event(&ev).is_ok() {
        return Err(fail("event recorded after a failure reported success"));
    }
    dev.stream_wait_event(&b, &ev)?;
    dev.copy_async(&b, &CopyRun::new(&out, 0, &d, 0, len))?;
    if dev.synchronize_stream(&b).is_ok() {
        return Err(fail("stream waiting on a failed event reported success"));
    }
    // A fresh stream is healthy.
    let c = dev.create_stream()?;
    dev.copy_async(&c, &CopyRun::new(&out, 0, &d, 0, len))?;
    dev.synchronize_stream(&c)?;
    let e2 = dev.create_event()?;
    dev.record_event(&e2, &c)?;
    dev.synchronize_event(&e2)?;
    Ok(())
}

/// A host function that panics is an error of its stream's work (sticky,
/// as [`errors_surface_from_stream`]), never a stream left hung: an event
/// recorded after it completes with an error within seconds, and a fresh
/// stream is unaffected.
pub fn a_panicking_host_fn_fails_its_stream<D: Device>(dev: &D) -> Result<()> {
    let s = dev.create_stream()?;
    dev.launch_host_fn(&s, Box::new(|| panic!("injected panic in a host function")))?;
    let ev = dev.create_event()?;
    dev.record_event(&ev, &s)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match dev.query_event(&ev) {
            Err(_) => break,
            Ok(true) => return Err(fail("an event after a panicking host function succeeded")),
            Ok(false) if Instant::now() > deadline => {
                return Err(fail("a panicking host function left its stream hung"))
            }
            Ok(false) => thread::sleep(Duration::from_millis(1)),
        }
    }
    match dev.synchronize_stream(&s) {
        Err(e) if e.to_string().contains("injected panic in a host function") => {}
        other => {
            return Err(fail(format!(
                "sync after a panicking host function gave {other:?}, not its message"
            )))
        }
    }
    let fresh = dev.create_stream()?;
    dev.launch_host_fn(&fresh, Box::new(|| Ok(())))?;
    dev.synchronize_stream(&fresh)
}

/// Bad arguments are errors before anything is queued.
pub fn invalid_arguments_are_errors<D: Device>(dev: &D) -> Result<()> {
    let len = 4096;
    let h = dev.alloc_pinned(len)?;
    let h2 = dev.alloc_pinned(len)?;
    let d = dev.alloc_device(len)?;
    let s = dev.create_stream()?;
    let expect = |what: &str, r: Result<()>| match r {
        Err(_) => Ok(()),
        Ok(()) => Err(fail(format!("{what} was accepted"))),
    };
    expect(
        "out-of-bounds copy",
        dev.copy_async(&s, &CopyRun::new(&d, 1024, &h, 0, len)),
    )?;
    expect(
        "offset overflow",
        dev.copy_async(&s, &CopyRun::new(&d, usize::MAX, &h, 0, 2)),
    )?;
    expect(
        "host-to-host copy",
        dev.copy_async(&s, &CopyRun::new(&h2, 0, &h, 0, 64)),
    )?;
    expect(
        "overlapping copy",
        dev.copy_async(&s, &CopyRun::new(&d, 64, &d, 0, 128)),
    )?;
    expect("read of device memory from host", {
        let mut b = [0u8; 4];
        d.read_host(0, &mut b)
    })?;
    // A batch with one bad run is rejected whole: nothing reaches `d`.
    h.write_host(0, &[7u8; 64])?;
    let batch = [
        CopyRun::new(&d, 0, &h, 0, 64),
        CopyRun::new(&d, 4096, &h, 0, 64),
    ];
    expect(
        "batch with an out-of-bounds run",
        dev.copy_batch_async(&s, &batch),
    )?;
    if dev.copy_alignment() > 1 {
        let a = dev.copy_alignment();
        expect(
            "misaligned copy",
            dev.copy_async(&s, &CopyRun::new(&d, a / 2, &h, 0, a)),
        )?;
    }
    dev.copy_async(&s, &CopyRun::new(&h2, 0, &d, 0, 64))?;
    dev.synchronize_stream(&s)?;
    let mut b = [9u8; 64];
    h2.read_host(0, &mut b)?;
    if b != [0u8; 64] {
        return Err(fail("a rejected batch still copied"));
    }
    if d.kind() != MemKind::Device || h.kind() != MemKind::Pinned {
        return Err(fail("allocations report the wrong memory kind"));
    }
    Ok(())
}
