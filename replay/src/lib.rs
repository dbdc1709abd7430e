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
//! windows and layers are the spec's, so hits are too. The simulated TTFT
//! ([`ttft`]) overlaps per-layer compute (`compute_us_per_token` per
//! prompt token not served) with the loads, at rates measured in the run.

//!
//! Files: [`workload`] (the requests), [`trace`] (public traces in the
//! Mooncake format: reader, token derivation, their own hit figures), [`faults`] (injection and the
//! accounting of what each fault caused), [`report`] (the figures, text and
//! SVG), [`ttft`] (the TTFT model), [`sim`] (the capacity-only trace
//! replay and its peer policies); this file runs the modes on the engine
//! harness.

#![deny(missing_docs)]

mod faults;
pub mod instances;
pub mod report;
pub mod requests;
pub mod sim;
pub mod trace;
pub mod ttft;
pub mod workload;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use ucm_coordinator::adapter::StoreSetConfig;
use ucm_coordinator::{CoordError, RequestKeys, SpecTable};
use ucm_device::{Device, HostDevice};
#[cfg(feature = "sabotage")]
use ucm_harness::Sabotage;
use ucm_harness::{Engine, EngineConfig, HarnessError, Request};
use ucm_store::SyncMode;

use faults::{FaultKind, Faults};
use report::{ratio, round4, turns};
pub use report::{render_svg, render_text, FaultKindReport, ModeReport, Report};
use ttft::TtftModel;
use workload::reusable;
pub use workload::{workload, WorkRequest, Workload};

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
    /// A file of requests replayed instead of `workload`
    /// ([`requests::read_requests`]).
    pub requests: Option<PathBuf>,
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
    /// Runs of each mode that measures a load rate (the TTFT's median and
    /// spread are over them; hits must be the same in each).
    pub runs: usize,
    /// Test only: a deliberate bug, so the oracle must fail the run
    /// (proves the checks can fail).
    pub sabotage: Option<SabotageKind>,
    /// A Redis or Valkey cluster below the disk tiers (`redis://...`).
    pub remote: Option<String>,
    /// An S3 bucket below that: the cold tier (`s3://...`).
    pub cold: Option<String>,
    /// No local disk tier: the remote tiers instead.
    pub no_disk: bool,
    /// How the disk tiers make saves durable.
    pub sync: SyncMode,
    /// `Some`: this process is one of several engine instances of
    /// `ucm replay --instances N` (see [`instances`]).
    pub instance: Option<instances::InstanceRole>,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            spec: PathBuf::from("specs/x-hybrid-96.toml"),
            workload: Workload::Chat,
            requests: None,
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
            runs: 1,
            modes: vec![Mode::Ucm, Mode::Recompute, Mode::Fold],
            sabotage: None,
            remote: None,
            cold: None,
            no_disk: false,
            sync: SyncMode::Auto,
            instance: None,
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
    /// Plants `kind` in an engine's configuration. Only a build with the
    /// test-only feature `sabotage` can; any other refuses it.
    pub(crate) fn plant(kind: Option<SabotageKind>, e: &mut EngineConfig) -> Result<()> {
        match kind {
            None => Ok(()),
            #[cfg(feature = "sabotage")]
            Some(SabotageKind::FlipByte) => {
                e.flip_byte = true;
                Ok(())
            }
            #[cfg(feature = "sabotage")]
            Some(k) => {
                e.sabotage = k.adapter();
                Ok(())
            }
            #[cfg(not(feature = "sabotage"))]
            Some(_) => {
                let _ = e;
                Err(ReplayError::NotBuilt {
                    flag: "--sabotage (a test-only switch)",
                    feature: "sabotage",
                })
            }
        }
    }

    #[cfg(feature = "sabotage")]
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
    /// An option outside what it takes.
    #[error("{flag} {value}: expected {expected}")]
    Option {
        /// The option (`--tp`, `--faults`, ...).
        flag: &'static str,
        /// Its value, as given.
        value: String,
        /// What it takes.
        expected: &'static str,
    },
    /// Two options that do not combine.
    #[error("{flag} {why}; it does not combine with {other}")]
    Conflict {
        /// The option.
        flag: &'static str,
        /// What it does.
        why: &'static str,
        /// The option it does not combine with.
        other: &'static str,
    },
    /// An option this build leaves out.
    #[error("{flag} needs a build with the `{feature}` feature")]
    NotBuilt {
        /// The option.
        flag: &'static str,
        /// The Cargo feature.
        feature: &'static str,
    },
    /// A rerun of a mode served other tokens than its first run.
    #[error(
        "{mode}: a rerun served {again_cached} tokens ({again_wrong} wrong), the first \
         {first_cached} ({first_wrong} wrong): the replay is not deterministic"
    )]
    NotDeterministic {
        /// The mode.
        mode: &'static str,
        /// Tokens served by the rerun.
        again_cached: u64,
        /// Its wrong hits.
        again_wrong: u64,
        /// Tokens served by the first run.
        first_cached: u64,
        /// Its wrong hits.
        first_wrong: u64,
    },
    /// A directory or process of the run could not be made.
    #[error("{path:?}: {source}")]
    Io {
        /// The directory or executable.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A request file that cannot be replayed.
    #[error("{path:?}: {source}")]
    Requests {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: requests::RequestsError,
    },
    /// A child-only run started outside a multi-instance run.
    #[error("not an instance of a multi-instance run")]
    NotAnInstance,
    /// Instances of a multi-instance run failed.
    #[error("{}", .0.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("\n"))]
    Instances(Vec<instances::InstanceFailure>),
}

/// An [`ReplayError::Io`] maker for `path`.
pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ReplayError + '_ {
    move |source| ReplayError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// An [`ReplayError::Option`].
pub(crate) fn bad_option(
    flag: &'static str,
    value: impl std::fmt::Display,
    expected: &'static str,
) -> ReplayError {
    ReplayError::Option {
        flag,
        value: value.to_string(),
        expected,
    }
}

type Result<T> = std::result::Result<T, ReplayError>;

/// The harness configuration of one mode.
fn engine_config(
    cfg: &ReplayConfig,
    ctx: &Ctx,
    dir: &Path,
    mode: Mode,
    max: usize,
) -> Result<EngineConfig> {
    let mut e = EngineConfig::new(Arc::clone(&ctx.spec), dir, max);
    e.full = Some(Arc::clone(&ctx.full));
    e.stores = StoreSetConfig {
        pool_slots: 4096,
        ways: 64,
        remote: cfg.remote.clone(),
        cold: cfg.cold.clone(),
        no_disk: cfg.no_disk,
        sync: cfg.sync,
        ..StoreSetConfig::default()
    };
    e.tp = cfg.tp;
    e.pp = cfg.pp;
    e.repeat = if cfg.spec_decode { 2 } else { 1 };
    e.chunk = cfg.chunk;
    e.seed = cfg.seed;
    e.fold = mode == Mode::Fold;
    SabotageKind::plant(cfg.sabotage, &mut e)?;
    Ok(e)
}

struct Ctx {
    /// The scaled spec the run uses.
    spec: Arc<SpecTable>,
    /// The spec at full size, for the TTFT model.
    full: Arc<SpecTable>,
}

/// The piece size of the copy-rate probe: a 16-token block of one
/// layer of a GQA model (8 KV heads x 128 x K and V x bf16).
const COPY_PIECE: usize = 64 << 10;

/// Replays one mode, the engine's tensors in `dev`'s memory.
#[allow(clippy::too_many_arguments)]
fn run_mode<D: Device>(
    dev: &Arc<D>,
    cfg: &ReplayConfig,
    ctx: &Ctx,
    reqs: &[WorkRequest],
    reuse: &[u64],
    mode: Mode,
    store_dir: Option<&Path>,
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
    // Instances of `--instances` share the directory their parent made;
    // otherwise a fresh scratch directory per mode.
    let scratch = match store_dir {
        Some(_) => None,
        None => Some(
            ucm_harness::scratch::Scratch::new(&cfg.dir, &format!("replay-{}", mode.name()))
                .map_err(io_err(&cfg.dir))?,
        ),
    };
    let dir = match (store_dir, &scratch) {
        (Some(d), _) => d.to_path_buf(),
        (None, Some(s)) => s.path().to_path_buf(),
        (None, None) => unreachable!("a scratch directory is made when none is given"),
    };
    let max_tokens = reqs
        .iter()
        .map(|r| r.tokens.len() + r.output.len())
        .max()
        .unwrap_or(0);
    let mut engine = Engine::open_on(
        engine_config(cfg, ctx, &dir, mode, max_tokens)?,
        Arc::clone(dev),
    )?;
    let mut faults = Faults::new(cfg, &ctx.spec);
    let (mut sum_l, mut sum_p, mut reusable_total) = (0u64, 0u64, 0u64);
    let (mut tier_pool, mut tier_disk) = (0u64, 0u64);
    let mut load_time = Duration::ZERO;
    let mut timings = Vec::with_capacity(reqs.len());
    let mut probe = ttft::CopyProbe::new(COPY_PIECE);
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
            // Decode retention is the design's: only `ucm` keeps answers.
            output: if mode == Mode::Ucm {
                Arc::clone(&w.output)
            } else {
                Arc::new(Vec::new())
            },
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
        load_time += out.load_wait;
        let served = out.served;
        rep.cached_tokens += served;
        rep.served.push(served);
        sum_l += out.l;
        sum_p += out.matched;
        let possible = re.min(n - 1) / grid * grid;
        reusable_total += possible;
        let e = per_turn.entry(w.turn).or_default();
        e.0 += served as f64;
        e.2 += possible as f64;
        e.3 += 1;
        timings.push((w.turn, n, served, out.steps));
        probe.sample();
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
    // The TTFT model needs the whole run's load rate.
    let model = TtftModel {
        compute_us_per_token: cfg.compute_us_per_token,
        layers: ctx.full.layer_count(),
        rate: ttft::load_rate(timings.iter().flat_map(|t| &t.3)),
        copy_rate: probe.rate(),
    };
    rep.copy_rate_gib_s = round4(model.copy_rate / (1u64 << 30) as f64);
    rep.load_rate_gib_s = model.rate.map(|r| round4(r / (1u64 << 30) as f64));
    for (turn, n, served, steps) in &timings {
        let ttft = model.request_ms(*n, *served, steps);
        rep.ttft_ms.push(ttft);
        per_turn.entry(*turn).or_default().1 += ttft;
    }
    rep.reusable_tokens = reusable_total;
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
    // The stores close before their directory goes.
    drop(engine);
    drop(scratch);
    Ok(rep)
}

/// Runs the replay: every mode on the same workload, on the host device.
pub fn run(cfg: &ReplayConfig, progress: &dyn Fn(&str)) -> Result<Report> {
    run_on(&Arc::new(HostDevice::new()), cfg, progress)
}

/// [`run`] with the simulated engine's KV caches and states in `dev`'s
/// memory (a GPU's, say): the stores' pool is registered with `dev`, loads
/// and saves cross to it, and the content oracle checks every byte there.
pub fn run_on<D: Device>(
    dev: &Arc<D>,
    cfg: &ReplayConfig,
    progress: &dyn Fn(&str),
) -> Result<Report> {
    let ctx = prepare(cfg)?;
    let reqs = match &cfg.requests {
        Some(path) => requests::read_requests(path).map_err(|source| ReplayError::Requests {
            path: path.clone(),
            source,
        })?,
        None => workload(cfg),
    };
    let reuse = reusable(&reqs);
    let mut modes = std::collections::BTreeMap::new();
    for &m in &cfg.modes {
        let mut r = run_mode(dev, cfg, &ctx, &reqs, &reuse, m, None, progress)?;
        // `recompute` measures nothing; every other mode's TTFT rests on a
        // measured load rate, so it runs again for the spread.
        if m != Mode::Recompute {
            for _ in 1..cfg.runs {
                let again = run_mode(dev, cfg, &ctx, &reqs, &reuse, m, None, progress)?;
                let differs =
                    again.cached_tokens != r.cached_tokens || again.wrong_hits != r.wrong_hits;
                // Injected faults fire by timing too; without them a run is
                // a function of its seed.
                if differs && cfg.faults == 0.0 {
                    return Err(ReplayError::NotDeterministic {
                        mode: m.name(),
                        again_cached: again.cached_tokens,
                        again_wrong: again.wrong_hits,
                        first_cached: r.cached_tokens,
                        first_wrong: r.wrong_hits,
                    });
                }
                r.ttft_ms_reruns.push(again.ttft_ms);
            }
        }
        modes.insert(m.name().to_string(), r);
    }
    ttft_reductions(&reqs, &reuse, &mut modes);
    Ok(Report { modes })
}

/// Checks the options and loads the spec (full and scaled).
fn prepare(cfg: &ReplayConfig) -> Result<Ctx> {
    let positive = [
        ("--tp", cfg.tp as u64),
        ("--pp", cfg.pp as u64),
        ("--bytes-scale", cfg.bytes_scale),
        ("--sessions", cfg.sessions as u64),
        ("--turns", cfg.turns as u64),
    ];
    if let Some((flag, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(bad_option(flag, 0, "positive"));
    }
    let bounded = [
        ("--tp", cfg.tp as u64, 64, "at most 64"),
        ("--sessions", cfg.sessions as u64, 4096, "at most 4096"),
        ("--turns", cfg.turns as u64, 256, "at most 256"),
        (
            "--sessions x --turns",
            (cfg.sessions as u64).saturating_mul(cfg.turns as u64),
            65_536,
            "at most 65536",
        ),
        ("chunk", cfg.chunk, 1 << 24, "at most 16777216"),
    ];
    for (flag, v, max, expected) in bounded {
        if v > max {
            return Err(bad_option(flag, v, expected));
        }
    }
    if !cfg.compute_us_per_token.is_finite() || cfg.compute_us_per_token < 0.0 {
        return Err(bad_option(
            "--compute-us-per-token",
            cfg.compute_us_per_token,
            "a finite, non-negative duration",
        ));
    }
    if !(0.0..=1.0).contains(&cfg.faults) {
        return Err(bad_option("--faults", cfg.faults, "a probability"));
    }
    if cfg.faults > 0.0 && cfg.no_disk {
        return Err(ReplayError::Conflict {
            flag: "--faults",
            why: "injects disk faults",
            other: "--no-disk",
        });
    }
    if cfg.faults > 0.0 && !cfg!(feature = "failpoints") {
        return Err(ReplayError::NotBuilt {
            flag: "--faults (I/O errors through fail points)",
            feature: "failpoints",
        });
    }
    let full = Arc::new(SpecTable::load(&cfg.spec)?);
    let spec = Arc::new(full.scaled(cfg.bytes_scale));
    if cfg.pp > spec.layer_count() {
        return Err(bad_option(
            "--pp",
            format!("{} for a model of {} layers", cfg.pp, spec.layer_count()),
            "at most the model's layers",
        ));
    }
    Ok(Ctx { spec, full })
}

/// Fills each mode's TTFT reductions against `recompute` and `fold`: one
/// per run (run `k` of a mode against run `k` of `fold`, or its last), and
/// their median.
fn ttft_reductions(
    reqs: &[WorkRequest],
    reuse: &[u64],
    modes: &mut std::collections::BTreeMap<String, ModeReport>,
) {
    // TTFT reductions over requests with >= 4096 reusable tokens.
    let long: Vec<usize> = (0..reqs.len()).filter(|&i| reuse[i] >= 4096).collect();
    if long.is_empty() {
        return;
    }
    let total = |ttft: &[f64]| {
        long.iter()
            .map(|&i| ttft.get(i).copied().unwrap_or(0.0))
            .sum::<f64>()
    };
    let runs = |m: &ModeReport| -> Vec<f64> {
        std::iter::once(&m.ttft_ms)
            .chain(&m.ttft_ms_reruns)
            .map(|t| total(t))
            .collect()
    };
    let base_r = modes.get("recompute").map(runs);
    let base_f = modes.get("fold").map(runs);
    let against = |mine: &[f64], base: &Option<Vec<f64>>| -> Vec<f64> {
        let Some(base) = base else { return Vec::new() };
        mine.iter()
            .enumerate()
            .filter_map(|(k, &t)| {
                let b = *base.get(k).or(base.last())?;
                (b > 0.0).then(|| round4(1.0 - t / b))
            })
            .collect()
    };
    for (name, m) in modes.iter_mut() {
        let mine = runs(m);
        if name != "recompute" {
            m.ttft_runs_vs_recompute = against(&mine, &base_r);
        }
        if name != "fold" {
            m.ttft_runs_vs_fold = against(&mine, &base_f);
        }
        let med = |v: &[f64]| (!v.is_empty()).then(|| round4(report::median(v)));
        m.ttft_reduction_vs_recompute = med(&m.ttft_runs_vs_recompute);
        m.ttft_reduction_vs_fold = med(&m.ttft_runs_vs_fold);
    }
}
