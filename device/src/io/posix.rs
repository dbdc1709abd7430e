//! The POSIX engine: pread / pwrite / fsync on a small thread pool.
//!
//! A submitted batch is cut into as many contiguous runs as there are
//! workers (at most), and each run goes to the pool as one message: a
//! worker that takes it executes its operations back to back, as one of
//! fio's `psync` jobs does, completing each as it finishes. A batch of 64
//! operations on 8 workers costs 8 hand-offs, not 64.
//!
//! Writes to a file whose writes the kernel serializes anyway
//! ([`IoFile::writes_serialize`]: buffered I/O, tmpfs) take another road:
//! while such a file has writes in flight, its new writes join the same
//! worker's own queue (its *lane*), so that worker goes from one write to
//! the next while it still holds the file's lock, instead of each write
//! waking another worker that then sleeps on the lock. A file with nothing
//! in flight gets the next lane in turn, so different files still spread
//! over the workers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};

use crossbeam_channel::{unbounded, Receiver, Select, Sender, TryRecvError};

use super::{prepare_batch, IoEngine, IoEngineConfig, IoOp, IoRequest, IoTicket, Prepared};
use crate::error::{DeviceError, Result};
use crate::io::IoFile;

/// Which lane each file with serialized writes in flight is on, and how
/// many of its writes are there. Files are keyed by their `IoFile`'s
/// address, which stays unique while an operation holds the file.
#[derive(Debug)]
struct LaneMap {
    lanes: usize,
    /// `file -> (lane, writes in flight)`.
    files: HashMap<usize, (usize, usize)>,
    /// The lane a file with nothing in flight gets next.
    next: usize,
    /// Writes sent to lanes so far.
    assigned: u64,
}

impl LaneMap {
    fn new(lanes: usize) -> Self {
        LaneMap {
            lanes: lanes.max(1),
            files: HashMap::new(),
            next: 0,
            assigned: 0,
        }
    }

    /// The lane for `n` more writes of `file`: the one its writes in
    /// flight are on, or the next in turn.
    fn assign(&mut self, file: usize, n: usize) -> usize {
        let (lanes, next) = (self.lanes, &mut self.next);
        let e = self.files.entry(file).or_insert_with(|| {
            let lane = *next % lanes;
            *next = next.wrapping_add(1);
            (lane, 0)
        });
        e.1 += n;
        self.assigned += n as u64;
        e.0
    }

    /// One write of `file` is done; a file with none left forgets its lane.
    fn done(&mut self, file: usize) {
        if let Some(e) = self.files.get_mut(&file) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                self.files.remove(&file);
            }
        }
    }
}

type Lanes = Arc<Mutex<LaneMap>>;

/// The POSIX engine.
pub(crate) struct PosixEngine {
    tx: Option<Sender<Vec<Prepared>>>,
    /// Each worker's own queue (its lane), for serialized writes.
    lanes_tx: Vec<Sender<Vec<Prepared>>>,
    lanes: Lanes,
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

/// Completes the operations of a run no worker can take any more.
fn refuse(run: Vec<Prepared>) {
    for p in run {
        p.complete(-(libc::ESHUTDOWN as i64));
    }
}

/// True for an operation that goes to its file's lane.
fn serialized(p: &Prepared) -> bool {
    p.op == IoOp::Write && p.file.writes_serialize()
}

fn file_key(f: &Arc<IoFile>) -> usize {
    Arc::as_ptr(f) as usize
}

/// Polls the worker's lane and the shared queue for up to [`super::SPIN`],
/// the lane first on each try: a run handed to the lane while the worker
/// polls is taken at once, not after the poll. `true` with a lane's run.
fn spin_both(
    own: &Receiver<Vec<Prepared>>,
    shared: &Receiver<Vec<Prepared>>,
) -> Option<(Vec<Prepared>, bool)> {
    // Both empty or closed until the time runs out: the blocking select
    // after it sorts out which.
    super::poll_with(super::SPIN, || {
        own.try_recv()
            .map(|run| (run, true))
            .or_else(|_| shared.try_recv().map(|run| (run, false)))
            .ok()
    })
}

/// Runs a worker: its own lane first, then the shared queue; ends once
/// every sender is gone and both queues are empty.
fn work(own: Receiver<Vec<Prepared>>, shared: Receiver<Vec<Prepared>>, lanes: Lanes, poll: bool) {
    let execute = |run: Vec<Prepared>, laned: bool| {
        for mut p in run {
            let res = p.execute_blocking();
            if laned {
                let mut m = lanes.lock().unwrap_or_else(PoisonError::into_inner);
                m.done(file_key(&p.file));
            }
            p.complete(res);
        }
    };
    let (mut own_open, mut shared_open) = (true, true);
    while own_open || shared_open {
        // The lane never waits behind the shared queue.
        match own.try_recv() {
            Ok(run) => {
                execute(run, true);
                continue;
            }
            Err(TryRecvError::Disconnected) => own_open = false,
            Err(TryRecvError::Empty) => {}
        }
        if poll {
            if let Some((run, laned)) = spin_both(&own, &shared) {
                execute(run, laned);
                continue;
            }
        }
        let mut sel = Select::new();
        let i_own = own_open.then(|| sel.recv(&own));
        let i_shared = shared_open.then(|| sel.recv(&shared));
        if i_own.is_none() && i_shared.is_none() {
            break;
        }
        let op = sel.select();
        let i = op.index();
        if Some(i) == i_own {
            match op.recv(&own) {
                Ok(run) => execute(run, true),
                Err(_) => own_open = false,
            }
        } else {
            match op.recv(&shared) {
                Ok(run) => execute(run, false),
                Err(_) => shared_open = false,
            }
        }
    }
}

impl PosixEngine {
    pub fn new(cfg: &IoEngineConfig) -> Result<Self> {
        let (tx, rx) = unbounded::<Vec<Prepared>>();
        // Idle workers (and waiters) poll briefly before sleeping, unless
        // the workers alone fill the cores: then polling would steal them.
        let poll = super::polling_fits(cfg.workers);
        let lanes: Lanes = Arc::new(Mutex::new(LaneMap::new(cfg.workers)));
        let mut threads = Vec::with_capacity(cfg.workers);
        let mut lanes_tx = Vec::with_capacity(cfg.workers);
        for i in 0..cfg.workers {
            let shared = rx.clone();
            let (own_tx, own) = unbounded::<Vec<Prepared>>();
            let lanes = Arc::clone(&lanes);
            let h = thread::Builder::new()
                .name(format!("ucm-posix-{i}"))
                .spawn(move || {
                    super::background_worker_thread();
                    work(own, shared, lanes, poll);
                })
                .map_err(|e| DeviceError::Io {
                    op: "spawn io worker",
                    path: None,
                    source: e,
                })?;
            threads.push(h);
            lanes_tx.push(own_tx);
        }
        Ok(PosixEngine {
            tx: Some(tx),
            lanes_tx,
            lanes,
            threads,
            poll,
        })
    }

    /// Sends each file's serialized writes of a batch to its lane: the
    /// lane its writes in flight are on, or the next in turn.
    fn to_lanes(&self, writes: Vec<Prepared>) {
        let mut by_file: Vec<(usize, Vec<Prepared>)> = Vec::new();
        for p in writes {
            let key = file_key(&p.file);
            match by_file.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(p),
                None => by_file.push((key, vec![p])),
            }
        }
        for (key, run) in by_file {
            let lane = self
                .lanes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .assign(key, run.len());
            if let Err(e) = self.lanes_tx[lane].send(run) {
                refuse(e.into_inner());
            }
        }
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
        let (laned, ready): (Vec<_>, Vec<_>) = ready.into_iter().partition(serialized);
        if !laned.is_empty() {
            self.to_lanes(laned);
        }
        if ready.is_empty() {
            return tickets;
        }
        for run in runs(ready, self.workers()) {
            match &self.tx {
                Some(tx) => {
                    if let Err(e) = tx.send(run) {
                        refuse(e.into_inner());
                    }
                }
                None => refuse(run),
            }
        }
        tickets
    }
}

impl Drop for PosixEngine {
    fn drop(&mut self) {
        self.tx = None;
        self.lanes_tx.clear();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{runs, spin_both, LaneMap, PosixEngine};
    use crate::io::{
        IoBuf, IoEngine, IoEngineConfig, IoEngineKind, IoFile, IoRequest, OpenOptions,
    };
    use std::sync::{Arc, PoisonError};

    /// A POSIX engine of `workers` workers, and options that open files
    /// buffered (their writes serialize: they take lanes).
    fn engine_and_buffered(workers: usize) -> (PosixEngine, OpenOptions) {
        let mut cfg = IoEngineConfig::new(IoEngineKind::Posix);
        cfg.workers = workers;
        let opts = OpenOptions {
            direct: false,
            ..OpenOptions::read_write()
        };
        (PosixEngine::new(&cfg).unwrap(), opts)
    }

    #[test]
    fn a_file_keeps_its_lane_while_its_writes_are_in_flight() {
        let mut m = LaneMap::new(3);
        assert_eq!(m.assign(10, 3), 0);
        assert_eq!(m.assign(20, 1), 1, "another file: the next lane");
        assert_eq!(m.assign(10, 2), 0, "writes in flight: the same lane");
        for _ in 0..5 {
            m.done(10);
        }
        assert!(!m.files.contains_key(&10), "nothing in flight: forgotten");
        assert_eq!(
            m.assign(10, 1),
            2,
            "back with nothing in flight: next in turn"
        );
        assert_eq!(m.assign(30, 1), 0, "lanes wrap around");
        m.done(99); // unknown files are ignored
        m.done(20);
        assert_eq!(m.files.len(), 2);
    }

    #[test]
    fn a_polling_worker_takes_its_lane_first_and_sees_both_queues() {
        let (own_tx, own) = crossbeam_channel::unbounded();
        let (shared_tx, shared) = crossbeam_channel::unbounded();
        assert!(spin_both(&own, &shared).is_none(), "both empty");
        own_tx.send(Vec::new()).unwrap();
        assert!(
            matches!(spin_both(&own, &shared), Some((_, true))),
            "lane only"
        );
        shared_tx.send(Vec::new()).unwrap();
        assert!(
            matches!(spin_both(&own, &shared), Some((_, false))),
            "shared only"
        );
        own_tx.send(Vec::new()).unwrap();
        shared_tx.send(Vec::new()).unwrap();
        assert!(
            matches!(spin_both(&own, &shared), Some((_, true))),
            "lane first"
        );
        assert!(matches!(spin_both(&own, &shared), Some((_, false))));
    }

    #[test]
    fn dropping_the_engine_drains_the_lanes() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, opts) = engine_and_buffered(3);
        let files: Vec<Arc<IoFile>> = (0..4)
            .map(|i| Arc::new(IoFile::open(dir.path().join(format!("f{i}")), opts).unwrap()))
            .collect();
        let reqs = (0..64u64)
            .map(|i| {
                let f = &files[i as usize % files.len()];
                IoRequest::write(Arc::clone(f), i * 4096, IoBuf::from_slice(&[1; 4096]))
            })
            .collect();
        let tickets = engine.submit(reqs);
        drop(engine);
        for t in tickets {
            assert_eq!(t.wait().result.unwrap(), 4096);
        }
    }

    #[test]
    fn serialized_writes_take_a_lane_and_leave_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, opts) = engine_and_buffered(4);
        let (a, b) = (
            Arc::new(IoFile::open(dir.path().join("a"), opts).unwrap()),
            Arc::new(IoFile::open(dir.path().join("b"), opts).unwrap()),
        );
        assert!(a.writes_serialize(), "buffered writes serialize");
        let mut tickets = Vec::new();
        for round in 0..8u8 {
            let reqs = (0..16u64)
                .flat_map(|i| {
                    [&a, &b].map(|f| {
                        IoRequest::write(Arc::clone(f), i * 4096, IoBuf::from_slice(&[round; 4096]))
                    })
                })
                .collect();
            tickets.extend(engine.submit(reqs));
        }
        for t in tickets {
            assert_eq!(t.wait().result.unwrap(), 4096);
        }
        // Every write was counted on its lane and counted off again.
        let lanes = engine.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(lanes.assigned, 256, "every write went to a lane");
        assert!(lanes.files.is_empty(), "{lanes:?}");
        drop(lanes);
        // One lane per file runs its writes in order: the last round wins.
        for f in [&a, &b] {
            assert!(std::fs::read(f.path()).unwrap().iter().all(|&x| x == 7));
        }
    }

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
