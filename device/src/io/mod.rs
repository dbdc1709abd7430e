//! The storage side of the HAL: the [`IoEngine`] trait and its backends.
//!
//! An engine takes a batch of [`IoRequest`]s (aligned reads, writes,
//! vectored writes and fsyncs at file offsets) and returns one
//! [`IoTicket`] per request, so a caller can wait for each operation on
//! its own. The engine owns each
//! request's [`IoBuf`] while the kernel may touch it and hands it back in
//! the [`IoOutput`]: no buffer is freed under an I/O in flight, on any
//! backend.
//!
//! Backends: io_uring (feature `io-uring`), libaio (kernel AIO syscalls) and
//! POSIX (pread/pwrite on a small thread pool). [`IoEngineConfig::build`]
//! picks one at run time; `Auto` probes them in that order
//! ([`IoEngineConfig::for_dir`] takes POSIX for a directory on tmpfs).
//!
//! Red line: engines move bytes between buffers and files. They never know
//! what the bytes mean.

mod aio;
pub mod buf;
pub mod dir;
pub mod faults;
pub mod file;
pub mod fs;
mod posix;
pub mod small;
#[cfg(feature = "io-uring")]
mod uring;
mod worker;

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

pub use buf::{IoBuf, DIRECT_IO_ALIGN};
pub use dir::{Entry, IoDir};
pub use file::{IoFile, OpenOptions};
pub use small::{read_small_file, SmallFileError, SMALL_FILE_LIMIT};

use crate::error::{DeviceError, Result};
use faults::{FaultOp, Injected};

/// Largest single transfer (Linux caps read/write at this count).
pub const MAX_IO_BYTES: usize = 0x7fff_f000;

/// Most buffers one vectored write takes (`buf` and its gather list
/// together; Linux's `IOV_MAX`).
pub const MAX_IO_BUFFERS: usize = 1024;

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoOp {
    /// Read `buf.len()` bytes at `offset` into `buf`.
    Read,
    /// Write `buf` at `offset`.
    Write,
    /// Flush the file's data and metadata to stable storage.
    Fsync,
}

/// One operation of a batch.
#[derive(Debug)]
pub struct IoRequest {
    /// The operation.
    pub op: IoOp,
    /// The file.
    pub file: Arc<IoFile>,
    /// Byte offset in the file (ignored by fsync).
    pub offset: u64,
    /// The buffer (reads and writes only).
    pub buf: Option<IoBuf>,
    /// Further buffers of a write, written right after `buf` in this order
    /// by one vectored operation (`pwritev`); empty for every other request.
    /// A file block split over several buffers (a header and its shards)
    /// then costs one operation, not one per buffer.
    pub gather: Vec<IoBuf>,
}

impl IoRequest {
    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(file: Arc<IoFile>, offset: u64, buf: IoBuf) -> Self {
        IoRequest {
            op: IoOp::Read,
            file,
            offset,
            buf: Some(buf),
            gather: Vec::new(),
        }
    }

    /// Writes `buf` at `offset`.
    pub fn write(file: Arc<IoFile>, offset: u64, buf: IoBuf) -> Self {
        IoRequest::write_vectored(file, offset, buf, Vec::new())
    }

    /// Writes `buf`, then each of `gather` right after it, at `offset`, in
    /// one operation. On an `O_DIRECT` file every buffer must be aligned
    /// and of an aligned length.
    pub fn write_vectored(file: Arc<IoFile>, offset: u64, buf: IoBuf, gather: Vec<IoBuf>) -> Self {
        IoRequest {
            op: IoOp::Write,
            file,
            offset,
            buf: Some(buf),
            gather,
        }
    }

    /// Writes `bufs` back to back from `offset` in as few vectored writes
    /// as the limits allow (at most [`MAX_IO_BUFFERS`] buffers and
    /// [`MAX_IO_BYTES`] bytes each), in file order. Empty for no buffers.
    pub fn writes_vectored(file: &Arc<IoFile>, mut offset: u64, bufs: Vec<IoBuf>) -> Vec<Self> {
        let mut out = Vec::new();
        let mut group: Vec<IoBuf> = Vec::new();
        let (mut start, mut bytes) = (offset, 0usize);
        let flush = |group: &mut Vec<IoBuf>, start: u64, out: &mut Vec<IoRequest>| {
            let mut g = std::mem::take(group).into_iter();
            if let Some(first) = g.next() {
                out.push(IoRequest::write_vectored(
                    Arc::clone(file),
                    start,
                    first,
                    g.collect(),
                ));
            }
        };
        for b in bufs {
            let fits = group.len() < MAX_IO_BUFFERS
                && bytes
                    .checked_add(b.len())
                    .is_some_and(|n| n <= MAX_IO_BYTES);
            if !fits {
                flush(&mut group, start, &mut out);
                (start, bytes) = (offset, 0);
            }
            bytes = bytes.saturating_add(b.len());
            offset = offset.saturating_add(b.len() as u64);
            group.push(b);
        }
        flush(&mut group, start, &mut out);
        out
    }

    /// Flushes `file`.
    pub fn fsync(file: Arc<IoFile>) -> Self {
        IoRequest {
            op: IoOp::Fsync,
            file,
            offset: 0,
            buf: None,
            gather: Vec::new(),
        }
    }
}

/// The outcome of one request.
///
/// `result` is the byte count: for a read it may be short (end of file);
/// a write is either whole or an error ([`DeviceError::ShortWrite`]); an
/// fsync gives 0.
#[derive(Debug)]
pub struct IoOutput {
    /// The request's buffer, handed back.
    pub buf: Option<IoBuf>,
    /// The request's gather buffers, handed back (empty unless vectored).
    pub gather: Vec<IoBuf>,
    /// Bytes transferred, or the error.
    pub result: Result<usize>,
}

/// Completion handle of one request.
#[derive(Debug)]
pub struct IoTicket {
    rx: Receiver<IoOutput>,
    /// Poll briefly before sleeping (engines turn it off where the waiter
    /// would steal a core from the threads doing the I/O).
    spin: bool,
}

impl IoTicket {
    fn closed() -> IoOutput {
        IoOutput {
            buf: None,
            gather: Vec::new(),
            result: Err(DeviceError::Closed("io engine")),
        }
    }

    /// Blocks until the operation completes. It polls for a few
    /// microseconds first: a fast device often completes within the time a
    /// thread takes to go to sleep and wake up again.
    pub fn wait(self) -> IoOutput {
        if self.spin {
            if let Some(out) = spin_recv(&self.rx) {
                return out;
            }
        }
        self.rx.recv().unwrap_or_else(|_| Self::closed())
    }

    /// Blocks until the operation completes, without polling first: for a
    /// caller that waits on many tickets of one batch, where polling each
    /// would only take cores from the threads completing them.
    pub fn wait_blocking(self) -> IoOutput {
        self.rx.recv().unwrap_or_else(|_| Self::closed())
    }

    /// Waits at most `timeout`; gives the ticket back if still pending.
    pub fn wait_timeout(self, timeout: Duration) -> std::result::Result<IoOutput, IoTicket> {
        match self.rx.recv_timeout(timeout) {
            Ok(out) => Ok(out),
            Err(RecvTimeoutError::Timeout) => Err(self),
            Err(RecvTimeoutError::Disconnected) => Ok(Self::closed()),
        }
    }

    /// True once the outcome is available (`wait` will not block).
    pub fn is_done(&self) -> bool {
        !self.rx.is_empty()
    }
}

/// Marks the calling thread as a background worker (Linux `SCHED_BATCH`,
/// same nice level): waking it never preempts the thread that woke it.
/// Without this, the scheduler tends to run a freshly woken I/O worker on
/// the waker's core at once, so a caller that merely submits work (an
/// engine's layer loop) stalls for as long as the worker runs. Returns
/// whether the policy was applied (it needs no privilege).
pub fn background_worker_thread() -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler` on the calling thread (pid 0) with a
    // valid, initialised parameter; it only changes scheduling policy.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) == 0 }
}

/// How long a waiter polls before it sleeps (see [`IoTicket::wait`]).
const SPIN: Duration = Duration::from_micros(50);

/// True when `threads` busy threads plus one polling waiter fit on the
/// machine's cores, so polling costs no other thread its core.
pub(crate) fn polling_fits(threads: usize) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    threads < cores
}

/// Polls `rx` for up to [`SPIN`]; `None` when nothing arrived (or the
/// sender is gone: the blocking receive then reports it).
pub(crate) fn spin_recv<T>(rx: &Receiver<T>) -> Option<T> {
    poll_recv(rx, SPIN)
}

/// Polls `rx` for up to `poll`, yielding the core between tries; `None`
/// when nothing arrived (or the sender is gone: a blocking receive after
/// it reports that). For threads that are handed work microseconds apart
/// and would otherwise sleep and be woken each time.
pub fn poll_recv<T>(rx: &Receiver<T>, poll: Duration) -> Option<T> {
    poll_with(poll, || match rx.try_recv() {
        Ok(v) => Some(Some(v)),
        Err(crossbeam_channel::TryRecvError::Disconnected) => Some(None),
        Err(crossbeam_channel::TryRecvError::Empty) => None,
    })
    .flatten()
}

/// Calls `attempt` until it gives `Some`, for up to `poll`, yielding the
/// core between tries; `None` when the time ran out.
pub(crate) fn poll_with<T>(poll: Duration, mut attempt: impl FnMut() -> Option<T>) -> Option<T> {
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = attempt() {
            return Some(v);
        }
        if start.elapsed() >= poll {
            return None;
        }
        // Yield rather than spin: on a machine with few cores the thread
        // that completes the operation may need this one.
        std::thread::yield_now();
    }
}

/// A batched, asynchronous block-I/O engine.
pub trait IoEngine: Send + Sync {
    /// Backend name: `"io_uring"`, `"libaio"` or `"posix"`.
    fn name(&self) -> &'static str;

    /// Submits a batch; returns one ticket per request, in order. Requests
    /// that break a rule (misaligned buffer or offset on an O_DIRECT file,
    /// a write to a read-only file, an offset past `i64::MAX`, a missing
    /// buffer) complete at once with that error; the rest go to the kernel.
    fn submit(&self, reqs: Vec<IoRequest>) -> Vec<IoTicket>;
}

impl fmt::Debug for dyn IoEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IoEngine({})", self.name())
    }
}

/// A validated request on its way to a backend.
pub(crate) struct Prepared {
    pub op: IoOp,
    pub file: Arc<IoFile>,
    pub offset: u64,
    pub buf: Option<IoBuf>,
    /// A vectored write's further buffers.
    pub gather: Vec<IoBuf>,
    /// Bytes to hand to the kernel (the buffers' length, or less when a
    /// short transfer is injected).
    pub submit_len: usize,
    /// A vectored write's segments (`buf`, then `gather`, cut at
    /// `submit_len`); empty for every other request.
    iov: Iovecs,
    done: Sender<IoOutput>,
}

/// The segments of a vectored write, pointing into the request's own
/// buffers.
struct Iovecs(Vec<libc::iovec>);

// SAFETY: the segments point into the `IoBuf`s of the same `Prepared`,
// which owns them exclusively and moves with them; the heap memory an
// `IoBuf` points to does not move when the `IoBuf` does, so the pointers
// stay valid on any thread for as long as the request lives.
unsafe impl Send for Iovecs {}

impl Prepared {
    /// Buffer address for the kernel (null for fsync).
    pub fn buf_ptr(&mut self) -> *mut u8 {
        match self.buf.as_mut() {
            Some(b) => b.as_mut_ptr(),
            None => std::ptr::null_mut(),
        }
    }

    /// A vectored write's segments for the kernel (`None` for any other
    /// request).
    pub fn iovecs(&self) -> Option<(*const libc::iovec, usize)> {
        let v = &self.iov.0;
        (!v.is_empty()).then_some((v.as_ptr(), v.len()))
    }

    /// The request's buffers: `buf`, then the gather list.
    fn buffers(&self) -> impl Iterator<Item = &IoBuf> {
        self.buf.iter().chain(&self.gather)
    }

    /// Total length of the request's buffers (saturating: a sum past
    /// `usize::MAX` is refused by `check` as over the per-operation limit).
    fn buffers_len(&self) -> usize {
        self.buffers().fold(0, |n, b| n.saturating_add(b.len()))
    }

    /// Builds a vectored write's segments, cut at `submit_len`.
    fn build_iovecs(&mut self) {
        if self.gather.is_empty() {
            return;
        }
        let mut left = self.submit_len;
        let mut v = Vec::with_capacity(1 + self.gather.len());
        for b in self.buf.iter_mut().chain(self.gather.iter_mut()) {
            if left == 0 {
                break;
            }
            let len = b.len().min(left);
            left -= len;
            v.push(libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: len,
            });
        }
        self.iov = Iovecs(v);
    }

    /// Completes with a kernel-style result: bytes, or `-errno`.
    pub fn complete(self, res: i64) {
        let expected = self.buffers_len();
        let path = || Some(self.file.path().to_path_buf());
        let result = if res < 0 {
            let op = match self.op {
                IoOp::Read => "read",
                IoOp::Write => "write",
                IoOp::Fsync => "fsync",
            };
            Err(DeviceError::os(op, path(), (-res) as i32))
        } else {
            let n = res as usize;
            match self.op {
                IoOp::Write if n < expected => Err(DeviceError::ShortWrite {
                    path: self.file.path().to_path_buf(),
                    offset: self.offset,
                    done: n,
                    expected,
                }),
                IoOp::Fsync => Ok(0),
                _ => Ok(n),
            }
        };
        // The ticket may have been dropped: then nobody wants the outcome,
        // and the buffer is freed here, after the kernel is done with it.
        let _ = self.done.send(IoOutput {
            buf: self.buf,
            gather: self.gather,
            result,
        });
    }

    /// Runs the operation synchronously on this thread (POSIX engine, and
    /// fallbacks). Returns bytes or `-errno`.
    pub fn execute_blocking(&mut self) -> i64 {
        let fd = self.file.raw_fd();
        let ptr = self.buf_ptr();
        let len = self.submit_len;
        let off = self.offset as libc::off_t;
        let iov = self.iovecs();
        loop {
            // SAFETY: `ptr` points to an owned buffer of at least `len` bytes
            // (checked in `prepare`), and a vectored write's segments to the
            // request's own buffers (`build_iovecs`), all living in `self`
            // for the call; `fd` is open while `self.file` lives.
            let rc = unsafe {
                match (self.op, iov) {
                    (IoOp::Read, _) => libc::pread(fd, ptr.cast(), len, off) as i64,
                    (IoOp::Write, Some((v, n))) => libc::pwritev(fd, v, n as i32, off) as i64,
                    (IoOp::Write, None) => {
                        libc::pwrite(fd, ptr.cast_const().cast(), len, off) as i64
                    }
                    (IoOp::Fsync, _) => libc::fsync(fd) as i64,
                }
            };
            if rc >= 0 {
                return rc;
            }
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if errno != libc::EINTR {
                return -(errno as i64);
            }
        }
    }
}

/// Validates `reqs`, completing the bad ones at once. Returns the tickets
/// (one per request, in order) and the requests for the backend.
pub(crate) fn prepare_batch(reqs: Vec<IoRequest>, spin: bool) -> (Vec<IoTicket>, Vec<Prepared>) {
    let mut tickets = Vec::with_capacity(reqs.len());
    let mut ready = Vec::with_capacity(reqs.len());
    for req in reqs {
        let (tx, rx) = bounded(1);
        tickets.push(IoTicket { rx, spin });
        let IoRequest {
            op,
            file,
            offset,
            buf,
            gather,
        } = req;
        let mut p = Prepared {
            op,
            file,
            offset,
            buf,
            gather,
            submit_len: 0,
            iov: Iovecs(Vec::new()),
            done: tx,
        };
        p.submit_len = p.buffers_len();
        match check(&p) {
            Err(e) => {
                let _ = p.done.send(IoOutput {
                    buf: p.buf,
                    gather: p.gather,
                    result: Err(e),
                });
            }
            Ok(Some(Injected::Errno(errno))) => p.complete(-(errno as i64)),
            Ok(Some(Injected::Short(n))) => {
                p.submit_len = p.submit_len.min(n);
                if p.submit_len == 0 {
                    p.complete(0);
                } else {
                    p.build_iovecs();
                    ready.push(p);
                }
            }
            Ok(None) => {
                p.build_iovecs();
                ready.push(p);
            }
        }
    }
    (tickets, ready)
}

fn check(p: &Prepared) -> Result<Option<Injected>> {
    let fault_op = match p.op {
        IoOp::Read => FaultOp::Read,
        IoOp::Write => FaultOp::Write,
        IoOp::Fsync => FaultOp::Fsync,
    };
    if p.op == IoOp::Fsync {
        return Ok(faults::check(fault_op, p.file.path(), 0, 0));
    }
    if p.op == IoOp::Write && !p.file.is_writable() {
        return Err(DeviceError::ReadOnly {
            path: p.file.path().to_path_buf(),
        });
    }
    if p.buf.is_none() {
        return Err(DeviceError::InvalidArgument(format!(
            "{:?} request without a buffer",
            p.op
        )));
    }
    if !p.gather.is_empty() && p.op != IoOp::Write {
        return Err(DeviceError::InvalidArgument(format!(
            "{:?} request with gather buffers (only writes are vectored)",
            p.op
        )));
    }
    if 1 + p.gather.len() > MAX_IO_BUFFERS {
        return Err(DeviceError::InvalidArgument(format!(
            "a vectored write of {} buffers exceeds the limit of {MAX_IO_BUFFERS}",
            1 + p.gather.len()
        )));
    }
    let total = p.buffers_len();
    if total > MAX_IO_BYTES {
        return Err(DeviceError::InvalidArgument(format!(
            "{:?} of {total} bytes exceeds the per-operation limit of {MAX_IO_BYTES}",
            p.op
        )));
    }
    if p.buffers().any(IoBuf::is_empty) {
        return Err(DeviceError::InvalidArgument(format!(
            "{:?} request with an empty buffer",
            p.op
        )));
    }
    let end = p.offset.checked_add(total as u64);
    if end.is_none_or(|e| e > i64::MAX as u64) {
        return Err(DeviceError::OutOfBounds {
            what: "file offset",
            offset: p.offset,
            len: total as u64,
            limit: i64::MAX as u64,
        });
    }
    if p.file.is_direct() {
        for b in p.buffers() {
            b.check_direct()?;
        }
        if p.offset % DIRECT_IO_ALIGN as u64 != 0 {
            return Err(DeviceError::Misaligned {
                what: "file offset",
                value: p.offset,
                align: DIRECT_IO_ALIGN as u64,
            });
        }
    }
    Ok(faults::check(
        fault_op,
        p.file.path(),
        p.offset,
        total as u64,
    ))
}

/// Which backend to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoEngineKind {
    /// The first that works here: io_uring, then libaio, then POSIX.
    Auto,
    /// io_uring.
    IoUring,
    /// Kernel AIO (io_setup / io_submit / io_getevents).
    Libaio,
    /// pread / pwrite on a thread pool.
    Posix,
}

impl IoEngineKind {
    /// The concrete kinds, in `Auto`'s order of preference.
    pub const CONCRETE: [IoEngineKind; 3] = [
        IoEngineKind::IoUring,
        IoEngineKind::Libaio,
        IoEngineKind::Posix,
    ];

    /// The name used in configs, CLI flags and reports.
    pub fn name(self) -> &'static str {
        match self {
            IoEngineKind::Auto => "auto",
            IoEngineKind::IoUring => "io_uring",
            IoEngineKind::Libaio => "libaio",
            IoEngineKind::Posix => "posix",
        }
    }
}

impl fmt::Display for IoEngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for IoEngineKind {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(IoEngineKind::Auto),
            "io_uring" | "uring" | "io-uring" => Ok(IoEngineKind::IoUring),
            "libaio" | "aio" => Ok(IoEngineKind::Libaio),
            "posix" | "psync" => Ok(IoEngineKind::Posix),
            other => Err(DeviceError::InvalidArgument(format!(
                "unknown io engine {other:?} (expected auto, io_uring, libaio or posix)"
            ))),
        }
    }
}

/// Builds an [`IoEngine`] at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoEngineConfig {
    /// Which backend.
    pub kind: IoEngineKind,
    /// Worker threads: rings for io_uring and libaio (one ring or AIO
    /// context each), pool threads for POSIX.
    pub workers: usize,
    /// Operations in flight per worker (ring and AIO context size).
    pub queue_depth: usize,
}

impl Default for IoEngineConfig {
    fn default() -> Self {
        IoEngineConfig {
            kind: IoEngineKind::Auto,
            workers: 1,
            queue_depth: 128,
        }
    }
}

impl IoEngineConfig {
    /// A default config for `kind`. POSIX gets 4 pool threads, the ring
    /// engines one ring.
    pub fn new(kind: IoEngineKind) -> Self {
        let workers = if kind == IoEngineKind::Posix { 4 } else { 1 };
        IoEngineConfig {
            kind,
            workers,
            ..Self::default()
        }
    }

    /// The config for files in `dir` (a store's directory, made or not):
    /// `Auto` becomes POSIX where `dir` lies on tmpfs, any other kind is
    /// kept (decision D88). On tmpfs every read and write is a memory copy
    /// done by the thread that issues it: the POSIX engine's threads copy
    /// at once, where io_uring hands each buffered write to a kernel
    /// worker of its own (measured on 2 cores: 64 KiB dumps at 2.8 GiB/s
    /// through POSIX against 0.6-1.9 through io_uring).
    pub fn for_dir(kind: IoEngineKind, dir: &Path) -> Self {
        match kind {
            IoEngineKind::Auto if dir::path_on_tmpfs(dir) => Self::new(IoEngineKind::Posix),
            k => Self::new(k),
        }
    }

    /// Builds the engine. A backend the kernel (or this build) refuses
    /// gives [`DeviceError::Unsupported`]; `Auto` then tries the next.
    pub fn build(&self) -> Result<Box<dyn IoEngine>> {
        if self.workers == 0 || self.queue_depth == 0 {
            return Err(DeviceError::InvalidArgument(
                "io engine needs at least one worker and a queue depth of at least 1".into(),
            ));
        }
        match self.kind {
            IoEngineKind::Auto => {
                let mut reasons = Vec::new();
                for kind in IoEngineKind::CONCRETE {
                    let mut cfg = IoEngineConfig::new(kind);
                    cfg.queue_depth = self.queue_depth;
                    match cfg.build() {
                        Ok(e) => return Ok(e),
                        Err(e) => {
                            log::info!("io engine {kind} not used: {e}");
                            reasons.push(e.to_string());
                        }
                    }
                }
                Err(DeviceError::Unsupported {
                    backend: "auto",
                    reason: reasons.join("; "),
                })
            }
            IoEngineKind::IoUring => build_uring(self),
            IoEngineKind::Libaio => Ok(Box::new(aio::AioEngine::new(self)?)),
            IoEngineKind::Posix => Ok(Box::new(posix::PosixEngine::new(self)?)),
        }
    }
}

#[cfg(feature = "io-uring")]
fn build_uring(cfg: &IoEngineConfig) -> Result<Box<dyn IoEngine>> {
    Ok(Box::new(uring::UringEngine::new(cfg)?))
}

#[cfg(not(feature = "io-uring"))]
fn build_uring(_cfg: &IoEngineConfig) -> Result<Box<dyn IoEngine>> {
    Err(DeviceError::Unsupported {
        backend: "io_uring",
        reason: "not built: this build has no `io-uring` feature".into(),
    })
}

/// Checks that `kind` can run here (the kernel accepts it), without
/// building a full engine.
pub fn probe(kind: IoEngineKind) -> Result<()> {
    match kind {
        IoEngineKind::Auto => Ok(()),
        IoEngineKind::IoUring => probe_uring(),
        IoEngineKind::Libaio => aio::probe(),
        IoEngineKind::Posix => Ok(()),
    }
}

#[cfg(feature = "io-uring")]
fn probe_uring() -> Result<()> {
    uring::probe()
}

#[cfg(not(feature = "io-uring"))]
fn probe_uring() -> Result<()> {
    build_uring(&IoEngineConfig::default()).map(|_| ())
}

/// What `ucm info` says of an I/O engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineStatus {
    /// Engine name.
    pub name: &'static str,
    /// Whether it works here.
    pub available: bool,
    /// Why not, or what was checked.
    pub reason: String,
    /// Whether O_DIRECT I/O through it worked in the probed directory.
    pub o_direct: bool,
}

/// Probes every engine: builds it, then writes, fsyncs and reads back one
/// O_DIRECT block in a scratch file under `dir` (removed afterwards).
pub fn probe_engines(dir: &Path) -> Vec<EngineStatus> {
    IoEngineKind::CONCRETE
        .iter()
        .map(|&kind| {
            let name = kind.name();
            let built = probe(kind).and_then(|_| IoEngineConfig::new(kind).build());
            match built {
                Err(e) => EngineStatus {
                    name,
                    available: false,
                    reason: e.to_string(),
                    o_direct: false,
                },
                Ok(engine) => match round_trip_probe(engine.as_ref(), dir) {
                    Ok(direct) => EngineStatus {
                        name,
                        available: true,
                        reason: if direct {
                            format!("write/fsync/read with O_DIRECT ok in {}", dir.display())
                        } else {
                            format!("O_DIRECT refused in {}; buffered I/O works", dir.display())
                        },
                        o_direct: direct,
                    },
                    Err(e) => EngineStatus {
                        name,
                        available: false,
                        reason: format!("probe I/O in {} failed: {e}", dir.display()),
                        o_direct: false,
                    },
                },
            }
        })
        .collect()
}

fn round_trip_probe(engine: &dyn IoEngine, dir: &Path) -> Result<bool> {
    let path = dir.join(format!(
        ".ucm-probe-{}-{}",
        std::process::id(),
        engine.name()
    ));
    let result = (|| {
        let file = Arc::new(IoFile::open(&path, OpenOptions::read_write())?);
        let data: Vec<u8> = (0..DIRECT_IO_ALIGN).map(|i| (i * 31 % 251) as u8).collect();
        let mut t = engine.submit(vec![IoRequest::write(
            Arc::clone(&file),
            0,
            IoBuf::from_slice(&data),
        )]);
        t.pop().map_or(Ok(0), |t| t.wait().result)?;
        let mut t = engine.submit(vec![IoRequest::fsync(Arc::clone(&file))]);
        t.pop().map_or(Ok(0), |t| t.wait().result)?;
        let mut t = engine.submit(vec![IoRequest::read(
            Arc::clone(&file),
            0,
            IoBuf::new(DIRECT_IO_ALIGN),
        )]);
        let out = t.pop().map_or_else(IoTicket::closed, IoTicket::wait);
        let n = out.result?;
        let ok = n == data.len() && out.buf.as_ref().is_some_and(|b| b.as_slice() == data);
        if !ok {
            return Err(DeviceError::InvalidArgument(
                "probe read back different bytes".into(),
            ));
        }
        Ok(file.is_direct())
    })();
    let _ = std::fs::remove_file(&path);
    result
}
