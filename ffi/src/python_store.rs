//! The Python class `ucm.BlockStore`: the raw BlockStore ([`RawStore`]) of
//! the drop-in surfaces (`ucm.upstream`, `ucm.sglang_hicache`). Items are
//! given as three flat lists: 16-byte block ids, shard indices and integer
//! addresses; the caller keeps the memory alive until the task is waited
//! for, as with upstream UCM's `load_data`/`dump_data`. Blocking calls
//! release the GIL.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::blockstore::{RawItem, RawStore, RawStoreOptions};
use crate::coordinator::store::{BlockId, Geometry};
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
    /// directory, for a busy shared file system).
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (dir, shard_bytes, shards_per_block, pool_bytes=256 << 20, disk_blocks=1 << 20, workers=2, device="cpu", sync_mode="auto"))]
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
    ) -> PyResult<Self> {
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

/// Adds the class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBlockStore>()
}
