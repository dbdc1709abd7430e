//! A bare BlockStore for the engines' other plug-in points (upstream UCM's
//! store interface, SGLang's HiCache storage backend): 16-byte block ids,
//! shard indices and raw addresses. No spec table and no tokens: the
//! caller names the blocks and owns the memory.
//!
//! Tasks are numbered. `wait` ends a task and reports every item that did
//! not succeed (a miss, a failure, and with `durable` a block whose disk
//! write failed), so a caller can never mistake a partial task for a
//! success. A store dropped with tasks in flight settles them first: no
//! copy may touch the caller's memory after the store is gone.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ucm_coordinator::store::device::{IoEngineConfig, IoEngineKind};
use ucm_coordinator::store::pool::PoolMode;
use ucm_coordinator::store::{
    BlockId, BlockStore, BlockStoreConfig, ClockPool, DiskBudget, DiskConfig, DiskTier, Durability,
    Geometry, ItemOutcome, PoolConfig, SyncMode, TaskHandle, TaskItem, TieredBlockStore,
};
use ucm_device::{Device, HostDevice};

use crate::error::{ArgProblem, FfiError, Result};
use crate::runtime::Backend;

/// How a raw store is opened.
#[derive(Clone, Debug)]
pub struct RawStoreOptions {
    /// The store directory (created if missing; one geometry per directory).
    pub dir: PathBuf,
    /// Bytes per shard (a multiple of 4 KiB) and shards per block.
    pub geometry: Geometry,
    /// Bytes of the memory tier (at least two blocks are kept).
    pub pool_bytes: usize,
    /// Block files on disk before GC.
    pub disk_blocks: u64,
    /// Store worker threads.
    pub workers: usize,
    /// Whose memory the addresses are.
    pub backend: Backend,
    /// How the disk tier makes writes durable.
    pub sync: SyncMode,
    /// A disk byte budget to share with other stores (the stores of one
    /// engine's host pools): this store's disk tier joins it, bringing
    /// the bytes of its `disk_blocks` files to a
    /// [`DiskBudget::summed`], and collects with the others as one.
    pub disk_budget: Option<Arc<DiskBudget>>,
    /// With `disk_budget`: the link of the stores that hold the other
    /// parts of each block under the same ids (a block's components of
    /// other sizes), whose files the budget takes or keeps together
    /// ([`DiskTier::join_budget_linked`]).
    pub disk_link: Option<u64>,
}

impl RawStoreOptions {
    /// Defaults for `dir` and `geometry`: a 256 MiB pool, 2^20 blocks on
    /// disk, two workers, host memory.
    pub fn new(dir: impl Into<PathBuf>, geometry: Geometry) -> Self {
        RawStoreOptions {
            dir: dir.into(),
            geometry,
            pool_bytes: 256 << 20,
            disk_blocks: 1 << 20,
            workers: 2,
            backend: Backend::Host,
            sync: SyncMode::Auto,
            disk_budget: None,
            disk_link: None,
        }
    }
}

/// One item of a task: a shard of a block and the address of its bytes
/// (the geometry's shard size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawItem {
    /// The block id.
    pub block: BlockId,
    /// The shard, `0..shards_per_block`.
    pub shard: u32,
    /// Host or device address, per the store's backend.
    pub addr: u64,
}

/// Why an item of a task did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemProblem {
    /// No tier holds the shard (loads).
    Miss,
    /// The copy or the read failed.
    Failed(String),
    /// In the pool, but the block's disk write failed (durable waits).
    NotDurable(String),
}

impl ItemProblem {
    /// A short kind: `miss`, `failed`, `not_durable`.
    pub fn kind(&self) -> &'static str {
        match self {
            ItemProblem::Miss => "miss",
            ItemProblem::Failed(_) => "failed",
            ItemProblem::NotDurable(_) => "not_durable",
        }
    }

    /// What happened, for a log line.
    pub fn detail(&self) -> &str {
        match self {
            ItemProblem::Miss => "not stored",
            ItemProblem::Failed(d) | ItemProblem::NotDurable(d) => d,
        }
    }
}

/// One item that did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemReport {
    /// The block.
    pub block: BlockId,
    /// The shard.
    pub shard: u32,
    /// Why.
    pub problem: ItemProblem,
}

enum AnyBlocks {
    Host(Arc<HostDevice>, TieredBlockStore<HostDevice>),
    #[cfg(feature = "cuda")]
    Cuda(
        Arc<ucm_device::accel::cuda::CudaDevice>,
        TieredBlockStore<ucm_device::accel::cuda::CudaDevice>,
    ),
}

macro_rules! each {
    ($b:expr, $d:ident, $s:ident => $body:expr) => {
        match $b {
            AnyBlocks::Host($d, $s) => $body,
            #[cfg(feature = "cuda")]
            AnyBlocks::Cuda($d, $s) => $body,
        }
    };
}

struct Pending {
    handle: TaskHandle,
    dump: bool,
}

/// A BlockStore over raw addresses.
pub struct RawStore {
    blocks: AnyBlocks,
    geometry: Geometry,
    backend: Backend,
    tasks: Mutex<HashMap<u64, Pending>>,
    next: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn open_on<D: Device>(dev: &Arc<D>, opts: &RawStoreOptions) -> Result<TieredBlockStore<D>> {
    let geo = opts.geometry;
    geo.validate()?;
    let min = 2 * geo.shards_per_block as usize;
    let slots = (opts.pool_bytes / geo.shard_bytes).max(min);
    let ways = slots.min(256);
    let pool = ClockPool::open(PoolConfig {
        shard_bytes: geo.shard_bytes,
        slots: slots.div_ceil(ways) * ways,
        ways,
        mode: PoolMode::Private,
        load_timeout: Duration::from_secs(5),
        dirty_timeout: Duration::from_secs(60),
    })?;
    let engine = Arc::from(
        IoEngineConfig::for_dir(IoEngineKind::Auto, &opts.dir)
            .build()
            .map_err(ucm_coordinator::store::StoreError::from)?,
    );
    let mut dcfg = DiskConfig::new(&opts.dir, geo, opts.disk_blocks);
    dcfg.sync = opts.sync;
    let disk = DiskTier::open(dcfg, engine)?;
    match (&opts.disk_budget, opts.disk_link) {
        (Some(b), Some(link)) => disk.join_budget_linked(b, link),
        (Some(b), None) => disk.join_budget(b),
        (None, _) => false,
    };
    let cfg = BlockStoreConfig {
        workers: opts.workers.max(1),
        ..BlockStoreConfig::default()
    };
    Ok(TieredBlockStore::new(Arc::clone(dev), pool, disk, cfg)?)
}

fn problem_of(o: &ItemOutcome) -> Option<ItemProblem> {
    match o {
        ItemOutcome::Ok => None,
        ItemOutcome::Miss => Some(ItemProblem::Miss),
        ItemOutcome::Failed(f) => Some(ItemProblem::Failed(f.to_string())),
    }
}

impl RawStore {
    /// Opens (or creates) the store. A directory of another geometry, a
    /// bad geometry or a backend this build lacks is an error.
    pub fn open(opts: RawStoreOptions) -> Result<RawStore> {
        if opts.dir.as_os_str().is_empty() {
            return Err(FfiError::Argument {
                name: "dir".into(),
                problem: ArgProblem::Empty,
            });
        }
        if opts.disk_blocks == 0 {
            return Err(FfiError::Argument {
                name: "disk_blocks".into(),
                problem: ArgProblem::OutOfRange {
                    value: "0".into(),
                    expected: "at least 1",
                },
            });
        }
        let blocks = match opts.backend {
            Backend::Host => {
                let dev = Arc::new(HostDevice::new());
                let s = open_on(&dev, &opts)?;
                AnyBlocks::Host(dev, s)
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(ordinal) => {
                let dev = Arc::new(ucm_device::accel::cuda::CudaDevice::new(ordinal)?);
                let s = open_on(&dev, &opts)?;
                AnyBlocks::Cuda(dev, s)
            }
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(_) => {
                return Err(FfiError::Unsupported(crate::error::Unsupported::NoCuda))
            }
        };
        Ok(RawStore {
            blocks,
            geometry: opts.geometry,
            backend: opts.backend,
            tasks: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The backend whose memory the addresses are.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Presence of each block (every shard in the pool, or its file).
    pub fn lookup(&self, ids: &[BlockId]) -> Vec<bool> {
        each!(&self.blocks, _d, s => s.lookup(ids))
    }

    /// The number of leading blocks present.
    pub fn lookup_on_prefix(&self, ids: &[BlockId]) -> usize {
        each!(&self.blocks, _d, s => s.lookup_on_prefix(ids))
    }

    /// Starts bringing disk-only blocks into the memory tier (a hint).
    pub fn prefetch(&self, ids: &[BlockId]) -> Result<()> {
        Ok(each!(&self.blocks, _d, s => s.prefetch(ids))?)
    }

    /// Counters: shards from the pool, shards read from disk, misses,
    /// failed items, blocks written, blocks whose write failed, `syncfs`
    /// calls that made batches of writes durable.
    pub fn counters(&self) -> [u64; 7] {
        use std::sync::atomic::Ordering::Relaxed;
        each!(&self.blocks, _d, s => {
            let st = s.stats();
            [
                st.pool_hits.load(Relaxed),
                st.disk_reads.load(Relaxed),
                st.misses.load(Relaxed),
                st.failed_items.load(Relaxed),
                st.blocks_written.load(Relaxed),
                st.write_failures.load(Relaxed),
                s.disk().map_or(0, |d| d.stats().fs_syncs.load(Relaxed)),
            ]
        })
    }

    fn task_items<D: Device>(&self, dev: &D, items: &[RawItem]) -> Result<Vec<TaskItem>> {
        let len = self.geometry.shard_bytes;
        let mut out = Vec::with_capacity(items.len());
        for it in items {
            if it.addr == 0 {
                return Err(FfiError::Argument {
                    name: format!("items[shard {}].addr", it.shard),
                    problem: ArgProblem::Null,
                });
            }
            // SAFETY: the caller guarantees (the contract of `load` and
            // `dump`) that `len` bytes at `addr` are this backend's memory
            // and stay allocated until the task is waited for or the store
            // is dropped, which settles every task first.
            let memory = unsafe { dev.import_device(it.addr, len) }?;
            out.push(TaskItem {
                block: it.block,
                shard: it.shard,
                memory,
                offset: 0,
            });
        }
        Ok(out)
    }

    fn register(&self, handle: TaskHandle, dump: bool) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.tasks).insert(id, Pending { handle, dump });
        id
    }

    /// Starts copying each item's shard from the store to its address.
    /// Returns the task number.
    ///
    /// # Safety
    /// Every address must point to a shard's worth of this backend's
    /// memory that stays allocated (and is not otherwise written) until
    /// the task is waited for or the store is dropped.
    pub unsafe fn load(&self, items: &[RawItem]) -> Result<u64> {
        let handle = each!(&self.blocks, d, s => {
            let items = self.task_items(d.as_ref(), items)?;
            s.load(items)?
        });
        Ok(self.register(handle, false))
    }

    /// Starts copying each item's shard from its address into the store.
    /// `after_event`, when not 0, is an engine's event (a `CUevent` on
    /// CUDA) that must complete before the bytes are read; the host backend
    /// has no events and refuses one. Returns the task number.
    ///
    /// # Safety
    /// As [`RawStore::load`]; a non-zero `after_event` must be a live event
    /// of the backend's context.
    pub unsafe fn dump(&self, items: &[RawItem], after_event: u64) -> Result<u64> {
        if after_event != 0 {
            match &self.blocks {
                AnyBlocks::Host(..) => {
                    return Err(FfiError::Argument {
                        name: "after_event".into(),
                        problem: ArgProblem::OutOfRange {
                            value: format!("{after_event:#x}"),
                            expected: "0 on the host backend, which has no events \
                                       (pass 0 once the bytes are written)",
                        },
                    })
                }
                // SAFETY: the caller guarantees a live event (this
                // function's contract).
                #[cfg(feature = "cuda")]
                AnyBlocks::Cuda(d, _) => unsafe { d.synchronize_raw_event(after_event) }?,
            }
        }
        let handle = each!(&self.blocks, d, s => {
            let items = self.task_items(d.as_ref(), items)?;
            s.dump(items, None)?
        });
        Ok(self.register(handle, true))
    }

    fn pending(&self, task: u64) -> Result<TaskHandle> {
        lock(&self.tasks)
            .get(&task)
            .map(|p| p.handle.clone())
            .ok_or(FfiError::UnknownTask { task })
    }

    /// True once every item of the task has completed (in the pool, for a
    /// dump). Does not end the task.
    pub fn check(&self, task: u64) -> Result<bool> {
        Ok(self.pending(task)?.check())
    }

    /// Waits for the task and ends it; returns every item that did not
    /// succeed (empty: all did). With `durable`, a dump also waits until
    /// its whole blocks are on disk, and a block whose write failed
    /// reports each of its items as [`ItemProblem::NotDurable`] (a block
    /// whose other shards were not dumped yet is not a problem).
    pub fn wait(&self, task: u64, durable: bool) -> Result<Vec<ItemReport>> {
        let handle = self.pending(task)?;
        let outcomes = handle.wait();
        let dump = lock(&self.tasks).remove(&task).is_some_and(|p| p.dump);
        let mut out: Vec<ItemReport> = outcomes
            .iter()
            .filter_map(|(b, s, o)| {
                problem_of(o).map(|problem| ItemReport {
                    block: *b,
                    shard: *s,
                    problem,
                })
            })
            .collect();
        if dump && durable {
            let failed: HashMap<BlockId, String> = handle
                .wait_durable()
                .into_iter()
                .filter_map(|(b, d)| match d {
                    Durability::Failed(f) => Some((b, f.to_string())),
                    Durability::Durable | Durability::Incomplete => None,
                })
                .collect();
            for (b, s, o) in &outcomes {
                if let (ItemOutcome::Ok, Some(why)) = (o, failed.get(b)) {
                    out.push(ItemReport {
                        block: *b,
                        shard: *s,
                        problem: ItemProblem::NotDurable(why.clone()),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Waits for every task still in flight and ends them all.
    pub fn settle(&self) {
        let pending: Vec<TaskHandle> = lock(&self.tasks).drain().map(|(_, p)| p.handle).collect();
        for h in pending {
            h.wait();
        }
    }
}

impl Drop for RawStore {
    /// Settles the tasks in flight: the caller frees its memory next.
    fn drop(&mut self) {
        self.settle();
    }
}
