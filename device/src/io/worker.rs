//! The worker loop shared by the ring engines (io_uring and libaio).
//!
//! One worker thread owns one ring (or AIO context). It blocks on its
//! channel when idle, pushes as much as the ring takes, submits, and sleeps
//! in the kernel until at least one completion arrives (no busy polling).
//! On shutdown it stops taking work and drains what is in flight before the
//! ring is torn down, so no buffer is freed under the kernel.

use std::collections::VecDeque;
use std::thread::{self, JoinHandle};

use crossbeam_channel::{unbounded, Receiver, Sender, TryRecvError};

use super::{prepare_batch, IoRequest, IoTicket, Prepared};
use crate::error::{DeviceError, Result};

/// A kernel submission interface driven by [`run`].
pub(crate) trait RingBackend: Send + 'static {
    /// Queues `p` under `id` for the next submit. False when the ring has no
    /// room: the caller keeps `p` and tries again after completions.
    fn push(&mut self, id: u64, p: &mut Prepared) -> bool;

    /// Hands queued entries to the kernel and waits until at least `min`
    /// completions are available. Operations the kernel refused at submit
    /// time are reported in `refused` as `(id, -errno)`.
    fn submit_and_wait(&mut self, min: usize, refused: &mut Vec<(u64, i64)>);

    /// Moves the available completions into `out` as `(id, result)`.
    fn reap(&mut self, out: &mut Vec<(u64, i64)>);
}

/// Slots for operations the kernel owns, indexed by id.
struct InFlight {
    slots: Vec<Option<Prepared>>,
    free: Vec<usize>,
    count: usize,
}

impl InFlight {
    fn insert(&mut self, p: Prepared) -> u64 {
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(p);
                i
            }
            None => {
                self.slots.push(Some(p));
                self.slots.len() - 1
            }
        };
        self.count += 1;
        idx as u64
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Prepared> {
        self.slots.get_mut(id as usize).and_then(Option::as_mut)
    }

    fn remove(&mut self, id: u64) -> Option<Prepared> {
        let p = self.slots.get_mut(id as usize)?.take()?;
        self.free.push(id as usize);
        self.count -= 1;
        Some(p)
    }
}

/// Runs the loop until the channel closes and everything in flight is done.
pub(crate) fn run<B: RingBackend>(mut ring: B, depth: usize, rx: Receiver<Vec<Prepared>>) {
    let mut backlog: VecDeque<Prepared> = VecDeque::new();
    let mut inflight = InFlight {
        slots: Vec::with_capacity(depth),
        free: Vec::new(),
        count: 0,
    };
    let mut open = true;
    let mut done = Vec::with_capacity(depth);
    loop {
        if inflight.count == 0 && backlog.is_empty() {
            if !open {
                return;
            }
            let next = match super::spin_recv(&rx) {
                Some(batch) => Ok(batch),
                None => rx.recv(),
            };
            match next {
                Ok(batch) => backlog.extend(batch),
                Err(_) => {
                    open = false;
                    continue;
                }
            }
        }
        while open {
            match rx.try_recv() {
                Ok(batch) => backlog.extend(batch),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        while inflight.count < depth {
            let Some(p) = backlog.pop_front() else { break };
            let id = inflight.insert(p);
            let accepted = match inflight.get_mut(id) {
                Some(slot) => ring.push(id, slot),
                None => false,
            };
            if !accepted {
                if let Some(p) = inflight.remove(id) {
                    backlog.push_front(p);
                }
                break;
            }
        }
        let min = usize::from(inflight.count > 0);
        done.clear();
        ring.submit_and_wait(min, &mut done);
        ring.reap(&mut done);
        for (id, res) in done.drain(..) {
            if let Some(p) = inflight.remove(id) {
                p.complete(res);
            }
        }
    }
}

/// A set of ring workers with round-robin dispatch.
pub(crate) struct Workers {
    senders: Vec<Sender<Vec<Prepared>>>,
    handles: Vec<JoinHandle<()>>,
    next: std::sync::atomic::AtomicUsize,
    poll: bool,
}

impl Workers {
    /// Starts one worker per ring that `make` builds.
    pub fn start<B: RingBackend>(
        name: &str,
        count: usize,
        depth: usize,
        mut make: impl FnMut() -> Result<B>,
    ) -> Result<Self> {
        let mut w = Workers {
            senders: Vec::new(),
            handles: Vec::new(),
            next: std::sync::atomic::AtomicUsize::new(0),
            poll: super::polling_fits(count),
        };
        for i in 0..count {
            let ring = make()?;
            let (tx, rx) = unbounded();
            let handle = thread::Builder::new()
                .name(format!("ucm-{name}-{i}"))
                .spawn(move || {
                    super::background_worker_thread();
                    run(ring, depth, rx)
                })
                .map_err(|e| DeviceError::Io {
                    op: "spawn io worker",
                    path: None,
                    source: e,
                })?;
            w.senders.push(tx);
            w.handles.push(handle);
        }
        Ok(w)
    }

    /// Validates and dispatches a batch to the next worker.
    pub fn submit(&self, reqs: Vec<IoRequest>) -> Vec<IoTicket> {
        let (tickets, ready) = prepare_batch(reqs, self.poll);
        if !ready.is_empty() {
            let i =
                self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.senders.len();
            if let Err(e) = self.senders[i].send(ready) {
                // Only after a worker died; fail the ops instead of losing them.
                for p in e.into_inner() {
                    p.complete(-(libc::ESHUTDOWN as i64));
                }
            }
        }
        tickets
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.senders.clear();
        for h in self.handles.drain(..) {
            // Waits for in-flight I/O to drain; a panicked worker is ignored.
            let _ = h.join();
        }
    }
}
