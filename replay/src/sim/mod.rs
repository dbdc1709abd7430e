//! The capacity-only replay of a public trace (`ucm replay --trace`):
//! every mode over every request of the trace, with capacity tiers, moving
//! no bytes.
//!
//! What runs for real: the coordinator's `resolve` decides every hit, in
//! every mode, over what that mode's tiers hold; for `ucm` and `fold` the
//! adapter's scheduler side (`get_num_new_matched_tokens`, retention and
//! its recurrence tracker, `extend_tokens`, `checkpoint_positions`) and
//! the checkpoint directory. What is modelled: each tier's content and
//! eviction ([`cache`]: capacities in bytes at the model's full sizes),
//! and the time of a load (bytes over an assumed bandwidth per tier).
//!
//! Deployment. Every mode but `recompute` has the engine's own device
//! prefix cache (`--engine-capacity`): `vllm` and `sglang` are that cache
//! alone, with each engine's policy ([`vllm`], [`sglang`]); `ucm`, `fold`
//! and `lmcache` sit below a vLLM cache ([`ucm`], [`lmcache`]) with a
//! memory and a disk tier of `--pool-capacity` and `--disk-capacity` each.
//! A hit in the engine's cache is not a load: the offload layer serves
//! only what lies beyond it.
//!
//! Tokens. A request's prompt is derived from its hash ids and its output
//! from its index ([`super::trace`]), so a trace's sharing is the tokens'
//! sharing; outputs are never re-sent by a later prompt of a trace (the
//! format does not say which answer a turn re-sends), so decode retention
//! cannot show there; the synthetic chat workload shows it.

pub mod cache;
pub mod lmcache;
pub mod marconi;
pub mod report;
pub mod sample;
pub mod sglang;
pub mod tiers;
pub mod ucm;
pub mod units;
pub mod vllm;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use super::trace::{output_tokens, prompt_tokens, TraceRequest};
use tiers::Loaded;
use ucm_coordinator::ceiling::HitCeiling;
use ucm_coordinator::{CoordError, Deployment, RequestHashes, RequestKeys};
use units::Model;

/// The modes of the capacity-only replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SimMode {
    /// UCM below a vLLM prefix cache (the design's retention, decode
    /// output kept).
    Ucm,
    /// vLLM's own prefix cache, hybrid allocator, align mode.
    Vllm,
    /// SGLang's radix cache, `no_buffer`.
    Sglang,
    /// LMCache below a vLLM prefix cache.
    Lmcache,
    /// Marconi's admission and eviction (MLSys 2025) below a vLLM prefix
    /// cache.
    Marconi,
    /// The predecessor's hash folding below a vLLM prefix cache.
    Fold,
    /// No cache.
    Recompute,
}

impl SimMode {
    /// Every mode, in report order.
    pub const ALL: [SimMode; 7] = [
        SimMode::Ucm,
        SimMode::Vllm,
        SimMode::Sglang,
        SimMode::Lmcache,
        SimMode::Marconi,
        SimMode::Fold,
        SimMode::Recompute,
    ];

    /// Whether the mode is an offload layer below the engine's own cache
    /// (`ucm`, `lmcache`, `marconi`, `fold`), rather than the engine's
    /// cache alone.
    pub fn offloads(self) -> bool {
        matches!(
            self,
            SimMode::Ucm | SimMode::Lmcache | SimMode::Marconi | SimMode::Fold
        )
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            SimMode::Ucm => "ucm",
            SimMode::Vllm => "vllm",
            SimMode::Sglang => "sglang",
            SimMode::Lmcache => "lmcache",
            SimMode::Marconi => "marconi",
            SimMode::Fold => "fold",
            SimMode::Recompute => "recompute",
        }
    }
}

/// The settings of a capacity-only replay.
#[derive(Clone, Debug, Serialize)]
pub struct SimConfig {
    /// Seed of the token derivation.
    pub seed: u64,
    /// Memory tier of `ucm`, `fold` and `lmcache`, in tokens of K/V.
    pub pool_tokens: u64,
    /// Disk tier of `ucm`, `fold` and `lmcache`, in tokens of K/V.
    pub disk_tokens: u64,
    /// Compute per prompt token not served (microseconds).
    pub compute_us_per_token: f64,
    /// Memory tier to device (GiB/s, assumed).
    pub pool_gib_s: f64,
    /// Disk tier to device (GiB/s, assumed).
    pub disk_gib_s: f64,
    /// `ucm` keeps the K/V and the state its requests decode.
    pub decode_retention: bool,
    /// SGLang's chunked-prefill size.
    pub sglang_chunk: u64,
    /// LMCache's chunk size.
    pub lmcache_chunk: u64,
    /// Marconi's `alpha`; `None`: bootstrapped on the trace's first
    /// requests, as the paper does.
    pub marconi_alpha: Option<f64>,
    /// The share of each tier `ucm`'s speculative checkpoints may keep;
    /// `None`: the scheduler's, as the store's (D82). `Some(0.0)`: they
    /// are evicted before any sure data (the stores' rule before D82).
    pub speculative_share: Option<f64>,
    /// How `ucm`'s tiers split their bytes between the groups
    /// ([`tiers::Split`]): one budget (the default), as the store keeps
    /// them, or as it did before D84.
    pub tier_split: tiers::Split,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            pool_tokens: 10_000_000,
            disk_tokens: 100_000_000,
            compute_us_per_token: 60.0,
            pool_gib_s: 10.0,
            disk_gib_s: 2.0,
            decode_retention: true,
            sglang_chunk: sglang::CHUNK,
            lmcache_chunk: lmcache::CHUNK,
            marconi_alpha: None,
            speculative_share: None,
            tier_split: tiers::Split::One,
        }
    }
}

/// One request as the modes see it.
#[derive(Debug)]
pub struct SimRequest {
    /// Prompt length.
    pub prompt_len: u64,
    /// Prompt and output tokens.
    pub seq: Vec<u32>,
    /// Ids of the whole sequence (the prompt's are its prefix).
    pub hashes: RequestHashes,
}

impl SimRequest {
    /// Request number `k` of a trace.
    pub fn new(m: &Model, seed: u64, k: usize, r: &TraceRequest) -> Result<Self, CoordError> {
        Self::from_tokens(m, &prompt_tokens(seed, r), &output_tokens(seed, k, r))
    }

    /// A request of `prompt` that generated `output`.
    pub fn from_tokens(m: &Model, prompt: &[u32], output: &[u32]) -> Result<Self, CoordError> {
        let mut seq = prompt.to_vec();
        seq.extend_from_slice(output);
        let hashes = RequestHashes::compute(
            &m.spec,
            Deployment { tp_size: 1 },
            &seq,
            &RequestKeys::default(),
        )?;
        Ok(SimRequest {
            prompt_len: prompt.len() as u64,
            seq,
            hashes,
        })
    }

    /// The prompt.
    pub fn prompt(&self) -> &[u32] {
        &self.seq[..self.prompt_len as usize]
    }
}

/// One mode at one point of a sweep.
#[derive(Clone, Debug, Serialize)]
pub struct SimPoint {
    /// The mode.
    pub mode: SimMode,
    /// The sweep's axis at this point, in tokens of K/V: the engine's
    /// prefix cache ([`SweepKind::Engine`]) or the cache's capacity
    /// ([`SweepKind::Cache`]).
    pub capacity_tokens: u64,
    /// The engine's prefix cache, in tokens of K/V.
    pub engine_tokens: u64,
    /// The offload layer's memory tier (0 for engine-only modes).
    pub pool_tokens: u64,
    /// The offload layer's disk tier (0 for engine-only modes).
    pub disk_tokens: u64,
    /// Requests replayed.
    pub requests: usize,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Prompt tokens not computed (served by the engine's cache or loaded).
    pub served_tokens: u64,
    /// Of those, served by the engine's own cache.
    pub engine_served: u64,
    /// `served_tokens` over `prompt_tokens`.
    pub hit_rate: f64,
    /// The hit ceiling: the rate unlimited capacity would have given on
    /// the same requests (`ucm_coordinator::ceiling`; the same for every
    /// mode).
    pub ceiling_hit_rate: f64,
    /// Bytes loaded from the memory tier (full size).
    pub bytes_from_pool: u64,
    /// Bytes loaded from the disk tier (full size).
    pub bytes_from_disk: u64,
    /// Bytes the offload layer saved (full size).
    pub bytes_saved: u64,
    /// Of those, recurrent states.
    pub state_bytes_saved: u64,
    /// Mean simulated TTFT (ms).
    pub ttft_mean_ms: f64,
    /// Median simulated TTFT (ms).
    pub ttft_p50_ms: f64,
    /// 90th percentile of the simulated TTFT (ms).
    pub ttft_p90_ms: f64,
    /// Marconi's `alpha` (the weight of FLOP efficiency against recency),
    /// as bootstrapped or set; absent for other modes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub marconi_alpha: Option<f64>,
    /// Seconds this point took.
    pub seconds: f64,
}

enum Engine {
    None,
    Vllm(vllm::VllmCache),
    Sglang(sglang::SglangCache),
}

enum Offload {
    None,
    Ucm(Box<ucm::UcmTiers>),
    Lm(Box<lmcache::LmCache>),
    Marconi(Box<marconi::Marconi>),
}

/// What one request got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// Prompt tokens not computed.
    pub served: u64,
    /// Of those, from the engine's own cache.
    pub engine: u64,
    /// What the offload layer loaded (the rest of `served`).
    pub loaded: Loaded,
    /// Bytes the offload layer saved at the request's end.
    pub saved: u64,
    /// Of those, recurrent states.
    pub state_saved: u64,
}

/// Bytes saved at a request's end: all of them, and the states' part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Saved {
    /// Every unit's bytes.
    pub bytes: u64,
    /// The states' bytes.
    pub state_bytes: u64,
}

impl Saved {
    /// The bytes of `units` under `m`.
    pub fn of<'a>(m: &Model, units: impl IntoIterator<Item = &'a cache::Unit>) -> Self {
        let mut s = Saved::default();
        for u in units {
            let b = m.bytes(u);
            s.bytes += b;
            if matches!(u, cache::Unit::State { .. }) {
                s.state_bytes += b;
            }
        }
        s
    }
}

/// One mode's caches, fed one request at a time.
pub struct Sim {
    mode: SimMode,
    engine: Engine,
    offload: Offload,
    next: usize,
}

impl Sim {
    /// `mode`'s caches, with an engine cache of `engine_tokens`.
    pub fn new(m: &Model, mode: SimMode, engine_tokens: u64, cfg: &SimConfig) -> Self {
        let bytes = |tokens: u64| tokens.saturating_mul(m.kv_bytes_per_token);
        let (pool, disk) = (bytes(cfg.pool_tokens), bytes(cfg.disk_tokens));
        let engine = match mode {
            SimMode::Recompute => Engine::None,
            SimMode::Sglang => Engine::Sglang(sglang::SglangCache::new(
                bytes(engine_tokens),
                cfg.sglang_chunk,
            )),
            _ => Engine::Vllm(vllm::VllmCache::new(bytes(engine_tokens))),
        };
        let offload = match mode {
            SimMode::Ucm => Offload::Ucm(Box::new(ucm::UcmTiers::new(
                m,
                pool,
                disk,
                false,
                cfg.decode_retention,
                cfg.speculative_share,
                cfg.tier_split,
            ))),
            SimMode::Fold => Offload::Ucm(Box::new(ucm::UcmTiers::new(
                m,
                pool,
                disk,
                true,
                false,
                None,
                tiers::Split::One,
            ))),
            SimMode::Lmcache => Offload::Lm(Box::new(lmcache::LmCache::new(
                m,
                pool,
                disk,
                cfg.lmcache_chunk,
            ))),
            SimMode::Marconi => Offload::Marconi(Box::new(marconi::Marconi::new(
                m,
                pool,
                disk,
                cfg.marconi_alpha.unwrap_or(0.0),
            ))),
            _ => Offload::None,
        };
        Sim {
            mode,
            engine,
            offload,
            next: 0,
        }
    }

    /// The mode.
    pub fn mode(&self) -> SimMode {
        self.mode
    }

    /// The speculative share the `ucm` or `fold` tiers keep now; `None`
    /// for modes without them.
    pub fn speculative_share(&self) -> Option<f64> {
        match &self.offload {
            Offload::Ucm(u) => Some(u.speculative_share()),
            _ => None,
        }
    }

    /// Runs the next request: the engine's hit, the offload layer's hit
    /// beyond it and its load, then the request's end in every cache.
    pub fn step(&mut self, m: &Model, r: &SimRequest) -> Result<Step, CoordError> {
        let k = self.next;
        self.next += 1;
        let e = match &mut self.engine {
            Engine::Vllm(c) => c.hit(m, r)?,
            Engine::Sglang(c) => c.hit(m, r)?,
            Engine::None => 0,
        };
        let (tier_hit, loaded) = match &mut self.offload {
            Offload::Ucm(u) => {
                let h = u.hit(r, k, e)?;
                let l = if h > e {
                    u.load(m, r, e, h)
                } else {
                    Loaded::default()
                };
                (h, l)
            }
            Offload::Lm(c) => {
                let h = c.hit(m, r)?;
                let l = if h > e {
                    c.load(m, r, e, h)
                } else {
                    Loaded::default()
                };
                (h, l)
            }
            Offload::Marconi(c) => {
                let h = c.hit(m, r)?;
                let l = if h > e {
                    c.load(m, r, e, h)
                } else {
                    Loaded::default()
                };
                (h, l)
            }
            Offload::None => (0, Loaded::default()),
        };
        let served = e.max(tier_hit);
        match &mut self.engine {
            Engine::Vllm(c) => c.finish(m, r, served),
            Engine::Sglang(c) => c.finish(m, r, served),
            Engine::None => {}
        }
        let saved = match &mut self.offload {
            Offload::Ucm(u) => u.finish(m, r, k, tier_hit, served)?,
            Offload::Lm(c) => c.finish(m, r, tier_hit),
            Offload::Marconi(c) => c.finish(m, r, tier_hit, served)?,
            Offload::None => Saved::default(),
        };
        Ok(Step {
            served,
            engine: e,
            loaded,
            saved: saved.bytes,
            state_saved: saved.state_bytes,
        })
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Replays `trace` in `mode` with an engine cache of `engine_tokens`,
/// reporting progress every 10% of the requests. Marconi without a set
/// `alpha` first bootstraps it ([`marconi::bootstrap_alpha`]).
pub fn simulate(
    trace: &[TraceRequest],
    m: &Model,
    mode: SimMode,
    engine_tokens: u64,
    cfg: &SimConfig,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<SimPoint, CoordError> {
    let started = Instant::now();
    let mut cfg = cfg.clone();
    if mode == SimMode::Marconi && cfg.marconi_alpha.is_none() {
        let alpha = marconi::bootstrap_alpha(trace, m, engine_tokens, &cfg)?;
        cfg.marconi_alpha = Some(alpha);
    }
    let cfg = &cfg;
    let mut sim = Sim::new(m, mode, engine_tokens, cfg);
    let (pool_tokens, disk_tokens) = if mode.offloads() {
        (cfg.pool_tokens, cfg.disk_tokens)
    } else {
        (0, 0)
    };
    let mut p = SimPoint {
        mode,
        capacity_tokens: engine_tokens,
        engine_tokens,
        pool_tokens,
        disk_tokens,
        requests: trace.len(),
        prompt_tokens: 0,
        served_tokens: 0,
        engine_served: 0,
        hit_rate: 0.0,
        ceiling_hit_rate: 0.0,
        bytes_from_pool: 0,
        bytes_from_disk: 0,
        bytes_saved: 0,
        state_bytes_saved: 0,
        ttft_mean_ms: 0.0,
        ttft_p50_ms: 0.0,
        ttft_p90_ms: 0.0,
        marconi_alpha: (mode == SimMode::Marconi).then_some(cfg.marconi_alpha.unwrap_or(0.0)),
        seconds: 0.0,
    };
    let mut ceiling = HitCeiling::new(&m.spec, usize::MAX);
    let mut ceiling_tokens = 0u64;
    let mut ttft = Vec::with_capacity(trace.len());
    let gib = (1u64 << 30) as f64;
    let tenth = (trace.len() / 10).max(1);
    for (k, t) in trace.iter().enumerate() {
        p.prompt_tokens += t.input_length;
        let r = SimRequest::new(m, cfg.seed, k, t)?;
        ceiling_tokens += ceiling.observe(&r.hashes, r.prompt_len);
        let st = if mode == SimMode::Recompute {
            Step::default()
        } else {
            sim.step(m, &r)?
        };
        p.served_tokens += st.served;
        p.engine_served += st.engine;
        p.bytes_from_pool += st.loaded.pool;
        p.bytes_from_disk += st.loaded.disk;
        p.bytes_saved += st.saved;
        p.state_bytes_saved += st.state_saved;
        let load_ms = (st.loaded.pool as f64 / (cfg.pool_gib_s * gib)
            + st.loaded.disk as f64 / (cfg.disk_gib_s * gib))
            * 1000.0;
        ttft.push(
            (t.input_length - st.served) as f64 * cfg.compute_us_per_token / 1000.0 + load_ms,
        );
        if (k + 1) % tenth == 0 && k + 1 < trace.len() && mode != SimMode::Recompute {
            progress(&format!(
                "{:<9} engine {:>11} tokens: {}/{} requests, hit rate {:.4}, {:.1} s",
                mode.name(),
                engine_tokens,
                k + 1,
                trace.len(),
                p.served_tokens as f64 / p.prompt_tokens.max(1) as f64,
                started.elapsed().as_secs_f64()
            ));
        }
    }
    p.hit_rate = p.served_tokens as f64 / p.prompt_tokens.max(1) as f64;
    p.ceiling_hit_rate = ceiling_tokens as f64 / p.prompt_tokens.max(1) as f64;
    p.ttft_mean_ms = ttft.iter().sum::<f64>() / ttft.len().max(1) as f64;
    ttft.sort_by(f64::total_cmp);
    p.ttft_p50_ms = percentile(&ttft, 0.5);
    p.ttft_p90_ms = percentile(&ttft, 0.9);
    p.seconds = started.elapsed().as_secs_f64();
    Ok(p)
}

/// What a sweep's axis is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SweepKind {
    /// The engine's prefix cache; the offload tiers stay as configured
    /// (`pool_tokens`, `disk_tokens`).
    Engine,
    /// The cache's capacity `C`, the same for every mode: an offload mode
    /// keeps `C` on disk (a tenth of it also in memory, written through)
    /// below an engine cache of `engine_tokens`; an engine-only mode gets
    /// an engine cache of `engine_tokens + C`.
    Cache,
}

/// The caches of `mode` at point `x` of a sweep of `kind`: its engine
/// capacity and its configuration (tiers), from `cfg` and
/// `engine_tokens` (the engine cache of a [`SweepKind::Cache`] sweep).
pub fn point_caches(
    kind: SweepKind,
    x: u64,
    mode: SimMode,
    engine_tokens: u64,
    cfg: &SimConfig,
) -> (u64, SimConfig) {
    match kind {
        SweepKind::Engine => (x, cfg.clone()),
        SweepKind::Cache if mode.offloads() => (
            engine_tokens,
            SimConfig {
                pool_tokens: x / 10,
                disk_tokens: x,
                ..cfg.clone()
            },
        ),
        SweepKind::Cache => (engine_tokens.saturating_add(x), cfg.clone()),
    }
}

/// A sweep: what its axis is, its points, and the engine cache in front of
/// the offload modes of a [`SweepKind::Cache`] sweep.
#[derive(Clone, Debug)]
pub struct Sweep {
    /// What the axis is.
    pub kind: SweepKind,
    /// The points (tokens of K/V).
    pub points: Vec<u64>,
    /// The engine cache of a capacity sweep (tokens).
    pub engine_tokens: u64,
}

/// Every mode at every point of `sweep`, on the machine's cores; points in
/// (x, mode) order.
pub fn sweep(
    trace: &[TraceRequest],
    m: &Model,
    modes: &[SimMode],
    sweep: &Sweep,
    cfg: &SimConfig,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Vec<SimPoint>, CoordError> {
    let (kind, xs, engine_tokens) = (sweep.kind, &sweep.points[..], sweep.engine_tokens);
    let mut jobs: Vec<(u64, SimMode)> = Vec::new();
    for &c in xs {
        for &mode in modes {
            // Recompute does not depend on the capacity: once.
            if mode != SimMode::Recompute || c == xs[0] {
                jobs.push((c, mode));
            }
        }
    }
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<(usize, Result<SimPoint, CoordError>)>> = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(c, mode)) = jobs.get(i) else {
                    break;
                };
                let (engine, pcfg) = point_caches(kind, c, mode, engine_tokens, cfg);
                let r = simulate(trace, m, mode, engine, &pcfg, progress).map(|mut pt| {
                    pt.capacity_tokens = c;
                    pt
                });
                if let Ok(pt) = &r {
                    progress(&format!(
                        "{:<9} capacity {:>11} tokens: hit rate {:.4} (ceiling {:.4}), mean TTFT {:.0} ms ({:.1} s) [{}/{}]",
                        mode.name(),
                        c,
                        pt.hit_rate,
                        pt.ceiling_hit_rate,
                        pt.ttft_mean_ms,
                        pt.seconds,
                        i + 1,
                        jobs.len()
                    ));
                }
                out.lock().unwrap_or_else(|e| e.into_inner()).push((i, r));
            });
        }
    });
    let mut got = out.into_inner().unwrap_or_else(|e| e.into_inner());
    got.sort_by_key(|(i, _)| *i);
    got.into_iter().map(|(_, r)| r).collect()
}
