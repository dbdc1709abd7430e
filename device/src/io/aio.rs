//! The libaio engine: Linux kernel AIO through raw syscalls
//! (`io_setup`, `io_submit`, `io_getevents`, `io_destroy`) with a
//! `#[repr(C)]` iocb, one AIO context per worker.

use super::worker::{RingBackend, Workers};
use super::{IoEngine, IoEngineConfig, IoOp, IoRequest, IoTicket, Prepared};
use crate::error::{DeviceError, Result};

#[cfg(not(target_endian = "little"))]
compile_error!("the libaio iocb layout below is the little-endian one");

type AioContext = libc::c_ulong;

const IOCB_CMD_PREAD: u16 = 0;
const IOCB_CMD_PWRITE: u16 = 1;
const IOCB_CMD_FSYNC: u16 = 2;
const IOCB_CMD_PWRITEV: u16 = 8;

/// `struct iocb` of `<linux/aio_abi.h>`, little-endian field order.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Iocb {
    aio_data: u64,
    aio_key: u32,
    aio_rw_flags: i32,
    aio_lio_opcode: u16,
    aio_reqprio: i16,
    aio_fildes: u32,
    aio_buf: u64,
    aio_nbytes: u64,
    aio_offset: i64,
    aio_reserved2: u64,
    aio_flags: u32,
    aio_resfd: u32,
}

/// `struct io_event` of `<linux/aio_abi.h>`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

const _: () = assert!(std::mem::size_of::<Iocb>() == 64);
const _: () = assert!(std::mem::size_of::<IoEvent>() == 32);

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn unsupported(reason: String) -> DeviceError {
    DeviceError::Unsupported {
        backend: "libaio",
        reason,
    }
}

fn setup(nr: usize) -> Result<AioContext> {
    let mut ctx: AioContext = 0;
    // SAFETY: io_setup writes the new context id to `ctx`, a valid out-pointer.
    let rc = unsafe { libc::syscall(libc::SYS_io_setup, nr as libc::c_long, &mut ctx) };
    if rc < 0 {
        let e = std::io::Error::from_raw_os_error(errno());
        return Err(unsupported(format!("io_setup({nr}) refused: {e}")));
    }
    Ok(ctx)
}

fn destroy(ctx: AioContext) {
    // SAFETY: `ctx` came from io_setup and is destroyed once.
    unsafe {
        libc::syscall(libc::SYS_io_destroy, ctx);
    }
}

/// Checks that the kernel gives us an AIO context.
pub(crate) fn probe() -> Result<()> {
    destroy(setup(1)?);
    Ok(())
}

struct AioRing {
    ctx: AioContext,
    depth: usize,
    /// Built but not yet accepted by the kernel, in submission order.
    pending: Vec<Iocb>,
    /// Fsyncs the kernel refused (EINVAL on file systems without AIO
    /// fsync), run synchronously: `(id, result)`.
    sync_fallback: Vec<(u64, i64)>,
    fds_for_fallback: Vec<(u64, i32)>,
    events: Vec<IoEvent>,
    inflight: usize,
}

impl AioRing {
    fn new(depth: usize) -> Result<Self> {
        Ok(AioRing {
            ctx: setup(depth)?,
            depth,
            pending: Vec::with_capacity(depth),
            sync_fallback: Vec::new(),
            fds_for_fallback: Vec::new(),
            events: vec![IoEvent::default(); depth],
            inflight: 0,
        })
    }

    fn submit_pending(&mut self, refused: &mut Vec<(u64, i64)>) {
        while !self.pending.is_empty() {
            let mut ptrs: Vec<*mut Iocb> =
                self.pending.iter_mut().map(|c| c as *mut Iocb).collect();
            // SAFETY: every pointer is a live iocb in `self.pending`; the
            // kernel copies them during the call. The buffers they name are
            // owned by the worker's in-flight table until completion.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_io_submit,
                    self.ctx,
                    ptrs.len() as libc::c_long,
                    ptrs.as_mut_ptr(),
                )
            };
            if rc > 0 {
                let n = rc as usize;
                self.inflight += n;
                self.pending.drain(..n);
                continue;
            }
            let e = if rc == 0 { libc::EAGAIN } else { errno() };
            match e {
                libc::EINTR => continue,
                // The context is full: wait for completions first.
                libc::EAGAIN => return,
                _ => {
                    // The first pending iocb was refused.
                    let cb = self.pending.remove(0);
                    if cb.aio_lio_opcode == IOCB_CMD_FSYNC && e == libc::EINVAL {
                        self.fds_for_fallback
                            .push((cb.aio_data, cb.aio_fildes as i32));
                    } else {
                        refused.push((cb.aio_data, -(e as i64)));
                    }
                }
            }
        }
    }
}

impl RingBackend for AioRing {
    fn push(&mut self, id: u64, p: &mut Prepared) -> bool {
        if self.inflight + self.pending.len() >= self.depth {
            return false;
        }
        // A vectored write hands the kernel its segments: `aio_buf` is
        // then the iovec array and `aio_nbytes` their count.
        let (opcode, buf, nbytes) = match (p.op, p.iovecs()) {
            (IoOp::Read, _) => (IOCB_CMD_PREAD, p.buf_ptr() as u64, p.submit_len as u64),
            (IoOp::Write, Some((v, n))) => (IOCB_CMD_PWRITEV, v as u64, n as u64),
            (IoOp::Write, None) => (IOCB_CMD_PWRITE, p.buf_ptr() as u64, p.submit_len as u64),
            (IoOp::Fsync, _) => (IOCB_CMD_FSYNC, p.buf_ptr() as u64, p.submit_len as u64),
        };
        self.pending.push(Iocb {
            aio_data: id,
            aio_lio_opcode: opcode,
            aio_fildes: p.file.raw_fd() as u32,
            aio_buf: buf,
            aio_nbytes: nbytes,
            aio_offset: p.offset as i64,
            ..Iocb::default()
        });
        true
    }

    fn submit_and_wait(&mut self, min: usize, refused: &mut Vec<(u64, i64)>) {
        self.submit_pending(refused);
        for (id, fd) in self.fds_for_fallback.drain(..) {
            // SAFETY: the descriptor belongs to a file the in-flight table
            // keeps open until this operation completes.
            let rc = unsafe { libc::fsync(fd) };
            let res = if rc == 0 { 0 } else { -(errno() as i64) };
            self.sync_fallback.push((id, res));
        }
        if min == 0 || self.inflight == 0 || !refused.is_empty() || !self.sync_fallback.is_empty() {
            return;
        }
        loop {
            // SAFETY: `events` has room for `depth` entries; a null timeout
            // blocks until at least `min` events are available.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_io_getevents,
                    self.ctx,
                    min as libc::c_long,
                    self.events.len() as libc::c_long,
                    self.events.as_mut_ptr(),
                    std::ptr::null_mut::<libc::timespec>(),
                )
            };
            if rc >= 0 {
                let n = rc as usize;
                self.inflight -= n;
                for ev in &self.events[..n] {
                    self.sync_fallback.push((ev.data, ev.res));
                }
                return;
            }
            if errno() != libc::EINTR {
                log::error!(
                    "io_getevents failed: {}; retrying",
                    std::io::Error::last_os_error()
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
                return;
            }
        }
    }

    fn reap(&mut self, out: &mut Vec<(u64, i64)>) {
        out.append(&mut self.sync_fallback);
    }
}

impl Drop for AioRing {
    fn drop(&mut self) {
        // The worker loop only returns once nothing is in flight.
        destroy(self.ctx);
    }
}

/// The libaio engine.
pub(crate) struct AioEngine {
    workers: Workers,
}

impl AioEngine {
    pub fn new(cfg: &IoEngineConfig) -> Result<Self> {
        probe()?;
        let depth = cfg.queue_depth;
        let workers = Workers::start("aio", cfg.workers, depth, || AioRing::new(depth))?;
        Ok(AioEngine { workers })
    }
}

impl IoEngine for AioEngine {
    fn name(&self) -> &'static str {
        "libaio"
    }

    fn submit(&self, reqs: Vec<IoRequest>) -> Vec<IoTicket> {
        self.workers.submit(reqs)
    }
}
