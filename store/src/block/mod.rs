//! The BlockStore: content-addressed, prefix-chained K/V blocks over the
//! memory tier ([`ClockPool`]) and the disk tier ([`DiskTier`]), generic over
//! the HAL's [`Device`].
//!
//! - **Load**: a pool hit is copied to the device; on a miss the owner reads
//!   the block's shards from disk into the pool (others wait for it) and then
//!   copies. Items that miss everywhere or fail are reported per item; the
//!   engine recomputes them.
//! - **Dump**: the D2H copy into a pool slot waits device-side for the
//!   task's prerequisite event; `wait` returns once the data is in the pool.
//!   A block whose shards are all in the pool is written behind to disk;
//!   `wait_durable` returns once that write is done or failed. A failed write
//!   is retried a bounded number of times, counted, and kept in
//!   [`BlockStore::failures`].
//! - A full queue returns [`StoreError::QueueFull`]: a task is never dropped.
//!
//! Geometry is configuration: tasks carry block ids, shards and device
//! addresses, never sizes.
//!
//! Files: this one holds the public types, the store, its task queue and
//! workers' dispatch; `task` a task's bookkeeping and handle; `load` the
//! load path; `dump` the dump path and write-behind.

mod dump;
mod load;
mod task;

pub use task::TaskHandle;
use task::{lock, next_job, Part, TaskShared, TaskState};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use ucm_device::{CopyRun, Device, IoBuf, Memory};

use crate::disk::{ArrivedReads, DiskTier, ReadSession, SubmittedReads};
use crate::error::{bad_value, ConfigError, Result, StoreError};
use crate::failure::{Failure, FailureKind};
use crate::geometry::{BlockId, Geometry};
use crate::pool::{rank_order, Acquire, ClockPool, LoadGuard, SlotRef};
use crate::remote::{RemoteRead, RemoteTier};

/// Blocks per batch of disk reads: bounds the files open at once (writes
/// are batched by the disk tier, `disk::WRITE_BATCH_BLOCKS`).
const IO_BATCH_BLOCKS: usize = 64;

/// Blocks per remote write batch.
const REMOTE_BATCH_BLOCKS: usize = 64;

/// One item of a load or dump task: which shard of which block, and where
/// on the device it lives (a region and an offset; the size is the
/// geometry's shard size).
#[derive(Clone, Debug)]
pub struct TaskItem {
    /// The block.
    pub block: BlockId,
    /// The shard (access-unit index).
    pub shard: u32,
    /// The device region.
    pub memory: Memory,
    /// Offset of the shard in `memory`.
    pub offset: usize,
}

/// Outcome of one item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemOutcome {
    /// Done.
    Ok,
    /// Not found in any tier: a miss (load only).
    Miss,
    /// Failed; the failure says why.
    Failed(Failure),
}

/// How long a dumped block is kept, relative to others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Retain {
    /// Kept by recency, as every block.
    #[default]
    Normal,
    /// Kept at a lower priority, at a level (0 lowest, up to 15): beyond
    /// the store's speculative share
    /// ([`TieredBlockStore::set_speculative_share`]; 0 by default) evicted
    /// before normal data by both tiers (the pool's CLOCK gives its slots
    /// no second chance; the disk tier's GC takes its files first, lower
    /// levels before higher ones), within it kept while normal data goes,
    /// until a use (a load hit, a touch) makes it normal. For data kept on
    /// speculation, such as speculative checkpoints.
    Low(u8),
}

/// Durability of one block of a dump task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Durability {
    /// On disk (for a store without a disk: in its nearest remote tier).
    Durable,
    /// Not all shards of the block have been dumped yet.
    Incomplete,
    /// The disk (or nearest tier's) write failed after its retries.
    Failed(Failure),
}

/// How long an idle store worker polls its queue before it sleeps.
const WORKER_POLL: std::time::Duration = std::time::Duration::from_micros(100);

/// A recent dump failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpFailure {
    /// The block.
    pub block: BlockId,
    /// What failed.
    pub error: Failure,
}

/// Counters.
#[derive(Debug, Default)]
pub struct BlockStoreStats {
    /// Shards loaded from the pool.
    pub pool_hits: AtomicU64,
    /// Shards read from disk.
    pub disk_reads: AtomicU64,
    /// Shards read from the remote tier.
    pub remote_reads: AtomicU64,
    /// Load items that missed.
    pub misses: AtomicU64,
    /// Items that failed.
    pub failed_items: AtomicU64,
    /// Blocks written to disk.
    pub blocks_written: AtomicU64,
    /// Disk writes retried.
    pub write_retries: AtomicU64,
    /// Blocks whose disk write failed for good.
    pub write_failures: AtomicU64,
    /// Shards handed over by [`TieredBlockStore::donate`] (no copy).
    pub donated: AtomicU64,
    /// Jobs whose worker panicked (a bug): their unfinished items were
    /// reported failed ([`FailureKind::Internal`]) and the worker went on.
    pub worker_panics: AtomicU64,
}

/// A pool slot leased for a zero-copy hand-over: the caller fills it in
/// place (through [`Lease::memory`] and [`Lease::offset`] on the device,
/// or [`Lease::data_mut`] on the host) and gives it to the store with
/// [`TieredBlockStore::donate`]. Dropped without a donation, the slot is
/// released as a failed load: nothing half-written is ever served.
pub struct Lease<'a> {
    guard: LoadGuard<'a>,
    block: BlockId,
    shard: u32,
    memory: &'a Memory,
    offset: usize,
}

impl Lease<'_> {
    /// The block the slot will hold.
    pub fn block(&self) -> BlockId {
        self.block
    }

    /// The shard the slot will hold.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The pool slot's index (stable across the hand-over).
    pub fn slot(&self) -> usize {
        self.guard.slot()
    }

    /// The pool's device registration, in which the slot lies at
    /// [`Lease::offset`]: a device copy or kernel may write the state there.
    pub fn memory(&self) -> &Memory {
        self.memory
    }

    /// Offset of the slot in [`Lease::memory`].
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The slot's bytes, to fill on the host.
    pub fn data_mut(&mut self) -> &mut [u8] {
        self.guard.data_mut()
    }
}

/// How a tiered BlockStore is built.
#[derive(Clone, Debug)]
pub struct BlockStoreConfig {
    /// Tasks that may wait in the queue before `QueueFull`.
    pub queue_depth: usize,
    /// Worker threads (one device stream each).
    pub workers: usize,
    /// Disk-write attempts per block before it is a failure.
    pub write_attempts: u32,
    /// This rank's device id and the number of ranks sharing the pool
    /// (rank rotation of shard order).
    pub device_id: usize,
    /// Ranks sharing the pool.
    pub ranks: usize,
}

impl Default for BlockStoreConfig {
    fn default() -> Self {
        BlockStoreConfig {
            queue_depth: 1024,
            workers: 2,
            write_attempts: 3,
            device_id: 0,
            ranks: 1,
        }
    }
}

/// The BlockStore interface (tiered implementation: [`TieredBlockStore`]).
pub trait BlockStore<D: Device> {
    /// Presence of each block (pool with all shards, or disk).
    fn lookup(&self, ids: &[BlockId]) -> Vec<bool>;
    /// Number of leading blocks present.
    fn lookup_on_prefix(&self, ids: &[BlockId]) -> usize;
    /// Starts loading `items` to the device.
    fn load(&self, items: Vec<TaskItem>) -> Result<TaskHandle>;
    /// Starts dumping `items` from the device, after `after` completes
    /// (device-side wait).
    fn dump(&self, items: Vec<TaskItem>, after: Option<Arc<D::Event>>) -> Result<TaskHandle>;
    /// A hotness pulse on these blocks (pool access bits, disk mtimes).
    fn touch(&self, ids: &[BlockId]);
    /// Recent dump failures.
    fn failures(&self) -> Vec<DumpFailure>;
}

enum Job<D: Device> {
    Load(Vec<TaskItem>, Arc<TaskShared>, usize),
    Dump(
        Vec<TaskItem>,
        Option<Arc<D::Event>>,
        Retain,
        Arc<TaskShared>,
        usize,
    ),
    Prefetch(Vec<BlockId>),
}

/// What reading one shard from disk into its pool slot gave.
enum Filled<'p> {
    /// Read and published; pinned while this lives.
    Slot(SlotRef<'p>),
    /// No tier holds it.
    Miss,
    /// The read failed.
    Failed(StoreError),
}

/// Tasks moving at least this many bytes are split by block across the
/// workers; smaller ones run whole on one worker (a split costs more than
/// it saves on a few shards).
const SPLIT_MIN_BYTES: usize = 4 << 20;

struct Inner<D: Device> {
    dev: Arc<D>,
    // Declared before `pool`: the registration ends before the mapping goes.
    pool_mem: Memory,
    pool: ClockPool,
    /// `None`: the remote tiers are the store's persistent tiers
    /// ([`TieredBlockStore::without_disk`]).
    disk: Option<DiskTier>,
    /// The tiers below the disk, nearest first (a cluster, a cold bucket).
    remotes: Vec<RemoteTier>,
    geo: Geometry,
    cfg: BlockStoreConfig,
    stats: BlockStoreStats,
    failures: Mutex<VecDeque<DumpFailure>>,
}

/// The tiered BlockStore.
pub struct TieredBlockStore<D: Device> {
    inner: Arc<Inner<D>>,
    tx: Option<Sender<Job<D>>>,
    submitting: Mutex<()>,
    workers: Vec<JoinHandle<()>>,
}

impl<D: Device> TieredBlockStore<D> {
    /// Builds the store over `pool` and `disk` (same shard size), on `dev`.
    pub fn new(
        dev: Arc<D>,
        pool: ClockPool,
        disk: DiskTier,
        cfg: BlockStoreConfig,
    ) -> Result<Self> {
        Self::with_remote(dev, pool, disk, None, cfg)
    }

    /// As [`TieredBlockStore::new`], with a remote tier below the disk
    /// tier, shared with other instances: every block written to disk is
    /// also written there (a failure there is counted in the remote tier's
    /// stats and leaves the block durable on disk); a block neither the
    /// pool nor the disk holds is looked up there (one batched lookup for
    /// a call's misses) and read from there into the pool.
    pub fn with_remote(
        dev: Arc<D>,
        pool: ClockPool,
        disk: DiskTier,
        remote: Option<RemoteTier>,
        cfg: BlockStoreConfig,
    ) -> Result<Self> {
        Self::with_tiers(dev, pool, disk, remote.into_iter().collect(), cfg)
    }

    /// As [`TieredBlockStore::with_remote`], with any number of tiers below
    /// the disk, nearest first (a Redis cluster, then an S3 bucket as the
    /// cold tier): written to each after the disk, asked in turn for what
    /// the tiers above them miss.
    pub fn with_tiers(
        dev: Arc<D>,
        pool: ClockPool,
        disk: DiskTier,
        remotes: Vec<RemoteTier>,
        cfg: BlockStoreConfig,
    ) -> Result<Self> {
        let geo = disk.geometry();
        Self::build(dev, pool, Some(disk), geo, remotes, cfg)
    }

    /// A store whose persistent tiers are remote tiers only, instead of a
    /// local disk (diskless nodes): a dump is durable once the nearest tier
    /// stored it (retried like a disk write), then it is written to the
    /// others; loads read from the tiers in turn. There is no local GC:
    /// capacity is the servers' (Redis's `maxmemory` policy, a bucket's
    /// lifecycle rules), and what they drop is a miss.
    pub fn without_disk(
        dev: Arc<D>,
        pool: ClockPool,
        remotes: Vec<RemoteTier>,
        cfg: BlockStoreConfig,
    ) -> Result<Self> {
        let geo = remotes
            .first()
            .map(RemoteTier::geometry)
            .ok_or(StoreError::Config(ConfigError::NoTier))?;
        Self::build(dev, pool, None, geo, remotes, cfg)
    }

    fn build(
        dev: Arc<D>,
        pool: ClockPool,
        disk: Option<DiskTier>,
        geo: Geometry,
        remotes: Vec<RemoteTier>,
        cfg: BlockStoreConfig,
    ) -> Result<Self> {
        if let Some(r) = remotes.iter().find(|r| r.geometry() != geo) {
            return Err(StoreError::Config(ConfigError::RemoteGeometry {
                remote: r.geometry().describe(),
                store: geo.describe(),
            }));
        }
        if pool.slot_bytes() != geo.shard_bytes {
            return Err(StoreError::Config(ConfigError::BufferSize {
                what: "a pool slot",
                len: pool.slot_bytes(),
                needed: geo.shard_bytes,
            }));
        }
        if cfg.workers == 0 || cfg.queue_depth == 0 || cfg.write_attempts == 0 {
            return Err(bad_value(
                "workers, queue depth or write attempts",
                0,
                "positive",
            ));
        }
        // `Inner` drops `pool_mem` (ending the registration) before `pool`.
        let pool_mem = pool.register(dev.as_ref())?;
        let inner = Arc::new(Inner {
            dev,
            pool_mem,
            pool,
            disk,
            remotes,
            geo,
            cfg: cfg.clone(),
            stats: BlockStoreStats::default(),
            failures: Mutex::new(VecDeque::new()),
        });
        let (tx, rx) = bounded::<Job<D>>(cfg.queue_depth);
        let mut workers = Vec::new();
        for i in 0..cfg.workers {
            let inner = Arc::clone(&inner);
            let rx: Receiver<Job<D>> = rx.clone();
            let stream = inner.dev.create_stream()?;
            workers.push(
                std::thread::Builder::new()
                    .name(format!("ucm-store-{i}"))
                    .spawn(move || {
                        // Submitting a task must not hand the submitter's
                        // core to this worker.
                        ucm_device::io::background_worker_thread();
                        while let Some(job) = next_job(&rx) {
                            inner.run_job(&stream, job);
                        }
                    })
                    .map_err(StoreError::fs("spawn store worker", "<thread>"))?,
            );
        }
        Ok(TieredBlockStore {
            inner,
            tx: Some(tx),
            submitting: Mutex::new(()),
            workers,
        })
    }

    /// Counters.
    pub fn stats(&self) -> &BlockStoreStats {
        &self.inner.stats
    }

    /// The disk tier (`None` for a store [`without_disk`](Self::without_disk)).
    pub fn disk(&self) -> Option<&DiskTier> {
        self.inner.disk.as_ref()
    }

    /// The store's geometry.
    pub fn geometry(&self) -> Geometry {
        self.inner.geo
    }

    /// Whether one shard of `block` is held by a tier: in the pool, or on
    /// disk as part of its whole block file. Presence only (no read).
    pub fn holds(&self, block: &BlockId, shard: u32) -> bool {
        self.inner.pool.contains(&(*block, shard))
            || self.inner.disk.as_ref().is_some_and(|d| d.exists(block))
            || self.inner.remotes.iter().any(|r| r.lookup(&[*block])[0])
    }

    /// The nearest tier below the disk, if any.
    pub fn remote(&self) -> Option<&RemoteTier> {
        self.inner.remotes.first()
    }

    /// Every tier below the disk, nearest first.
    pub fn remotes(&self) -> &[RemoteTier] {
        &self.inner.remotes
    }

    /// The memory tier.
    pub fn pool(&self) -> &ClockPool {
        &self.inner.pool
    }

    /// Sets the speculative share of the pool and the disk tier: the
    /// fraction of each that blocks dumped at [`Retain::Low`] may fill
    /// before they are evicted first ([`ClockPool::set_speculative_share`],
    /// [`DiskTier::set_speculative_share`]). Clamped to 0-1; 0 (the
    /// default): low blocks always go first. Remote tiers keep their own
    /// policy.
    pub fn set_speculative_share(&self, share: f64) {
        self.inner.pool.set_speculative_share(share);
        if let Some(d) = &self.inner.disk {
            d.set_speculative_share(share);
        }
    }

    /// Starts bringing the blocks `ids` from disk into the memory tier, in
    /// the background and without a device copy, so that a load soon after
    /// is a pool hit. A hint: nothing is reported; a block no tier holds is
    /// skipped. [`StoreError::QueueFull`] when no task can be queued.
    pub fn prefetch(&self, ids: &[BlockId]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let tx = self.tx.as_ref().ok_or(StoreError::QueueFull)?;
        let _one = lock(&self.submitting);
        tx.try_send(Job::Prefetch(ids.to_vec()))
            .map_err(|_| StoreError::QueueFull)
    }

    /// Leases the pool slot of `(block, shard)` for a zero-copy hand-over
    /// ([`TieredBlockStore::donate`]). `Ok(None)` when the shard is already
    /// stored (nothing to hand over); [`StoreError::PoolFull`] when every
    /// slot of its bucket is pinned or loading.
    pub fn lease(&self, block: BlockId, shard: u32) -> Result<Option<Lease<'_>>> {
        self.inner.geo.check_shard(shard)?;
        let pool = &self.inner.pool;
        for _attempt in 0..2 {
            match pool.acquire((block, shard))? {
                Some(Acquire::Hit(_)) => return Ok(None),
                Some(Acquire::Load(guard)) => {
                    let offset = pool.data_at(guard.slot());
                    return Ok(Some(Lease {
                        guard,
                        block,
                        shard,
                        memory: &self.inner.pool_mem,
                        offset,
                    }));
                }
                // A failed load of this key: claim afresh.
                Some(Acquire::Failed(_)) => continue,
                None => break,
            }
        }
        Err(StoreError::PoolFull)
    }

    /// Hands filled leases over to the store without copying them: each
    /// slot is published in place, then every block whose shards are all in
    /// the pool is written behind to disk (in the caller's thread). Returns
    /// each block's durability, as [`TaskHandle::wait_durable`] would.
    pub fn donate(&self, leases: Vec<Lease<'_>>) -> Vec<(BlockId, Durability)> {
        let mut blocks = Vec::new();
        let mut pins = Vec::new();
        for l in leases {
            if !blocks.contains(&l.block) {
                blocks.push(l.block);
            }
            let r = l.guard.complete();
            r.set_dirty(true);
            pins.push(r);
            self.inner.stats.donated.fetch_add(1, Ordering::Relaxed);
        }
        let durable = self.inner.write_behind(&blocks);
        drop(pins);
        durable
    }

    /// Dumps `items` as [`BlockStore::dump`] does, kept at `retain`.
    pub fn dump_retained(
        &self,
        items: Vec<TaskItem>,
        after: Option<Arc<D::Event>>,
        retain: Retain,
    ) -> Result<TaskHandle> {
        self.submit(items, Some((after, retain)))
    }

    fn submit(
        &self,
        items: Vec<TaskItem>,
        dump: Option<(Option<Arc<D::Event>>, Retain)>,
    ) -> Result<TaskHandle> {
        for it in &items {
            self.inner.geo.check_shard(it.shard)?;
            let end = it.offset.checked_add(self.inner.geo.shard_bytes);
            if end.is_none_or(|e| e > it.memory.len()) {
                return Err(StoreError::Config(ConfigError::BufferSize {
                    what: "a device region",
                    len: it.memory.len(),
                    needed: it.offset.saturating_add(self.inner.geo.shard_bytes),
                }));
            }
        }
        let mut seen = std::collections::HashSet::with_capacity(items.len());
        for it in &items {
            if !seen.insert((it.block, it.shard)) {
                return Err(StoreError::DuplicateItem {
                    block: crate::geometry::hex(&it.block),
                    shard: it.shard,
                });
            }
        }
        let mut shards: Vec<u32> = items.iter().map(|i| i.shard).collect();
        shards.sort_unstable();
        shards.dedup();
        let parts = self.split(items);
        let mut st = TaskState {
            parts_left: parts.len(),
            parts_copied: vec![false; parts.len()],
            durable_left: parts.len(),
            ..TaskState::default()
        };
        for p in &parts {
            let mut mine: Vec<u32> = p.iter().map(|i| i.shard).collect();
            mine.sort_unstable();
            mine.dedup();
            for s in mine {
                *st.shard_left.entry(s).or_default() += 1;
            }
        }
        let shared = Arc::new(TaskShared {
            state: Mutex::new(st),
            cv: Condvar::new(),
        });
        let tx = self.tx.as_ref().ok_or(StoreError::QueueFull)?;
        // All parts or none: room is checked under the submit lock (only
        // submitters fill the queue; workers only make room).
        let _one = lock(&self.submitting);
        if tx.capacity().unwrap_or(usize::MAX) - tx.len() < parts.len() {
            return Err(StoreError::QueueFull);
        }
        for (index, items) in parts.into_iter().enumerate() {
            let t = Arc::clone(&shared);
            let job = match &dump {
                None => Job::Load(items, t, index),
                Some((after, retain)) => Job::Dump(items, after.clone(), *retain, t, index),
            };
            match tx.try_send(job) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    // Unreachable while the room check holds; never a
                    // silent partial task.
                    return Err(StoreError::QueueFull);
                }
            }
        }
        Ok(TaskHandle { shared, shards })
    }

    /// Splits a task by block (contiguous runs of blocks in order of first
    /// appearance) into one part per worker, when it is large enough.
    fn split(&self, items: Vec<TaskItem>) -> Vec<Vec<TaskItem>> {
        let workers = self.inner.cfg.workers;
        if workers < 2 || items.len().saturating_mul(self.inner.geo.shard_bytes) < SPLIT_MIN_BYTES {
            return vec![items];
        }
        let mut order: HashMap<BlockId, usize> = HashMap::new();
        for it in &items {
            let n = order.len();
            order.entry(it.block).or_insert(n);
        }
        let blocks = order.len();
        let parts = workers.min(blocks);
        if parts < 2 {
            return vec![items];
        }
        let mut out: Vec<Vec<TaskItem>> = (0..parts).map(|_| Vec::new()).collect();
        for it in items {
            let b = order[&it.block];
            out[b * parts / blocks].push(it);
        }
        out
    }
}

impl<D: Device> Drop for TieredBlockStore<D> {
    fn drop(&mut self) {
        self.tx = None;
        for w in self.workers.drain(..) {
            // Workers finish the queued tasks first; a panicked one is ignored.
            let _ = w.join();
        }
    }
}

/// Asks one tier, in one batched `lookup`, for the ids the tiers above
/// it lack, and marks those it holds. False when nothing was missing.
fn ask_for_misses(
    ids: &[BlockId],
    found: &mut [bool],
    lookup: impl FnOnce(&[BlockId]) -> Vec<bool>,
) -> bool {
    let missing: Vec<usize> = (0..ids.len()).filter(|&i| !found[i]).collect();
    if missing.is_empty() {
        return false;
    }
    let asked: Vec<BlockId> = missing.iter().map(|&i| ids[i]).collect();
    for (i, there) in missing.into_iter().zip(lookup(&asked)) {
        found[i] = there;
    }
    true
}

impl<D: Device> BlockStore<D> for TieredBlockStore<D> {
    fn lookup(&self, ids: &[BlockId]) -> Vec<bool> {
        // The pool first, then the disk for the rest in one batch (its
        // presence summary, then parallel stats), then each remote tier
        // for what is still missing.
        let mut found: Vec<bool> = ids.iter().map(|id| self.inner.in_pool(id)).collect();
        if let Some(d) = &self.inner.disk {
            ask_for_misses(ids, &mut found, |asked| d.lookup(asked));
        }
        for r in &self.inner.remotes {
            if !ask_for_misses(ids, &mut found, |asked| r.lookup(asked)) {
                break;
            }
        }
        found
    }

    fn lookup_on_prefix(&self, ids: &[BlockId]) -> usize {
        // Runs of ids the pool holds are counted at once; each run the
        // pool lacks goes to the disk as one prefix lookup, which stops at
        // its first miss.
        let inner = &self.inner;
        let mut local = 0;
        while local < ids.len() {
            if inner.in_pool(&ids[local]) {
                local += 1;
                continue;
            }
            let Some(d) = &inner.disk else { break };
            let run = ids[local..]
                .iter()
                .position(|id| inner.in_pool(id))
                .unwrap_or(ids.len() - local);
            let on_disk = d.lookup_on_prefix(&ids[local..local + run]);
            local += on_disk;
            if on_disk < run {
                break;
            }
        }
        if local == ids.len() || inner.remotes.is_empty() {
            return local;
        }
        // Below the disk, a block counts if any tier holds it.
        local
            + self
                .lookup(&ids[local..])
                .iter()
                .take_while(|&&p| p)
                .count()
    }

    fn load(&self, items: Vec<TaskItem>) -> Result<TaskHandle> {
        self.submit(items, None)
    }

    fn dump(&self, items: Vec<TaskItem>, after: Option<Arc<D::Event>>) -> Result<TaskHandle> {
        self.submit(items, Some((after, Retain::Normal)))
    }

    fn touch(&self, ids: &[BlockId]) {
        for id in ids {
            for s in 0..self.inner.geo.shards_per_block {
                self.inner.pool.touch(&(*id, s));
            }
        }
        if let Some(d) = &self.inner.disk {
            d.touch(ids);
        }
    }

    fn failures(&self) -> Vec<DumpFailure> {
        lock(&self.inner.failures).iter().cloned().collect()
    }
}

impl<D: Device> Inner<D> {
    /// Runs one job. A panic inside it (a bug in the store or a device
    /// binding) is caught: the job's task is finished as failed
    /// ([`Part::abort`]) and the worker lives on. Without this, every
    /// waiter of the task would block for good and the worker would be
    /// lost. Unwinding is safe here: the task and failure state sit behind
    /// poison-tolerant mutexes, and a pool slot's load guard publishes its
    /// slot as failed when it is dropped mid-load.
    fn run_job(&self, stream: &D::Stream, job: Job<D>) {
        // The items are grouped by shard before the job runs, so that the
        // groups outlive a panic inside it.
        match job {
            Job::Load(items, t, index) => {
                let (groups, part) = (self.by_shard(items), Part { shared: &t, index });
                if let Some(why) = self.unwinding(|| self.run_load(stream, &groups, &part)) {
                    part.fail_rest(&groups, &why, false);
                }
            }
            Job::Dump(items, after, retain, t, index) => {
                let (groups, part) = (self.by_shard(items), Part { shared: &t, index });
                let run = || self.run_dump(stream, &groups, after.as_deref(), retain, &part);
                if let Some(why) = self.unwinding(run) {
                    part.fail_rest(&groups, &why, true);
                }
            }
            Job::Prefetch(ids) => {
                self.unwinding(|| self.run_prefetch(&ids));
            }
        }
    }

    /// Runs `f`; a panic inside it is caught, counted and logged, and
    /// returned as the failure its unfinished items are reported with.
    fn unwinding(&self, f: impl FnOnce()) -> Option<Failure> {
        let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).err()?;
        self.stats.worker_panics.fetch_add(1, Ordering::Relaxed);
        let what = ucm_device::panic_message(payload.as_ref());
        let why = Failure::new(
            FailureKind::Internal,
            format!("a store worker panicked: {what}"),
        );
        log::error!("{why}; the task is reported failed and the worker goes on");
        Some(why)
    }
}
