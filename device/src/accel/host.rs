//! `HostDevice`: the [`Device`] trait on plain memory.
//!
//! "Device memory" and pinned memory are page-aligned heap allocations. A
//! stream is a worker thread that executes its queue in order; an event is a
//! counter pair (recorded / completed) with a condition variable; a
//! stream-wait-event is a queue entry that makes the *worker* wait, so the
//! caller never blocks. It is the embedded default and the test double for
//! every layer above the HAL.

use std::alloc::{self, Layout};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;

use crossbeam_channel::{unbounded, Sender};

use super::{
    check_alloc_len, check_region, CopyKind, CopyRun, Device, DeviceId, HostFn, MemKind, Memory,
};
use crate::error::{DeviceError, Result};

/// Alignment of host-device allocations (one page).
const HOST_ALLOC_ALIGN: usize = 4096;

/// The host backend. Cheap to create; every instance has its own identity.
#[derive(Debug)]
pub struct HostDevice {
    id: DeviceId,
    copy_align: usize,
}

impl Default for HostDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl HostDevice {
    /// A host device with no copy alignment rule.
    pub fn new() -> Self {
        HostDevice {
            id: DeviceId::fresh(),
            copy_align: 1,
        }
    }

    /// A host device that enforces `align` on copy addresses, to emulate a
    /// runtime with such a rule (ACL: 64) in tests.
    pub fn with_copy_alignment(align: usize) -> Result<Self> {
        if !align.is_power_of_two() {
            return Err(DeviceError::InvalidArgument(format!(
                "copy alignment {align} is not a power of two"
            )));
        }
        Ok(HostDevice {
            id: DeviceId::fresh(),
            copy_align: align,
        })
    }

    /// Copies `len` bytes from `src` to `dst` on the calling thread with a
    /// plain memcpy: the raw baseline that `ucm bench device` measures the
    /// stream path against. Both regions must be of this device and in bounds.
    pub fn raw_copy(&self, dst: &Memory, src: &Memory, len: usize) -> Result<()> {
        self.raw_copy_at(dst, 0, src, 0, len)
    }

    /// [`HostDevice::raw_copy`] of `len` bytes from `src_offset` in `src`
    /// to `dst_offset` in `dst`: one call of the C library's `memcpy`.
    pub fn raw_copy_at(
        &self,
        dst: &Memory,
        dst_offset: usize,
        src: &Memory,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        let run = CopyRun::new(dst, dst_offset, src, src_offset, len);
        run.validate(self.id, 1)?;
        OwnedRun {
            dst: dst.clone(),
            dst_offset,
            src: src.clone(),
            src_offset,
            len,
        }
        .execute_plain();
        Ok(())
    }

    fn alloc(&self, kind: MemKind, len: usize) -> Result<Memory> {
        let alloc = HostAlloc::new(len)?;
        let addr = alloc.ptr as u64;
        Ok(Memory::from_parts(
            self.id,
            kind,
            addr,
            len,
            Box::new(alloc),
        ))
    }

    fn check_stream(&self, stream: &HostStream) -> Result<()> {
        if stream.device == self.id {
            Ok(())
        } else {
            Err(DeviceError::InvalidArgument(
                "stream belongs to another device".into(),
            ))
        }
    }

    fn check_event(&self, event: &HostEvent) -> Result<()> {
        if event.device == self.id {
            Ok(())
        } else {
            Err(DeviceError::InvalidArgument(
                "event belongs to another device".into(),
            ))
        }
    }

    fn validate_runs(&self, runs: &[CopyRun<'_>]) -> Result<Vec<OwnedRun>> {
        Ok(own(CopyRun::validate_batch(
            runs,
            self.id,
            self.copy_align,
        )?))
    }
}

/// Runs that passed validation, with handles of their own for a stream's
/// queue.
fn own(valid: Vec<(&CopyRun<'_>, CopyKind)>) -> Vec<OwnedRun> {
    valid
        .into_iter()
        .map(|(r, _)| OwnedRun {
            dst: r.dst.clone(),
            dst_offset: r.dst_offset,
            src: r.src.clone(),
            src_offset: r.src_offset,
            len: r.len,
        })
        .collect()
}

/// The addresses a run copies to and from.
fn ends(dst: &Memory, dst_offset: usize, src: &Memory, src_offset: usize) -> (*mut u8, *const u8) {
    (
        (dst.addr() as usize + dst_offset) as *mut u8,
        (src.addr() as usize + src_offset) as *const u8,
    )
}

/// A page-aligned heap allocation, zeroed, freed on drop.
struct HostAlloc {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the allocation is plain memory owned by this value; access to its
// bytes is coordinated by streams and events, as on a real device.
unsafe impl Send for HostAlloc {}
// SAFETY: as above; `HostAlloc` itself exposes no interior mutability.
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    fn new(len: usize) -> Result<Self> {
        check_alloc_len(len)?;
        let layout = Layout::from_size_align(len, HOST_ALLOC_ALIGN)
            .map_err(|e| DeviceError::InvalidArgument(format!("allocation of {len} bytes: {e}")))?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(DeviceError::InvalidArgument(format!(
                "out of host memory allocating {len} bytes"
            )));
        }
        Ok(HostAlloc { ptr, layout })
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with this `layout`, once.
        unsafe { alloc::dealloc(self.ptr, self.layout) }
    }
}

/// A run that owns handles to its memory while it sits in a queue.
struct OwnedRun {
    dst: Memory,
    dst_offset: usize,
    src: Memory,
    src_offset: usize,
    len: usize,
}

impl OwnedRun {
    fn ends(&self) -> (*mut u8, *const u8) {
        ends(&self.dst, self.dst_offset, &self.src, self.src_offset)
    }

    /// The copy of a stream: large runs with streaming stores (the stream
    /// fences after each batch).
    fn execute(&self) {
        let (dst, src) = self.ends();
        // SAFETY: the run was validated (same device, in bounds) and the
        // handles keep both regions alive.
        unsafe { stream_run(dst, src, self.len) };
    }

    /// A plain `memcpy` (the C library's).
    fn execute_plain(&self) {
        let (dst, src) = self.ends();
        // SAFETY: the run was validated (same device, in bounds, no overlap
        // inside one region) and the handles keep both regions alive.
        unsafe { std::ptr::copy(src, dst, self.len) };
    }
}

/// Copies one validated run: streaming stores where the ranges are
/// disjoint, `memmove` where they overlap.
///
/// # Safety
/// Both ranges lie within live regions of this device (a validated run).
unsafe fn stream_run(dst: *mut u8, src: *const u8, len: usize) {
    let disjoint = dst as usize >= src as usize + len || src as usize >= dst as usize + len;
    if disjoint {
        // SAFETY: the caller's contract, and the ranges are disjoint.
        unsafe { super::stream_copy::copy(dst, src, len) };
    } else {
        // SAFETY: the caller's contract; `copy` allows the overlap.
        unsafe { std::ptr::copy(src, dst, len) };
    }
}

enum Op {
    Copy(Vec<OwnedRun>),
    HostFn(HostFn),
    Record(Arc<EventShared>, u64),
    Wait(Arc<EventShared>, u64),
}

#[derive(Default)]
struct StreamState {
    submitted: u64,
    completed: u64,
    error: Option<DeviceError>,
}

struct StreamShared {
    state: Mutex<StreamState>,
    cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned mutex only means another thread panicked while holding it;
    // the counters it guards stay consistent, so carry on.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A host stream: a worker thread executing its queue in order.
pub struct HostStream {
    device: DeviceId,
    shared: Arc<StreamShared>,
    tx: Sender<Op>,
}

impl HostStream {
    fn spawn(device: DeviceId) -> Result<Self> {
        let (tx, rx) = unbounded::<Op>();
        let shared = Arc::new(StreamShared {
            state: Mutex::new(StreamState::default()),
            cv: Condvar::new(),
        });
        let worker = Arc::clone(&shared);
        thread::Builder::new()
            .name("ucm-host-stream".into())
            .spawn(move || {
                // The "device": its copies must not take the core of the
                // thread that queued them.
                crate::io::background_worker_thread();
                // Runs until every handle is gone and the queue is drained,
                // so events recorded here always complete.
                for op in rx {
                    worker.execute(op);
                }
            })
            .map_err(|e| DeviceError::Io {
                op: "spawn stream worker",
                path: None,
                source: e,
            })?;
        Ok(HostStream { device, shared, tx })
    }

    fn push(&self, op: Op) -> Result<()> {
        let mut st = lock(&self.shared.state);
        st.submitted += 1;
        if self.tx.send(op).is_err() {
            st.submitted -= 1;
            return Err(DeviceError::Closed("host stream"));
        }
        Ok(())
    }
}

impl StreamShared {
    fn poisoned(&self) -> Option<DeviceError> {
        lock(&self.state).error.clone()
    }

    fn execute(&self, op: Op) {
        let poisoned = self.poisoned();
        let outcome = match op {
            Op::Copy(runs) => {
                if poisoned.is_none() {
                    runs.iter().for_each(OwnedRun::execute);
                    // The batch's streaming stores land before it is
                    // reported complete.
                    super::stream_copy::fence();
                }
                Ok(())
            }
            Op::HostFn(f) => match poisoned {
                // A panicking host function is an error of the stream's
                // work like any other (sticky), never a dead stream whose
                // waiters block for good.
                None => {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
                        Err(DeviceError::Stream(format!(
                            "host function panicked: {}",
                            crate::error::panic_message(p.as_ref())
                        )))
                    })
                }
                Some(_) => Ok(()),
            },
            Op::Record(event, epoch) => {
                event.complete(epoch, poisoned.clone());
                Ok(())
            }
            Op::Wait(event, epoch) => match poisoned {
                None => event.wait_epoch(epoch),
                Some(_) => Ok(()),
            },
        };
        let mut st = lock(&self.state);
        if let Err(e) = outcome {
            st.error.get_or_insert(e);
        }
        st.completed += 1;
        self.cv.notify_all();
    }
}

#[derive(Default)]
struct EventState {
    recorded: u64,
    completed: u64,
    error: Option<DeviceError>,
}

struct EventShared {
    state: Mutex<EventState>,
    cv: Condvar,
}

impl EventShared {
    fn complete(&self, epoch: u64, error: Option<DeviceError>) {
        let mut st = lock(&self.state);
        if epoch >= st.completed {
            st.completed = epoch;
            st.error = error;
        }
        self.cv.notify_all();
    }

    /// Blocks until the record of `epoch` completed; returns its error.
    fn wait_epoch(&self, epoch: u64) -> Result<()> {
        let mut st = lock(&self.state);
        while st.completed < epoch {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        match &st.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

/// A host event.
pub struct HostEvent {
    device: DeviceId,
    shared: Arc<EventShared>,
}

impl Device for HostDevice {
    type Stream = HostStream;
    type Event = HostEvent;

    fn name(&self) -> &'static str {
        "host"
    }

    fn id(&self) -> DeviceId {
        self.id
    }

    fn copy_alignment(&self) -> usize {
        self.copy_align
    }

    fn alloc_device(&self, len: usize) -> Result<Memory> {
        self.alloc(MemKind::Device, len)
    }

    fn alloc_pinned(&self, len: usize) -> Result<Memory> {
        self.alloc(MemKind::Pinned, len)
    }

    unsafe fn register_host(&self, addr: *mut u8, len: usize) -> Result<Memory> {
        check_region(addr.is_null(), len, "host")?;
        Ok(Memory::from_parts(
            self.id,
            MemKind::Pinned,
            addr as u64,
            len,
            Box::new(()),
        ))
    }

    unsafe fn import_device(&self, addr: u64, len: usize) -> Result<Memory> {
        check_region(addr == 0, len, "device")?;
        Ok(Memory::from_parts(
            self.id,
            MemKind::Device,
            addr,
            len,
            Box::new(()),
        ))
    }

    fn create_stream(&self) -> Result<HostStream> {
        HostStream::spawn(self.id)
    }

    fn create_event(&self) -> Result<HostEvent> {
        Ok(HostEvent {
            device: self.id,
            shared: Arc::new(EventShared {
                state: Mutex::new(EventState::default()),
                cv: Condvar::new(),
            }),
        })
    }

    fn copy_async(&self, stream: &HostStream, run: &CopyRun<'_>) -> Result<()> {
        self.copy_batch_async(stream, std::slice::from_ref(run))
    }

    fn copy_batch_async(&self, stream: &HostStream, runs: &[CopyRun<'_>]) -> Result<()> {
        self.check_stream(stream)?;
        let owned = self.validate_runs(runs)?;
        if owned.is_empty() {
            return Ok(());
        }
        stream.push(Op::Copy(owned))
    }

    fn launch_host_fn(&self, stream: &HostStream, f: HostFn) -> Result<()> {
        self.check_stream(stream)?;
        stream.push(Op::HostFn(f))
    }

    fn record_event(&self, event: &HostEvent, stream: &HostStream) -> Result<()> {
        self.check_stream(stream)?;
        self.check_event(event)?;
        // Hold the event lock across the push so that concurrent records
        // enqueue in epoch order.
        let mut st = lock(&event.shared.state);
        st.recorded += 1;
        let epoch = st.recorded;
        if let Err(e) = stream.push(Op::Record(Arc::clone(&event.shared), epoch)) {
            st.recorded -= 1;
            return Err(e);
        }
        Ok(())
    }

    fn query_event(&self, event: &HostEvent) -> Result<bool> {
        self.check_event(event)?;
        let st = lock(&event.shared.state);
        if st.completed < st.recorded {
            return Ok(false);
        }
        match &st.error {
            Some(e) => Err(e.clone()),
            None => Ok(true),
        }
    }

    fn synchronize_event(&self, event: &HostEvent) -> Result<()> {
        self.check_event(event)?;
        let epoch = lock(&event.shared.state).recorded;
        event.shared.wait_epoch(epoch)
    }

    fn stream_wait_event(&self, stream: &HostStream, event: &HostEvent) -> Result<()> {
        self.check_stream(stream)?;
        self.check_event(event)?;
        let epoch = lock(&event.shared.state).recorded;
        if epoch == 0 {
            // Never recorded: nothing to wait for (CUDA and ACL agree).
            return Ok(());
        }
        stream.push(Op::Wait(Arc::clone(&event.shared), epoch))
    }

    fn copy_batch_sync(&self, stream: &HostStream, runs: &[CopyRun<'_>]) -> Result<()> {
        self.check_stream(stream)?;
        let valid = CopyRun::validate_batch(runs, self.id, self.copy_align)?;
        let st = lock(&stream.shared.state);
        if st.completed == st.submitted {
            // Idle: nothing queued can run before or beside these runs, and
            // the lock held keeps later submissions behind them. The runs
            // are borrowed for the call: no handle is cloned.
            if let Some(e) = &st.error {
                return Err(e.clone());
            }
            for (r, _) in valid {
                let (dst, src) = ends(r.dst, r.dst_offset, r.src, r.src_offset);
                // SAFETY: validated (this device, in bounds), and the
                // caller's borrows keep both regions alive for the call.
                unsafe { stream_run(dst, src, r.len) };
            }
            super::stream_copy::fence();
            return Ok(());
        }
        drop(st);
        let owned = own(valid);
        if !owned.is_empty() {
            stream.push(Op::Copy(owned))?;
        }
        self.synchronize_stream(stream)
    }

    fn synchronize_stream(&self, stream: &HostStream) -> Result<()> {
        self.check_stream(stream)?;
        let shared = &stream.shared;
        let mut st = lock(&shared.state);
        let target = st.submitted;
        while st.completed < target {
            st = shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        match &st.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}
