//! The io_uring engine: one ring per worker, `submit_and_wait` when idle.

use io_uring::{opcode, squeue, types, IoUring, Probe};

use super::worker::{RingBackend, Workers};
use super::{IoEngine, IoEngineConfig, IoOp, IoRequest, IoTicket, Prepared};
use crate::error::{DeviceError, Result};

fn unsupported(reason: String) -> DeviceError {
    DeviceError::Unsupported {
        backend: "io_uring",
        reason,
    }
}

/// Checks that the kernel gives us a ring and supports the opcodes we use.
pub(crate) fn probe() -> Result<()> {
    let ring = IoUring::new(4).map_err(|e| unsupported(format!("io_uring_setup refused: {e}")))?;
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| unsupported(format!("opcode probe refused: {e}")))?;
    for (name, code) in [
        ("READ", opcode::Read::CODE),
        ("WRITE", opcode::Write::CODE),
        ("WRITEV", opcode::Writev::CODE),
        ("FSYNC", opcode::Fsync::CODE),
    ] {
        if !probe.is_supported(code) {
            return Err(unsupported(format!("kernel lacks IORING_OP_{name}")));
        }
    }
    Ok(())
}

struct Ring {
    ring: IoUring,
}

impl RingBackend for Ring {
    fn push(&mut self, id: u64, p: &mut Prepared) -> bool {
        let fd = types::Fd(p.file.raw_fd());
        let len = p.submit_len as u32;
        let ptr = p.buf_ptr();
        let entry: squeue::Entry = match (p.op, p.iovecs()) {
            (IoOp::Read, _) => opcode::Read::new(fd, ptr, len).offset(p.offset).build(),
            (IoOp::Write, Some((v, n))) => opcode::Writev::new(fd, v, n as u32)
                .offset(p.offset)
                .build(),
            (IoOp::Write, None) => opcode::Write::new(fd, ptr.cast_const(), len)
                .offset(p.offset)
                .build(),
            (IoOp::Fsync, _) => opcode::Fsync::new(fd).build(),
        };
        let entry = entry.user_data(id);
        // SAFETY: the buffers (and a vectored write's segments, which point
        // into them) and the file descriptor belong to `p`, which the worker
        // keeps in its in-flight table until this entry's completion is
        // reaped; `submit_len` is within the buffers (checked in prepare).
        unsafe { self.ring.submission().push(&entry).is_ok() }
    }

    fn submit_and_wait(&mut self, min: usize, _refused: &mut Vec<(u64, i64)>) {
        loop {
            match self.ring.submit_and_wait(min) {
                Ok(_) => return,
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // Completion queue full or kernel busy: reap, then retry.
                    Some(libc::EBUSY) | Some(libc::EAGAIN) => return,
                    _ => {
                        log::error!("io_uring submit failed: {e}; retrying");
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        return;
                    }
                },
            }
        }
    }

    fn reap(&mut self, out: &mut Vec<(u64, i64)>) {
        for cqe in self.ring.completion() {
            out.push((cqe.user_data(), cqe.result() as i64));
        }
    }
}

/// The io_uring engine.
pub(crate) struct UringEngine {
    workers: Workers,
}

impl UringEngine {
    pub fn new(cfg: &IoEngineConfig) -> Result<Self> {
        probe()?;
        let entries = cfg.queue_depth.next_power_of_two().clamp(4, 4096) as u32;
        let workers = Workers::start("uring", cfg.workers, cfg.queue_depth, || {
            let ring = IoUring::new(entries)
                .map_err(|e| unsupported(format!("io_uring_setup({entries}) refused: {e}")))?;
            Ok(Ring { ring })
        })?;
        Ok(UringEngine { workers })
    }
}

impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn submit(&self, reqs: Vec<IoRequest>) -> Vec<IoTicket> {
        self.workers.submit(reqs)
    }
}
