//! `ucm replay`: a model end to end on the host device, with a content
//! oracle, baselines and a report.
//!
//! A simulated engine drives the adapter exactly as a real engine would:
//! per request, the scheduler side (`get_num_new_matched_tokens`,
//! `update_state_after_alloc`, `build_meta`), then per step every rank and
//! pipeline stage (threads sharing the stores) calls `start_load_kv`, per
//! layer `wait_for_layer_load` and `save_kv_layer`, then `wait_for_save`.
//! The engine's KV pools are host-device memory.
//!
//! **Content oracle.** The bytes of (group, layer, block) are a keyed
//! stream of the block's id (a pure function of the token prefix up to the
//! block's end, the group and, for `intersection` groups, the rank) and the
//! layer; a state at `p` is one of `H(p)` and the layer. After every load
//! the engine compares every loaded byte with the oracle: a mismatch is a
//! **wrong hit**, printed with its request, group, layer and block, and the
//! run fails.
//!
//! **Modes**, on the same workload: `ucm` (the design), `recompute` (no
//! cache) and `fold` (the predecessor's hash-folding: a state is kept only
//! where a prompt ended on a chain-block boundary).
//!
//! **Scale.** Byte sizes are divided by `bytes_scale` (default 64) so the
//! default run fits two cores in well under two minutes; block sizes, grids,
//! windows and layers are the spec's, so hits are too. In the simulated
//! TTFT the measured load time of a step is scaled by the bytes the same
//! items hold at full size over the bytes moved (the bandwidth measured,
//! applied to the real sizes), and compute is `compute_us_per_token` per
//! prompt token not served.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::coordinator::adapter::units::partition;
use crate::coordinator::adapter::{
    Allocation, ConnectorMeta, EngineRequest, LayerRegistration, ReqMeta, Scheduled, Scheduler,
    StoreSet, StoreSetConfig, UnitMap, Worker, WorkerConfig,
};
use crate::coordinator::hash::{checkpoint_hash, seeded_tokens, Id};
use crate::coordinator::{
    CheckpointDirectory, CoordError, Deployment, Kind, RankRule, RequestKeys, SpecTable,
};
use crate::device::conformance::{download, pattern, upload};
use crate::device::{Device, HostDevice, Memory};

/// The workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Multi-turn chat: a shared system prompt, per-session history.
    Chat,
    /// Questions over shared long documents.
    Docqa,
    /// Random prompts with low reuse.
    Random,
}

/// The modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The design.
    Ucm,
    /// No cache.
    Recompute,
    /// Hash-folding baseline.
    Fold,
}

impl Mode {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Ucm => "ucm",
            Mode::Recompute => "recompute",
            Mode::Fold => "fold",
        }
    }
}

/// What to replay.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// The spec table.
    pub spec: PathBuf,
    /// The workload.
    pub workload: Workload,
    /// Its seed.
    pub seed: u64,
    /// Sessions (chat), documents (docqa) or prompts / turns (random).
    pub sessions: usize,
    /// Turns per session (chat), questions per document (docqa).
    pub turns: usize,
    /// Tensor-parallel ranks.
    pub tp: u32,
    /// Pipeline stages.
    pub pp: u32,
    /// Call every layer hook twice per step (speculative decoding).
    pub spec_decode: bool,
    /// Probability per request of an injected fault.
    pub faults: f64,
    /// Where the stores live (a fresh subdirectory per mode).
    pub dir: PathBuf,
    /// Byte sizes divided by this.
    pub bytes_scale: u64,
    /// Simulated compute per prompt token not served, in microseconds.
    pub compute_us_per_token: f64,
    /// Longest prefill chunk.
    pub chunk: u64,
    /// Modes to run.
    pub modes: Vec<Mode>,
    /// Test only: flip one byte of the first block loaded, so the oracle
    /// must report a wrong hit (proves the check can fail).
    pub sabotage: bool,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            spec: PathBuf::from("specs/x-hybrid-96.toml"),
            workload: Workload::Chat,
            seed: 1,
            sessions: 8,
            turns: 4,
            tp: 1,
            pp: 1,
            spec_decode: false,
            faults: 0.0,
            dir: std::env::temp_dir(),
            bytes_scale: 64,
            compute_us_per_token: 60.0,
            chunk: 2048,
            modes: vec![Mode::Ucm, Mode::Recompute, Mode::Fold],
            sabotage: false,
        }
    }
}

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The coordinator or a store failed.
    #[error(transparent)]
    Coord(#[from] CoordError),
    /// The host device failed.
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    /// A bad option or an impossible run.
    #[error("{0}")]
    Config(String),
}

type Result<T> = std::result::Result<T, ReplayError>;

/// One request of a workload.
#[derive(Clone, Debug)]
pub struct WorkRequest {
    /// Session (chat), document (docqa) or prompt (random) index.
    pub session: usize,
    /// Turn (chat) or question (docqa) index.
    pub turn: usize,
    /// The prompt.
    pub tokens: Arc<Vec<u32>>,
}

fn mix(seed: u64, a: u64, b: u64, c: u64) -> u64 {
    let mut x =
        seed ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.rotate_left(21) ^ c.rotate_left(42);
    x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 29)
}

/// The requests of a workload, in arrival order (sessions interleaved).
pub fn workload(cfg: &ReplayConfig) -> Vec<WorkRequest> {
    let s = cfg.seed;
    let mut out = Vec::new();
    match cfg.workload {
        Workload::Chat => {
            let system = seeded_tokens(mix(s, 1, 0, 0), 3072);
            let mut history: Vec<Vec<u32>> = vec![system; cfg.sessions];
            for t in 0..cfg.turns {
                for (i, h) in history.iter_mut().enumerate() {
                    // Message and answer lengths vary, as in real chats.
                    let user = 256 + (mix(s, 10, i as u64, t as u64) % 512) as usize;
                    let answer = 64 + (mix(s, 11, i as u64, t as u64) % 384) as usize;
                    let mut prompt = h.clone();
                    prompt.extend(seeded_tokens(mix(s, 2, i as u64, t as u64), user));
                    let mut next = prompt.clone();
                    next.extend(seeded_tokens(mix(s, 3, i as u64, t as u64), answer));
                    *h = next;
                    out.push(WorkRequest {
                        session: i,
                        turn: t,
                        tokens: Arc::new(prompt),
                    });
                }
            }
        }
        Workload::Docqa => {
            let docs: Vec<Vec<u32>> = (0..cfg.sessions)
                .map(|d| seeded_tokens(mix(s, 4, d as u64, 0), 4096))
                .collect();
            for q in 0..cfg.turns {
                for (d, doc) in docs.iter().enumerate() {
                    let mut prompt = doc.clone();
                    let len = 32 + (mix(s, 12, d as u64, q as u64) % 160) as usize;
                    prompt.extend(seeded_tokens(mix(s, 5, d as u64, q as u64), len));
                    out.push(WorkRequest {
                        session: d,
                        turn: q,
                        tokens: Arc::new(prompt),
                    });
                }
            }
        }
        Workload::Random => {
            for i in 0..cfg.sessions * cfg.turns {
                let len = 1024 + (mix(s, 6, i as u64, 0) % 3072) as usize;
                out.push(WorkRequest {
                    session: i,
                    turn: 0,
                    tokens: Arc::new(seeded_tokens(mix(s, 7, i as u64, 0), len)),
                });
            }
        }
    }
    out
}

/// Per request: the longest prefix shared with any earlier prompt (what a
/// perfect cache could serve, before the grid and the last-token rule).
fn reusable(reqs: &[WorkRequest]) -> Vec<u64> {
    (0..reqs.len())
        .map(|i| {
            let t = &reqs[i].tokens;
            reqs[..i]
                .iter()
                .map(|e| {
                    t.iter()
                        .zip(e.tokens.iter())
                        .take_while(|(a, b)| a == b)
                        .count()
                })
                .max()
                .unwrap_or(0) as u64
        })
        .collect()
}

/// The report of one mode.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ModeReport {
    /// Requests replayed.
    pub requests: usize,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens served from the persistent tiers (`p*`, less failed loads).
    pub cached_tokens: u64,
    /// `cached_tokens` over the tokens reusable at all (each prompt's
    /// longest prefix shared with an earlier prompt, on the chain grid,
    /// without its last token).
    pub hit_rate: f64,
    /// Tokens the states let the engine skip over those the chain groups
    /// held: sum of `p*` over sum of `l`.
    pub state_hit_rate: f64,
    /// Simulated TTFT reduction against `recompute`, over requests with at
    /// least 4096 reusable tokens.
    pub ttft_reduction_vs_recompute: Option<f64>,
    /// The same against `fold`.
    pub ttft_reduction_vs_fold: Option<f64>,
    /// Loaded bytes that differed from the oracle.
    pub wrong_hits: u64,
    /// Faults injected (fail points that fired, eviction storms, rank kills).
    pub injected_faults: u64,
    /// Faults the adapter reported (load errors, failed saves) or the store
    /// absorbed (counted write retries), plus the storms and kills, whose
    /// effect is misses.
    pub reported_faults: u64,
    /// Injected I/O faults with no report in their request (must be 0).
    pub unaccounted_faults: u64,
    /// Bytes loaded into the engine and saved out of it (scaled).
    pub bytes_loaded: u64,
    /// Bytes saved.
    pub bytes_saved: u64,
    /// Bytes the stores served from the memory tier (scaled).
    pub bytes_from_pool: u64,
    /// Bytes the stores read from the disk tier (scaled).
    pub bytes_from_disk: u64,
    /// Load throughput, GiB/s (scaled bytes over load wall time).
    pub load_gib_s: f64,
    /// Per turn: (hit rate, mean simulated TTFT in ms).
    pub per_turn: Vec<(f64, f64)>,
    /// Simulated TTFT of each request, ms (for cross-mode ratios).
    #[serde(skip)]
    pub ttft_ms: Vec<f64>,
}

/// The full report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Per mode.
    pub modes: std::collections::BTreeMap<String, ModeReport>,
}

struct Rank {
    worker: Worker<HostDevice>,
    regions: HashMap<u32, (Memory, usize)>,
    rank: u32,
}

struct Ctx {
    dev: Arc<HostDevice>,
    /// The scaled spec the run uses.
    spec: Arc<SpecTable>,
    /// The spec at full size, for the TTFT model.
    full: Arc<SpecTable>,
    units: Arc<UnitMap>,
}

fn rank_of(spec: &SpecTable, group: usize, rank: u32) -> usize {
    match spec.groups()[group].rank_rule {
        RankRule::AllUnion => 0,
        RankRule::Intersection => rank as usize,
    }
}

/// The oracle's bytes of `layer`'s unit for block `i` (chain) or the state
/// at `p` (snapshot).
fn oracle(ctx: &Ctx, r: &ReqMeta, layer: u32, rank: u32, i: usize, p: u64, len: usize) -> Vec<u8> {
    let u = ctx.units.unit_of(layer).expect("a cached layer");
    let g = &ctx.spec.groups()[u.group];
    let rk = rank_of(&ctx.spec, u.group, rank);
    let id: Id = match g.kind {
        Kind::Snapshot => checkpoint_hash(
            &r.hashes.seeds[u.group][rk],
            &r.hashes.chains[u.group][rk],
            &r.tokens,
            g.hash_block,
            p,
        )
        .unwrap_or([0; 16]),
        _ => r.hashes.chains[u.group][rk][i],
    };
    let seed = u64::from_le_bytes(id[..8].try_into().unwrap_or([0; 8]))
        ^ (u64::from(u.first_layer()) << 48)
        ^ u64::from(rk as u32);
    pattern(seed, len)
}

/// What one rank saw in one step.
#[derive(Default)]
struct StepOut {
    wrong: Vec<String>,
    load_wait: Duration,
    loaded_bytes: u64,
    /// What `loaded_bytes` would be at full size.
    loaded_full_bytes: u64,
    saved_bytes: u64,
    load_errors: Vec<(usize, u32)>,
}

/// One step of one rank, hooks in contract order: after each unit's wait,
/// every loaded byte is checked against the oracle (except what the adapter
/// reported failed: the engine recomputes that), then the chunk is
/// "computed" (the oracle's bytes written) and the layer saved.
fn rank_step(
    ctx: &Ctx,
    rk: &mut Rank,
    meta: &Arc<ConnectorMeta>,
    chunk: &Scheduled,
    repeat: usize,
    save: bool,
    sabotage: bool,
) -> Result<StepOut> {
    let mut sabotage = sabotage;
    let mut out = StepOut::default();
    rk.worker.start_load_kv(Arc::clone(meta))?;
    let mut layers: Vec<u32> = rk.regions.keys().copied().collect();
    layers.sort_unstable();
    let r = &meta.requests[0];
    for &layer in &layers {
        let t = Instant::now();
        for _ in 0..repeat {
            rk.worker.wait_for_layer_load(layer)?;
        }
        out.load_wait += t.elapsed();
        let new_errors = rk.worker.block_ids_with_load_errors();
        let failed: std::collections::HashSet<(usize, u32)> = new_errors
            .iter()
            .map(|e| (e.group, e.engine_block))
            .collect();
        out.load_errors.extend(failed.iter().copied());
        let u = ctx
            .units
            .unit_of(layer)
            .expect("registered layers have units")
            .clone();
        let g = ctx.spec.groups()[u.group].clone();
        let (mem, stride) = rk.regions[&layer].clone();
        let b = crate::coordinator::adapter::scheduler::block_of(&ctx.spec, u.group).max(1);
        if layer == u.first_layer() {
            if let Some((p, have)) = r.load {
                let mut check = |i: usize, p: u64, at: usize| -> Result<()> {
                    let mut got = download(ctx.dev.as_ref(), &mem, at, stride)?;
                    if std::mem::take(&mut sabotage) {
                        got[0] ^= 1;
                    }
                    out.loaded_bytes += stride as u64;
                    out.loaded_full_bytes +=
                        crate::coordinator::adapter::stores::shard_bytes(&ctx.full, &g) as u64;
                    if got != oracle(ctx, r, layer, rk.rank, i, p, stride) {
                        out.wrong.push(format!(
                            "wrong hit: request {} group {} layer {layer} {} (rank {})",
                            r.id,
                            g.name,
                            if g.kind == Kind::Snapshot {
                                format!("state at {p}")
                            } else {
                                format!("block {i}")
                            },
                            rk.rank
                        ));
                    }
                    Ok(())
                };
                match g.kind {
                    // A failed state load reports the request's first blocks.
                    Kind::Snapshot if new_errors.is_empty() => {
                        let slot = r.alloc.state_slots[&u.group] as usize;
                        check(0, p, slot * stride)?;
                    }
                    Kind::Chain | Kind::Sidecar => {
                        let window = match (g.window, g.source) {
                            (Some(w), _) => Some(w),
                            (None, Some(s)) => ctx.spec.groups()[s].window,
                            _ => None,
                        };
                        let from = window.map_or(have, |w| have.max(p.saturating_sub(w)));
                        for i in (from / b) as usize..(p / b) as usize {
                            let eb = r.alloc.blocks[&u.group][i];
                            if !failed.contains(&(u.group, eb)) {
                                check(i, 0, eb as usize * stride)?;
                            }
                        }
                    }
                    _ => {}
                }
            }
            // Compute: the chunk's completed blocks, the state at its end.
            match g.kind {
                Kind::Snapshot => {
                    let slot = r.alloc.state_slots[&u.group] as usize;
                    let bytes = oracle(ctx, r, layer, rk.rank, 0, chunk.end, stride);
                    upload(ctx.dev.as_ref(), &mem, slot * stride, &bytes)?;
                }
                Kind::Chain | Kind::Sidecar => {
                    for i in (chunk.start / b) as usize..(chunk.end / b) as usize {
                        let eb = r.alloc.blocks[&u.group][i] as usize;
                        let bytes = oracle(ctx, r, layer, rk.rank, i, 0, stride);
                        upload(ctx.dev.as_ref(), &mem, eb * stride, &bytes)?;
                    }
                }
                Kind::None => {}
            }
        }
        if save {
            for _ in 0..repeat {
                rk.worker.save_kv_layer(layer, None)?;
            }
        }
    }
    rk.worker.wait_for_save()?;
    for e in rk.worker.block_ids_with_load_errors() {
        out.load_errors.push((e.group, e.engine_block));
    }
    if save {
        for (gi, range) in &r.save_blocks {
            let units = rk
                .worker
                .stage_units()
                .iter()
                .filter(|u| u.group == *gi)
                .count() as u64;
            let shard = crate::coordinator::adapter::stores::shard_bytes(
                &ctx.spec,
                &ctx.spec.groups()[*gi],
            ) as u64;
            out.saved_bytes += range.len() as u64 * units * shard;
        }
    }
    Ok(out)
}

/// Replays one mode.
fn run_mode(
    cfg: &ReplayConfig,
    ctx: &Ctx,
    reqs: &[WorkRequest],
    reuse: &[u64],
    mode: Mode,
    progress: &dyn Fn(&str),
) -> Result<ModeReport> {
    let mut rep = ModeReport {
        requests: reqs.len(),
        ..ModeReport::default()
    };
    let grid = ctx.spec.chain_grid();
    let compute_ms = |tokens: u64| tokens as f64 * cfg.compute_us_per_token / 1000.0;
    let mut per_turn: HashMap<usize, (f64, f64, f64, usize)> = HashMap::new();
    if mode == Mode::Recompute {
        for (w, &re) in reqs.iter().zip(reuse) {
            let n = w.tokens.len() as u64;
            rep.prompt_tokens += n;
            let ttft = compute_ms(n);
            rep.ttft_ms.push(ttft);
            let e = per_turn.entry(w.turn).or_default();
            e.1 += ttft;
            e.2 += (re.min(n - 1) / grid * grid) as f64;
            e.3 += 1;
        }
        rep.per_turn = turns(&per_turn);
        return Ok(rep);
    }
    let dir = cfg
        .dir
        .join(format!("ucm-replay-{}-{}", std::process::id(), mode.name()));
    let _ = std::fs::remove_dir_all(&dir);
    let max_tokens = reqs.iter().map(|r| r.tokens.len()).max().unwrap_or(0);
    let blocks = max_tokens / grid.max(1) as usize + 2;
    let stores = Arc::new(StoreSet::open(
        &ctx.spec,
        &ctx.units,
        &dir,
        Arc::clone(&ctx.dev),
        &StoreSetConfig {
            pool_slots: 4096,
            ways: 64,
            ..StoreSetConfig::default()
        },
    )?);
    let directory = Arc::new(CheckpointDirectory::new());
    let mut sched = Scheduler::new(
        Arc::clone(&ctx.spec),
        Deployment { tp_size: cfg.tp },
        Arc::clone(&stores),
        Arc::clone(&directory),
    );
    sched.set_fold_retention(mode == Mode::Fold);
    let num_layers = ctx.spec.num_layers.unwrap_or_else(|| {
        ctx.spec
            .groups()
            .iter()
            .flat_map(|g| g.layers.iter().copied())
            .max()
            .map_or(0, |m| m + 1)
    });
    let bounds: Vec<u32> = (1..cfg.pp).map(|s| num_layers * s / cfg.pp).collect();
    let stages = partition(&bounds, num_layers)?;
    let mut ranks: Vec<Rank> = Vec::new();
    for stage in &stages {
        for rank in 0..cfg.tp {
            let mut worker = Worker::new(
                Arc::clone(&ctx.spec),
                Arc::clone(&ctx.units),
                Arc::clone(&stores),
                Arc::clone(&directory),
                Arc::clone(&ctx.dev),
                WorkerConfig {
                    rank,
                    tp_size: cfg.tp,
                    stage: stage.clone(),
                    lookahead: 1,
                },
            )?;
            let mut regions = HashMap::new();
            let mut regs = Vec::new();
            for u in worker.stage_units() {
                let stride = stores.shard_bytes(u.group);
                let n = if ctx.spec.groups()[u.group].kind == Kind::Snapshot {
                    1
                } else {
                    blocks
                };
                let mem = ctx.dev.alloc_device(stride * n)?;
                for &l in &u.layers {
                    regions.insert(l, (mem.clone(), stride));
                    regs.push(LayerRegistration {
                        layer: l,
                        memory: mem.clone(),
                        stride,
                    });
                }
            }
            worker.register_kv_caches(regs)?;
            ranks.push(Rank {
                worker,
                regions,
                rank,
            });
        }
    }
    let repeat = if cfg.spec_decode { 2 } else { 1 };
    let mut faults = Faults::new(cfg, &dir, &ctx.spec);
    let (mut sum_l, mut sum_p, mut reusable_total) = (0u64, 0u64, 0u64);
    let mut sabotaged = false;
    let mut load_time = Duration::ZERO;
    let started = Instant::now();
    for (k, (w, &re)) in reqs.iter().zip(reuse).enumerate() {
        let id = format!("{}-s{}-t{}-{k}", mode.name(), w.session, w.turn);
        let n = w.tokens.len() as u64;
        rep.prompt_tokens += n;
        let fault = faults.before(k)?;
        let retries_before = stores.write_retries();
        let req = EngineRequest {
            id: id.clone(),
            tokens: Arc::clone(&w.tokens),
            keys: RequestKeys::default(),
        };
        let (matched, _) = sched.get_num_new_matched_tokens(&req, 0)?;
        let (l, _) = sched.resolution(&id).unwrap_or((0, 0));
        let mut alloc = Allocation::default();
        for g in ctx.spec.groups() {
            match g.kind {
                Kind::Chain | Kind::Sidecar => {
                    alloc.blocks.insert(g.index, (0..blocks as u32).collect());
                }
                Kind::Snapshot => {
                    alloc.state_slots.insert(g.index, 0);
                }
                Kind::None => {}
            }
        }
        sched.update_state_after_alloc(&id, alloc, matched)?;
        let mut ends: Vec<u64> = sched
            .checkpoint_positions(&id)
            .into_iter()
            .filter(|&p| p > matched)
            .collect();
        ends.push(n);
        let mut start = matched;
        let mut req_wait = Duration::ZERO;
        let mut req_load_full_ms = 0.0f64;
        let mut served = matched;
        let mut reported = 0u64;
        for end in ends {
            while start < end {
                let stop = end.min(start + cfg.chunk.max(1));
                let chunk = Scheduled {
                    req: id.clone(),
                    start,
                    end: stop,
                };
                let meta = sched.build_meta(std::slice::from_ref(&chunk))?;
                let kill = fault.kill_rank && start == matched;
                let outs: Vec<Result<StepOut>> = std::thread::scope(|s| {
                    let hs: Vec<_> = ranks
                        .iter_mut()
                        .map(|rk| {
                            let save = !(kill && rk.rank == cfg.tp - 1);
                            let meta = &meta;
                            let chunk = &chunk;
                            let sabotage = cfg.sabotage && rk.rank == 0 && !sabotaged;
                            s.spawn(move || rank_step(ctx, rk, meta, chunk, repeat, save, sabotage))
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| {
                            h.join().unwrap_or_else(|_| {
                                Err(ReplayError::Config("a rank thread panicked".into()))
                            })
                        })
                        .collect()
                });
                let mut step_wait = Duration::ZERO;
                let (mut scaled_b, mut full_b) = (0u64, 0u64);
                sabotaged |= cfg.sabotage && meta.requests[0].load.is_some();
                for o in outs {
                    let o = o?;
                    step_wait = step_wait.max(o.load_wait);
                    scaled_b += o.loaded_bytes;
                    full_b += o.loaded_full_bytes;
                    rep.bytes_loaded += o.loaded_bytes;
                    rep.bytes_saved += o.saved_bytes;
                    for wmsg in &o.wrong {
                        eprintln!("\n{wmsg}");
                    }
                    rep.wrong_hits += o.wrong.len() as u64;
                    if !o.load_errors.is_empty() {
                        reported += o.load_errors.len() as u64;
                        // The engine recomputes from the first failed block.
                        let first = o
                            .load_errors
                            .iter()
                            .map(|(g, eb)| {
                                u64::from(*eb)
                                    * crate::coordinator::adapter::scheduler::block_of(
                                        &ctx.spec, *g,
                                    )
                            })
                            .min()
                            .unwrap_or(0);
                        served = served.min(first);
                    }
                }
                req_wait += step_wait;
                // The TTFT model: the load at full size, at the bandwidth
                // this step measured.
                if scaled_b > 0 {
                    req_load_full_ms +=
                        step_wait.as_secs_f64() * 1e3 * full_b as f64 / scaled_b as f64;
                }
                start = stop;
            }
        }
        // Saves end (durable or failed) before the next request.
        for _ in 0..400 {
            let mut pending = false;
            for rk in ranks.iter_mut() {
                let f = rk.worker.get_finished(std::slice::from_ref(&id));
                reported += f.save_failed.len() as u64;
                pending |= !f.saved.contains(&id) && f.save_failed.is_empty();
            }
            if !pending {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        sched.request_finished(&id);
        // A write fault a retry absorbed is accounted for by the retry.
        reported += stores.write_retries() - retries_before;
        let acc = faults.after(fault, reported);
        rep.injected_faults += acc.0;
        rep.reported_faults += acc.1;
        rep.unaccounted_faults += acc.2;
        load_time += req_wait;
        rep.cached_tokens += served;
        sum_l += l;
        sum_p += matched;
        let possible = re.min(n - 1) / grid * grid;
        reusable_total += possible;
        let ttft = compute_ms(n - served) + req_load_full_ms;
        rep.ttft_ms.push(ttft);
        let e = per_turn.entry(w.turn).or_default();
        e.0 += served as f64;
        e.1 += ttft;
        e.2 += possible as f64;
        e.3 += 1;
        progress(&format!(
            "{:<9} [{}{}] {}/{} requests, {:.0}% cached, {} wrong hits, {:.1}s",
            mode.name(),
            "#".repeat((k + 1) * 30 / reqs.len()),
            " ".repeat(30 - (k + 1) * 30 / reqs.len()),
            k + 1,
            reqs.len(),
            if reusable_total > 0 {
                100.0 * rep.cached_tokens as f64 / reusable_total as f64
            } else {
                0.0
            },
            rep.wrong_hits,
            started.elapsed().as_secs_f64()
        ));
    }
    rep.hit_rate = ratio(rep.cached_tokens, reusable_total);
    rep.state_hit_rate = ratio(sum_p, sum_l);
    rep.load_gib_s = if load_time.is_zero() {
        0.0
    } else {
        rep.bytes_loaded as f64 / (1u64 << 30) as f64 / load_time.as_secs_f64()
    };
    rep.per_turn = turns(&per_turn);
    (rep.bytes_from_pool, rep.bytes_from_disk) = stores.tier_bytes();
    progress("\n");
    drop(ranks);
    drop(sched);
    drop(stores);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(rep)
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        (a as f64 / b as f64 * 1e4).round() / 1e4
    }
}

fn turns(m: &HashMap<usize, (f64, f64, f64, usize)>) -> Vec<(f64, f64)> {
    let mut keys: Vec<usize> = m.keys().copied().collect();
    keys.sort_unstable();
    keys.iter()
        .map(|k| {
            let (c, t, p, n) = m[k];
            (if p > 0.0 { c / p } else { 0.0 }, t / n.max(1) as f64)
        })
        .collect()
}

/// One request's injected fault.
#[derive(Default)]
struct Fault {
    #[cfg(feature = "failpoints")]
    guard: Option<crate::device::io::faults::FaultGuard>,
    storm: bool,
    kill_rank: bool,
}

struct Faults {
    rate: f64,
    seed: u64,
    dir: PathBuf,
    groups: Vec<String>,
    tp: u32,
}

impl Faults {
    fn new(cfg: &ReplayConfig, dir: &Path, spec: &SpecTable) -> Faults {
        Faults {
            rate: cfg.faults,
            seed: cfg.seed,
            dir: dir.to_path_buf(),
            groups: spec
                .groups()
                .iter()
                .filter(|g| matches!(g.kind, Kind::Chain | Kind::Snapshot))
                .map(|g| g.name.clone())
                .collect(),
            tp: cfg.tp,
        }
    }

    /// Maybe injects a fault for request `k`.
    fn before(&mut self, k: usize) -> Result<Fault> {
        let x = mix(self.seed, 9, k as u64, 0);
        if self.rate <= 0.0 || (x % 1_000_000) as f64 / 1e6 >= self.rate || self.groups.is_empty() {
            return Ok(Fault::default());
        }
        let group = &self.groups[(x >> 20) as usize % self.groups.len()];
        let path = self.dir.join(group);
        let kind = (x >> 40) % if self.tp > 1 { 5 } else { 4 };
        #[cfg(feature = "failpoints")]
        {
            use crate::device::io::faults::{inject, FaultOp, FaultRule};
            let rule = |op, errno| {
                let mut r = FaultRule::errno(&path, op, errno);
                r.times = Some(4);
                r
            };
            match kind {
                0 => {
                    return Ok(Fault {
                        guard: Some(inject(rule(FaultOp::Read, libc::EIO))),
                        ..Fault::default()
                    })
                }
                1 => {
                    return Ok(Fault {
                        guard: Some(inject(rule(FaultOp::Write, libc::EIO))),
                        ..Fault::default()
                    })
                }
                2 => {
                    return Ok(Fault {
                        guard: Some(inject(rule(FaultOp::Write, libc::ENOSPC))),
                        ..Fault::default()
                    })
                }
                _ => {}
            }
        }
        #[cfg(not(feature = "failpoints"))]
        if kind < 3 {
            return Err(ReplayError::Config(
                "--faults injects I/O errors through fail points: build with --features failpoints"
                    .into(),
            ));
        }
        if kind == 3 {
            // An eviction storm: every block file of the group goes (GC on
            // another machine); the pool may still hold some.
            let _ = std::fs::remove_dir_all(path.join("blocks"));
            return Ok(Fault {
                storm: true,
                ..Fault::default()
            });
        }
        Ok(Fault {
            kill_rank: true,
            ..Fault::default()
        })
    }

    /// Accounts for a request's fault: (injected, reported, unaccounted).
    #[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
    fn after(&mut self, f: Fault, reported: u64) -> (u64, u64, u64) {
        let mut acc = (0, 0, 0);
        #[cfg(feature = "failpoints")]
        if let Some(g) = f.guard {
            if g.fired() > 0 {
                acc.0 += 1;
                if reported > 0 {
                    acc.1 += 1;
                } else {
                    acc.2 += 1;
                }
            }
        }
        if f.storm || f.kill_rank {
            // Their effect is misses, which the oracle proves harmless.
            acc.0 += 1;
            acc.1 += 1;
        }
        acc
    }
}

/// Runs the replay: every mode on the same workload.
pub fn run(cfg: &ReplayConfig, progress: &dyn Fn(&str)) -> Result<Report> {
    if cfg.tp == 0 || cfg.pp == 0 || cfg.bytes_scale == 0 || cfg.sessions == 0 || cfg.turns == 0 {
        return Err(ReplayError::Config(
            "tp, pp, bytes-scale, sessions and turns must be positive".into(),
        ));
    }
    if !(0.0..=1.0).contains(&cfg.faults) {
        return Err(ReplayError::Config(format!(
            "--faults {} is not a probability",
            cfg.faults
        )));
    }
    let full = Arc::new(SpecTable::load(&cfg.spec)?);
    let spec = Arc::new(full.scaled(cfg.bytes_scale));
    let ctx = Ctx {
        dev: Arc::new(HostDevice::new()),
        units: Arc::new(UnitMap::new(&spec)),
        spec,
        full,
    };
    let reqs = workload(cfg);
    let reuse = reusable(&reqs);
    let mut modes = std::collections::BTreeMap::new();
    for &m in &cfg.modes {
        let r = run_mode(cfg, &ctx, &reqs, &reuse, m, progress)?;
        modes.insert(m.name().to_string(), r);
    }
    // TTFT reductions over requests with >= 4096 reusable tokens.
    let long: Vec<usize> = (0..reqs.len()).filter(|&i| reuse[i] >= 4096).collect();
    let total = |m: &ModeReport| {
        long.iter()
            .map(|&i| m.ttft_ms.get(i).copied().unwrap_or(0.0))
            .sum::<f64>()
    };
    let base_r = modes.get("recompute").map(total);
    let base_f = modes.get("fold").map(total);
    for (name, m) in modes.iter_mut() {
        let t = total(m);
        if !long.is_empty() {
            m.ttft_reduction_vs_recompute = base_r
                .filter(|b| *b > 0.0 && name != "recompute")
                .map(|b| round4(1.0 - t / b));
            m.ttft_reduction_vs_fold = base_f
                .filter(|b| *b > 0.0 && name != "fold")
                .map(|b| round4(1.0 - t / b));
        }
    }
    Ok(Report { modes })
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// The report as text.
pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<10} {:>8} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>6} {:>9}",
        "mode",
        "requests",
        "prompt",
        "cached",
        "hit",
        "state",
        "ttft-rec",
        "ttft-fold",
        "wrong",
        "faults"
    );
    for (name, m) in &r.modes {
        let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}%", v * 100.0));
        let _ = writeln!(
            s,
            "{:<10} {:>8} {:>10} {:>10} {:>7.1}% {:>7.1}% {:>9} {:>9} {:>6} {:>4}/{:<4}",
            name,
            m.requests,
            m.prompt_tokens,
            m.cached_tokens,
            m.hit_rate * 100.0,
            m.state_hit_rate * 100.0,
            pct(m.ttft_reduction_vs_recompute),
            pct(m.ttft_reduction_vs_fold),
            m.wrong_hits,
            m.reported_faults,
            m.injected_faults
        );
    }
    s
}

/// An SVG of hit rate and mean TTFT per turn, one line per mode.
pub fn render_svg(r: &Report) -> String {
    let (w, h, pad) = (640.0, 240.0, 40.0);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n", w * 2.0, h);
    let max_ttft = r
        .modes
        .values()
        .flat_map(|m| m.per_turn.iter().map(|t| t.1))
        .fold(1.0, f64::max);
    for (panel, title) in [
        (0, "hit rate per turn"),
        (1, "mean simulated TTFT per turn (ms)"),
    ] {
        let x0 = panel as f64 * w;
        let _ = writeln!(s, "<text x=\"{}\" y=\"16\">{title}</text>", x0 + pad);
        let _ = writeln!(
            s,
            "<rect x=\"{}\" y=\"{pad}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>",
            x0 + pad,
            w - 2.0 * pad,
            h - 2.0 * pad
        );
        for (ci, (name, m)) in r.modes.iter().enumerate() {
            let n = m.per_turn.len().max(2) - 1;
            let pts: Vec<String> = m
                .per_turn
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let v = if panel == 0 {
                        t.0.min(1.0)
                    } else {
                        t.1 / max_ttft
                    };
                    format!(
                        "{:.1},{:.1}",
                        x0 + pad + (w - 2.0 * pad) * i as f64 / n as f64,
                        h - pad - (h - 2.0 * pad) * v
                    )
                })
                .collect();
            let c = colors[ci % colors.len()];
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
                pts.join(" ")
            );
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" fill=\"{c}\">{name}</text>",
                x0 + w - pad - 60.0,
                pad + 14.0 * (ci + 1) as f64
            );
        }
    }
    s.push_str("</svg>\n");
    s
}
