//! The embeddable cache: one model's spec table, its stores and checkpoint
//! directory, and the scheduler and worker sides an engine drives. The C ABI
//! and the Python module are thin shims over this module; it holds no engine
//! types, only spec layer indices, engine block numbers and raw regions.
//!
//! The device backend is chosen when the first worker registers its KV
//! caches (host memory, CUDA or Ascend where built), so one build serves
//! every device. The scheduler side never moves bytes: it asks the stores
//! of the worker side of the same cache when they exist, and otherwise a
//! host view of the same directory (disk presence; what the workers put in
//! the pool becomes visible once dumped).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;
use ucm_device::{DeviceNameProblem, DeviceSpec};

use ucm_coordinator::adapter::{
    Allocation, ConnectorMeta, EngineRequest, Finished, GroupCounters, LayerRegistration,
    LoadError, Scheduled, Scheduler, StoreSet, StoreSetConfig, UnitMap, Worker, WorkerConfig,
};
use ucm_coordinator::hash::Id;
use ucm_coordinator::{
    CheckpointDirectory, CheckpointSource, CoordError, Deployment, Group, Presence, RequestKeys,
    SpecTable,
};
use ucm_device::{Device, DeviceHandle, HostDevice};

use crate::error::{ArgProblem, FfiError, Result, Unsupported};
use crate::metrics::Metrics;

/// Where a worker's KV caches live, and so which device backend moves them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Host memory (CPU engines; the host device).
    Host,
    /// An NVIDIA GPU, by ordinal (feature `cuda`).
    Cuda(usize),
}

impl Backend {
    /// The device this backend moves.
    pub fn spec(self) -> DeviceSpec {
        match self {
            Backend::Host => DeviceSpec::Host,
            Backend::Cuda(i) => DeviceSpec::Cuda(i as u32),
        }
    }

    /// The backend of a tensor device string as torch writes it (`cpu`,
    /// `cuda`, `cuda:1`), parsed by the HAL's one device-name parser
    /// ([`DeviceSpec`]). Ascend (`npu`) is refused until its import path is
    /// built.
    pub fn parse(device: &str) -> Result<Backend> {
        match device.parse::<DeviceSpec>() {
            Ok(DeviceSpec::Host) => Ok(Backend::Host),
            Ok(DeviceSpec::Cuda(i)) => Ok(Backend::Cuda(i as usize)),
            Ok(d @ DeviceSpec::Npu(_)) => Err(FfiError::Unsupported(Unsupported::Device(d))),
            // A kind no backend has may be a device this build does not
            // carry: unsupported, as a known one without its feature.
            Err(e) if e.why == DeviceNameProblem::UnknownKind => {
                Err(FfiError::Unsupported(Unsupported::UnknownDevice(e)))
            }
            Err(e) => Err(FfiError::DeviceName(e)),
        }
    }
}

/// How a cache is opened.
#[derive(Clone, Debug)]
pub struct CacheOptions {
    /// The store directory (created if missing).
    pub dir: PathBuf,
    /// Tensor-parallel ranks of the deployment.
    pub tp_size: u32,
    /// Pool, disk and I/O settings.
    pub store: StoreSetConfig,
    /// Units loaded ahead of the one a layer waits for.
    pub lookahead: usize,
}

impl CacheOptions {
    /// Defaults for `dir`: one rank, a 256 MiB pool per group, lookahead 2.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CacheOptions {
            dir: dir.into(),
            tp_size: 1,
            store: StoreSetConfig {
                pool_bytes: Some(256 << 20),
                ..StoreSetConfig::default()
            },
            lookahead: ucm_coordinator::adapter::DEFAULT_LOOKAHEAD,
        }
    }
}

/// The stores of the backend the workers chose.
#[derive(Clone)]
enum AnyStores {
    Host(Arc<HostDevice>, Arc<StoreSet<HostDevice>>),
    #[cfg(feature = "cuda")]
    Cuda(
        Arc<ucm_device::accel::cuda::CudaDevice>,
        Arc<StoreSet<ucm_device::accel::cuda::CudaDevice>>,
        usize,
    ),
}

impl AnyStores {
    fn backend(&self) -> Backend {
        match self {
            AnyStores::Host(..) => Backend::Host,
            #[cfg(feature = "cuda")]
            AnyStores::Cuda(_, _, ordinal) => Backend::Cuda(*ordinal),
        }
    }

    fn view(&self) -> &dyn StoreView {
        match self {
            AnyStores::Host(_, s) => s.as_ref(),
            #[cfg(feature = "cuda")]
            AnyStores::Cuda(_, s, _) => s.as_ref(),
        }
    }

    fn tier_bytes(&self) -> (u64, u64) {
        match self {
            AnyStores::Host(_, s) => s.tier_bytes(),
            #[cfg(feature = "cuda")]
            AnyStores::Cuda(_, s, _) => s.tier_bytes(),
        }
    }

    fn group_counters(&self, group: usize) -> Option<GroupCounters> {
        match self {
            AnyStores::Host(_, s) => s.group_counters(group),
            #[cfg(feature = "cuda")]
            AnyStores::Cuda(_, s, _) => s.group_counters(group),
        }
    }
}

struct Stores {
    /// The workers' stores, once a worker registered.
    workers: Option<AnyStores>,
    /// The scheduler's host view, opened only while no worker exists.
    view: Option<Arc<StoreSet<HostDevice>>>,
}

/// One model's cache in this process.
pub struct Cache {
    spec: Arc<SpecTable>,
    dep: Deployment,
    units: Arc<UnitMap>,
    directory: Arc<CheckpointDirectory>,
    opts: CacheOptions,
    stores: Mutex<Stores>,
    metrics: Arc<Metrics>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Cache {
    /// Opens the cache of `spec` under `opts.dir`. Nothing is opened on
    /// disk until a side needs it; bad options are refused here.
    pub fn open(spec: SpecTable, opts: CacheOptions) -> Result<Arc<Cache>> {
        if opts.tp_size == 0 {
            return Err(FfiError::Argument {
                name: "tp_size".into(),
                problem: ArgProblem::OutOfRange {
                    value: "0".into(),
                    expected: "at least 1",
                },
            });
        }
        if opts.dir.as_os_str().is_empty() {
            return Err(FfiError::Argument {
                name: "dir".into(),
                problem: ArgProblem::Empty,
            });
        }
        opts.store.validate()?;
        let units = Arc::new(UnitMap::new(&spec));
        let metrics = Arc::new(Metrics::new(&spec));
        // The directory asks this cache's stores for checkpoints it does not
        // know (other instances sharing the tiers); a weak reference, so the
        // cache and its directory do not keep each other alive.
        Ok(Arc::new_cyclic(|me: &Weak<Cache>| Cache {
            spec: Arc::new(spec),
            dep: Deployment {
                tp_size: opts.tp_size,
            },
            units,
            directory: Arc::new(CheckpointDirectory::with_source(Arc::new(CacheSource(
                me.clone(),
            )))),
            opts,
            stores: Mutex::new(Stores {
                workers: None,
                view: None,
            }),
            metrics,
        }))
    }

    /// The spec table.
    pub fn spec(&self) -> &Arc<SpecTable> {
        &self.spec
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.opts.dir
    }

    /// When the store directory holds other identities of this model than
    /// this cache's own: which, and what differs
    /// ([`ucm_coordinator::adapter::identities::others_note`]).
    pub fn identity_note(&self) -> Option<String> {
        ucm_coordinator::adapter::identities::others_note(&self.opts.dir, &self.spec)
    }

    /// Counters and histograms of this cache.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Bytes held now in the pool and on disk, over the stores that are
    /// open.
    pub fn tier_bytes(&self) -> (u64, u64) {
        let st = lock(&self.stores);
        match (&st.workers, &st.view) {
            (Some(s), _) => s.tier_bytes(),
            (None, Some(v)) => v.tier_bytes(),
            (None, None) => (0, 0),
        }
    }

    /// The metrics of this cache and its stores, in the Prometheus text
    /// format.
    pub fn prometheus(&self) -> String {
        let st = lock(&self.stores);
        let counters: Vec<(String, GroupCounters)> = self
            .spec
            .groups()
            .iter()
            .filter_map(|g| {
                let c = match (&st.workers, &st.view) {
                    (Some(s), _) => s.group_counters(g.index),
                    (None, Some(v)) => v.group_counters(g.index),
                    (None, None) => None,
                }?;
                Some((g.name.clone(), c))
            })
            .collect();
        drop(st);
        self.metrics.render(&counters)
    }

    fn open_set<D: Device>(&self, dev: &Arc<D>) -> Result<Arc<StoreSet<D>>> {
        let set = StoreSet::open(
            &self.spec,
            &self.units,
            &self.opts.dir,
            Arc::clone(dev),
            &self.opts.store,
        )?;
        set.rebuild_directory(&self.spec, &self.directory);
        Ok(Arc::new(set))
    }

    /// The workers' stores on `backend`, opened by the first worker.
    fn stores_on(&self, backend: Backend) -> Result<AnyStores> {
        let mut st = lock(&self.stores);
        if let Some(s) = &st.workers {
            if s.backend() != backend {
                return Err(FfiError::BackendMismatch {
                    have: s.backend().spec(),
                    want: backend.spec(),
                });
            }
            return Ok(s.clone());
        }
        #[cfg(not(feature = "cuda"))]
        if let Backend::Cuda(_) = backend {
            return Err(FfiError::Unsupported(Unsupported::NoCuda));
        }
        // The HAL's one device handle, as the command line opens it.
        #[allow(unreachable_patterns)]
        let s = match DeviceHandle::open(backend.spec())? {
            DeviceHandle::Host(dev) => {
                let set = self.open_set(&dev)?;
                AnyStores::Host(dev, set)
            }
            #[cfg(feature = "cuda")]
            DeviceHandle::Cuda(dev, ordinal) => {
                let set = self.open_set(&dev)?;
                AnyStores::Cuda(dev, set, ordinal as usize)
            }
            // A backend the cache does not import tensors from yet (the
            // HAL may carry Ascend in a build with every feature).
            other => return Err(FfiError::Unsupported(Unsupported::Device(other.spec()))),
        };
        st.view = None;
        st.workers = Some(s.clone());
        Ok(s)
    }

    /// The scheduler side of this cache.
    pub fn scheduler(self: &Arc<Self>) -> SchedulerSide {
        let mut inner = Scheduler::new(
            Arc::clone(&self.spec),
            self.dep,
            Arc::new(CachePresence(Arc::clone(self))),
            Arc::clone(&self.directory),
        );
        if !self.opts.store.no_disk {
            inner.bound_saved_to_disk(self.opts.store.disk_blocks);
        }
        SchedulerSide {
            inner,
            cache: Arc::clone(self),
        }
    }

    /// A worker of `rank` over the pipeline stage `stage` (spec layers);
    /// its KV caches are registered next, on `backend`.
    pub fn worker(
        self: &Arc<Self>,
        backend: Backend,
        rank: u32,
        stage: std::ops::Range<u32>,
    ) -> Result<WorkerSide> {
        let cfg = WorkerConfig::new(rank, self.dep.tp_size, stage, self.opts.lookahead);
        let inner = match self.stores_on(backend)? {
            AnyStores::Host(dev, set) => AnyWorker::Host(self.new_worker(set, &dev, cfg)?, dev),
            #[cfg(feature = "cuda")]
            AnyStores::Cuda(dev, set, _) => AnyWorker::Cuda(self.new_worker(set, &dev, cfg)?, dev),
        };
        Ok(WorkerSide {
            inner,
            cache: Arc::clone(self),
            step_started: None,
        })
    }
}

impl Cache {
    fn new_worker<D: Device>(
        &self,
        set: Arc<StoreSet<D>>,
        dev: &Arc<D>,
        cfg: WorkerConfig,
    ) -> Result<Worker<D>> {
        Ok(Worker::new(
            Arc::clone(&self.spec),
            Arc::clone(&self.units),
            set,
            Arc::clone(&self.directory),
            Arc::clone(dev),
            cfg,
        )?)
    }
}

/// What the scheduler side asks of stores: presence and checkpoints.
trait StoreView: Presence + CheckpointSource {}

impl<T: Presence + CheckpointSource> StoreView for T {}

impl Cache {
    /// Runs `f` on the workers' stores, or on a host view of the same
    /// directory while there are none; `miss` when neither opens.
    fn with_view<R>(&self, miss: R, f: impl FnOnce(&dyn StoreView) -> R) -> R {
        let mut st = lock(&self.stores);
        if let Some(s) = &st.workers {
            return f(s.view());
        }
        if st.view.is_none() {
            match self.open_set(&Arc::new(HostDevice::new())) {
                Ok(v) => st.view = Some(v),
                Err(e) => {
                    // A store that cannot open serves nothing: a miss.
                    log::warn!("ucm: the scheduler's store view did not open: {e}");
                    return miss;
                }
            }
        }
        match &st.view {
            Some(v) => f(v.as_ref()),
            None => miss,
        }
    }
}

/// The scheduler's presence: the workers' stores, or a host view of the
/// same directory while there are none.
struct CachePresence(Arc<Cache>);

impl Presence for CachePresence {
    fn lookup(&self, group: &Group, ids: &[Id]) -> Vec<bool> {
        self.0
            .with_view(vec![false; ids.len()], |v| v.lookup(group, ids))
    }
}

/// The checkpoint directory's source: the same stores as the presence.
struct CacheSource(Weak<Cache>);

impl CheckpointSource for CacheSource {
    fn exists(&self, group: &Group, position: u64, hash: &Id) -> bool {
        self.0.upgrade().is_some_and(|c| {
            c.with_view(false, |v| {
                CheckpointSource::exists(v, group, position, hash)
            })
        })
    }
}

/// The scheduler side: how much of a prompt is persisted, and the
/// metadata of each step.
pub struct SchedulerSide {
    inner: Scheduler<CachePresence>,
    cache: Arc<Cache>,
}

impl SchedulerSide {
    /// Tokens of the prompt beyond `num_computed` that UCM serves.
    pub fn get_num_new_matched_tokens(
        &mut self,
        req_id: &str,
        tokens: Arc<Vec<u32>>,
        keys: RequestKeys,
        num_computed: u64,
    ) -> Result<u64> {
        let n = tokens.len() as u64;
        let req = EngineRequest {
            id: req_id.to_owned(),
            tokens,
            keys,
        };
        let (extra, _) = self.inner.get_num_new_matched_tokens(&req, num_computed)?;
        let ceiling = self.inner.ceiling(req_id).unwrap_or(0);
        self.cache
            .metrics
            .lookup(n.saturating_sub(1), num_computed, extra, ceiling);
        Ok(extra)
    }

    /// Where the engine placed the request, and how many external tokens
    /// it takes.
    pub fn update_state_after_alloc(
        &mut self,
        req_id: &str,
        alloc: Allocation,
        num_external_tokens: u64,
    ) -> Result<()> {
        Ok(self
            .inner
            .update_state_after_alloc(req_id, alloc, num_external_tokens)?)
    }

    /// The request's tokens grew by decoding: blocks it completes are
    /// saved too.
    pub fn extend_tokens(&mut self, req_id: &str, tokens: Arc<Vec<u32>>) -> Result<()> {
        Ok(self.inner.extend_tokens(req_id, tokens)?)
    }

    /// The engine's placement of the request grew: later saves use it.
    pub fn update_allocation(&mut self, req_id: &str, alloc: Allocation) -> Result<()> {
        Ok(self.inner.update_allocation(req_id, alloc)?)
    }

    /// The metadata of a step that computes `chunks`.
    pub fn build_meta(&mut self, chunks: &[Scheduled]) -> Result<Arc<ConnectorMeta>> {
        Ok(self.inner.build_meta(chunks)?)
    }

    /// Positions where the request should end a prefill chunk so that its
    /// states are kept.
    pub fn checkpoint_positions(&self, req_id: &str) -> Vec<u64> {
        self.inner.checkpoint_positions(req_id)
    }

    /// The last resolution of a request, `(l, p*)`.
    pub fn resolution(&self, req_id: &str) -> Option<(u64, u64)> {
        self.inner.resolution(req_id)
    }

    /// The request ended; `true` when its blocks must stay allocated
    /// (never).
    pub fn request_finished(&mut self, req_id: &str) -> bool {
        self.inner.request_finished(req_id)
    }

    /// The cache this side belongs to.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }
}

enum AnyWorker {
    Host(Worker<HostDevice>, Arc<HostDevice>),
    #[cfg(feature = "cuda")]
    Cuda(
        Worker<ucm_device::accel::cuda::CudaDevice>,
        Arc<ucm_device::accel::cuda::CudaDevice>,
    ),
}

macro_rules! each {
    ($w:expr, $v:ident, $d:ident => $body:expr) => {
        match $w {
            AnyWorker::Host($v, $d) => $body,
            #[cfg(feature = "cuda")]
            AnyWorker::Cuda($v, $d) => $body,
        }
    };
}

/// One engine layer's tensor, as raw parts.
#[derive(Clone, Copy, Debug)]
pub struct RawRegion {
    /// The spec layer.
    pub layer: u32,
    /// Base address (host or device).
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
    /// Bytes between engine blocks or state slots.
    pub stride: usize,
}

/// A refused KV-cache region, named by its layer.
fn region_arg(r: &RawRegion, problem: ArgProblem) -> FfiError {
    FfiError::Argument {
        name: format!("regions[layer {}]", r.layer),
        problem,
    }
}

/// The worker side of one rank.
pub struct WorkerSide {
    inner: AnyWorker,
    cache: Arc<Cache>,
    step_started: Option<Instant>,
}

impl WorkerSide {
    /// Registers the engine's tensors.
    ///
    /// # Safety
    /// Every region must be memory of this worker's backend (host memory
    /// for [`Backend::Host`]) that stays allocated, and is not freed or
    /// moved, until this worker is dropped.
    pub unsafe fn register_kv_caches(&mut self, regions: &[RawRegion]) -> Result<()> {
        each!(&mut self.inner, w, dev => {
            let mut regs = Vec::with_capacity(regions.len());
            for r in regions {
                if r.addr == 0 {
                    return Err(region_arg(r, ArgProblem::Null));
                }
                if r.addr.checked_add(r.len as u64).is_none() {
                    return Err(region_arg(
                        r,
                        ArgProblem::Wraps {
                            addr: r.addr,
                            len: r.len,
                        },
                    ));
                }
                if r.stride == 0 || r.len < r.stride {
                    return Err(region_arg(
                        r,
                        ArgProblem::Stride {
                            len: r.len,
                            stride: r.stride,
                        },
                    ));
                }
                // SAFETY: the caller guarantees (this function's contract)
                // that the region is this backend's memory and outlives the
                // worker, which holds every handle made from it.
                let memory = unsafe { dev.import_device(r.addr, r.len) }?;
                regs.push(LayerRegistration {
                    layer: r.layer,
                    memory,
                    stride: r.stride,
                });
            }
            Ok(w.register_kv_caches(regs)?)
        })
    }

    /// Starts a step: loads begin.
    pub fn start_load_kv(&mut self, meta: Arc<ConnectorMeta>) -> Result<()> {
        self.step_started = Some(Instant::now());
        let loads = meta.requests.iter().filter(|r| r.load.is_some()).count();
        each!(&mut self.inner, w, _d => w.start_load_kv(meta))?;
        self.cache.metrics.loads_started(loads as u64);
        Ok(())
    }

    /// Blocks until `layer`'s loads of this step are in the engine's
    /// memory (or reported failed).
    pub fn wait_for_layer_load(&mut self, layer: u32) -> Result<()> {
        let t = Instant::now();
        let r = each!(&mut self.inner, w, _d => w.wait_for_layer_load(layer));
        self.cache.metrics.load_wait(t.elapsed());
        Ok(r?)
    }

    /// `layer` is computed: its saves of this step start.
    pub fn save_kv_layer(&mut self, layer: u32) -> Result<()> {
        Ok(each!(&mut self.inner, w, _d => w.save_kv_layer(layer, None))?)
    }

    /// Blocks until this step's saves are out of the engine's memory.
    pub fn wait_for_save(&mut self) -> Result<()> {
        let r = each!(&mut self.inner, w, _d => w.wait_for_save());
        if let Some(t) = self.step_started.take() {
            self.cache.metrics.step(t.elapsed());
        }
        Ok(r?)
    }

    /// What finished: saved, failed saves, loaded.
    pub fn get_finished(&mut self, finished: &[String]) -> Finished {
        let f = each!(&mut self.inner, w, _d => w.get_finished(finished));
        self.cache.metrics.finished(&f);
        f
    }

    /// Load items that failed since the last call.
    pub fn block_ids_with_load_errors(&mut self) -> Vec<LoadError> {
        let e = each!(&mut self.inner, w, _d => w.block_ids_with_load_errors());
        self.cache.metrics.load_errors(&e);
        e
    }

    /// Items loaded, failed, saved, failed to save, per this worker.
    pub fn adapter_counters(&self) -> [u64; 4] {
        use std::sync::atomic::Ordering::Relaxed;
        let m = each!(&self.inner, w, _d => Arc::clone(w.metrics()));
        [
            m.loaded_items.load(Relaxed),
            m.load_failures.load(Relaxed),
            m.saved_items.load(Relaxed),
            m.save_failures.load(Relaxed),
        ]
    }

    /// The cache this side belongs to.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }
}

impl Drop for WorkerSide {
    /// Settles the step in flight: no store task may still copy into (or
    /// out of) the engine's memory once the worker is gone, since the
    /// engine frees it next.
    fn drop(&mut self) {
        if let Err(e) = self.wait_for_save() {
            log::warn!("ucm: the last step of a dropped worker did not settle: {e}");
        }
    }
}

impl From<CoordError> for FfiError {
    fn from(e: CoordError) -> Self {
        FfiError::Coord(e)
    }
}
