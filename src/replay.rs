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

use crate::coordinator::adapter::StoreSetConfig;
use crate::coordinator::hash::seeded_tokens;
use crate::coordinator::{
    CoordError, Deployment, Kind, Presence, RequestHashes, RequestKeys, SpecTable,
};
use crate::harness::{Engine, EngineConfig, HarnessError, Outcome, Request, Sabotage};

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
    /// Test only: a deliberate bug, so the oracle must fail the run
    /// (proves the checks can fail).
    pub sabotage: Option<SabotageKind>,
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
            sabotage: None,
        }
    }
}

/// The deliberate bugs `--sabotage` can plant (tests only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SabotageKind {
    /// The harness flips one byte of the first block it checks.
    FlipByte,
    /// The worker leaves out one block of every chain load.
    SkipLoad,
    /// The worker loads into the next engine block.
    WrongBlock,
    /// The worker loads a state from another position.
    StatePosition,
    /// The worker skips blocks the previous request loaded.
    StalePrefix,
    /// The worker leaves out one block of every chain save.
    SkipSave,
}

impl SabotageKind {
    fn adapter(self) -> Option<Sabotage> {
        match self {
            SabotageKind::FlipByte => None,
            SabotageKind::SkipLoad => Some(Sabotage::SkipLoad),
            SabotageKind::WrongBlock => Some(Sabotage::WrongEngineBlock),
            SabotageKind::StatePosition => Some(Sabotage::StateFromOtherPosition),
            SabotageKind::StalePrefix => Some(Sabotage::StalePrefix),
            SabotageKind::SkipSave => Some(Sabotage::SkipSave),
        }
    }
}

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The coordinator or a store failed.
    #[error(transparent)]
    Coord(#[from] CoordError),
    /// The engine harness failed.
    #[error(transparent)]
    Harness(#[from] HarnessError),
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

/// Faults of one kind, and what they caused.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FaultKindReport {
    /// Faults of this kind injected (chosen for a request).
    pub injected: u64,
    /// Those that hit a target (a fail point that fired, files removed, a
    /// rank that held saves).
    pub fired: u64,
    /// Disk writes a retry absorbed.
    pub retries: u64,
    /// Saves reported failed to the engine.
    pub failed_saves: u64,
    /// Load items reported failed to the engine (recomputed).
    pub failed_loads: u64,
    /// Requests whose hit shrank because of the fault (a miss, recomputed).
    pub misses: u64,
    /// Fired faults with an observed effect (any of the above).
    pub with_effect: u64,
    /// Fired faults whose effect was absorbed by design (a storm the
    /// memory tier covered, a dead rank whose shards other ranks hold).
    pub absorbed: u64,
    /// Fired I/O faults with neither an effect nor a retry: must be 0.
    pub unaccounted: u64,
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
    /// Loaded items that differed from the oracle, items never loaded yet
    /// not reported, and writes where the engine computes (must be 0).
    pub wrong_hits: u64,
    /// Saves reported good that no tier held (must be 0).
    pub lost_saves: u64,
    /// Items the oracle checked after loads.
    pub checked_items: u64,
    /// Faults injected.
    pub injected_faults: u64,
    /// Fired faults with an observed effect or absorbed by design.
    pub reported_faults: u64,
    /// Fired I/O faults with no observed effect (must be 0).
    pub unaccounted_faults: u64,
    /// Requests whose loads failed and which were recomputed.
    pub recomputed_after_failed_load: u64,
    /// Per fault kind.
    pub faults: std::collections::BTreeMap<String, FaultKindReport>,
    /// Bytes loaded into the engine (scaled).
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

/// The harness configuration of one mode.
fn engine_config(
    cfg: &ReplayConfig,
    ctx: &Ctx,
    dir: &Path,
    mode: Mode,
    max: usize,
) -> EngineConfig {
    let mut e = EngineConfig::new(Arc::clone(&ctx.spec), dir, max);
    e.full = Some(Arc::clone(&ctx.full));
    e.stores = StoreSetConfig {
        pool_slots: 4096,
        ways: 64,
        ..StoreSetConfig::default()
    };
    e.tp = cfg.tp;
    e.pp = cfg.pp;
    e.repeat = if cfg.spec_decode { 2 } else { 1 };
    e.chunk = cfg.chunk;
    e.seed = cfg.seed;
    e.fold = mode == Mode::Fold;
    match cfg.sabotage {
        Some(SabotageKind::FlipByte) => e.flip_byte = true,
        Some(k) => e.sabotage = k.adapter(),
        None => {}
    }
    e
}

struct Ctx {
    /// The scaled spec the run uses.
    spec: Arc<SpecTable>,
    /// The spec at full size, for the TTFT model.
    full: Arc<SpecTable>,
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
    let mut engine = Engine::open(engine_config(cfg, ctx, &dir, mode, max_tokens))?;
    let mut faults = Faults::new(cfg, &ctx.spec);
    let (mut sum_l, mut sum_p, mut reusable_total) = (0u64, 0u64, 0u64);
    let (mut tier_pool, mut tier_disk) = (0u64, 0u64);
    let mut load_time = Duration::ZERO;
    let started = Instant::now();
    for (k, (w, &re)) in reqs.iter().zip(reuse).enumerate() {
        let id = format!("{}-s{}-t{}-{k}", mode.name(), w.session, w.turn);
        let n = w.tokens.len() as u64;
        rep.prompt_tokens += n;
        let mut req = Request {
            id: id.clone(),
            tokens: Arc::clone(&w.tokens),
            keys: RequestKeys::default(),
            dead_rank: None,
        };
        let read_fault = faults.pending.is_some()
            || (faults.wants(k) && faults.kind_next() == FaultKind::ReadEio);
        if read_fault {
            // A cold memory tier, so that the loads reach the disk.
            let (p, d) = engine.stores().tier_bytes();
            (tier_pool, tier_disk) = (tier_pool + p, tier_disk + d);
            engine.restart()?;
        }
        let fault = faults.before(k, &engine, &mut req)?;
        let retries_before = engine.stores().write_retries();
        let out = engine.run(&req)?;
        faults.after(
            fault,
            &out,
            engine.stores().write_retries() - retries_before,
        );
        for wmsg in out
            .wrong
            .iter()
            .map(ToString::to_string)
            .chain(out.lost.iter().map(ToString::to_string))
        {
            eprintln!("\n{wmsg}");
        }
        rep.wrong_hits += out.wrong.len() as u64;
        rep.lost_saves += out.lost.len() as u64;
        rep.checked_items += out.checked;
        rep.bytes_loaded += out.bytes_loaded;
        rep.bytes_saved += out.bytes_saved;
        if !out.load_errors.is_empty() {
            rep.recomputed_after_failed_load += 1;
        }
        // The TTFT model: each step's load at full size, at the bandwidth
        // that step measured.
        let load_full_ms: f64 = out
            .steps
            .iter()
            .filter(|s| s.1 > 0)
            .map(|(wait, scaled, full)| wait.as_secs_f64() * 1e3 * *full as f64 / *scaled as f64)
            .sum();
        load_time += out.load_wait;
        let served = out.served;
        rep.cached_tokens += served;
        sum_l += out.l;
        sum_p += out.matched;
        let possible = re.min(n - 1) / grid * grid;
        reusable_total += possible;
        let ttft = compute_ms(n - served) + load_full_ms;
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
    let (p, d) = engine.stores().tier_bytes();
    (rep.bytes_from_pool, rep.bytes_from_disk) = (tier_pool + p, tier_disk + d);
    faults.report(&mut rep);
    progress("\n");
    drop(engine);
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

/// The kinds of injected faults, taken in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultKind {
    /// A restart (cold memory tier), then EIO on the first chain group's
    /// disk reads: its loads fail and are recomputed.
    ReadEio,
    /// EIO on a group's disk writes (retried; may fail the save).
    WriteEio,
    /// ENOSPC on a group's disk writes.
    WriteEnospc,
    /// Every block file of a group removed through the store (another
    /// machine's GC); the memory tier may still hold some.
    Storm,
    /// A rank dies before it saves (TP > 1 only).
    DeadRank,
}

impl FaultKind {
    fn name(self) -> &'static str {
        match self {
            FaultKind::ReadEio => "read_eio",
            FaultKind::WriteEio => "write_eio",
            FaultKind::WriteEnospc => "write_enospc",
            FaultKind::Storm => "eviction_storm",
            FaultKind::DeadRank => "dead_rank",
        }
    }

    fn is_io(self) -> bool {
        matches!(
            self,
            FaultKind::ReadEio | FaultKind::WriteEio | FaultKind::WriteEnospc
        )
    }
}

/// One request's injected fault.
struct Fault {
    kind: FaultKind,
    #[cfg(feature = "failpoints")]
    guard: Option<crate::device::io::faults::FaultGuard>,
    /// Storms: the group, and its stored prefix of the request's ids
    /// before and right after the storm.
    storm: Option<(usize, usize, usize)>,
    fired: bool,
    /// Read faults: further requests it stays armed for when the request
    /// it was set for loaded nothing from disk.
    left: usize,
}

struct Faults {
    rate: f64,
    seed: u64,
    groups: Vec<usize>,
    kinds: Vec<FaultKind>,
    next: usize,
    /// A read fault that has not fired yet, armed for the next request.
    pending: Option<Fault>,
    stats: std::collections::BTreeMap<String, FaultKindReport>,
}

impl Faults {
    fn new(cfg: &ReplayConfig, spec: &SpecTable) -> Faults {
        let mut kinds = vec![
            FaultKind::ReadEio,
            FaultKind::WriteEio,
            FaultKind::Storm,
            FaultKind::WriteEnospc,
        ];
        if cfg.tp > 1 {
            kinds.push(FaultKind::DeadRank);
        }

        Faults {
            rate: cfg.faults,
            seed: cfg.seed,
            groups: spec
                .groups()
                .iter()
                .filter(|g| matches!(g.kind, Kind::Chain | Kind::Snapshot))
                .map(|g| g.index)
                .collect(),
            kinds,
            next: 0,
            pending: None,
            stats: Default::default(),
        }
    }

    /// Whether request `k` gets a new fault (none while a read fault is
    /// still armed).
    fn wants(&self, k: usize) -> bool {
        let x = mix(self.seed, 9, k as u64, 0);
        self.pending.is_none()
            && self.rate > 0.0
            && ((x % 1_000_000) as f64 / 1e6) < self.rate
            && !self.groups.is_empty()
    }

    /// The kind the next fault will be (kinds are taken in turn, so every
    /// kind occurs once faults are frequent enough).
    fn kind_next(&self) -> FaultKind {
        self.kinds[self.next % self.kinds.len()]
    }

    /// Maybe injects a fault for request `k`.
    fn before(&mut self, k: usize, engine: &Engine, req: &mut Request) -> Result<Option<Fault>> {
        if let Some(f) = self.pending.take() {
            return Ok(Some(f));
        }
        if !self.wants(k) {
            return Ok(None);
        }
        let kind = self.kind_next();
        self.next += 1;
        let x = mix(self.seed, 13, k as u64, 0);
        let spec = engine.spec();
        // Read faults target the first chain group, which every hit loads.
        let group = match kind {
            FaultKind::ReadEio => spec
                .chain_groups()
                .next()
                .map_or(self.groups[0], |g| g.index),
            _ => self.groups[(x >> 20) as usize % self.groups.len()],
        };
        self.stats.entry(kind.name().into()).or_default().injected += 1;
        let mut f = Fault {
            kind,
            #[cfg(feature = "failpoints")]
            guard: None,
            storm: None,
            fired: false,
            left: 3,
        };
        let path = engine.stores().dir().join(&spec.groups()[group].name);
        match kind {
            FaultKind::ReadEio | FaultKind::WriteEio | FaultKind::WriteEnospc => {
                #[cfg(feature = "failpoints")]
                {
                    use crate::device::io::faults::{inject, FaultOp, FaultRule};
                    let (op, errno) = match kind {
                        FaultKind::ReadEio => (FaultOp::Read, libc::EIO),
                        FaultKind::WriteEio => (FaultOp::Write, libc::EIO),
                        _ => (FaultOp::Write, libc::ENOSPC),
                    };
                    let mut r = FaultRule::errno(&path, op, errno);
                    r.times = Some(4);
                    f.guard = Some(inject(r));
                }
                #[cfg(not(feature = "failpoints"))]
                {
                    let _ = path;
                    return Err(ReplayError::Config(
                        "--faults injects I/O errors through fail points: build with --features failpoints".into(),
                    ));
                }
            }
            FaultKind::Storm => {
                let before = stored_prefix(engine, group, req)?;
                let removed = engine
                    .stores()
                    .tier(group)
                    .map_or(0, |t| t.disk().evict_all());
                f.fired = removed > 0;
                f.storm = Some((group, before, stored_prefix(engine, group, req)?));
            }
            FaultKind::DeadRank => {
                req.dead_rank = Some(engine_tp(engine).saturating_sub(1));
                f.fired = true;
            }
        }
        Ok(Some(f))
    }

    /// Accounts for a request's fault from what was observed.
    fn after(&mut self, f: Option<Fault>, out: &Outcome, retries: u64) {
        let Some(mut f) = f else {
            return;
        };
        #[cfg(feature = "failpoints")]
        let fired = f.fired || f.guard.as_ref().is_some_and(|g| g.fired() > 0);
        #[cfg(not(feature = "failpoints"))]
        let fired = f.fired;
        // A read fault whose request read nothing from disk (it missed, or
        // the memory tier served it) stays armed for the next requests.
        if f.kind == FaultKind::ReadEio && !fired && f.left > 0 {
            f.left -= 1;
            self.pending = Some(f);
            return;
        }
        let st = self.stats.entry(f.kind.name().into()).or_default();
        if !fired {
            return;
        }
        st.fired += 1;
        // A storm's miss: blocks of the request's prefix that no tier held
        // any more right after it (the memory tier did not cover them).
        let misses = match f.storm {
            Some((_, before, after)) if after < before => 1,
            _ => 0,
        };
        let failed_loads = out.load_errors.len() as u64;
        let failed_saves = out.save_failures.len() as u64;
        st.retries += retries;
        st.failed_loads += failed_loads;
        st.failed_saves += failed_saves;
        st.misses += misses;
        let effect = failed_loads + failed_saves + misses + out.dead_rank_missing > 0;
        if effect || retries > 0 {
            st.with_effect += 1;
        } else if f.kind.is_io() {
            st.unaccounted += 1;
        } else {
            st.absorbed += 1;
        }
    }

    fn report(&self, rep: &mut ModeReport) {
        for s in self.stats.values() {
            rep.injected_faults += s.injected;
            rep.reported_faults += s.with_effect + s.absorbed;
            rep.unaccounted_faults += s.unaccounted;
        }
        rep.faults = self.stats.clone();
    }
}

/// Blocks of `req`'s prefix that group `group`'s store holds (rank 0's ids).
fn stored_prefix(engine: &Engine, group: usize, req: &Request) -> Result<usize> {
    let spec = engine.spec();
    let g = &spec.groups()[group];
    let h = RequestHashes::compute(
        spec,
        Deployment {
            tp_size: engine_tp(engine),
        },
        &req.tokens,
        &req.keys,
    )?;
    let ids = h.chains[group].first().map(Vec::as_slice).unwrap_or(&[]);
    let full = (req.tokens.len() as u64 / g.hash_block.max(1)) as usize;
    Ok(match g.kind {
        Kind::Chain => engine
            .stores()
            .lookup_on_prefix(g, &ids[..full.min(ids.len())]),
        _ => 0,
    })
}

fn engine_tp(engine: &Engine) -> u32 {
    engine.config().tp
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
    if cfg.faults > 0.0 && !cfg!(feature = "failpoints") {
        return Err(ReplayError::Config(
            "--faults injects I/O errors through fail points: build with --features failpoints"
                .into(),
        ));
    }
    let full = Arc::new(SpecTable::load(&cfg.spec)?);
    let spec = Arc::new(full.scaled(cfg.bytes_scale));
    if cfg.pp > spec.layer_count() {
        return Err(ReplayError::Config(format!(
            "--pp {} is more than the model's {} layers",
            cfg.pp,
            spec.layer_count()
        )));
    }
    let ctx = Ctx { spec, full };
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
