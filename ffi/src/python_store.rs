//! The Python class `ucm.BlockStore`: the raw BlockStore ([`RawStore`]) of
//! the drop-in surfaces (`ucm.upstream`, `ucm.sglang_hicache`). Items are
//! given as three flat lists: 16-byte block ids, shard indices and integer
//! addresses; the caller keeps the memory alive until the task is waited
//! for, as with upstream UCM's `load_data`/`dump_data`. Blocking calls
//! release the GIL.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use std::sync::Arc;

use crate::blockstore::{RawItem, RawStore, RawStoreOptions};
use crate::coordinator::store::{BlockId, DiskBudget, Geometry};
use crate::error::FfiError;
use crate::runtime::Backend;

fn err(e: FfiError) -> PyErr {
    e.into()
}

fn ids_of(ids: &[Vec<u8>]) -> PyResult<Vec<BlockId>> {
    ids.iter()
        .enumerate()
        .map(|(i, b)| {
            BlockId::try_from(b.as_slice()).map_err(|_| {
                PyValueError::new_err(format!(
                    "block id {i}: {} bytes, a block id has 16",
                    b.len()
                ))
            })
        })
        .collect()
}

fn items_of(ids: &[Vec<u8>], shards: &[u32], addrs: &[u64]) -> PyResult<Vec<RawItem>> {
    if ids.len() != shards.len() || ids.len() != addrs.len() {
        return Err(PyValueError::new_err(format!(
            "{} block ids, {} shards and {} addresses: one of each per item",
            ids.len(),
            shards.len(),
            addrs.len()
        )));
    }
    Ok(ids_of(ids)?
        .into_iter()
        .zip(shards.iter().zip(addrs))
        .map(|(block, (&shard, &addr))| RawItem { block, shard, addr })
        .collect())
}

/// One item that did not succeed: `(block_id, shard, kind, detail)`.
type Problem<'py> = (Bound<'py, PyBytes>, u32, &'static str, String);

/// One disk byte budget for several block stores (an engine's host pools:
/// K/V pages and Mamba states): each store opened with it brings the bytes
/// of its `disk_blocks` files, and their disk tiers are collected as one,
/// oldest files first whichever store holds them, so the room each store
/// gets follows what is used.
#[pyclass(name = "DiskBudget", module = "ucm", frozen)]
pub struct PyDiskBudget(Arc<DiskBudget>);

#[pymethods]
impl PyDiskBudget {
    /// An empty budget; stores bring their bytes as they join it.
    #[new]
    fn new() -> Self {
        PyDiskBudget(DiskBudget::summed())
    }

    /// The capacity in bytes: what the stores that joined brought.
    #[getter]
    fn capacity_bytes(&self) -> u64 {
        self.0.high_bytes()
    }

    /// A new link number: stores opened with it (`budget_link`) hold the
    /// parts of one set of blocks under the same ids (a block's
    /// components of several sizes), and the budget takes or keeps each
    /// block's parts together.
    fn new_link(&self) -> u64 {
        self.0.new_link()
    }

    /// Collects now (GC is otherwise run by the stores' writes): returns
    /// `(block_files_found, deleted)`.
    fn collect(&self, py: Python<'_>) -> (u64, u64) {
        let r = py.detach(|| self.0.gc());
        (r.found, r.deleted)
    }
}

/// A block store over raw addresses: blocks of `shards_per_block` shards
/// of `shard_bytes` each, under `dir`.
#[pyclass(name = "BlockStore", module = "ucm", frozen)]
pub struct PyBlockStore(RawStore);

#[pymethods]
impl PyBlockStore {
    /// Opens (or creates) the store. `device` is whose memory the
    /// addresses are: `cpu` (host memory) or `cuda[:N]`. `sync_mode` is how the
    /// disk tier makes writes durable: `auto` (one `syncfs` per batch where
    /// the file system allows) or `files` (an fsync per file and
    /// directory, for a busy shared file system). With `disk_budget` (a
    /// `DiskBudget`), the disk tier collects with the budget's other
    /// stores instead of alone; with `budget_link` too (from
    /// `DiskBudget.new_link`), as one part of blocks whose other parts the
    /// stores of that link hold.
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (dir, shard_bytes, shards_per_block, pool_bytes=256 << 20, disk_blocks=1 << 20, workers=2, device="cpu", sync_mode="auto", disk_budget=None, budget_link=None))]
    fn new(
        py: Python<'_>,
        dir: &str,
        shard_bytes: usize,
        shards_per_block: u32,
        pool_bytes: usize,
        disk_blocks: u64,
        workers: usize,
        device: &str,
        sync_mode: &str,
        disk_budget: Option<&PyDiskBudget>,
        budget_link: Option<u64>,
    ) -> PyResult<Self> {
        if budget_link.is_some() && disk_budget.is_none() {
            return Err(PyValueError::new_err(
                "budget_link without disk_budget: a link is one of a budget's",
            ));
        }
        let backend = Backend::parse(device).map_err(err)?;
        let sync = sync_mode.parse().map_err(|e| err(FfiError::from(e)))?;
        let mut o = RawStoreOptions::new(
            dir,
            Geometry {
                shard_bytes,
                shards_per_block,
            },
        );
        o.pool_bytes = pool_bytes;
        o.disk_blocks = disk_blocks;
        o.workers = workers;
        o.backend = backend;
        o.sync = sync;
        o.disk_budget = disk_budget.map(|b| Arc::clone(&b.0));
        o.disk_link = budget_link;
        Ok(PyBlockStore(py.detach(|| RawStore::open(o)).map_err(err)?))
    }

    /// `(shard_bytes, shards_per_block)`.
    #[getter]
    fn geometry(&self) -> (usize, u32) {
        let g = self.0.geometry();
        (g.shard_bytes, g.shards_per_block)
    }

    /// Presence of each block.
    fn lookup(&self, py: Python<'_>, ids: Vec<Vec<u8>>) -> PyResult<Vec<bool>> {
        let ids = ids_of(&ids)?;
        Ok(py.detach(|| self.0.lookup(&ids)))
    }

    /// The number of leading blocks present.
    fn lookup_on_prefix(&self, py: Python<'_>, ids: Vec<Vec<u8>>) -> PyResult<usize> {
        let ids = ids_of(&ids)?;
        Ok(py.detach(|| self.0.lookup_on_prefix(&ids)))
    }

    /// Starts bringing disk-only blocks into the memory tier (a hint).
    fn prefetch(&self, py: Python<'_>, ids: Vec<Vec<u8>>) -> PyResult<()> {
        let ids = ids_of(&ids)?;
        py.detach(|| self.0.prefetch(&ids)).map_err(err)
    }

    /// Starts copying shards from the store to the addresses; returns the
    /// task number. The memory must stay allocated until `wait`.
    fn load(
        &self,
        py: Python<'_>,
        ids: Vec<Vec<u8>>,
        shards: Vec<u32>,
        addrs: Vec<u64>,
    ) -> PyResult<u64> {
        let items = items_of(&ids, &shards, &addrs)?;
        // SAFETY: the Python caller promises (this method's documented
        // contract, upstream's `load_data` contract) that every address is
        // a shard of live memory of this store's device until `wait`.
        py.detach(|| unsafe { self.0.load(&items) }).map_err(err)
    }

    /// Starts copying shards from the addresses into the store, after the
    /// engine event `event` (0: none; a `CUevent` on CUDA); returns the
    /// task number. The memory must stay allocated until `wait`.
    #[pyo3(signature = (ids, shards, addrs, event=0))]
    fn dump(
        &self,
        py: Python<'_>,
        ids: Vec<Vec<u8>>,
        shards: Vec<u32>,
        addrs: Vec<u64>,
        event: u64,
    ) -> PyResult<u64> {
        let items = items_of(&ids, &shards, &addrs)?;
        // SAFETY: as `load`; a non-zero event is the caller's live event.
        py.detach(|| unsafe { self.0.dump(&items, event) })
            .map_err(err)
    }

    /// True once the task's items have completed (does not end it).
    fn check(&self, task: u64) -> PyResult<bool> {
        self.0.check(task).map_err(err)
    }

    /// Waits for the task and ends it. Returns the items that did not
    /// succeed, as `(block_id, shard, kind, detail)` with kind `miss`,
    /// `failed` or `not_durable` (empty: every item succeeded). With
    /// `durable`, a dump also waits for its whole blocks to be on disk.
    #[pyo3(signature = (task, durable=false))]
    fn wait<'py>(&self, py: Python<'py>, task: u64, durable: bool) -> PyResult<Vec<Problem<'py>>> {
        let report = py.detach(|| self.0.wait(task, durable)).map_err(err)?;
        Ok(report
            .into_iter()
            .map(|r| {
                (
                    PyBytes::new(py, &r.block),
                    r.shard,
                    r.problem.kind(),
                    r.problem.detail().to_string(),
                )
            })
            .collect())
    }

    /// Counters as a dict.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.0.counters();
        let d = PyDict::new(py);
        for (k, v) in [
            "pool_hits",
            "disk_reads",
            "misses",
            "failed_items",
            "blocks_written",
            "write_failures",
            "fs_syncs",
        ]
        .iter()
        .zip(c)
        {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Waits for every task in flight and ends them.
    fn settle(&self, py: Python<'_>) {
        py.detach(|| self.0.settle())
    }
}

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBlockStore>()?;
    m.add_class::<PyDiskBudget>()
}
