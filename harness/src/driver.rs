//! The hook driver: a simulated engine that drives the adapter in the
//! connector contract's order, with the content oracle.
//!
//! Per request ([`Engine::run`]): the scheduler side
//! (`get_num_new_matched_tokens`, then `update_state_after_alloc` once the
//! allocator gave the request its blocks, which are poisoned on every rank
//! first); then per step (prefill chunks end at the planned checkpoint
//! positions and at most `chunk` tokens apart) `build_meta`, and on every
//! rank of every stage (one thread each) `start_load_kv`, per layer
//! `wait_for_layer_load` (`repeat` times: speculative decoding), the
//! checks, the "compute" (the oracle's bytes written into the blocks the
//! chunk completes and the state slot), `save_kv_layer` (`repeat` times),
//! and `wait_for_save`. At the end the driver polls `get_finished` until the
//! saves ended, audits the saves, calls `request_finished` and frees the
//! blocks.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
#[cfg(feature = "sabotage")]
use ucm_coordinator::adapter::Sabotage;

use ucm_coordinator::adapter::units::partition;
use ucm_coordinator::adapter::{
    Allocation, ConnectorMeta, EngineRequest, LoadError, ReqMeta, Scheduled, Scheduler, StoreSet,
    StoreSetConfig, Unit, UnitMap, Worker, WorkerConfig,
};
use ucm_coordinator::hash::checkpoint_hash;
use ucm_coordinator::{CheckpointDirectory, CoordError, Deployment, Kind, RequestKeys, SpecTable};
use ucm_device::{Device, DeviceError, HostDevice};
use ucm_store::Failure;

use crate::alloc::BlockAllocator;
use crate::io::EngineIo;
use crate::layout::Layout;
use crate::oracle::{self, content, is_poison, poison};

/// What can go wrong in the harness itself (never a finding of the oracle:
/// those are in [`Outcome`]).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The coordinator, adapter or a store refused or failed.
    #[error(transparent)]
    Coord(#[from] CoordError),
    /// The host device failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A store could not be opened.
    #[error(transparent)]
    Store(#[from] ucm_store::StoreError),
    /// A zero count where each must be positive.
    #[error("tp, pp, repeat and chunk must be positive")]
    NotPositive,
    /// More pipeline stages than the model has layers.
    #[error("{stages} pipeline stages for a model of {layers} layers")]
    TooManyStages {
        /// Stages asked for.
        stages: u32,
        /// The model's layers.
        layers: u32,
    },
    /// A request longer, with its output, than the engine was sized for.
    #[error(
        "request `{request}` has {tokens} tokens with its output; the engine was sized for {max}"
    )]
    RequestTooLong {
        /// The request.
        request: String,
        /// Its tokens with its output.
        tokens: usize,
        /// The engine's size.
        max: usize,
    },
    /// The engine's blocks are all in use.
    #[error("no free engine blocks for request `{request}`")]
    NoFreeBlocks {
        /// The request.
        request: String,
    },
    /// A rank's thread panicked (a bug).
    #[error("a rank thread panicked")]
    RankPanicked,
}

type Result<T> = std::result::Result<T, HarnessError>;

/// How the simulated engine is set up.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The spec table the stores and the adapter use.
    pub spec: Arc<SpecTable>,
    /// The same table at full size (byte accounting only); `None`: `spec`.
    pub full: Option<Arc<SpecTable>>,
    /// The stores' directory.
    pub dir: PathBuf,
    /// The stores.
    pub stores: StoreSetConfig,
    /// Tensor-parallel ranks.
    pub tp: u32,
    /// Pipeline stages (contiguous, as even as the layers allow), or the
    /// explicit stage bounds in `stage_bounds`.
    pub pp: u32,
    /// Explicit pipeline stage bounds (overrides `pp` when not empty).
    pub stage_bounds: Vec<u32>,
    /// The adapter's lookahead.
    pub lookahead: usize,
    /// Hook calls per layer per step (2 or more: speculative decoding).
    pub repeat: usize,
    /// Longest prefill chunk, in tokens.
    pub chunk: u64,
    /// Longest prompt the run will see (sizes the block pools).
    pub max_tokens: usize,
    /// State slots per snapshot group.
    pub slots: usize,
    /// Seed of the allocator's shuffles.
    pub seed: u64,
    /// The predecessor's hash-folding retention (baseline).
    pub fold: bool,
    /// Test only (feature `sabotage`): a deliberate bug in every worker.
    #[cfg(feature = "sabotage")]
    pub sabotage: Option<Sabotage>,
    /// Test only: flip one byte of the first block the oracle checks.
    pub flip_byte: bool,
    /// How long to wait for saves to end before reporting them unfinished.
    pub save_timeout: Duration,
}

impl EngineConfig {
    /// A configuration with one rank and stage, no speculative decoding.
    pub fn new(spec: Arc<SpecTable>, dir: impl Into<PathBuf>, max_tokens: usize) -> Self {
        EngineConfig {
            spec,
            full: None,
            dir: dir.into(),
            stores: StoreSetConfig::default(),
            tp: 1,
            pp: 1,
            stage_bounds: Vec::new(),
            lookahead: ucm_coordinator::adapter::DEFAULT_LOOKAHEAD,
            repeat: 1,
            chunk: 2048,
            max_tokens,
            slots: 4,
            seed: 1,
            fold: false,
            #[cfg(feature = "sabotage")]
            sabotage: None,
            flip_byte: false,
            save_timeout: Duration::from_secs(20),
        }
    }
}

/// One request.
#[derive(Clone, Debug)]
pub struct Request {
    /// The engine's id.
    pub id: String,
    /// The prompt.
    pub tokens: Arc<Vec<u32>>,
    /// Salt and extra keys.
    pub keys: RequestKeys,
    /// Fault: this rank dies before its saves (it skips them).
    pub dead_rank: Option<u32>,
    /// Tokens the request generates after its prompt (empty: none). The
    /// engine decodes them after the prefill: the connector's
    /// `extend_tokens`, then steps that end at the planned checkpoint
    /// positions and at the sequence's end, so the blocks decoding
    /// completes and the state at the end are saved (decode retention).
    pub output: Arc<Vec<u32>>,
}

impl Request {
    /// A request without salt, keys, faults or output.
    pub fn new(id: impl Into<String>, tokens: Vec<u32>) -> Self {
        Request {
            id: id.into(),
            tokens: Arc::new(tokens),
            keys: RequestKeys::default(),
            dead_rank: None,
            output: Arc::new(Vec::new()),
        }
    }
}

/// What the oracle found wrong with one loaded or computed item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrongKind {
    /// Loaded, not reported failed, and its bytes are not the oracle's.
    WrongBytes,
    /// Meant to be loaded, not reported failed, and still poisoned: the
    /// load never happened.
    NotLoaded,
    /// The engine computes it, yet something wrote there.
    Overwritten,
}

/// A wrong hit (or a write where the engine computes): the run must fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrongHit {
    /// The request.
    pub req: String,
    /// The group's name.
    pub group: String,
    /// The layer (the unit's first).
    pub layer: u32,
    /// The rank.
    pub rank: u32,
    /// Block index in the request (`None` for a state).
    pub block: Option<usize>,
    /// The engine block or state slot.
    pub engine_block: u32,
    /// The state's position (states only).
    pub position: Option<u64>,
    /// What went wrong.
    pub kind: WrongKind,
}

impl fmt::Display for WrongHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match (self.block, self.position) {
            (Some(i), _) => format!("block {i} (engine block {})", self.engine_block),
            (None, Some(p)) => format!("state at {p} (slot {})", self.engine_block),
            _ => format!("slot {}", self.engine_block),
        };
        let kind = match self.kind {
            WrongKind::WrongBytes => "wrong hit: loaded bytes differ from the oracle",
            WrongKind::NotLoaded => "wrong hit: never loaded (still poisoned), not reported",
            WrongKind::Overwritten => "write where the engine computes",
        };
        write!(
            f,
            "{kind}: request {} group {} layer {} {what} (rank {})",
            self.req, self.group, self.layer, self.rank
        )
    }
}

/// A save that every report called good, yet no tier holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostSave {
    /// The request.
    pub req: String,
    /// The group's name.
    pub group: String,
    /// The layer (the unit's first).
    pub layer: u32,
    /// The rank.
    pub rank: u32,
    /// Block index (`None` for a state).
    pub block: Option<usize>,
    /// The state's position (states only).
    pub position: Option<u64>,
}

impl fmt::Display for LostSave {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match (self.block, self.position) {
            (Some(i), _) => format!("block {i}"),
            (_, Some(p)) => format!("state at {p}"),
            _ => "item".into(),
        };
        write!(
            f,
            "lost save: request {} group {} layer {} {what} (rank {}) was reported saved but no tier holds it",
            self.req, self.group, self.layer, self.rank
        )
    }
}

/// What one request did, and what the oracle found.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// `l` of the resolution.
    pub l: u64,
    /// Tokens the scheduler said were persisted (`p*`).
    pub matched: u64,
    /// Tokens actually served: `p*`, or the resume point after load errors.
    pub served: u64,
    /// Wrong hits and writes where the engine computes.
    pub wrong: Vec<WrongHit>,
    /// Saves reported good that no tier holds.
    pub lost: Vec<LostSave>,
    /// Load errors the adapter reported (every rank).
    pub load_errors: Vec<LoadError>,
    /// Save failures the adapter reported (every rank).
    pub save_failures: Vec<Failure>,
    /// Ranks whose saves did not end within the timeout.
    pub unfinished_saves: u32,
    /// Items a dead rank did not save that no other rank's copy covers
    /// (the dead rank's effect: later misses).
    pub dead_rank_missing: u64,
    /// Items loaded and checked against the oracle.
    pub checked: u64,
    /// Blocks checked still poisoned before the engine computed them.
    pub untouched: u64,
    /// Bytes loaded (as stored: scaled).
    pub bytes_loaded: u64,
    /// The same items at full size.
    pub bytes_loaded_full: u64,
    /// Bytes saved (scaled).
    pub bytes_saved: u64,
    /// Load wait of the request: per step the slowest rank's, summed.
    pub load_wait: Duration,
    /// Per step, in order: its tokens, its slowest rank's load wait and
    /// the bytes it loaded.
    pub steps: Vec<StepTiming>,
}

/// One step of a request, as a TTFT model needs it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTiming {
    /// First token the step computed.
    pub start: u64,
    /// One past its last token.
    pub end: u64,
    /// Whether the step is part of the prompt's prefill (it ends at or
    /// before the prompt's end; decode steps come after it).
    pub prefill: bool,
    /// The slowest rank's wait in `wait_for_layer_load`.
    pub load_wait: Duration,
    /// Bytes the step loaded, as stored (scaled).
    pub loaded: u64,
    /// The same items at full size.
    pub loaded_full: u64,
}

/// One worker of the engine: a TP rank of a pipeline stage.
pub struct RankEngine<D: Device = HostDevice> {
    /// The adapter's worker.
    pub worker: Worker<D>,
    /// Its engine memory.
    pub layout: Layout,
    /// Its rank.
    pub rank: u32,
    /// Its stage's layers.
    pub stage: Range<u32>,
    io: EngineIo<D>,
}

/// Shared, read-only facts the rank threads use.
struct Ctx<'a, D: Device> {
    dev: &'a D,
    spec: &'a SpecTable,
    full: &'a SpecTable,
    units: &'a UnitMap,
    stores: &'a StoreSet<D>,
    repeat: usize,
}

/// The simulated engine, its tensors in device `D`'s memory (the host's
/// by default).
pub struct Engine<D: Device = HostDevice> {
    cfg: EngineConfig,
    dev: Arc<D>,
    units: Arc<UnitMap>,
    stores: Arc<StoreSet<D>>,
    directory: Arc<CheckpointDirectory>,
    sched: Scheduler<StoreSet<D>>,
    ranks: Vec<RankEngine<D>>,
    alloc: BlockAllocator,
    flipped: bool,
}

impl Engine<HostDevice> {
    /// Opens the stores under `cfg.dir` and sets up every rank and stage
    /// on the host device. A directory that already holds stores is a warm
    /// restart: the checkpoint directory is rebuilt from them.
    pub fn open(cfg: EngineConfig) -> Result<Engine> {
        Engine::open_on(cfg, Arc::new(HostDevice::new()))
    }
}

impl<D: Device> Engine<D> {
    /// [`Engine::open`] with the engine's tensors in `dev`'s memory (a
    /// GPU's, say): the stores' pool is registered with `dev`, and every
    /// poison, check and compute goes through its copies.
    pub fn open_on(cfg: EngineConfig, dev: Arc<D>) -> Result<Engine<D>> {
        if cfg.tp == 0 || cfg.pp == 0 || cfg.repeat == 0 || cfg.chunk == 0 {
            return Err(HarnessError::NotPositive);
        }
        let spec = Arc::clone(&cfg.spec);
        let units = Arc::new(UnitMap::new(&spec));
        let stores = Arc::new(StoreSet::open(
            &spec,
            &units,
            &cfg.dir,
            Arc::clone(&dev),
            &cfg.stores,
        )?);
        // Checkpoints other instances store later are found in the stores.
        let directory = Arc::new(CheckpointDirectory::with_source(Arc::clone(&stores) as _));
        stores.rebuild_directory(&spec, &directory);
        let mut sched = Scheduler::new(
            Arc::clone(&spec),
            Deployment { tp_size: cfg.tp },
            Arc::clone(&stores),
            Arc::clone(&directory),
        );
        sched.set_fold_retention(cfg.fold);
        if !cfg.stores.no_disk {
            sched.bound_saved_to_disk(cfg.stores.disk_blocks);
        }
        let alloc = BlockAllocator::new(&spec, cfg.max_tokens, cfg.slots, cfg.seed);
        let layers = spec.layer_count();
        if cfg.pp > layers.max(1) {
            return Err(HarnessError::TooManyStages {
                stages: cfg.pp,
                layers,
            });
        }
        let bounds: Vec<u32> = if cfg.stage_bounds.is_empty() {
            (1..cfg.pp).map(|s| layers * s / cfg.pp).collect()
        } else {
            cfg.stage_bounds.clone()
        };
        let stages = partition(&bounds, layers)?;
        let mut ranks = Vec::new();
        for stage in &stages {
            for rank in 0..cfg.tp {
                #[cfg_attr(not(feature = "sabotage"), allow(unused_mut))]
                let mut worker_config =
                    WorkerConfig::new(rank, cfg.tp, stage.clone(), cfg.lookahead);
                #[cfg(feature = "sabotage")]
                {
                    worker_config.sabotage = cfg.sabotage;
                }
                let mut worker = Worker::new(
                    Arc::clone(&spec),
                    Arc::clone(&units),
                    Arc::clone(&stores),
                    Arc::clone(&directory),
                    Arc::clone(&dev),
                    worker_config,
                )?;
                let layout = Layout::new(
                    &*dev,
                    &spec,
                    &*stores,
                    worker.stage_units(),
                    alloc.block_counts(),
                    alloc.slot_counts(),
                )?;
                worker.register_kv_caches(layout.registrations())?;
                ranks.push(RankEngine {
                    worker,
                    layout,
                    rank,
                    stage: stage.clone(),
                    io: EngineIo::new(&*dev)?,
                });
            }
        }
        Ok(Engine {
            cfg,
            dev,
            units,
            stores,
            directory,
            sched,
            ranks,
            alloc,
            flipped: false,
        })
    }

    /// Restarts the engine process: every store, pool, worker and engine
    /// tensor is dropped and opened afresh on the same directory (a warm
    /// restart: the memory tier starts empty, the directory is rebuilt).
    pub fn restart(&mut self) -> Result<()> {
        // Every save has ended (the last request waited for them), so the
        // old instance is idle while the new one opens.
        let mut fresh = Engine::open_on(self.cfg.clone(), Arc::clone(&self.dev))?;
        fresh.flipped = self.flipped;
        *self = fresh;
        Ok(())
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The stores.
    pub fn stores(&self) -> &Arc<StoreSet<D>> {
        &self.stores
    }

    /// The checkpoint directory.
    pub fn directory(&self) -> &Arc<CheckpointDirectory> {
        &self.directory
    }

    /// The scheduler side.
    pub fn scheduler(&mut self) -> &mut Scheduler<StoreSet<D>> {
        &mut self.sched
    }

    /// The workers, stage-major then by rank.
    pub fn ranks(&mut self) -> &mut [RankEngine<D>] {
        &mut self.ranks
    }

    /// The device the engine's tensors are in.
    pub fn device(&self) -> &Arc<D> {
        &self.dev
    }

    /// The spec table.
    pub fn spec(&self) -> &Arc<SpecTable> {
        &self.cfg.spec
    }

    /// The access-unit map.
    pub fn units(&self) -> &Arc<UnitMap> {
        &self.units
    }

    /// Scheduler side of one request: resolves it, allocates (and poisons
    /// on every rank) its blocks and slots, tells the scheduler. Returns the
    /// matched tokens, the allocation and the chunk ends.
    pub fn admit(&mut self, req: &Request) -> Result<(u64, Arc<Allocation>, Vec<u64>)> {
        let er = EngineRequest {
            id: req.id.clone(),
            tokens: Arc::clone(&req.tokens),
            keys: req.keys.clone(),
        };
        let (matched, _) = self.sched.get_num_new_matched_tokens(&er, 0)?;
        let n = req.tokens.len();
        let total = n + req.output.len();
        if total > self.cfg.max_tokens {
            return Err(HarnessError::RequestTooLong {
                request: req.id.clone(),
                tokens: total,
                max: self.cfg.max_tokens,
            });
        }
        let alloc = self.alloc.allocate(&self.cfg.spec, total).ok_or_else(|| {
            HarnessError::NoFreeBlocks {
                request: req.id.clone(),
            }
        })?;
        for rk in &mut self.ranks {
            poison_allocation(&*self.dev, &self.cfg.spec, rk, &alloc)?;
        }
        self.sched
            .update_state_after_alloc(&req.id, alloc.clone(), matched)?;
        let mut ends: BTreeSet<u64> = self
            .sched
            .checkpoint_positions(&req.id)
            .into_iter()
            .filter(|&p| p > matched && p <= n as u64)
            .collect();
        ends.insert(n as u64);
        let mut out = Vec::new();
        let mut start = matched;
        for e in ends {
            while start < e {
                let stop = e.min(start + self.cfg.chunk);
                out.push(stop);
                start = stop;
            }
        }
        Ok((matched, Arc::new(alloc), out))
    }

    /// Runs one request to its end on every rank and stage, with the
    /// oracle's checks and the save audit.
    pub fn run(&mut self, req: &Request) -> Result<Outcome> {
        let (matched, alloc, ends) = self.admit(req)?;
        let (l, _) = self.sched.resolution(&req.id).unwrap_or((0, 0));
        let mut out = Outcome {
            l,
            matched,
            ..Outcome::default()
        };
        let mut saved_blocks: HashMap<usize, BTreeSet<usize>> = HashMap::new();
        let mut saved_states: Vec<(usize, u64)> = Vec::new();
        let mut metas: Vec<Arc<ConnectorMeta>> = Vec::new();
        let mut start = matched;
        // The prefill's chunks, then (with an output) the decode's: the
        // tokens grow by the output and the steps end at the planned
        // positions beyond the prompt and at the sequence's end.
        let mut ends = ends;
        let n = req.tokens.len() as u64;
        let mut decode: Vec<u64> = Vec::new();
        if !req.output.is_empty() {
            let mut all = req.tokens.to_vec();
            all.extend_from_slice(&req.output);
            let total = all.len() as u64;
            self.sched.extend_tokens(&req.id, Arc::new(all))?;
            let mut at: BTreeSet<u64> = self
                .sched
                .checkpoint_positions(&req.id)
                .into_iter()
                .filter(|&p| p > n && p <= total)
                .collect();
            at.insert(total);
            decode.extend(at);
        }
        ends.extend(decode);
        for &end in &ends {
            let chunk = Scheduled {
                req: req.id.clone(),
                start,
                end,
            };
            let meta = self.sched.build_meta(std::slice::from_ref(&chunk))?;
            let r = &meta.requests[0];
            for (g, range) in &r.save_blocks {
                saved_blocks.entry(*g).or_default().extend(range.clone());
            }
            saved_states.extend(r.save_states.iter().map(|s| (s.group, s.position)));
            let flip = self.cfg.flip_byte && !self.flipped;
            let steps = self.step(&meta, &chunk, req.dead_rank, flip)?;
            let mut slowest = Duration::ZERO;
            let (mut scaled, mut full) = (0, 0);
            for s in steps {
                slowest = slowest.max(s.load_wait);
                scaled += s.loaded;
                full += s.loaded_full;
                out.bytes_saved += s.saved;
                out.checked += s.checked;
                out.untouched += s.untouched;
                self.flipped |= s.flipped;
                out.wrong.extend(s.wrong);
                out.load_errors.extend(s.load_errors);
            }
            out.bytes_loaded += scaled;
            out.bytes_loaded_full += full;
            out.load_wait += slowest;
            out.steps.push(StepTiming {
                start,
                end,
                prefill: end <= n,
                load_wait: slowest,
                loaded: scaled,
                loaded_full: full,
            });
            metas.push(meta);
            start = end;
        }
        out.load_errors.sort_by_key(|e| (e.group, e.engine_block));
        out.load_errors
            .dedup_by(|a, b| (a.group, a.engine_block) == (b.group, b.engine_block));
        self.finish_saves(req, &mut out);
        // The last step's metadata holds the ids of every token (decoding
        // extends them).
        if let Some(meta) = metas.last() {
            self.audit(
                req,
                &meta.requests[0],
                &saved_blocks,
                &saved_states,
                &mut out,
            );
        }
        // Served: p*, or where the engine resumes after the load errors.
        let first_failed = out
            .load_errors
            .iter()
            .filter_map(|e| {
                let table = alloc.blocks.get(&e.group)?;
                let i = table.iter().position(|&b| b == e.engine_block)?;
                Some(i as u64 * self.cfg.spec.block_of(e.group))
            })
            .chain(
                out.load_errors
                    .iter()
                    .filter(|e| alloc.state_slots.get(&e.group) == Some(&e.engine_block))
                    .map(|_| 0),
            )
            .min();
        out.served = oracle::resume_point(&self.cfg.spec, matched, 0, first_failed);
        self.sched.request_finished(&req.id);
        self.alloc.free((*alloc).clone());
        Ok(out)
    }

    /// One step on every rank (threads when there are several).
    fn step(
        &mut self,
        meta: &Arc<ConnectorMeta>,
        chunk: &Scheduled,
        dead: Option<u32>,
        flip: bool,
    ) -> Result<Vec<RankStep>> {
        let full = self.cfg.full.as_deref().unwrap_or(&self.cfg.spec);
        let ctx = Ctx {
            dev: &*self.dev,
            spec: &self.cfg.spec,
            full,
            units: &self.units,
            stores: &*self.stores,
            repeat: self.cfg.repeat,
        };
        let mut flip_left = flip;
        let jobs: Vec<(&mut RankEngine<D>, bool, bool)> = self
            .ranks
            .iter_mut()
            .map(|rk| {
                let save = dead != Some(rk.rank);
                let f = std::mem::take(&mut flip_left);
                (rk, save, f)
            })
            .collect();
        if jobs.len() == 1 {
            let mut v = Vec::new();
            for (rk, save, f) in jobs {
                v.push(rank_step(&ctx, rk, meta, chunk, save, f)?);
            }
            return Ok(v);
        }
        let ctx = &ctx;
        let results: Vec<Result<RankStep>> = std::thread::scope(|s| {
            let hs: Vec<_> = jobs
                .into_iter()
                .map(|(rk, save, f)| s.spawn(move || rank_step(ctx, rk, meta, chunk, save, f)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(Err(HarnessError::RankPanicked)))
                .collect()
        });
        results.into_iter().collect()
    }

    /// Polls every rank's `get_finished` until its saves of `req` ended
    /// (durable, incomplete or failed), within the timeout.
    fn finish_saves(&mut self, req: &Request, out: &mut Outcome) {
        let ids = [req.id.clone()];
        let deadline = Instant::now() + self.cfg.save_timeout;
        let mut done: HashSet<usize> = HashSet::new();
        loop {
            for (i, rk) in self.ranks.iter_mut().enumerate() {
                if done.contains(&i) {
                    continue;
                }
                let f = rk.worker.get_finished(&ids);
                let failed = !f.save_failed.is_empty();
                out.save_failures
                    .extend(f.save_failed.into_iter().map(|(_, why)| why));
                if failed || f.saved.contains(&req.id) {
                    done.insert(i);
                }
            }
            if done.len() == self.ranks.len() || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        out.unfinished_saves = (self.ranks.len() - done.len()) as u32;
        // Late failures of ranks already done (a write-behind that ended
        // after another failure was seen).
        for rk in self.ranks.iter_mut() {
            let f = rk.worker.get_finished(&[]);
            out.save_failures
                .extend(f.save_failed.into_iter().map(|(_, why)| why));
        }
    }

    /// The save audit: when no rank reported a failed or unfinished save,
    /// every block and state the request saved must be held, shard by
    /// shard, by a tier. A dead rank's items are counted apart.
    fn audit(
        &self,
        req: &Request,
        r: &ReqMeta,
        blocks: &HashMap<usize, BTreeSet<usize>>,
        states: &[(usize, u64)],
        out: &mut Outcome,
    ) {
        if !out.save_failures.is_empty() || out.unfinished_saves > 0 {
            return;
        }
        let spec = &self.cfg.spec;
        for rk in &self.ranks {
            let dead = req.dead_rank == Some(rk.rank);
            for u in rk.worker.stage_units() {
                let g = &spec.groups()[u.group];
                let key_rank = spec.key_rank(u.group, rk.rank);
                let mut missing = |block: Option<usize>, position: Option<u64>| {
                    if dead {
                        out.dead_rank_missing += 1;
                    } else {
                        out.lost.push(LostSave {
                            req: req.id.clone(),
                            group: g.name.clone(),
                            layer: u.first_layer(),
                            rank: rk.rank,
                            block,
                            position,
                        });
                    }
                };
                match g.kind {
                    Kind::Chain | Kind::Sidecar => {
                        let (Some(store), Some(ids)) = (
                            self.stores.blocks(u.group),
                            r.hashes.chains[u.group].get(key_rank),
                        ) else {
                            continue;
                        };
                        for &i in blocks.get(&u.group).into_iter().flatten() {
                            if !ids.get(i).is_some_and(|id| store.holds(id, u.shard)) {
                                missing(Some(i), None);
                            }
                        }
                    }
                    Kind::Snapshot => {
                        let Some(store) = self.stores.snapshots(u.group) else {
                            continue;
                        };
                        let (Some(seed), Some(ids)) = (
                            r.hashes.seeds[u.group].get(key_rank),
                            r.hashes.chains[u.group].get(key_rank),
                        ) else {
                            continue;
                        };
                        for &(_, p) in states.iter().filter(|(gi, _)| *gi == u.group) {
                            let held = checkpoint_hash(seed, ids, &r.tokens, g.hash_block, p)
                                .is_ok_and(|h| store.blocks().holds(&h, u.shard));
                            if !held {
                                missing(None, Some(p));
                            }
                        }
                    }
                    Kind::None => {}
                }
            }
        }
    }
}

/// Poisons every engine block and state slot of `alloc` in `rk`'s tensors.
fn poison_allocation<D: Device>(
    dev: &D,
    spec: &SpecTable,
    rk: &mut RankEngine<D>,
    alloc: &Allocation,
) -> Result<()> {
    let units: Vec<(u32, usize)> = rk
        .worker
        .stage_units()
        .iter()
        .map(|u| (u.global, u.group))
        .collect();
    for (global, group) in units {
        let region = rk.layout.region(global).clone();
        let targets: Vec<usize> = match spec.groups()[group].kind {
            Kind::Snapshot => alloc.state_slots.get(&group).copied().into_iter().collect(),
            Kind::Chain | Kind::Sidecar => alloc.blocks.get(&group).cloned().unwrap_or_default(),
            Kind::None => Vec::new(),
        }
        .into_iter()
        .map(|t| t as usize * region.stride)
        .collect();
        rk.io
            .write_each(dev, &region.memory, &targets, |_| poison(region.stride))?;
    }
    Ok(())
}

/// What one rank saw in one step.
#[derive(Default)]
struct RankStep {
    wrong: Vec<WrongHit>,
    load_errors: Vec<LoadError>,
    load_wait: Duration,
    loaded: u64,
    loaded_full: u64,
    saved: u64,
    checked: u64,
    untouched: u64,
    flipped: bool,
}

/// One step of one rank, hooks in contract order.
fn rank_step<D: Device>(
    ctx: &Ctx<'_, D>,
    rk: &mut RankEngine<D>,
    meta: &Arc<ConnectorMeta>,
    chunk: &Scheduled,
    save: bool,
    mut flip: bool,
) -> Result<RankStep> {
    let mut out = RankStep::default();
    let r = &meta.requests[0];
    rk.worker.start_load_kv(Arc::clone(meta))?;
    let mut layers: Vec<u32> = rk.layout.layer_unit.keys().copied().collect();
    layers.sort_unstable();
    let mut errors: Vec<LoadError> = Vec::new();
    for &layer in &layers {
        let t = Instant::now();
        for _ in 0..ctx.repeat {
            rk.worker.wait_for_layer_load(layer)?;
        }
        out.load_wait += t.elapsed();
        errors.extend(rk.worker.block_ids_with_load_errors());
        let Some(u) = ctx.units.unit_of(layer) else {
            continue;
        };
        if layer == u.first_layer() {
            check_and_compute(ctx, rk, r, chunk, u, &errors, &mut flip, &mut out)?;
        }
        if save {
            for _ in 0..ctx.repeat {
                rk.worker.save_kv_layer(layer, None)?;
            }
        }
    }
    rk.worker.wait_for_save()?;
    errors.extend(rk.worker.block_ids_with_load_errors());
    out.load_errors = errors;
    if save {
        for (gi, range) in &r.save_blocks {
            let n = rk
                .worker
                .stage_units()
                .iter()
                .filter(|u| u.group == *gi)
                .count() as u64;
            out.saved += range.len() as u64 * n * ctx.stores.shard_bytes(*gi) as u64;
        }
    }
    Ok(out)
}

/// At unit `u`'s first layer, after its wait: checks what was loaded
/// (equal to the oracle unless reported failed) and what the chunk will
/// compute (still poisoned), then "computes" the chunk: the oracle's bytes
/// of its completed blocks, or of the state at its end.
#[allow(clippy::too_many_arguments)]
fn check_and_compute<D: Device>(
    ctx: &Ctx<'_, D>,
    rk: &mut RankEngine<D>,
    r: &ReqMeta,
    chunk: &Scheduled,
    u: &Unit,
    errors: &[LoadError],
    flip: &mut bool,
    out: &mut RankStep,
) -> Result<()> {
    let layer = u.first_layer();
    let region = rk.layout.region(u.global).clone();
    let stride = region.stride;
    let g = &ctx.spec.groups()[u.group];
    let key_rank = ctx.spec.key_rank(u.group, rk.rank);
    let failed: HashSet<u32> = errors
        .iter()
        .filter(|e| e.group == u.group)
        .map(|e| e.engine_block)
        .collect();
    let rank = rk.rank;
    let wrong = |block: Option<usize>, eb: u32, position: Option<u64>, kind| WrongHit {
        req: r.id.clone(),
        group: g.name.clone(),
        layer,
        rank,
        block,
        engine_block: eb,
        position,
        kind,
    };
    let classify = |got: &[u8]| {
        if is_poison(got) {
            WrongKind::NotLoaded
        } else {
            WrongKind::WrongBytes
        }
    };
    let shard_full =
        ucm_coordinator::adapter::stores::shard_bytes(ctx.full, &ctx.full.groups()[u.group]) as u64;
    let mut flip_first = |got: &mut Vec<u8>, out: &mut RankStep| {
        if std::mem::take(flip) {
            got[0] ^= 1;
            out.flipped = true;
        }
    };
    let at = |eb: u32| eb as usize * stride;
    match g.kind {
        Kind::Chain | Kind::Sidecar => {
            let b = ctx.spec.block_of(u.group).max(1);
            let table = &r.alloc.blocks[&u.group];
            let ids = &r.hashes.chains[u.group][key_rank];
            if let Some((p, have)) = r.load {
                let want: Vec<usize> = oracle::loaded_blocks(ctx.spec, u.group, p, have)
                    .filter(|&i| !failed.contains(&table[i]))
                    .collect();
                let offs: Vec<usize> = want.iter().map(|&i| at(table[i])).collect();
                let got = rk.io.read_each(ctx.dev, &region.memory, &offs, stride)?;
                for (&i, mut got) in want.iter().zip(got) {
                    flip_first(&mut got, out);
                    out.checked += 1;
                    out.loaded += stride as u64;
                    out.loaded_full += shard_full;
                    if got != content(&ids[i], layer, key_rank, stride) {
                        out.wrong
                            .push(wrong(Some(i), table[i], None, classify(&got)));
                    }
                }
            }
            // Untouched: what this chunk computes, and in the first step
            // what lies below a window (neither loaded nor computed).
            let mut idle: Vec<usize> =
                (chunk.start.div_ceil(b) as usize..(chunk.end / b) as usize).collect();
            if let Some((p, have)) = r.load {
                let loaded = oracle::loaded_blocks(ctx.spec, u.group, p, have);
                idle.extend((have / b) as usize..loaded.start.min(table.len()));
            }
            let offs: Vec<usize> = idle.iter().map(|&i| at(table[i])).collect();
            for (&i, got) in
                idle.iter()
                    .zip(rk.io.read_each(ctx.dev, &region.memory, &offs, stride)?)
            {
                out.untouched += 1;
                if !is_poison(&got) {
                    out.wrong
                        .push(wrong(Some(i), table[i], None, WrongKind::Overwritten));
                }
            }
            // Compute: the chunk's completed blocks.
            let done: Vec<usize> = ((chunk.start / b) as usize..(chunk.end / b) as usize).collect();
            let offs: Vec<usize> = done.iter().map(|&i| at(table[i])).collect();
            rk.io.write_each(ctx.dev, &region.memory, &offs, |k| {
                content(&ids[done[k]], layer, key_rank, stride)
            })?;
        }
        Kind::Snapshot => {
            let slot = r.alloc.state_slots[&u.group];
            let seed = &r.hashes.seeds[u.group][key_rank];
            let ids = &r.hashes.chains[u.group][key_rank];
            let state = |p: u64| -> Result<Vec<u8>> {
                let h = checkpoint_hash(seed, ids, &r.tokens, g.hash_block, p)?;
                Ok(content(&h, layer, key_rank, stride))
            };
            let mut got = rk
                .io
                .read_each(ctx.dev, &region.memory, &[at(slot)], stride)?
                .remove(0);
            match r.load {
                Some((p, have))
                    if oracle::loads_state(ctx.spec, u.group, p, have)
                        && !failed.contains(&slot) =>
                {
                    flip_first(&mut got, out);
                    out.checked += 1;
                    out.loaded += stride as u64;
                    out.loaded_full += shard_full;
                    if got != state(p)? {
                        out.wrong.push(wrong(None, slot, Some(p), classify(&got)));
                    }
                }
                // A state load reported failed: the engine recomputes.
                Some((p, have)) if oracle::loads_state(ctx.spec, u.group, p, have) => {}
                _ if chunk.start == 0 => {
                    out.untouched += 1;
                    if !is_poison(&got) {
                        out.wrong
                            .push(wrong(None, slot, None, WrongKind::Overwritten));
                    }
                }
                _ => {}
            }
            // Compute: the state at the chunk's end.
            let bytes = state(chunk.end)?;
            rk.io
                .write_each(ctx.dev, &region.memory, &[at(slot)], |_| bytes.clone())?;
        }
        Kind::None => {}
    }
    Ok(())
}
