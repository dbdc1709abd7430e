//! A BlockStore task's bookkeeping: per-item outcomes and durability as
//! the workers report them, and the handle the caller waits on.

use super::*;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Progress of a task, which the store may have split into parts (by
/// block) that run on different workers.
#[derive(Default)]
pub(super) struct TaskState {
    /// Per shard: each part's item outcomes, by part index.
    pub(super) shards_done: HashMap<u32, BTreeMap<usize, Vec<(BlockId, ItemOutcome)>>>,
    /// Per shard: parts that have yet to report it.
    pub(super) shard_left: HashMap<u32, usize>,
    /// Parts whose copies are still running.
    pub(super) parts_left: usize,
    /// Per part: whether its copies have been reported done.
    pub(super) parts_copied: Vec<bool>,
    /// Dump parts whose write-behind is still running.
    pub(super) durable_left: usize,
    /// Durability reported so far, by part index.
    pub(super) durable_parts: BTreeMap<usize, Vec<(BlockId, Durability)>>,
    pub(super) done: bool,
    pub(super) durable: Option<Vec<(BlockId, Durability)>>,
}

impl TaskState {
    pub(super) fn shard_outcomes(&self, shard: u32) -> Vec<(BlockId, ItemOutcome)> {
        self.shards_done
            .get(&shard)
            .map(|parts| parts.values().flatten().cloned().collect())
            .unwrap_or_default()
    }

    pub(super) fn shard_reported(&self, index: usize, shard: u32) -> bool {
        self.shards_done
            .get(&shard)
            .is_some_and(|parts| parts.contains_key(&index))
    }

    pub(super) fn report_shard(
        &mut self,
        index: usize,
        shard: u32,
        outcomes: Vec<(BlockId, ItemOutcome)>,
    ) {
        self.shards_done
            .entry(shard)
            .or_default()
            .insert(index, outcomes);
        if let Some(left) = self.shard_left.get_mut(&shard) {
            *left = left.saturating_sub(1);
        }
    }

    pub(super) fn report_done(&mut self, index: usize) {
        match self.parts_copied.get_mut(index) {
            Some(true) => return,
            Some(copied) => *copied = true,
            None => {}
        }
        self.parts_left = self.parts_left.saturating_sub(1);
        self.done = self.parts_left == 0;
    }

    pub(super) fn durable_reported(&self, index: usize) -> bool {
        self.durable.is_some() || self.durable_parts.contains_key(&index)
    }

    pub(super) fn report_durable(&mut self, index: usize, durable: Vec<(BlockId, Durability)>) {
        self.durable_parts.insert(index, durable);
        self.durable_left = self.durable_left.saturating_sub(1);
        if self.durable_left == 0 {
            self.durable = Some(
                std::mem::take(&mut self.durable_parts)
                    .into_values()
                    .flatten()
                    .collect(),
            );
        }
    }
}

pub(super) struct TaskShared {
    pub(super) state: Mutex<TaskState>,
    pub(super) cv: Condvar,
}

/// One part of a task, as a worker reports it.
pub(super) struct Part<'a> {
    pub(super) shared: &'a TaskShared,
    pub(super) index: usize,
}

impl Part<'_> {
    /// The part's items of `shard` completed with `outcomes`.
    pub(super) fn shard(&self, shard: u32, outcomes: Vec<(BlockId, ItemOutcome)>) {
        self.shared
            .update(|st| st.report_shard(self.index, shard, outcomes));
    }

    /// Every copy of the part completed.
    pub(super) fn done(&self) {
        self.shared.update(|st| st.report_done(self.index));
    }

    /// The part's write-behind ended with `durable`.
    pub(super) fn durable(&self, durable: Vec<(BlockId, Durability)>) {
        self.shared
            .update(|st| st.report_durable(self.index, durable));
    }

    /// Everything of the part (its items, `groups`) not reported yet is
    /// reported failed with `why`: its shards' items, its copies' end, and
    /// for a dump its blocks' durability. For a part that cannot run (its
    /// prerequisite event failed) and one whose worker panicked midway, so
    /// that no waiter of the task is left hanging and nothing unfinished
    /// counts as done.
    pub(super) fn fail_rest(&self, groups: &[(u32, Vec<TaskItem>)], why: &Failure, dump: bool) {
        self.shared.update(|st| {
            let mut blocks: Vec<BlockId> = Vec::new();
            for (shard, group) in groups {
                for it in group {
                    if !blocks.contains(&it.block) {
                        blocks.push(it.block);
                    }
                }
                if !st.shard_reported(self.index, *shard) {
                    let outcomes = group
                        .iter()
                        .map(|it| (it.block, ItemOutcome::Failed(why.clone())))
                        .collect();
                    st.report_shard(self.index, *shard, outcomes);
                }
            }
            st.report_done(self.index);
            if dump && !st.durable_reported(self.index) {
                let failed = blocks
                    .into_iter()
                    .map(|b| (b, Durability::Failed(why.clone())))
                    .collect();
                st.report_durable(self.index, failed);
            }
        });
    }
}

impl TaskShared {
    pub(super) fn update(&self, f: impl FnOnce(&mut TaskState)) {
        f(&mut lock(&self.state));
        self.cv.notify_all();
    }

    pub(super) fn wait_until<T>(&self, mut f: impl FnMut(&TaskState) -> Option<T>) -> T {
        let mut st = lock(&self.state);
        loop {
            if let Some(v) = f(&st) {
                return v;
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The next job of a store worker (`None` once the store is closed). It
/// polls for [`WORKER_POLL`] first, yielding its core to any other runnable
/// thread: an engine submits the next layer's load within microseconds of
/// the last one's end, and a worker that went to sleep is woken by an
/// interrupt that a virtual machine delivers to an idle core in up to a
/// millisecond (measured: a quarter of `load_layerwise`'s 32 MiB loads took
/// twice their copy time).
pub(super) fn next_job<T>(rx: &Receiver<T>) -> Option<T> {
    ucm_device::io::poll_recv(rx, WORKER_POLL).or_else(|| rx.recv().ok())
}

/// A submitted task.
#[derive(Clone)]
pub struct TaskHandle {
    pub(super) shared: Arc<TaskShared>,
    pub(super) shards: Vec<u32>,
}

impl TaskHandle {
    /// Non-blocking: true once every item has completed (in the pool, for a
    /// dump).
    pub fn check(&self) -> bool {
        lock(&self.shared.state).done
    }

    /// Waits for every item; returns each item's outcome, by shard, then
    /// in the order of the blocks' first appearance in the task (which is
    /// submission order for block-major and shard-major tasks).
    pub fn wait(&self) -> Vec<(BlockId, u32, ItemOutcome)> {
        self.shared.wait_until(|st| {
            st.done.then(|| {
                let mut out = Vec::new();
                for s in &self.shards {
                    out.extend(st.shard_outcomes(*s).into_iter().map(|(b, o)| (b, *s, o)));
                }
                out
            })
        })
    }

    /// Waits for the items of one shard only (a layer is ready as soon as
    /// its shards are).
    pub fn wait_shard(&self, shard: u32) -> Vec<(BlockId, ItemOutcome)> {
        self.shared
            .wait_until(|st| match st.shard_left.get(&shard) {
                Some(0) => Some(st.shard_outcomes(shard)),
                Some(_) => None,
                None => st.done.then(Vec::new),
            })
    }

    /// Dump tasks, non-blocking: every block's durability once the
    /// write-behind has ended, else `None`.
    pub fn durable_now(&self) -> Option<Vec<(BlockId, Durability)>> {
        lock(&self.shared.state).durable.clone()
    }

    /// Dump tasks: waits until every block of the task is durable, failed,
    /// or incomplete (its other shards not dumped yet).
    pub fn wait_durable(&self) -> Vec<(BlockId, Durability)> {
        self.shared.wait_until(|st| st.durable.clone())
    }
}
