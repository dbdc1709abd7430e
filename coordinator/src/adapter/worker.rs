//! The worker side of the adapter: moves bytes between the engine's
//! memory and the stores, one access unit at a time, behind the engine's
//! hooks.
//!
//! Call order per step (vLLM's `KVConnectorBase_V1` contract):
//! [`Worker::start_load_kv`] before the forward pass; per layer
//! [`Worker::wait_for_layer_load`] before its attention and
//! [`Worker::save_kv_layer`] after it; [`Worker::wait_for_save`] at the end
//! of the step; then [`Worker::get_finished`] and
//! [`Worker::block_ids_with_load_errors`].
//!
//! - **Lookahead**: loads start `lookahead` units ahead of the layer being
//!   waited for ([`DEFAULT_LOOKAHEAD`]), one store task per (unit, request), so a
//!   slow load of one request never holds back another request's layer
//!   ([`Worker::layer_ready`], [`Worker::wait_for_layer_load_of`]).
//! - **Saves** wait device-side on the engine's event before copying; a
//!   row is saved after its last layer.
//! - **Speculative decoding**: a layer called several times in one step is
//!   loaded once and saved once.
//! - **Nothing is dropped**: failed load items are reported per engine
//!   block with their typed cause ([`LoadCause`]: a miss, or a
//!   [`Failure`] with its kind and errno; the engine recomputes them); a
//!   state that fails to load removes its checkpoint from the directory and
//!   reports its slot and the request's first blocks (a full recompute);
//!   a save that fails, or cannot even be submitted, is reported by
//!   [`Worker::get_finished`] with its [`Failure`] and counted, and every
//!   save submitted in a step is waited for by [`Worker::wait_for_save`].
//! - **Graph-safe waits**: [`Worker::wait_for_layer_load_on`] makes a
//!   stream wait for the unit's loads through a host function instead of
//!   blocking the caller.

#[cfg(feature = "sabotage")]
mod sabotage;
#[cfg(feature = "sabotage")]
pub use sabotage::Sabotage;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ucm_device::{Device, Memory};
use ucm_store::{
    BlockStore, Durability, Failure, FailureKind, ItemOutcome, Retain, SnapshotKey, SnapshotStore,
    StateItem, TaskHandle, TaskItem,
};

use super::scheduler::{ConnectorMeta, ReqMeta};
use super::stores::StoreSet;
use super::units::{Unit, UnitMap};
use crate::directory::CheckpointDirectory;
use crate::error::{CoordError, RequestError, Result};
use crate::hash::{checkpoint_hash, Id};
use crate::retention::Priority;
use crate::spec::{Kind, SpecTable};

/// One layer's tensor in the engine, as `register_kv_caches` gives it.
#[derive(Clone, Debug)]
pub struct LayerRegistration {
    /// The layer.
    pub layer: u32,
    /// Its device region.
    pub memory: Memory,
    /// Bytes between engine blocks (chain, sidecar) or state slots
    /// (snapshot) in it; at least the group's shard size.
    pub stride: usize,
}

/// The lookahead every embedding starts with: two units.
///
/// Measured with `ucm bench layerwise --dir /dev/shm` (D59): one unit ahead
/// hides 0.84-0.96 of the hideable I/O where the I/O per unit equals the
/// compute (no slack: any jitter of one load is exposed), two units
/// 0.95-0.98 at every ratio up to 1 (three and four gave no more). The cost
/// is memory held, not allocated: the loads of up to `lookahead + 1` units
/// are in flight at once, each pinning its shards' pool slots (one unit's
/// blocks x shard bytes: 4 MiB for 64 blocks of 64 KiB) until they are
/// copied into the engine's memory, which the engine owns already.
pub const DEFAULT_LOOKAHEAD: usize = 2;

/// How a worker is set up.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Its tensor-parallel rank.
    pub rank: u32,
    /// TP ranks.
    pub tp_size: u32,
    /// The layers of its pipeline stage.
    pub stage: Range<u32>,
    /// Units loaded ahead of the one being waited for
    /// ([`DEFAULT_LOOKAHEAD`] unless there is a reason).
    pub lookahead: usize,
    /// Test only (feature `sabotage`): a deliberate bug, so that a test
    /// can prove the content oracle catches it.
    #[cfg(feature = "sabotage")]
    #[doc(hidden)]
    pub sabotage: Option<Sabotage>,
}

impl WorkerConfig {
    /// The configuration of TP rank `rank` of `tp_size`, serving the
    /// layers `stage`, loading `lookahead` units ahead.
    pub fn new(rank: u32, tp_size: u32, stage: Range<u32>, lookahead: usize) -> Self {
        WorkerConfig {
            rank,
            tp_size,
            stage,
            lookahead,
            #[cfg(feature = "sabotage")]
            sabotage: None,
        }
    }
}

/// Why a load item failed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LoadCause {
    /// No tier held it (evicted or never stored since resolve).
    Miss,
    /// The store failed to bring it; the failure says why.
    Failed(Failure),
}

/// A load item that failed: the engine recomputes this block.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LoadError {
    /// The request.
    pub req: String,
    /// The group (spec index).
    pub group: usize,
    /// The engine block (chain and sidecar groups) or the state slot
    /// (snapshot groups: a state that failed to load; the request's first
    /// block of every chain group is reported with it, since the whole
    /// prefix must then be recomputed).
    pub engine_block: u32,
    /// Why: a miss, or a typed failure.
    pub cause: LoadCause,
}

/// What [`Worker::get_finished`] reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Finished {
    /// Finished requests whose saves all ended (durable, or waiting for
    /// other ranks' or stages' shards).
    pub saved: Vec<String>,
    /// Requests with a failed save, and why (counted in the metrics too).
    pub save_failed: Vec<(String, Failure)>,
    /// Requests whose loads of this worker's units all completed.
    pub loaded: Vec<String>,
}

/// Counters.
#[derive(Debug, Default)]
pub struct AdapterMetrics {
    /// Load items (blocks or states) that completed.
    pub loaded_items: AtomicU64,
    /// Load items that failed or missed.
    pub load_failures: AtomicU64,
    /// Save items that reached the pool.
    pub saved_items: AtomicU64,
    /// Save items or blocks that failed.
    pub save_failures: AtomicU64,
    /// Checkpoints registered in the directory.
    pub checkpoints_put: AtomicU64,
    /// Checkpoints whose load missed (removed from the directory).
    pub checkpoint_misses: AtomicU64,
    /// Repeated hook calls for a layer within a step (speculative decoding).
    pub repeated_calls: AtomicU64,
    /// Store tasks started for loads.
    pub load_tasks: AtomicU64,
}

enum What {
    Blocks {
        group: usize,
        engine_blocks: Vec<u32>,
    },
    State {
        group: usize,
        position: u64,
        hash: Id,
    },
}

type Submitted = std::result::Result<TaskHandle, Failure>;

struct UnitLoad {
    req: usize,
    what: What,
    task: Submitted,
    settled: bool,
}

struct Save {
    req: usize,
    what: What,
    task: Submitted,
}

struct Step {
    meta: Arc<ConnectorMeta>,
    next: usize,
    loads: HashMap<u32, Vec<UnitLoad>>,
    waited: HashSet<u32>,
    saved: HashSet<u32>,
    saves: Vec<Save>,
}

/// A failure of the adapter itself to build a task (an unregistered
/// layer, a missing slot), or the store's refusal of it, as a typed value.
fn not_submitted(e: &CoordError) -> Failure {
    match e {
        CoordError::Store(se) => Failure::from_store(se, "submit"),
        _ => Failure::new(FailureKind::NotSubmitted, e.to_string()),
    }
}

/// A task of group `g` that has no store instance to go to.
fn no_store(g: &crate::spec::Group) -> Failure {
    Failure::new(
        FailureKind::NotSubmitted,
        format!("group `{}` has no store", g.name),
    )
}

/// The worker side, for one rank of one pipeline stage.
pub struct Worker<D: Device> {
    spec: Arc<SpecTable>,
    units: Arc<UnitMap>,
    stores: Arc<StoreSet<D>>,
    directory: Arc<CheckpointDirectory>,
    dev: Arc<D>,
    cfg: WorkerConfig,
    stage: Vec<Unit>,
    regs: HashMap<u32, LayerRegistration>,
    step: Option<Step>,
    load_errors: HashMap<(String, usize, u32), LoadCause>,
    durable: Vec<(String, TaskHandle)>,
    failed: Vec<(String, Failure)>,
    /// Sabotage::StalePrefix only: the block ids the previous step loaded.
    #[cfg(feature = "sabotage")]
    last_loaded: HashSet<(usize, Id, u32)>,
    loaded: Vec<String>,
    metrics: Arc<AdapterMetrics>,
    /// The speculative share last given to the stores.
    share: Option<f64>,
}

impl<D: Device> Worker<D> {
    /// A worker over shared stores and directory.
    pub fn new(
        spec: Arc<SpecTable>,
        units: Arc<UnitMap>,
        stores: Arc<StoreSet<D>>,
        directory: Arc<CheckpointDirectory>,
        dev: Arc<D>,
        cfg: WorkerConfig,
    ) -> Result<Self> {
        if cfg.stage.start > cfg.stage.end {
            return Err(CoordError::BadRequest(RequestError::StageReversed {
                start: cfg.stage.start,
                end: cfg.stage.end,
            }));
        }
        if cfg.rank >= cfg.tp_size {
            return Err(CoordError::BadRequest(RequestError::RankOutOfRange {
                rank: cfg.rank,
                tp_size: cfg.tp_size,
            }));
        }
        let stage = units
            .stage(cfg.stage.clone())?
            .into_iter()
            .cloned()
            .collect();
        Ok(Worker {
            spec,
            units,
            stores,
            directory,
            dev,
            cfg,
            stage,
            regs: HashMap::new(),
            step: None,
            load_errors: HashMap::new(),
            #[cfg(feature = "sabotage")]
            last_loaded: HashSet::new(),
            durable: Vec::new(),
            failed: Vec::new(),
            loaded: Vec::new(),
            metrics: Arc::new(AdapterMetrics::default()),
            share: None,
        })
    }

    /// Counters.
    pub fn metrics(&self) -> &Arc<AdapterMetrics> {
        &self.metrics
    }

    /// The units of this worker's stage.
    pub fn stage_units(&self) -> &[Unit] {
        &self.stage
    }

    /// Registers the engine's tensors. Every unit of the stage needs its
    /// first layer registered, with a stride of at least the group's shard.
    pub fn register_kv_caches(&mut self, regs: Vec<LayerRegistration>) -> Result<()> {
        for r in regs {
            self.regs.insert(r.layer, r);
        }
        for u in &self.stage {
            let g = &self.spec.groups()[u.group];
            let need = self.stores.shard_bytes(u.group);
            match self.regs.get(&u.first_layer()) {
                None => {
                    return Err(CoordError::BadRequest(RequestError::LayerNotRegistered {
                        layer: u.first_layer(),
                        group: g.name.clone(),
                    }))
                }
                Some(r) if r.stride < need => {
                    return Err(CoordError::BadRequest(RequestError::StrideTooSmall {
                        layer: r.layer,
                        stride: r.stride as u64,
                        need: need as u64,
                    }))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The rank whose ids this worker uses for `group`.
    fn id_rank(&self, group: usize) -> usize {
        self.spec.key_rank(group, self.cfg.rank)
    }

    fn ids<'m>(&self, r: &'m ReqMeta, group: usize) -> &'m [Id] {
        r.hashes.chains[group]
            .get(self.id_rank(group))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The key and item of `r`'s state of snapshot unit `u` at `position`.
    fn state_item(
        &self,
        u: &Unit,
        r: &ReqMeta,
        position: u64,
        reg: &LayerRegistration,
    ) -> Result<(SnapshotKey, StateItem)> {
        let g = &self.spec.groups()[u.group];
        let rank = self.id_rank(u.group);
        let seed = r.hashes.seeds[u.group].get(rank).ok_or_else(|| {
            CoordError::BadRequest(RequestError::NoSeed {
                rank: rank as u32,
                group: g.name.clone(),
            })
        })?;
        let hash = checkpoint_hash(
            seed,
            self.ids(r, u.group),
            &r.tokens,
            g.hash_block,
            position,
        )?;
        let slot = r.alloc.state_slots.get(&u.group).ok_or_else(|| {
            CoordError::BadRequest(RequestError::NoStateSlot {
                request: r.id.clone(),
                group: g.name.clone(),
            })
        })?;
        Ok((
            SnapshotKey {
                group: u.group as u32,
                position,
                hash,
            },
            StateItem {
                shard: u.shard,
                memory: reg.memory.clone(),
                offset: *slot as usize * reg.stride,
            },
        ))
    }

    /// The items of `r`'s blocks `range` of chain or sidecar unit `u`, their
    /// engine blocks, and the blocks of the range that cannot be addressed
    /// (no id or no engine block: never silently left out; the callers
    /// report them), as their engine block where there is one.
    fn block_items(
        &self,
        u: &Unit,
        r: &ReqMeta,
        range: Range<usize>,
        reg: &LayerRegistration,
    ) -> (Vec<TaskItem>, Vec<u32>, Vec<Option<u32>>) {
        let ids = self.ids(r, u.group);
        let table = r
            .alloc
            .blocks
            .get(&u.group)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let mut items = Vec::new();
        let mut engine_blocks = Vec::new();
        let mut unaddressable = Vec::new();
        for i in range {
            let (Some(id), Some(&eb)) = (ids.get(i), table.get(i)) else {
                unaddressable.push(table.get(i).copied());
                continue;
            };
            engine_blocks.push(eb);
            items.push(TaskItem {
                block: *id,
                shard: u.shard,
                memory: reg.memory.clone(),
                offset: eb as usize * reg.stride,
            });
        }
        (items, engine_blocks, unaddressable)
    }

    fn reg(&self, u: &Unit) -> Result<&LayerRegistration> {
        self.regs.get(&u.first_layer()).ok_or_else(|| {
            CoordError::BadRequest(RequestError::LayerNotRegistered {
                layer: u.first_layer(),
                group: self.spec.groups()[u.group].name.clone(),
            })
        })
    }

    /// The chain blocks unit `u`'s group loads for a hit at `p` when the
    /// engine already holds `have` tokens.
    fn load_range(&self, group: usize, p: u64, have: u64) -> Range<usize> {
        let b = self.spec.block_of(group).max(1);
        let from = match self.spec.window_of(group) {
            Some(w) => have.max(p.saturating_sub(w)),
            None => have,
        };
        ((from / b) as usize)..((p / b) as usize)
    }

    /// Starts a step: loads begin for the first `lookahead` units.
    pub fn start_load_kv(&mut self, meta: Arc<ConnectorMeta>) -> Result<()> {
        for r in &meta.requests {
            r.validate(&self.spec)?;
        }
        if self.step.is_some() {
            self.wait_for_save()?;
        }
        self.stores.note_use();
        if let Some(share) = meta.speculative_share {
            if self.share != Some(share) {
                self.stores.set_speculative_share(share);
                self.share = Some(share);
            }
        }
        self.step = Some(Step {
            meta,
            next: 0,
            loads: HashMap::new(),
            waited: HashSet::new(),
            saved: HashSet::new(),
            saves: Vec::new(),
        });
        self.start_until(self.cfg.lookahead.max(1));
        Ok(())
    }

    /// Starts the loads of stage units `[next, upto)`.
    fn start_until(&mut self, upto: usize) {
        let Some(step) = self.step.as_mut() else {
            return;
        };
        let upto = upto.min(self.stage.len());
        let meta = Arc::clone(&step.meta);
        let first = step.next;
        step.next = step.next.max(upto);
        for i in first..upto {
            let u = self.stage[i].clone();
            let mut loads = Vec::new();
            for (ri, r) in meta.requests.iter().enumerate() {
                if let Some((p, have)) = r.load {
                    if let Some(l) = self.start_unit_load(&u, ri, r, p, have) {
                        loads.push(l);
                    }
                }
            }
            if let Some(step) = self.step.as_mut() {
                step.loads.insert(u.global, loads);
            }
        }
    }

    /// Starts `r`'s load of unit `u` (`None`: nothing to load). A load
    /// that cannot even be submitted is kept as a failed one, so that it is
    /// reported like any other failed load, never silently skipped.
    fn start_unit_load(
        &mut self,
        u: &Unit,
        ri: usize,
        r: &ReqMeta,
        p: u64,
        have: u64,
    ) -> Option<UnitLoad> {
        let g = &self.spec.groups()[u.group];
        let reg = self.reg(u).map_err(|e| not_submitted(&e)).cloned();
        let no_store = || no_store(g);
        let (what, task) = match g.kind {
            Kind::Chain | Kind::Sidecar => {
                let range = self.load_range(u.group, p, have);
                if range.is_empty() {
                    return None;
                }
                let stores = Arc::clone(&self.stores);
                match (reg, stores.blocks(u.group)) {
                    (Ok(reg), Some(store)) => {
                        #[cfg_attr(not(feature = "sabotage"), allow(unused_mut))]
                        let (mut items, mut engine_blocks, lost) =
                            self.block_items(u, r, range, &reg);
                        for eb in lost.into_iter().flatten() {
                            let why = Failure::new(
                                FailureKind::NotSubmitted,
                                format!("request `{}`: a block without an id", r.id),
                            );
                            self.load_errors
                                .entry((r.id.clone(), u.group, eb))
                                .or_insert(LoadCause::Failed(why));
                        }
                        #[cfg(feature = "sabotage")]
                        self.sabotage_load(u.group, &mut items, &mut engine_blocks, reg.stride);
                        self.metrics.load_tasks.fetch_add(1, Ordering::Relaxed);
                        let what = What::Blocks {
                            group: u.group,
                            engine_blocks,
                        };
                        let task = store
                            .load(items)
                            .map_err(|e| Failure::from_store(&e, "load submit"));
                        (what, task)
                    }
                    (reg, _) => {
                        let table = r
                            .alloc
                            .blocks
                            .get(&u.group)
                            .map(Vec::as_slice)
                            .unwrap_or(&[]);
                        let what = What::Blocks {
                            group: u.group,
                            engine_blocks: range.filter_map(|i| table.get(i).copied()).collect(),
                        };
                        (what, Err(reg.err().unwrap_or_else(no_store)))
                    }
                }
            }
            Kind::Snapshot => {
                if p == 0 {
                    return None;
                }
                #[cfg(feature = "sabotage")]
                let at = self.sabotage_state_position(u, r, p);
                #[cfg(not(feature = "sabotage"))]
                let at = p;
                let keyed = reg.and_then(|reg| {
                    self.state_item(u, r, at, &reg)
                        .map_err(|e| not_submitted(&e))
                });
                let store = self.stores.snapshots(u.group).ok_or_else(no_store);
                let hash = keyed.as_ref().map_or([0; 16], |(k, _)| k.hash);
                let what = What::State {
                    group: u.group,
                    position: p,
                    hash,
                };
                let task = keyed.and_then(|(key, item)| {
                    let store = store?;
                    self.metrics.load_tasks.fetch_add(1, Ordering::Relaxed);
                    store
                        .get(&key, vec![item])
                        .map_err(|e| Failure::from_store(&e, "state load submit"))
                });
                (what, task)
            }
            Kind::None => return None,
        };
        Some(UnitLoad {
            req: ri,
            what,
            task,
            settled: false,
        })
    }

    fn stage_index(&self, layer: u32) -> Result<Option<(usize, Unit)>> {
        let Some(u) = self.units.unit_of(layer) else {
            if !self.spec.groups().iter().any(|g| g.layers.contains(&layer)) {
                return Err(CoordError::BadRequest(RequestError::NotALayer { layer }));
            }
            if !self.cfg.stage.contains(&layer) {
                return Err(CoordError::BadRequest(RequestError::LayerOutsideStage {
                    layer,
                    stage: self.cfg.stage.clone(),
                }));
            }
            return Ok(None); // a `none` layer: nothing to load or save
        };
        match self.stage.iter().position(|s| s.global == u.global) {
            Some(i) => Ok(Some((i, u.clone()))),
            None => Err(CoordError::BadRequest(RequestError::LayerOutsideStage {
                layer,
                stage: self.cfg.stage.clone(),
            })),
        }
    }

    /// Blocks until every request's load of `layer`'s unit has completed,
    /// and starts the units after it (lookahead). Failures are recorded for
    /// [`Worker::block_ids_with_load_errors`]; a repeated call in one step
    /// returns at once.
    pub fn wait_for_layer_load(&mut self, layer: u32) -> Result<()> {
        if let Some(global) = self.begin_wait(layer, "wait_for_layer_load")? {
            self.settle_unit(global, None);
        }
        Ok(())
    }

    /// The common start of a layer wait: starts the lookahead and returns
    /// the unit to wait for, or `None` when there is nothing to wait for
    /// (a `none` layer, a row's later layer, a repeated call).
    fn begin_wait(&mut self, layer: u32, hook: &'static str) -> Result<Option<u32>> {
        let Some((i, u)) = self.stage_index(layer)? else {
            return Ok(None);
        };
        if layer != u.first_layer() {
            return Ok(None); // a row: loaded before its first layer
        }
        self.start_until(i + 1 + self.cfg.lookahead);
        let Some(step) = self.step.as_mut() else {
            return Err(CoordError::BadRequest(RequestError::HookBeforeStart {
                hook,
            }));
        };
        if !step.waited.insert(u.global) {
            self.metrics.repeated_calls.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        Ok(Some(u.global))
    }

    /// Non-blocking: has `req`'s load of `layer`'s unit completed (or is
    /// there none)?
    pub fn layer_ready(&self, layer: u32, req: &str) -> bool {
        let (Some(step), Some(u)) = (self.step.as_ref(), self.units.unit_of(layer)) else {
            return true;
        };
        let Some(loads) = step.loads.get(&u.global) else {
            return false;
        };
        loads
            .iter()
            .filter(|l| step.meta.requests[l.req].id == req)
            .all(|l| l.task.as_ref().map_or(true, TaskHandle::check))
    }

    /// Blocks until `req`'s load of `layer`'s unit has completed, without
    /// waiting for other requests' loads of it.
    pub fn wait_for_layer_load_of(&mut self, layer: u32, req: &str) -> Result<()> {
        let Some((i, u)) = self.stage_index(layer)? else {
            return Ok(());
        };
        self.start_until(i + 1 + self.cfg.lookahead);
        self.settle_unit(u.global, Some(req));
        Ok(())
    }

    /// Graph-safe wait: `stream` waits for the loads of `layer`'s unit
    /// through a host function queued on it; the caller does not block.
    /// Failures are recorded at [`Worker::wait_for_save`].
    pub fn wait_for_layer_load_on(&mut self, layer: u32, stream: &D::Stream) -> Result<()> {
        let Some(global) = self.begin_wait(layer, "wait_for_layer_load_on")? else {
            return Ok(());
        };
        let Some(step) = self.step.as_ref() else {
            return Ok(());
        };
        let handles: Vec<TaskHandle> = step
            .loads
            .get(&global)
            .map(|ls| {
                ls.iter()
                    .filter_map(|l| l.task.as_ref().ok().cloned())
                    .collect()
            })
            .unwrap_or_default();
        self.dev
            .launch_host_fn(
                stream,
                Box::new(move || {
                    for h in handles {
                        h.wait();
                    }
                    Ok(())
                }),
            )
            .map_err(ucm_store::StoreError::from)?;
        Ok(())
    }

    /// Waits for and records the outcomes of unit `global`'s loads (of one
    /// request, or all).
    fn settle_unit(&mut self, global: u32, only: Option<&str>) {
        let Some(step) = self.step.as_mut() else {
            return;
        };
        let meta = Arc::clone(&step.meta);
        let Some(loads) = step.loads.get_mut(&global) else {
            return;
        };
        let mut errors: Vec<(String, usize, u32, LoadCause)> = Vec::new();
        let mut forget: Vec<(usize, Id)> = Vec::new();
        for l in loads.iter_mut() {
            let r = &meta.requests[l.req];
            if l.settled || only.is_some_and(|q| q != r.id) {
                continue;
            }
            l.settled = true;
            let causes: Vec<Option<LoadCause>> = match &l.task {
                Ok(t) => t
                    .wait()
                    .into_iter()
                    .map(|(_, _, o)| match o {
                        ItemOutcome::Ok => None,
                        ItemOutcome::Miss => Some(LoadCause::Miss),
                        ItemOutcome::Failed(f) => Some(LoadCause::Failed(f)),
                    })
                    .collect(),
                Err(f) => vec![Some(LoadCause::Failed(f.clone()))],
            };
            let ok = causes.iter().filter(|c| c.is_none()).count();
            self.metrics
                .loaded_items
                .fetch_add(ok as u64, Ordering::Relaxed);
            let bad = causes.len() - ok;
            if bad > 0 {
                self.metrics
                    .load_failures
                    .fetch_add(bad as u64, Ordering::Relaxed);
            }
            match &l.what {
                What::Blocks {
                    group,
                    engine_blocks,
                } => {
                    if let Err(f) = &l.task {
                        // Not submitted: every block of the task failed.
                        for eb in engine_blocks {
                            errors.push((r.id.clone(), *group, *eb, LoadCause::Failed(f.clone())));
                        }
                    } else {
                        for (c, eb) in causes.iter().zip(engine_blocks) {
                            if let Some(c) = c {
                                errors.push((r.id.clone(), *group, *eb, c.clone()));
                            }
                        }
                    }
                }
                What::State { group, hash, .. } => {
                    let Some(cause) = causes.into_iter().flatten().next() else {
                        continue;
                    };
                    self.metrics
                        .checkpoint_misses
                        .fetch_add(1, Ordering::Relaxed);
                    // Lazy invalidation; the state is gone, so the whole
                    // prefix is recomputed: report every chain group's
                    // first block.
                    forget.push((*group, *hash));
                    // The state itself, by its slot, then the blocks.
                    if let Some(&slot) = r.alloc.state_slots.get(group) {
                        errors.push((r.id.clone(), *group, slot, cause.clone()));
                    }
                    for g in self.spec.groups() {
                        if let Some(&eb) = r.alloc.blocks.get(&g.index).and_then(|b| b.first()) {
                            errors.push((r.id.clone(), g.index, eb, cause.clone()));
                        }
                    }
                }
            }
        }
        for (group, hash) in forget {
            self.directory
                .forget(&self.spec.groups()[group].name, &hash);
        }
        for (req, group, eb, cause) in errors {
            self.load_errors.entry((req, group, eb)).or_insert(cause);
        }
    }

    /// Saves `layer`'s unit when `layer` is its last: the copies out of the
    /// engine's memory wait device-side for `event`. A repeated call in one
    /// step is a no-op. Nothing is dropped: an item that cannot even be
    /// submitted (no store, no state slot) is kept as a failed save and
    /// reported by [`Worker::get_finished`]; every save submitted before an
    /// error is recorded, so [`Worker::wait_for_save`] waits for it.
    pub fn save_kv_layer(&mut self, layer: u32, event: Option<Arc<D::Event>>) -> Result<()> {
        let Some((_, u)) = self.stage_index(layer)? else {
            return Ok(());
        };
        if layer != u.last_layer() {
            return Ok(()); // a row is saved after its last layer
        }
        let Some(step) = self.step.as_mut() else {
            return Err(CoordError::BadRequest(RequestError::HookBeforeStart {
                hook: "save_kv_layer",
            }));
        };
        if !step.saved.insert(u.global) {
            self.metrics.repeated_calls.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let meta = Arc::clone(&step.meta);
        let reg = self.reg(&u).map_err(|e| not_submitted(&e)).cloned();
        let g = &self.spec.groups()[u.group];
        let no_store = || no_store(g);
        let mut saves = Vec::new();
        for (ri, r) in meta.requests.iter().enumerate() {
            match g.kind {
                Kind::Chain | Kind::Sidecar => {
                    let Some((_, range)) = r.save_blocks.iter().find(|(gi, _)| *gi == u.group)
                    else {
                        continue;
                    };
                    let (task, engine_blocks) = match (&reg, self.stores.blocks(u.group)) {
                        (Ok(reg), Some(store)) => {
                            #[cfg_attr(not(feature = "sabotage"), allow(unused_mut))]
                            let (mut items, mut engine_blocks, lost) =
                                self.block_items(&u, r, range.clone(), reg);
                            if !lost.is_empty() {
                                saves.push(Save {
                                    req: ri,
                                    what: What::Blocks {
                                        group: u.group,
                                        engine_blocks: lost.iter().flatten().copied().collect(),
                                    },
                                    task: Err(Failure::new(
                                        FailureKind::NotSubmitted,
                                        format!(
                                            "request `{}`: {} blocks to save have no id or engine block",
                                            r.id,
                                            lost.len()
                                        ),
                                    )),
                                });
                            }
                            #[cfg(feature = "sabotage")]
                            if self.cfg.sabotage == Some(Sabotage::SkipSave) && !items.is_empty() {
                                items.remove(0);
                                engine_blocks.remove(0);
                            }
                            if items.is_empty() {
                                continue;
                            }
                            let task = store
                                .dump(items, event.clone())
                                .map_err(|e| Failure::from_store(&e, "save submit"));
                            (task, engine_blocks)
                        }
                        (reg, _) => {
                            let why = reg.as_ref().err().cloned().unwrap_or_else(no_store);
                            (Err(why), Vec::new())
                        }
                    };
                    saves.push(Save {
                        req: ri,
                        what: What::Blocks {
                            group: u.group,
                            engine_blocks,
                        },
                        task,
                    });
                }
                Kind::Snapshot => {
                    for save in r.save_states.iter().filter(|s| s.group == u.group) {
                        let (gi, pos) = (save.group, save.position);
                        let keyed = reg.as_ref().map_err(Clone::clone).and_then(|reg| {
                            self.state_item(&u, r, pos, reg)
                                .map_err(|e| not_submitted(&e))
                        });
                        let hash = keyed.as_ref().map_or([0; 16], |(k, _)| k.hash);
                        let task = keyed.and_then(|(key, item)| {
                            let store = self.stores.snapshots(gi).ok_or_else(no_store)?;
                            // A speculative checkpoint is kept at the lower
                            // priority: evicted first until a request uses it.
                            let retain = match save.priority {
                                Priority::Sure => Retain::Normal,
                                Priority::Speculative(level) => Retain::Low(level),
                            };
                            store
                                .put_retained(&key, vec![item], event.clone(), retain)
                                .map_err(|e| Failure::from_store(&e, "state save submit"))
                        });
                        saves.push(Save {
                            req: ri,
                            what: What::State {
                                group: gi,
                                position: pos,
                                hash,
                            },
                            task,
                        });
                    }
                }
                Kind::None => {}
            }
        }
        if let Some(step) = self.step.as_mut() {
            step.saves.extend(saves);
        }
        Ok(())
    }

    /// Ends the step: every copy out of the engine's memory has finished
    /// when it returns (the engine may reuse those blocks). Records load
    /// failures not yet seen, registers completed checkpoints, and keeps
    /// the saves' durability for [`Worker::get_finished`].
    pub fn wait_for_save(&mut self) -> Result<()> {
        // Settle every load first (including those only a stream waited for).
        let globals: Vec<u32> = match &self.step {
            Some(step) => step.loads.keys().copied().collect(),
            None => return Ok(()),
        };
        for g in globals {
            self.settle_unit(g, None);
        }
        let Some(step) = self.step.take() else {
            return Ok(());
        };
        let meta = step.meta;
        let saves = step.saves;
        let loads_by_req: HashSet<String> = step
            .loads
            .values()
            .flatten()
            .map(|l| meta.requests[l.req].id.clone())
            .collect();
        self.loaded.extend(loads_by_req);
        // Per state put: (group, position, hash, all parts ok).
        let mut states: HashMap<(usize, u64, Id), bool> = HashMap::new();
        for s in saves {
            let r = &meta.requests[s.req];
            let outcomes: Vec<ItemOutcome> = match &s.task {
                Ok(t) => t.wait().into_iter().map(|(_, _, o)| o).collect(),
                Err(f) => vec![ItemOutcome::Failed(f.clone())],
            };
            let total = outcomes.len();
            let good = outcomes.iter().filter(|o| **o == ItemOutcome::Ok).count();
            let ok = good == total;
            self.metrics
                .saved_items
                .fetch_add(good as u64, Ordering::Relaxed);
            if !ok {
                let why = outcomes
                    .into_iter()
                    .find_map(|o| match o {
                        ItemOutcome::Failed(f) => Some(f),
                        _ => None,
                    })
                    .unwrap_or_else(|| Failure::new(FailureKind::Io, "save failed"));
                self.metrics
                    .save_failures
                    .fetch_add((total - good) as u64, Ordering::Relaxed);
                self.failed.push((r.id.clone(), why));
            }
            if let What::State {
                group,
                position,
                hash,
            } = s.what
            {
                let e = states.entry((group, position, hash)).or_insert(true);
                *e &= ok;
            }
            if let Ok(t) = s.task {
                self.durable.push((r.id.clone(), t));
            }
        }
        for ((group, position, hash), ok) in states {
            // A checkpoint is whole only when every layer of it is stored:
            // this stage's layers here; a checkpoint split across stages
            // registers from each and is verified at load (a miss then).
            if self
                .directory
                .put_completed(&self.spec.groups()[group].name, position, hash, ok)
            {
                self.metrics.checkpoints_put.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Requests finished (`finished`, as the engine gives them) whose saves
    /// all ended, requests whose saves failed, and requests whose loads
    /// completed since the last call. Non-blocking.
    pub fn get_finished(&mut self, finished: &[String]) -> Finished {
        let mut still = Vec::new();
        let mut pending: HashSet<String> = HashSet::new();
        for (req, t) in self.durable.drain(..) {
            match t.durable_now() {
                None => {
                    pending.insert(req.clone());
                    still.push((req, t));
                }
                Some(v) => {
                    for (_, d) in v {
                        if let Durability::Failed(why) = d {
                            self.metrics.save_failures.fetch_add(1, Ordering::Relaxed);
                            self.failed.push((req.clone(), why));
                        }
                    }
                }
            }
        }
        self.durable = still;
        let failed = std::mem::take(&mut self.failed);
        let failed_ids: HashSet<&String> = failed.iter().map(|(r, _)| r).collect();
        Finished {
            saved: finished
                .iter()
                .filter(|r| !pending.contains(*r) && !failed_ids.contains(r))
                .cloned()
                .collect(),
            save_failed: failed,
            loaded: std::mem::take(&mut self.loaded),
        }
    }

    /// Engine blocks whose load failed since the last call, with why: the
    /// engine recomputes them (and everything after them in their request).
    pub fn block_ids_with_load_errors(&mut self) -> Vec<LoadError> {
        let mut v: Vec<LoadError> = self
            .load_errors
            .drain()
            .map(|((req, group, engine_block), cause)| LoadError {
                req,
                group,
                engine_block,
                cause,
            })
            .collect();
        v.sort_by(|a, b| (&a.req, a.group, a.engine_block).cmp(&(&b.req, b.group, b.engine_block)));
        v
    }
}
