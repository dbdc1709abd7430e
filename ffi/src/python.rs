//! The Python module `ucm` (its native part, `ucm._ucm`): the spec table,
//! hashing, a cache with its scheduler and worker sides, and metrics.
//!
//! KV caches are registered from tensors without copies: the data pointer,
//! shape, strides, element size and device are read from the tensor (any
//! object with torch's `data_ptr()`, `element_size()`, `stride()`,
//! `size()`, `is_contiguous()` and `device`), and the tensor is kept alive
//! while registered. The device backend is chosen from the tensor's device
//! at run time. Blocking calls release the GIL.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use ucm_coordinator::adapter::{Allocation, LoadCause, Scheduled};
use ucm_coordinator::{Kind, RequestKeys, SpecTable};

use crate::error::FfiError;
use crate::runtime::{Backend, Cache, CacheOptions, RawRegion, SchedulerSide, WorkerSide};

impl From<FfiError> for PyErr {
    fn from(e: FfiError) -> Self {
        match e {
            FfiError::Argument { .. }
            | FfiError::Wire(_)
            | FfiError::DeviceName(_)
            | FfiError::UnknownTask { .. }
            | FfiError::NotRegistered
            | FfiError::BackendMismatch { .. }
            | FfiError::Buffer { .. }
            | FfiError::Coord(ucm_coordinator::CoordError::Store(
                ucm_coordinator::store::StoreError::Config(_),
            )) => PyValueError::new_err(e.to_string()),
            _ => PyRuntimeError::new_err(e.to_string()),
        }
    }
}

fn err(e: impl Into<FfiError>) -> PyErr {
    e.into().into()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn keys(cache_salt: Option<String>, extra_keys: Option<Vec<Vec<u8>>>) -> RequestKeys {
    RequestKeys {
        cache_salt,
        extra_keys: extra_keys.unwrap_or_default(),
    }
}

/// A validated spec table.
#[pyclass(name = "SpecTable", module = "ucm", frozen)]
pub struct PySpec(SpecTable);

#[pymethods]
impl PySpec {
    /// Parses a spec table from TOML text.
    #[staticmethod]
    fn from_toml(text: &str) -> PyResult<Self> {
        Ok(PySpec(SpecTable::from_toml(text).map_err(err)?))
    }

    /// Loads a spec table from a TOML file.
    #[staticmethod]
    fn load(path: &str) -> PyResult<Self> {
        Ok(PySpec(SpecTable::load(Path::new(path)).map_err(err)?))
    }

    /// The model name.
    #[getter]
    fn model(&self) -> String {
        self.0.model.clone()
    }

    /// The identity digest (hex) of the table's `[identity]`, or None.
    #[getter]
    fn identity(&self) -> Option<String> {
        self.0.identity.as_ref().map(|i| i.hex())
    }

    /// The canonical text the identity digest is computed over, or None.
    #[getter]
    fn identity_text(&self) -> Option<String> {
        self.0.identity.as_ref().map(|i| i.text.clone())
    }

    /// The number of layers.
    #[getter]
    fn num_layers(&self) -> u32 {
        self.0.layer_count()
    }

    /// The groups, as dicts: index, name, kind, layers, block (block size
    /// or grid), window, bytes of one layer's block or state.
    fn groups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for g in self.0.groups() {
            let d = PyDict::new(py);
            d.set_item("index", g.index)?;
            d.set_item("name", &g.name)?;
            d.set_item(
                "kind",
                match g.kind {
                    Kind::Chain => "chain",
                    Kind::Snapshot => "snapshot",
                    Kind::None => "none",
                    Kind::Sidecar => "sidecar",
                },
            )?;
            d.set_item("layers", g.layers.clone())?;
            d.set_item("block", self.0.block_of(g.index))?;
            d.set_item("window", g.window)?;
            d.set_item(
                "layer_bytes",
                g.bytes_per_layer_block(self.0.block_of(g.index)),
            )?;
            out.append(d)?;
        }
        Ok(out)
    }
}

/// The chain ids (16 bytes each) of `tokens` in `group` for `rank`.
#[pyfunction]
#[pyo3(signature = (spec, tokens, group, rank=0, tp_size=1, cache_salt=None, extra_keys=None))]
#[allow(clippy::too_many_arguments)]
fn block_ids<'py>(
    py: Python<'py>,
    spec: &PySpec,
    tokens: Vec<u32>,
    group: &str,
    rank: u32,
    tp_size: u32,
    cache_salt: Option<String>,
    extra_keys: Option<Vec<Vec<u8>>>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let k = keys(cache_salt, extra_keys);
    let ids = py
        .detach(|| crate::hashing::block_ids(&spec.0, tp_size, &k, &tokens, group, rank))
        .map_err(err)?;
    Ok(ids.iter().map(|id| PyBytes::new(py, id)).collect())
}

/// The checkpoint hash of snapshot group `group` at `position`.
#[pyfunction]
#[pyo3(signature = (spec, tokens, group, position, rank=0, tp_size=1, cache_salt=None, extra_keys=None))]
#[allow(clippy::too_many_arguments)]
fn checkpoint_hash<'py>(
    py: Python<'py>,
    spec: &PySpec,
    tokens: Vec<u32>,
    group: &str,
    position: u64,
    rank: u32,
    tp_size: u32,
    cache_salt: Option<String>,
    extra_keys: Option<Vec<Vec<u8>>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let k = keys(cache_salt, extra_keys);
    let id = py
        .detach(|| crate::hashing::checkpoint(&spec.0, tp_size, &k, &tokens, group, rank, position))
        .map_err(err)?;
    Ok(PyBytes::new(py, &id))
}

/// One model's cache under a directory.
#[pyclass(name = "Cache", module = "ucm", frozen)]
pub struct PyCache(Arc<Cache>);

#[pymethods]
impl PyCache {
    /// Opens the cache of `spec` under `dir`; `remote` (a Redis or Valkey
    /// cluster, `redis://host:port,...`) and `cold` (an S3 bucket,
    /// `s3://bucket/prefix?endpoint=...`) are tiers below the disk shared
    /// with other instances; `no_disk` makes them the persistent tiers
    /// instead of a local disk. `sync_mode` is how the disk tiers make writes
    /// durable: `auto` (one `syncfs` per batch where the file system
    /// allows) or `files` (an fsync per file and directory, for a busy
    /// shared file system). `disk_blocks` is the disk capacity, as that
    /// many block files of every group, shared by the groups as one byte
    /// budget.
    #[new]
    #[pyo3(signature = (spec, dir, tp_size=1, pool_bytes=256 << 20, disk_blocks=1 << 20, lookahead=2, workers=2, remote=None, cold=None, no_disk=false, sync_mode="auto"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        spec: &PySpec,
        dir: &str,
        tp_size: u32,
        pool_bytes: usize,
        disk_blocks: u64,
        lookahead: usize,
        workers: usize,
        remote: Option<String>,
        cold: Option<String>,
        no_disk: bool,
        sync_mode: &str,
    ) -> PyResult<Self> {
        let mut o = CacheOptions::new(dir);
        o.store.sync = sync_mode.parse().map_err(err)?;
        o.tp_size = tp_size;
        o.store.pool_bytes = Some(pool_bytes);
        o.store.disk_blocks = disk_blocks;
        o.store.workers = workers;
        o.store.remote = remote;
        o.store.cold = cold;
        o.store.no_disk = no_disk;
        o.lookahead = lookahead;
        Ok(PyCache(Cache::open(spec.0.clone(), o).map_err(err)?))
    }

    /// The scheduler side.
    fn scheduler(&self) -> PyScheduler {
        PyScheduler(Mutex::new(self.0.scheduler()))
    }

    /// A worker of `rank` over spec layers `[stage_start, stage_end)`
    /// (default: all); its backend is chosen when its KV caches register.
    #[pyo3(signature = (rank=0, stage_start=0, stage_end=None))]
    fn worker(&self, rank: u32, stage_start: u32, stage_end: Option<u32>) -> PyWorker {
        PyWorker {
            cache: Arc::clone(&self.0),
            rank,
            stage: stage_start..stage_end.unwrap_or_else(|| self.0.spec().layer_count()),
            state: Mutex::new(None),
        }
    }

    /// When the store directory holds other identities of this model than
    /// this cache's: which, and what differs (a note for the operator,
    /// worth logging when a lookup serves nothing); else None.
    fn identity_note(&self, py: Python<'_>) -> Option<String> {
        py.detach(|| self.0.identity_note())
    }

    /// Metrics in the Prometheus text format.
    fn metrics_text(&self) -> String {
        self.0.prometheus()
    }

    /// Counters as a dict.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        use std::sync::atomic::Ordering::Relaxed;
        let m = self.0.metrics();
        let d = PyDict::new(py);
        d.set_item("lookups", m.lookups.load(Relaxed))?;
        d.set_item("lookup_hits", m.lookup_hits.load(Relaxed))?;
        d.set_item("loads", m.loads.load(Relaxed))?;
        d.set_item("failed_loads", m.failed_loads.load(Relaxed))?;
        d.set_item("saved_requests", m.saved_requests.load(Relaxed))?;
        d.set_item("failed_saves", m.failed_saves.load(Relaxed))?;
        let (pool, disk) = self.0.tier_bytes();
        d.set_item("pool_read_bytes", pool)?;
        d.set_item("disk_read_bytes", disk)?;
        let hits = PyDict::new(py);
        for g in self.0.spec().groups() {
            if let Some((h, miss)) = m.group_tokens(&g.name) {
                hits.set_item(&g.name, (h, miss))?;
            }
        }
        d.set_item("group_tokens", hits)?;
        Ok(d)
    }
}

/// The scheduler side of a cache.
#[pyclass(name = "Scheduler", module = "ucm", frozen)]
pub struct PyScheduler(Mutex<SchedulerSide>);

#[pymethods]
impl PyScheduler {
    /// Tokens of the prompt beyond `num_computed` that UCM serves.
    #[pyo3(signature = (req_id, tokens, num_computed, cache_salt=None, extra_keys=None))]
    fn get_num_new_matched_tokens(
        &self,
        py: Python<'_>,
        req_id: &str,
        tokens: Vec<u32>,
        num_computed: u64,
        cache_salt: Option<String>,
        extra_keys: Option<Vec<Vec<u8>>>,
    ) -> PyResult<u64> {
        let k = keys(cache_salt, extra_keys);
        py.detach(|| {
            lock(&self.0).get_num_new_matched_tokens(req_id, Arc::new(tokens), k, num_computed)
        })
        .map_err(err)
    }

    /// Where the engine placed the request: per chain or sidecar group
    /// index, the engine block of each block index; per snapshot group
    /// index, its state slot.
    fn update_state_after_alloc(
        &self,
        req_id: &str,
        blocks: HashMap<usize, Vec<u32>>,
        state_slots: HashMap<usize, u32>,
        num_external_tokens: u64,
    ) -> PyResult<()> {
        let alloc = Allocation {
            blocks,
            state_slots,
        };
        lock(&self.0)
            .update_state_after_alloc(req_id, alloc, num_external_tokens)
            .map_err(err)
    }

    /// The request's tokens grew by decoding (`tokens`: all of them so
    /// far, beginning with the prompt): blocks it completes are saved too.
    fn extend_tokens(&self, py: Python<'_>, req_id: &str, tokens: Vec<u32>) -> PyResult<()> {
        py.detach(|| lock(&self.0).extend_tokens(req_id, Arc::new(tokens)))
            .map_err(err)
    }

    /// The engine's placement of the request grew (more blocks after a
    /// chunk or an asynchronous load): later saves use it.
    fn update_allocation(
        &self,
        req_id: &str,
        blocks: HashMap<usize, Vec<u32>>,
        state_slots: HashMap<usize, u32>,
    ) -> PyResult<()> {
        let alloc = Allocation {
            blocks,
            state_slots,
        };
        lock(&self.0).update_allocation(req_id, alloc).map_err(err)
    }

    /// The encoded metadata of a step computing `chunks` (`(req_id, start,
    /// end)` each), for the workers' `start_load_kv`.
    fn build_meta<'py>(
        &self,
        py: Python<'py>,
        chunks: Vec<(String, u64, u64)>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let cs: Vec<Scheduled> = chunks
            .into_iter()
            .map(|(req, start, end)| Scheduled { req, start, end })
            .collect();
        let bytes = py
            .detach(|| {
                lock(&self.0)
                    .build_meta(&cs)
                    .map(|m| crate::wire::encode(&m))
            })
            .map_err(err)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Positions where the request should end a prefill chunk so that its
    /// states are kept.
    fn checkpoint_positions(&self, req_id: &str) -> Vec<u64> {
        lock(&self.0).checkpoint_positions(req_id)
    }

    /// The last resolution of a request, `(l, p*)`.
    fn resolution(&self, req_id: &str) -> Option<(u64, u64)> {
        lock(&self.0).resolution(req_id)
    }

    /// The request ended.
    fn request_finished(&self, req_id: &str) -> bool {
        lock(&self.0).request_finished(req_id)
    }
}

/// `(saved, save_failed with why, loaded)` request ids.
type FinishedLists = (Vec<String>, Vec<(String, String)>, Vec<String>);

struct Registered {
    side: WorkerSide,
    /// The registered tensors, kept alive while the worker lives.
    _tensors: Vec<Py<PyAny>>,
}

/// The worker side of one rank.
#[pyclass(name = "Worker", module = "ucm", frozen)]
pub struct PyWorker {
    cache: Arc<Cache>,
    rank: u32,
    stage: std::ops::Range<u32>,
    state: Mutex<Option<Registered>>,
}

/// The raw region of a tensor whose dimension `block_dim` indexes engine
/// blocks (or state slots).
fn region_of(layer: u32, t: &Bound<'_, PyAny>, block_dim: usize) -> PyResult<(RawRegion, String)> {
    let dev = t.getattr("device")?.str()?.to_string();
    let addr: u64 = t.call_method0("data_ptr")?.extract()?;
    let elem: usize = t.call_method0("element_size")?.extract()?;
    let shape: Vec<usize> = t.call_method0("size")?.extract()?;
    let strides: Vec<usize> = t.call_method0("stride")?.extract()?;
    if block_dim >= shape.len() {
        return Err(PyValueError::new_err(format!(
            "layer {layer}: block dimension {block_dim} of a {}-d tensor",
            shape.len()
        )));
    }
    // Every size below is checked: a tensor-like object can report any
    // element size, shape or stride, and a product that wraps would
    // register a region smaller than the view.
    let overflow = || {
        PyValueError::new_err(format!(
            "layer {layer}: the tensor's size overflows (element size {elem}, shape {shape:?}, \
             strides {strides:?})"
        ))
    };
    if elem == 0 || shape.len() != strides.len() {
        return Err(PyValueError::new_err(format!(
            "layer {layer}: element size {elem}, {} dimensions and {} strides",
            shape.len(),
            strides.len()
        )));
    }
    // Each block must be one contiguous chunk: the dimensions after the
    // block dimension are dense, and those before it are outermost.
    let mut dense = elem;
    for d in (block_dim + 1..shape.len()).rev() {
        let bytes = strides[d].checked_mul(elem).ok_or_else(overflow)?;
        if shape[d] > 1 && bytes != dense {
            return Err(PyValueError::new_err(format!(
                "layer {layer}: a block is not one contiguous chunk (shape {shape:?}, strides \
                 {strides:?}); this layout is not supported"
            )));
        }
        dense = dense.checked_mul(shape[d]).ok_or_else(overflow)?;
    }
    let stride = strides[block_dim].checked_mul(elem).ok_or_else(overflow)?;
    if stride < dense {
        return Err(PyValueError::new_err(format!(
            "layer {layer}: blocks overlap (stride {stride} bytes, block {dense} bytes)"
        )));
    }
    // The bytes spanned by the view.
    let mut span = elem;
    for (n, s) in shape.iter().zip(&strides) {
        let part = n
            .saturating_sub(1)
            .checked_mul(*s)
            .and_then(|x| x.checked_mul(elem))
            .ok_or_else(overflow)?;
        span = span.checked_add(part).ok_or_else(overflow)?;
    }
    Ok((
        RawRegion {
            layer,
            addr,
            len: span,
            stride,
        },
        dev,
    ))
}

impl PyWorker {
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut WorkerSide) -> crate::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let mut st = lock(&self.state);
            let r = st.as_mut().ok_or(FfiError::NotRegistered)?;
            f(&mut r.side)
        })
        .map_err(err)
    }
}

#[pymethods]
impl PyWorker {
    /// Registers the engine's KV caches: `(spec_layer, tensor, block_dim)`
    /// each, where dimension `block_dim` of the tensor indexes engine
    /// blocks (chain, sidecar) or state slots (snapshot) and each block is
    /// one contiguous chunk. All tensors must be on one device; its type
    /// chooses the backend (`cpu`: host memory; `cuda`: the CUDA backend
    /// where built).
    fn register_kv_caches(
        &self,
        py: Python<'_>,
        layers: Vec<(u32, Bound<'_, PyAny>, usize)>,
    ) -> PyResult<()> {
        let mut regions = Vec::with_capacity(layers.len());
        let mut device: Option<String> = None;
        let mut keep = Vec::with_capacity(layers.len());
        for (layer, t, dim) in &layers {
            let (r, dev) = region_of(*layer, t, *dim)?;
            match &device {
                Some(d) if *d != dev => {
                    return Err(PyValueError::new_err(format!(
                        "layer {layer} is on {dev}, earlier layers on {d}"
                    )))
                }
                _ => device = Some(dev),
            }
            regions.push(r);
            keep.push(t.clone().unbind());
        }
        let backend = Backend::parse(device.as_deref().unwrap_or("cpu")).map_err(err)?;
        let mut st = lock(&self.state);
        if st.is_some() {
            return Err(PyValueError::new_err("KV caches are registered already"));
        }
        let mut side = self
            .cache
            .worker(backend, self.rank, self.stage.clone())
            .map_err(err)?;
        // SAFETY: every region spans the bytes of a live tensor on
        // `backend` (read from the tensor above), and the tensors are kept
        // alive in `Registered` for as long as the worker side lives.
        py.detach(|| unsafe { side.register_kv_caches(&regions) })
            .map_err(err)?;
        *st = Some(Registered {
            side,
            _tensors: keep,
        });
        Ok(())
    }

    /// Starts a step from the scheduler's encoded metadata.
    fn start_load_kv(&self, py: Python<'_>, meta: &[u8]) -> PyResult<()> {
        let spec = Arc::clone(self.cache.spec());
        let m = crate::wire::decode(&spec, meta).map_err(err)?;
        self.with(py, |w| w.start_load_kv(m))
    }

    /// Blocks until `layer`'s loads of this step are in place.
    fn wait_for_layer_load(&self, py: Python<'_>, layer: u32) -> PyResult<()> {
        self.with(py, |w| w.wait_for_layer_load(layer))
    }

    /// `layer` is computed: its saves of this step start.
    fn save_kv_layer(&self, py: Python<'_>, layer: u32) -> PyResult<()> {
        self.with(py, |w| w.save_kv_layer(layer))
    }

    /// Blocks until this step's saves are out of the engine's memory.
    fn wait_for_save(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |w| w.wait_for_save())
    }

    /// `(saved, save_failed, loaded)` request ids, given the requests the
    /// engine finished (pass a request again until it is reported).
    fn get_finished(&self, py: Python<'_>, finished: Vec<String>) -> PyResult<FinishedLists> {
        let f = self.with(py, |w| Ok(w.get_finished(&finished)))?;
        Ok((
            f.saved,
            f.save_failed
                .into_iter()
                .map(|(r, why)| (r, why.to_string()))
                .collect(),
            f.loaded,
        ))
    }

    /// Load items that failed since the last call: `(req_id, group,
    /// engine_block, cause)`; the engine recomputes those blocks.
    fn load_errors(&self, py: Python<'_>) -> PyResult<Vec<(String, usize, u32, String)>> {
        let e = self.with(py, |w| Ok(w.block_ids_with_load_errors()))?;
        Ok(e.into_iter()
            .map(|e| {
                let cause = match &e.cause {
                    LoadCause::Miss => "miss".to_string(),
                    LoadCause::Failed(f) => f.to_string(),
                };
                (e.req, e.group, e.engine_block, cause)
            })
            .collect())
    }

    /// `(loaded, load_failures, saved, save_failures)` items of this worker.
    fn counters(&self, py: Python<'_>) -> PyResult<(u64, u64, u64, u64)> {
        let [a, b, c, d] = self.with(py, |w| Ok(w.adapter_counters()))?;
        Ok((a, b, c, d))
    }
}

/// The ABI version of the native library.
#[pyfunction]
fn abi_version() -> u32 {
    crate::ABI_VERSION
}

/// The native part of the `ucm` package.
#[pymodule]
fn _ucm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySpec>()?;
    m.add_class::<PyCache>()?;
    m.add_class::<PyScheduler>()?;
    m.add_class::<PyWorker>()?;
    m.add_function(wrap_pyfunction!(block_ids, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint_hash, m)?)?;
    m.add_function(wrap_pyfunction!(abi_version, m)?)?;
    crate::python_store::register(m)?;
    Ok(())
}
