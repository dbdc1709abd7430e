//! The POSIX engine: pread / pwrite / fsync on a small thread pool.
//!
//! A submitted batch is cut into as many contiguous runs as there are
//! workers (at most), and each run goes to the pool as one message: a
//! worker that takes it executes its operations back to back, as one of
//! fio's `psync` jobs does, completing each as it finishes. A batch of 64
//! operations on 8 workers costs 8 hand-offs, not 64.

use std::thread::{self, JoinHandle};

use crossbeam_channel::{unbounded, Sender};

use super::{prepare_batch, IoEngine, IoEngineConfig, IoRequest, IoTicket, Prepared};
use crate::error::{DeviceError, Result};

/// The POSIX engine.
pub(crate) struct PosixEngine {
    tx: Option<Sender<Vec<Prepared>>>,
    threads: Vec<JoinHandle<()>>,
    poll: bool,
}

/// Cuts `ready` into at most `workers` contiguous runs of nearly equal
/// length, in order.
fn runs<T>(mut ready: Vec<T>, workers: usize) -> Vec<Vec<T>> {
    let parts = workers.clamp(1, ready.len().max(1));
    let mut out = Vec::with_capacity(parts);
    for i in (0..parts).rev() {
        // The last `len / (i + 1)` (rounded down) go to this run, so the
        // earlier runs are the longer ones.
        let take = ready.len() / (i + 1);
        let tail = ready.split_off(ready.len() - take);
        out.push(tail);
    }
    out.reverse();
    out.retain(|r| !r.is_empty());
    out
}

impl PosixEngine {
    pub fn new(cfg: &IoEngineConfig) -> Result<Self> {
        let (tx, rx) = unbounded::<Vec<Prepared>>();
        // Idle workers (and waiters) poll briefly before sleeping, unless
        // the workers alone fill the cores: then polling would steal them.
        let poll = super::polling_fits(cfg.workers);
        let mut threads = Vec::with_capacity(cfg.workers);
        for i in 0..cfg.workers {
            let rx = rx.clone();
            let h = thread::Builder::new()
                .name(format!("ucm-posix-{i}"))
                .spawn(move || {
                    super::background_worker_thread();
                    // Ends once every sender is gone and the queue is empty.
                    let next = || match poll {
                        true => super::spin_recv(&rx).or_else(|| rx.recv().ok()),
                        false => rx.recv().ok(),
                    };
                    while let Some(run) = next() {
                        for mut p in run {
                            let res = p.execute_blocking();
                            p.complete(res);
                        }
                    }
                })
                .map_err(|e| DeviceError::Io {
                    op: "spawn io worker",
                    path: None,
                    source: e,
                })?;
            threads.push(h);
        }
        Ok(PosixEngine {
            tx: Some(tx),
            threads,
            poll,
        })
    }

    fn workers(&self) -> usize {
        self.threads.len()
    }
}

impl IoEngine for PosixEngine {
    fn name(&self) -> &'static str {
        "posix"
    }

    fn submit(&self, reqs: Vec<IoRequest>) -> Vec<IoTicket> {
        let (tickets, ready) = prepare_batch(reqs, self.poll);
        if ready.is_empty() {
            return tickets;
        }
        for run in runs(ready, self.workers()) {
            let refused = match &self.tx {
                Some(tx) => tx.send(run).err().map(|e| e.into_inner()),
                None => Some(run),
            };
            for p in refused.into_iter().flatten() {
                p.complete(-(libc::ESHUTDOWN as i64));
            }
        }
        tickets
    }
}

impl Drop for PosixEngine {
    fn drop(&mut self) {
        self.tx = None;
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn a_batch_is_cut_into_contiguous_runs_one_per_worker_at_most() {
        let r = runs((0..10).collect::<Vec<u32>>(), 4);
        assert_eq!(
            r,
            vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7], vec![8, 9]]
        );
        assert_eq!(runs(vec![1, 2], 8), vec![vec![1], vec![2]]);
        assert_eq!(runs((0..64).collect::<Vec<u32>>(), 8).len(), 8);
        assert!(runs((0..64).collect::<Vec<u32>>(), 8)
            .iter()
            .all(|r| r.len() == 8));
        assert_eq!(runs(vec![7], 0), vec![vec![7]]);
        assert!(runs(Vec::<u32>::new(), 3).is_empty());
    }
}
