//! The POSIX engine: pread / pwrite / fsync on a small thread pool.

use std::thread::{self, JoinHandle};

use crossbeam_channel::{unbounded, Sender};

use super::{prepare_batch, IoEngine, IoEngineConfig, IoRequest, IoTicket, Prepared};
use crate::error::{DeviceError, Result};

/// The POSIX engine.
pub(crate) struct PosixEngine {
    tx: Option<Sender<Prepared>>,
    threads: Vec<JoinHandle<()>>,
    poll: bool,
}

impl PosixEngine {
    pub fn new(cfg: &IoEngineConfig) -> Result<Self> {
        let (tx, rx) = unbounded::<Prepared>();
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
                    while let Some(mut p) = next() {
                        let res = p.execute_blocking();
                        p.complete(res);
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
}

impl IoEngine for PosixEngine {
    fn name(&self) -> &'static str {
        "posix"
    }

    fn submit(&self, reqs: Vec<IoRequest>) -> Vec<IoTicket> {
        let (tickets, ready) = prepare_batch(reqs, self.poll);
        for p in ready {
            match &self.tx {
                Some(tx) => {
                    if let Err(e) = tx.send(p) {
                        e.into_inner().complete(-(libc::ESHUTDOWN as i64));
                    }
                }
                None => p.complete(-(libc::ESHUTDOWN as i64)),
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
