//! The accelerator side of the HAL: the [`Device`] trait and its memory handles.
//!
//! The trait is shaped so that each method is one runtime call on CUDA
//! (`cuMemAlloc`, `cuMemcpyAsync`, `cuEventRecord`, `cuStreamWaitEvent`, ...)
//! and on Ascend ACL (`aclrtMalloc`, `aclrtMemcpyAsync`, `aclrtRecordEvent`,
//! `aclrtStreamWaitEvent`, `aclrtSynchronizeEvent`, ...). Validation that the
//! runtimes leave to the caller (bounds, overlap, ACL's 64-byte address rule
//! for async copies) happens here, before the call, so that a bad argument
//! is an error and never undefined behaviour.
//!
//! Red line: this module knows memory, streams and events, never keys,
//! blocks or tokens.

#[cfg(feature = "ascend")]
pub mod ascend;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod handle;
pub mod host;
pub mod spec;
#[cfg(any(feature = "cuda", feature = "ascend"))]
mod sticky;
mod stream_copy;

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{DeviceError, Result};

/// Where a [`Memory`] region lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKind {
    /// Accelerator memory: only reachable through copies.
    Device,
    /// Page-locked (pinned or registered) host memory: DMA-able and also
    /// readable and writable by the host.
    Pinned,
}

/// Direction of a copy, derived from the kinds of its two ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyKind {
    /// Pinned host memory to device memory.
    HostToDevice,
    /// Device memory to pinned host memory.
    DeviceToHost,
    /// Device memory to device memory.
    DeviceToDevice,
}

impl CopyKind {
    /// Derives the direction of a copy from `dst` and `src` kinds. Host to
    /// host is refused: it is not device work (ACL rejects it too).
    pub fn between(dst: MemKind, src: MemKind) -> Result<Self> {
        match (dst, src) {
            (MemKind::Device, MemKind::Pinned) => Ok(CopyKind::HostToDevice),
            (MemKind::Pinned, MemKind::Device) => Ok(CopyKind::DeviceToHost),
            (MemKind::Device, MemKind::Device) => Ok(CopyKind::DeviceToDevice),
            (MemKind::Pinned, MemKind::Pinned) => Err(DeviceError::InvalidArgument(
                "host-to-host copies are not device work; copy on the host instead".into(),
            )),
        }
    }
}

/// Identity of one `Device` instance; memory, streams and events remember it
/// so that a handle of another device is refused instead of misused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceId(u64);

impl DeviceId {
    /// A fresh, process-unique id.
    pub fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        DeviceId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

struct MemoryInner {
    addr: u64,
    len: usize,
    kind: MemKind,
    device: DeviceId,
    // Frees (or unregisters) the region when the last handle goes. Queued
    // stream work holds a handle, so nothing is freed under a pending copy.
    _owner: Box<dyn Any + Send + Sync>,
}

/// A region of device or pinned host memory, owned by one [`Device`].
///
/// Cloning is cheap (a reference count). The region is released when the
/// last clone is dropped, and work queued on a stream holds a clone, so a
/// pending copy never outlives its memory.
#[derive(Clone)]
pub struct Memory {
    inner: Arc<MemoryInner>,
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memory")
            .field("addr", &format_args!("{:#x}", self.inner.addr))
            .field("len", &self.inner.len)
            .field("kind", &self.inner.kind)
            .finish()
    }
}

impl Memory {
    /// Wraps a region. Backends call this; `owner` releases it on drop.
    ///
    /// The caller (a backend) guarantees that `[addr, addr + len)` is valid
    /// memory of `kind` for as long as `owner` lives.
    pub fn from_parts(
        device: DeviceId,
        kind: MemKind,
        addr: u64,
        len: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Self {
        Memory {
            inner: Arc::new(MemoryInner {
                addr,
                len,
                kind,
                device,
                _owner: owner,
            }),
        }
    }

    /// Base address (a device address for [`MemKind::Device`]).
    pub fn addr(&self) -> u64 {
        self.inner.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Device or pinned host memory.
    pub fn kind(&self) -> MemKind {
        self.inner.kind
    }

    /// The device that owns this region.
    pub fn device(&self) -> DeviceId {
        self.inner.device
    }

    /// True when both handles refer to the same region.
    pub fn same_region(&self, other: &Memory) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.inner.len => Ok(()),
            _ => Err(DeviceError::OutOfBounds {
                what: "memory region",
                offset: offset as u64,
                len: len as u64,
                limit: self.inner.len as u64,
            }),
        }
    }

    fn check_host(&self) -> Result<()> {
        if self.inner.kind == MemKind::Pinned {
            Ok(())
        } else {
            Err(DeviceError::InvalidArgument(
                "device memory is not host-accessible; copy it to pinned memory first".into(),
            ))
        }
    }

    /// Copies `src` into this pinned region at `offset`.
    ///
    /// The bytes of a range that an in-flight stream operation also touches
    /// are unspecified: synchronise first.
    pub fn write_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_host()?;
        self.check_range(offset, src.len())?;
        // SAFETY: the region is pinned host memory valid for `len` bytes while
        // `self` lives (constructor contract) and the range was bounds-checked.
        unsafe {
            std::ptr::copy(
                src.as_ptr(),
                (self.inner.addr as usize + offset) as *mut u8,
                src.len(),
            );
        }
        Ok(())
    }

    /// Copies from this pinned region at `offset` into `dst`.
    ///
    /// See [`Memory::write_host`] on in-flight operations.
    pub fn read_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_host()?;
        self.check_range(offset, dst.len())?;
        // SAFETY: as in `write_host`; `dst` is a distinct Rust-owned buffer.
        unsafe {
            std::ptr::copy(
                (self.inner.addr as usize + offset) as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        Ok(())
    }
}

/// One `(src, dst, len)` run of a copy.
#[derive(Clone, Copy, Debug)]
pub struct CopyRun<'a> {
    /// Destination region.
    pub dst: &'a Memory,
    /// Byte offset into `dst`.
    pub dst_offset: usize,
    /// Source region.
    pub src: &'a Memory,
    /// Byte offset into `src`.
    pub src_offset: usize,
    /// Bytes to copy.
    pub len: usize,
}

impl<'a> CopyRun<'a> {
    /// A run copying `len` bytes from `src[src_offset..]` to `dst[dst_offset..]`.
    pub fn new(
        dst: &'a Memory,
        dst_offset: usize,
        src: &'a Memory,
        src_offset: usize,
        len: usize,
    ) -> Self {
        CopyRun {
            dst,
            dst_offset,
            src,
            src_offset,
            len,
        }
    }

    /// Checks the run against the rules every backend shares: both regions
    /// of `device`, in bounds, no overlap inside one region, addresses
    /// aligned to `align`, and a legal direction. Returns the direction.
    pub fn validate(&self, device: DeviceId, align: usize) -> Result<CopyKind> {
        if self.dst.device() != device || self.src.device() != device {
            return Err(DeviceError::InvalidArgument(
                "memory region belongs to another device".into(),
            ));
        }
        let kind = CopyKind::between(self.dst.kind(), self.src.kind())?;
        self.dst.check_range(self.dst_offset, self.len)?;
        self.src.check_range(self.src_offset, self.len)?;
        let align = align.max(1) as u64;
        for (what, addr) in [
            (
                "destination address",
                self.dst.addr() + self.dst_offset as u64,
            ),
            ("source address", self.src.addr() + self.src_offset as u64),
        ] {
            if addr % align != 0 {
                return Err(DeviceError::Misaligned {
                    what,
                    value: addr,
                    align,
                });
            }
        }
        if self.dst.same_region(self.src) {
            let (a, b) = (self.dst_offset, self.src_offset);
            if a < b + self.len && b < a + self.len && self.len > 0 {
                return Err(DeviceError::InvalidArgument(format!(
                    "overlapping copy inside one region: dst {a:#x} and src {b:#x}, {} bytes",
                    self.len
                )));
            }
        }
        Ok(kind)
    }

    /// Validates every run of a batch before any is queued (a bad run
    /// rejects the whole batch); returns the non-empty runs with their
    /// directions.
    pub fn validate_batch<'r>(
        runs: &'r [CopyRun<'a>],
        device: DeviceId,
        align: usize,
    ) -> Result<Vec<(&'r CopyRun<'a>, CopyKind)>> {
        let kinds = runs
            .iter()
            .map(|r| r.validate(device, align))
            .collect::<Result<Vec<_>>>()?;
        Ok(runs.iter().zip(kinds).filter(|(r, _)| r.len > 0).collect())
    }
}

/// Refuses a zero-byte allocation (every backend does the same).
pub(crate) fn check_alloc_len(len: usize) -> Result<()> {
    if len == 0 {
        return Err(DeviceError::InvalidArgument(
            "cannot allocate zero bytes".into(),
        ));
    }
    Ok(())
}

/// Refuses a null or empty region handed to `register_host` (`what` =
/// "host") or `import_device` (`what` = "device").
pub(crate) fn check_region(null: bool, len: usize, what: &str) -> Result<()> {
    if null || len == 0 {
        return Err(DeviceError::InvalidArgument(format!(
            "cannot {} a null or empty {what} region",
            if what == "host" { "register" } else { "import" }
        )));
    }
    Ok(())
}

/// Host work queued on a stream. Its error poisons the stream.
pub type HostFn = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

/// An accelerator runtime: memory, streams, events and copies.
///
/// Every method is non-blocking except the `synchronize_*` ones. Work queued
/// on one stream runs in order; work on different streams is ordered only
/// through events. An error of queued work is *sticky*: it poisons the
/// stream, and surfaces at every later `synchronize_stream`, at events
/// recorded after it, and in streams that wait on those events.
pub trait Device: Send + Sync + 'static {
    /// A stream: an in-order queue of device work.
    type Stream: Send + Sync;
    /// An event: a marker recorded into a stream.
    type Event: Send + Sync;

    /// The backend's name (`"host"`, `"cuda"`, `"ascend"`).
    fn name(&self) -> &'static str;

    /// This instance's identity.
    fn id(&self) -> DeviceId;

    /// Alignment that async copy addresses must have (64 on Ascend ACL, 1
    /// where the runtime has no rule). Checked before every copy.
    fn copy_alignment(&self) -> usize;

    /// Allocates `len` bytes of device memory.
    fn alloc_device(&self, len: usize) -> Result<Memory>;

    /// Allocates `len` bytes of pinned (page-locked) host memory.
    fn alloc_pinned(&self, len: usize) -> Result<Memory>;

    /// Registers an existing host region as pinned (`cuMemHostRegister`,
    /// `aclrtHostRegister`), so that e.g. a shared-memory pool is DMA-able.
    /// The registration ends when the last handle is dropped.
    ///
    /// # Safety
    /// 1. `[addr, addr + len)` must be valid, writable host memory.
    /// 2. It must stay mapped until every clone of the returned handle is
    ///    dropped and all work using it has completed.
    unsafe fn register_host(&self, addr: *mut u8, len: usize) -> Result<Memory>;

    /// Wraps device memory allocated by someone else (an engine's KV cache
    /// tensors). Nothing is freed when the handle goes.
    ///
    /// # Safety
    /// 1. `[addr, addr + len)` must be device memory of this device.
    /// 2. It must stay allocated until every clone of the returned handle is
    ///    dropped and all work using it has completed.
    unsafe fn import_device(&self, addr: u64, len: usize) -> Result<Memory>;

    /// Creates a stream.
    fn create_stream(&self) -> Result<Self::Stream>;

    /// Creates an event (timing disabled).
    fn create_event(&self) -> Result<Self::Event>;

    /// Queues one async copy on `stream`.
    fn copy_async(&self, stream: &Self::Stream, run: &CopyRun<'_>) -> Result<()>;

    /// Queues a scatter-gather copy of many runs in one call. All runs are
    /// validated before any is queued: a bad run rejects the whole batch.
    fn copy_batch_async(&self, stream: &Self::Stream, runs: &[CopyRun<'_>]) -> Result<()>;

    /// Queues `f` on `stream`; it runs after the work before it.
    fn launch_host_fn(&self, stream: &Self::Stream, f: HostFn) -> Result<()>;

    /// Records `event` at the current end of `stream`'s queue.
    fn record_event(&self, event: &Self::Event, stream: &Self::Stream) -> Result<()>;

    /// True when the work captured by the event's latest record is done (an
    /// event never recorded counts as done). The error of that work, if any,
    /// is returned instead.
    fn query_event(&self, event: &Self::Event) -> Result<bool>;

    /// Blocks the caller until the work captured by `event` is done.
    fn synchronize_event(&self, event: &Self::Event) -> Result<()>;

    /// Makes all later work on `stream` wait for `event`, on the device side:
    /// the caller is never blocked, so this is legal inside graph capture.
    fn stream_wait_event(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()>;

    /// Blocks the caller until all work queued on `stream` is done.
    fn synchronize_stream(&self, stream: &Self::Stream) -> Result<()>;

    /// [`Device::copy_batch_async`] of `runs` on `stream`, then
    /// [`Device::synchronize_stream`]: returns once the runs and everything
    /// queued before them are done. A backend may do the copy on the
    /// calling thread when the stream is idle (the host device does: it
    /// saves two thread hand-offs per batch); the order of the stream's
    /// work is the same either way.
    fn copy_batch_sync(&self, stream: &Self::Stream, runs: &[CopyRun<'_>]) -> Result<()> {
        self.copy_batch_async(stream, runs)?;
        self.synchronize_stream(stream)
    }
}

/// What `ucm info` says of a device backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendStatus {
    /// Backend name.
    pub name: &'static str,
    /// Whether it can be used here.
    pub available: bool,
    /// Why not, or what was found.
    pub reason: String,
}

/// Probes every device backend this build knows of. Never panics.
pub fn probe_devices() -> Vec<BackendStatus> {
    vec![
        BackendStatus {
            name: "host",
            available: true,
            reason: "always available: plain memory, worker threads as streams".into(),
        },
        cuda_status(),
        ascend_status(),
    ]
}

#[cfg(feature = "ascend")]
fn ascend_status() -> BackendStatus {
    let (available, reason) = ascend::probe();
    BackendStatus {
        name: "ascend",
        available,
        reason,
    }
}

#[cfg(not(feature = "ascend"))]
fn ascend_status() -> BackendStatus {
    BackendStatus {
        name: "ascend",
        available: false,
        reason: "not built: this build has no `ascend` feature".into(),
    }
}

#[cfg(feature = "cuda")]
fn cuda_status() -> BackendStatus {
    let (available, reason) = cuda::probe();
    BackendStatus {
        name: "cuda",
        available,
        reason,
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_status() -> BackendStatus {
    BackendStatus {
        name: "cuda",
        available: false,
        reason: "not built: this build has no `cuda` feature".into(),
    }
}
