//! `ucm replay` (workload and trace replays, multi-instance runs, the
//! byte-moving sample) and `ucm trace`.

use std::path::PathBuf;

use clap::Args;
use ucm::replay::sim::tiers::Split;
use ucm::store::SyncMode;

use super::*;

#[derive(Args)]
pub(crate) struct TraceArgs {
    /// The trace: one JSON object per line with `timestamp`,
    /// `input_length`, `output_length` and `hash_ids` (512-token blocks).
    file: PathBuf,
    /// Capacities of the sweep, in tokens (e.g. `1e4,1e5,1e6`).
    #[arg(long, default_value = "1e4,1e5,1e6,1e7,1e8")]
    sweep: String,
    /// Only the first N requests.
    #[arg(long)]
    limit: Option<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct ReplayArgs {
    /// The model's spec table.
    #[arg(long, default_value = "specs/x-hybrid-96.toml")]
    spec: PathBuf,
    /// The workload.
    #[arg(long, value_enum, default_value = "chat")]
    workload: ucm::replay::Workload,
    /// Seed of the workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Sessions (chat), documents (docqa); prompts = sessions x turns (random).
    #[arg(long, default_value_t = 8)]
    sessions: usize,
    /// Turns per session (chat), questions per document (docqa).
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Tensor-parallel ranks (threads sharing the stores).
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// Pipeline stages.
    #[arg(long, default_value_t = 1)]
    pp: u32,
    /// Speculative decoding: every layer hook is called twice per step.
    #[arg(long)]
    spec_decode: bool,
    /// Probability per request of an injected fault (I/O error, ENOSPC,
    /// eviction storm, a rank dying before it saves); needs the
    /// `failpoints` feature for the I/O errors.
    #[arg(long, default_value_t = 0.0)]
    faults: f64,
    /// Modes to run: `ucm,recompute,fold` (default) on a workload; with
    /// `--trace` also `vllm,sglang,lmcache,marconi` (default: all seven).
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<String>>,
    /// Replay a public trace (Mooncake format) instead of a workload, in
    /// the capacity-only mode (no bytes moved), over a capacity sweep
    /// (default: `--capacity-sweep auto`).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// With `--trace`: sweep the cache's capacity, the same for every mode
    /// (tokens of K/V, or `auto`: 1%, 3%, 10%, 30%, 100% and 200% of the
    /// trace's working set). An offload mode (ucm, lmcache, marconi, fold)
    /// keeps it on disk, a tenth of it also in memory, below an engine
    /// cache of `--engine-capacity` (default 0: every mode then holds the
    /// same capacity); vllm and sglang get an engine cache of
    /// `--engine-capacity` plus it.
    #[arg(long)]
    capacity_sweep: Option<String>,
    /// With `--trace`: sweep the engine prefix-cache capacity instead, in
    /// tokens of K/V, below fixed tiers (`--pool-capacity`,
    /// `--disk-capacity`).
    #[arg(long)]
    sweep: Option<String>,
    /// With `--trace`: the engine prefix-cache capacity (tokens). Alone, an
    /// engine sweep of one; with `--capacity-sweep`, the engine cache in
    /// front of every point.
    #[arg(long)]
    engine_capacity: Option<String>,
    /// With `--trace --sweep`: the offload modes' memory tier, in tokens
    /// of K/V.
    #[arg(long, default_value = DEFAULT_POOL_CAPACITY)]
    pool_capacity: String,
    /// With `--trace --sweep`: the offload modes' disk tier, in tokens of
    /// K/V.
    #[arg(long, default_value = DEFAULT_DISK_CAPACITY)]
    disk_capacity: String,
    /// With `--trace`: only the first N requests.
    #[arg(long)]
    limit: Option<usize>,
    /// With `--trace`: memory-tier load bandwidth assumed (GiB/s).
    #[arg(long, default_value_t = 10.0)]
    pool_gib_s: f64,
    /// With `--trace`: disk-tier load bandwidth assumed (GiB/s).
    #[arg(long, default_value_t = 2.0)]
    disk_gib_s: f64,
    /// With `--trace`: `ucm` does not keep what its requests decode.
    #[arg(long)]
    no_decode_retention: bool,
    /// With `--trace`: the share (0 to 1) of each tier that `ucm`'s
    /// speculative checkpoints may keep, fixed; by default it follows the
    /// scheduler's evidence, as the store's does (D82). 0: speculative
    /// items are evicted before any sure item (the stores' rule before
    /// D82).
    #[arg(long)]
    speculative_share: Option<f64>,
    /// With `--trace`: how `ucm`'s tiers split their bytes between the
    /// groups: `one` budget for K/V and states (default); `store`, as the
    /// store keeps them (a pool per group of equal bytes, one disk budget,
    /// D84); `groups`, as it did before D84 (a pool per group of equal
    /// bytes, a disk tier per group of equal file counts).
    #[arg(long, value_enum, default_value_t = Split::One)]
    tier_split: Split,
    /// A Redis or Valkey cluster below every store's disk tier
    /// (`redis://host:port,...`), as instances on several machines would
    /// share it (workload replays).
    #[arg(long)]
    remote: Option<String>,
    /// An S3-compatible bucket below that (or below the disk tiers without
    /// `--remote`): the cold tier, `s3://bucket[/prefix]?endpoint=URL`
    /// (credentials from `AWS_*`; workload replays).
    #[arg(long)]
    cold: Option<String>,
    /// No local disk tier: `--remote` and/or `--cold` are the persistent
    /// tiers (diskless nodes).
    #[arg(long)]
    no_disk: bool,
    /// How the disk tiers make saves durable: `auto` (one syncfs per batch
    /// where the file system allows) or `files` (an fsync per file and
    /// directory; workload replays).
    #[arg(long, default_value = "auto")]
    sync_mode: SyncMode,
    /// Run N engine instances (processes with their own pools, schedulers
    /// and checkpoint directories) over one shared configuration: one store
    /// directory, or with `--remote` own disks and one cluster; `ucm` mode
    /// (workload replays).
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Internal: this process is instance K of a `--instances` run.
    #[arg(long, hide = true, requires_all = ["instance_count", "instance_dir"])]
    instance: Option<usize>,
    /// Internal: the instances of the run.
    #[arg(long, hide = true)]
    instance_count: Option<usize>,
    /// Internal: the run's shared directory.
    #[arg(long, hide = true)]
    instance_dir: Option<PathBuf>,
    /// With `--trace` and `--limit`: also move the bytes (the engine
    /// harness with the content oracle, `ucm` mode, no engine cache) and
    /// check that every request is served what the capacity-only model
    /// serves.
    #[arg(long)]
    bytes: bool,
    /// Byte sizes divided by this (structure unchanged).
    #[arg(long, default_value_t = 64)]
    bytes_scale: u64,
    /// Simulated compute per prompt token not served, in microseconds.
    #[arg(long, default_value_t = 60.0)]
    compute_us_per_token: f64,
    /// Runs of each mode that loads (not with `--trace`): the TTFT columns
    /// are the median over them, and the spread is printed below the table.
    #[arg(long)]
    runs: Option<usize>,
    /// Directory of the stores (default: /dev/shm when present).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Draw hit rate and TTFT per turn for each mode into this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Replay these requests instead of `--workload`: one JSON object per
    /// line, `{"session", "turn", "prompt": [ids], "output": [ids]}` (the
    /// requests an engine served, to predict what UCM serves them).
    #[arg(long)]
    requests: Option<PathBuf>,
    /// Where the simulated engine's KV caches and states live (workload
    /// replays): `host`, or `cuda[:N]` (a build with the `cuda` feature:
    /// GPU memory, the pool registered with the GPU, every byte still
    /// checked by the content oracle).
    #[arg(long, default_value = "host")]
    device: String,
    /// Test only: plant a deliberate bug (default: flip one loaded byte),
    /// to prove the oracle reports it and the run fails.
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "flip-byte")]
    sabotage: Option<ucm::replay::SabotageKind>,
}

/// Runs of each loading mode in a workload replay, for the TTFT's spread.
pub(crate) const DEFAULT_REPLAY_RUNS: usize = 3;

/// A long run's progress on stderr: rewritten in place on a terminal; in a
/// captured log (not a terminal), one line at most every few seconds, so
/// the log stays readable.
pub(crate) struct StatusLine {
    tty: bool,
    last: std::cell::Cell<Option<std::time::Instant>>,
    shown: std::cell::Cell<bool>,
}

impl StatusLine {
    /// Seconds between two lines in a log.
    const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

    pub(crate) fn new() -> Self {
        use std::io::IsTerminal;
        StatusLine {
            tty: std::io::stderr().is_terminal(),
            last: std::cell::Cell::new(None),
            shown: std::cell::Cell::new(false),
        }
    }

    /// Shows `l`, the progress now.
    pub(crate) fn show(&self, l: &str) {
        use std::io::Write;
        let mut e = std::io::stderr();
        if self.tty {
            let _ = write!(e, "\r{l}");
            let _ = e.flush();
            self.shown.set(true);
            return;
        }
        let now = std::time::Instant::now();
        if self.last.get().is_none_or(|t| now - t >= Self::LOG_EVERY) {
            self.last.set(Some(now));
            let _ = writeln!(e, "{l}");
        }
    }

    /// Ends the line a terminal was shown.
    pub(crate) fn end(&self) {
        if self.shown.get() {
            eprintln!();
        }
    }
}

pub(crate) fn replay(a: ReplayArgs) -> Result<(), String> {
    if a.trace.is_some() {
        return replay_trace(a);
    }
    for (flag, set) in [
        ("--sweep", a.sweep.is_some()),
        ("--engine-capacity", a.engine_capacity.is_some()),
        ("--limit", a.limit.is_some()),
        ("--speculative-share", a.speculative_share.is_some()),
        ("--tier-split", a.tier_split != Split::One),
    ] {
        if set {
            return Err(format!("{flag} needs --trace"));
        }
    }
    let runs = a.runs.unwrap_or(DEFAULT_REPLAY_RUNS);
    if !(1..=100).contains(&runs) {
        return Err(format!("--runs {runs} is not between 1 and 100"));
    }
    let modes = parse_modes::<ucm::replay::Mode>(a.modes.as_deref(), "ucm,recompute,fold")?;
    let device: ucm::device::DeviceSpec = a.device.parse().map_err(|e| format!("--device: {e}"))?;
    let dir = a.dir.unwrap_or_else(default_scratch_parent);
    let cfg = ucm::replay::ReplayConfig {
        spec: a.spec,
        workload: a.workload,
        requests: a.requests.clone(),
        seed: a.seed,
        sessions: a.sessions,
        turns: a.turns,
        tp: a.tp,
        pp: a.pp,
        spec_decode: a.spec_decode,
        faults: a.faults,
        dir,
        bytes_scale: a.bytes_scale,
        compute_us_per_token: a.compute_us_per_token,
        chunk: 2048,
        runs,
        modes,
        sabotage: a.sabotage,
        remote: a.remote.clone(),
        cold: a.cold.clone(),
        no_disk: a.no_disk,
        sync: a.sync_mode,
        instance: None,
    };
    if let (Some(index), Some(count), Some(dir)) = (a.instance, a.instance_count, &a.instance_dir) {
        return replay_instance(cfg, index, count, dir.clone());
    }
    if a.instances == 0 {
        return Err("--instances must be at least 1".into());
    }
    if a.instances > 1 {
        if a.requests.is_some() {
            return Err(
                "--requests replays in one instance; it does not combine with --instances".into(),
            );
        }
        if device != ucm::device::DeviceSpec::Host {
            return Err("--instances runs on the host device only".into());
        }
        return replay_instances(&cfg, a.instances, a.json);
    }
    let status = StatusLine::new();
    let progress = |l: &str| status.show(l);
    struct OnDevice<'a, P>(&'a ucm::replay::ReplayConfig, &'a P);
    impl<P: Fn(&str)> ucm::device::DeviceVisitor for OnDevice<'_, P> {
        type Output = Result<ucm::replay::Report, ucm::replay::ReplayError>;
        fn visit<D: ucm::device::Device>(self, dev: &std::sync::Arc<D>) -> Self::Output {
            ucm::replay::run_on(dev, self.0, self.1)
        }
    }
    let report = super::bench::open_device(&a.device)?
        .visit(OnDevice(&cfg, &progress))
        .map_err(|e| e.to_string())?;
    status.end();
    if let Some(p) = &a.plot {
        std::fs::write(p, ucm::replay::render_svg(&report))
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", ucm::replay::render_text(&report));
    }
    let wrong: u64 = report.modes.values().map(|m| m.wrong_hits).sum();
    let lost: u64 = report.modes.values().map(|m| m.unaccounted_faults).sum();
    if wrong > 0 {
        return Err(format!("{wrong} wrong hits"));
    }
    if lost > 0 {
        return Err(format!("{lost} injected faults were never reported"));
    }
    let dropped: u64 = report.modes.values().map(|m| m.lost_saves).sum();
    if dropped > 0 {
        return Err(format!(
            "{dropped} saves were reported good but no tier holds them"
        ));
    }
    Ok(())
}

/// One instance of `replay --instances` (a child process): its report as
/// JSON on stdout, progress lines on stderr.
pub(crate) fn replay_instance(
    mut cfg: ucm::replay::ReplayConfig,
    index: usize,
    count: usize,
    dir: PathBuf,
) -> Result<(), String> {
    use ucm::replay::instances;
    cfg.instance = Some(instances::InstanceRole { index, count, dir });
    let rep =
        instances::run_instance(&cfg, &instances::child_progress()).map_err(|e| e.to_string())?;
    println!(
        "{}",
        serde_json::to_string(&rep).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// `replay --instances N`: N child processes of this executable.
pub(crate) fn replay_instances(
    cfg: &ucm::replay::ReplayConfig,
    count: usize,
    json: bool,
) -> Result<(), String> {
    use ucm::replay::instances;
    let exe = std::env::current_exe().map_err(|e| format!("this executable: {e}"))?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let progress = |l: &str| eprintln!("{l}");
    let rep =
        instances::run_parent(cfg, count, &exe, &args, &progress).map_err(|e| e.to_string())?;
    if json {
        println!(
            "{}",
            serde_json::to_string(&rep).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", instances::render(&rep));
    }
    if rep.wrong_hits > 0 {
        return Err(format!("{} wrong hits", rep.wrong_hits));
    }
    if rep.lost_saves > 0 {
        return Err(format!(
            "{} saves were reported good but no tier holds them",
            rep.lost_saves
        ));
    }
    Ok(())
}

/// `ucm replay --trace F --limit N --bytes`: the byte-moving sample set
/// beside the capacity-only model.
pub(crate) fn sample(
    a: &ReplayArgs,
    t: &[ucm::replay::trace::TraceRequest],
    model: &ucm::replay::sim::units::Model,
    cfg: &ucm::replay::sim::SimConfig,
) -> Result<(), String> {
    if a.limit.is_none() {
        return Err("--bytes moves every block: give a sample with --limit".into());
    }
    let dir = a.dir.clone().unwrap_or_else(default_scratch_parent);
    let status = StatusLine::new();
    let line = |l: &str| status.show(l);
    let r = ucm::replay::sim::sample::run_sample(
        t,
        &model.spec,
        cfg,
        a.bytes_scale,
        &dir,
        a.sabotage,
        &line,
    )
    .map_err(|e| e.to_string())?;
    status.end();
    if a.json {
        println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
    } else {
        println!(
            "byte-moving sample ({} requests, bytes at 1/{}, content oracle): {} of {} prompt \
             tokens served; capacity-only on the same requests: {}; {} disagreements; {} items \
             checked, {} wrong",
            r.requests,
            a.bytes_scale,
            r.served_moving,
            r.prompt_tokens,
            r.served_capacity_only,
            r.disagreements,
            r.checked_items,
            r.wrong
        );
    }
    if r.wrong > 0 {
        return Err(format!("{} wrong hits or lost saves", r.wrong));
    }
    if r.disagreements > 0 {
        return Err(format!(
            "{} requests served differently by the two modes (request, moving, capacity-only): {:?}",
            r.disagreements, r.first_disagreements
        ));
    }
    Ok(())
}

/// Parses `--modes` (or `default`) as values of `M`.
pub(crate) fn parse_modes<M: clap::ValueEnum>(
    given: Option<&[String]>,
    default: &str,
) -> Result<Vec<M>, String> {
    let parts: Vec<String> = match given {
        Some(v) => v.to_vec(),
        None => default.split(',').map(str::to_string).collect(),
    };
    let names: Vec<String> = M::value_variants()
        .iter()
        .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
        .collect();
    parts
        .iter()
        .map(|p| {
            M::from_str(p.trim(), true)
                .map_err(|_| format!("--modes: `{p}` is not one of {}", names.join(", ")))
        })
        .collect()
}

/// The offload tiers of an engine sweep, by default (tokens of K/V).
pub(crate) const DEFAULT_POOL_CAPACITY: &str = "1e7";

pub(crate) const DEFAULT_DISK_CAPACITY: &str = "1e8";

/// The engine cache in front of the offload modes in a capacity sweep
/// (tokens of K/V): none, so that every mode holds the same capacity and
/// the sweep compares policies.
pub(crate) const DEFAULT_SWEEP_ENGINE: u64 = 0;

pub(crate) fn one_capacity(flag: &str, v: &str) -> Result<u64, String> {
    match ucm::replay::trace::parse_capacities(v).map_err(|e| format!("{flag}: {e}"))?[..] {
        [c] => Ok(c),
        _ => Err(format!("{flag} takes one capacity")),
    }
}

pub(crate) fn replay_trace(a: ReplayArgs) -> Result<(), String> {
    use std::io::Write;
    use ucm::replay::sim::{self, report, SimConfig, SimMode};
    use ucm::replay::trace;
    let file = a.trace.clone().unwrap_or_default();
    if a.remote.is_some()
        || a.cold.is_some()
        || a.no_disk
        || a.sync_mode != SyncMode::Auto
        || a.runs.is_some()
        || a.device != "host"
        || a.requests.is_some()
    {
        return Err(
            "--remote, --cold, --no-disk, --sync-mode, --runs, --device and --requests apply to workload replays, not to --trace"
                .into(),
        );
    }
    if a.instances != 1 {
        return Err("--instances applies to workload replays, not to --trace".into());
    }
    // The sweep: its kind, its points (None: `auto`, set from the trace),
    // and the engine cache of a capacity sweep.
    let (kind, caps, engine) = match (&a.capacity_sweep, &a.sweep, &a.engine_capacity) {
        (Some(_), Some(_), _) => return Err("give --capacity-sweep or --sweep, not both".into()),
        (None, Some(_), Some(_)) => {
            return Err("give --sweep or --engine-capacity, not both".into())
        }
        (None, Some(s), None) => (
            sim::SweepKind::Engine,
            Some(trace::parse_capacities(s).map_err(|e| format!("--sweep: {e}"))?),
            0,
        ),
        (None, None, Some(c)) => (
            sim::SweepKind::Engine,
            Some(vec![one_capacity("--engine-capacity", c)?]),
            0,
        ),
        (cs, None, e) => {
            let caps = match cs.as_deref() {
                None | Some("auto") => None,
                Some(s) => {
                    Some(trace::parse_capacities(s).map_err(|e| format!("--capacity-sweep: {e}"))?)
                }
            };
            // In front of a capacity sweep the engine may hold nothing
            // (0: every mode's hits then come from its own policy alone).
            let engine = match e.as_deref() {
                Some("0") => 0,
                Some(c) => one_capacity("--engine-capacity", c)?,
                None => DEFAULT_SWEEP_ENGINE,
            };
            (sim::SweepKind::Cache, caps, engine)
        }
    };
    if kind == sim::SweepKind::Cache
        && (a.pool_capacity != DEFAULT_POOL_CAPACITY || a.disk_capacity != DEFAULT_DISK_CAPACITY)
    {
        return Err(
            "--pool-capacity and --disk-capacity set the tiers of an engine sweep (--sweep); a \
             capacity sweep sets them from its points"
                .into(),
        );
    }
    let modes = parse_modes::<SimMode>(
        a.modes.as_deref(),
        "ucm,vllm,sglang,lmcache,marconi,fold,recompute",
    )?;
    for (name, v) in [
        ("--pool-gib-s", a.pool_gib_s),
        ("--disk-gib-s", a.disk_gib_s),
    ] {
        if !v.is_finite() || v <= 0.0 {
            return Err(format!("{name} {v} is not a positive bandwidth"));
        }
    }
    if !a.compute_us_per_token.is_finite() || a.compute_us_per_token < 0.0 {
        return Err(format!(
            "--compute-us-per-token {} is not a finite, non-negative duration",
            a.compute_us_per_token
        ));
    }
    if let Some(s) = a.speculative_share {
        if !(0.0..=1.0).contains(&s) {
            return Err(format!(
                "--speculative-share {s} is not a share from 0 to 1"
            ));
        }
    }
    let cfg = SimConfig {
        seed: a.seed,
        pool_tokens: one_capacity("--pool-capacity", &a.pool_capacity)?,
        disk_tokens: one_capacity("--disk-capacity", &a.disk_capacity)?,
        compute_us_per_token: a.compute_us_per_token,
        pool_gib_s: a.pool_gib_s,
        disk_gib_s: a.disk_gib_s,
        decode_retention: !a.no_decode_retention,
        speculative_share: a.speculative_share,
        tier_split: a.tier_split,
        ..SimConfig::default()
    };
    let spec = ucm::coordinator::SpecTable::load(&a.spec).map_err(|e| e.to_string())?;
    let model = sim::units::Model::new(spec);
    let mut t = trace::read_trace(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    if let Some(n) = a.limit {
        t.truncate(n);
    }
    if a.bytes {
        return sample(&a, &t, &model, &cfg);
    }
    let caps = match caps {
        Some(c) => c,
        None => {
            let ws = trace::working_set_tokens(&t);
            eprintln!(
                "ucm replay: the trace's working set is {ws} tokens; capacities at 1%, 3%, 10%, \
                 30%, 100% and 200% of it"
            );
            [0.01, 0.03, 0.1, 0.3, 1.0, 2.0]
                .iter()
                .map(|f| ((ws as f64 * f) as u64).max(1))
                .collect()
        }
    };
    eprintln!(
        "ucm replay: {} requests of {}; {} modes x {} {} capacities, capacity-only (no bytes moved)",
        t.len(),
        file.display(),
        modes.len(),
        caps.len(),
        match kind {
            sim::SweepKind::Engine => "engine",
            sim::SweepKind::Cache => "cache",
        }
    );
    let summary = trace::summarize(&t, &caps, |l| eprintln!("ucm replay: trace {l}"));
    let progress = |l: &str| {
        let mut e = std::io::stderr();
        let _ = writeln!(e, "ucm replay: {l}");
    };
    let sw = sim::Sweep {
        kind,
        points: caps,
        engine_tokens: engine,
    };
    let points = sim::sweep(&t, &model, &modes, &sw, &cfg, &progress).map_err(|e| e.to_string())?;
    let rep = report::SimReport {
        kind: "capacity-only",
        trace: file.display().to_string(),
        spec: a.spec.display().to_string(),
        kv_bytes_per_token: model.kv_bytes_per_token,
        sweep: kind,
        engine_tokens: engine,
        config: cfg,
        summary,
        points,
    };
    if let Some(p) = &a.plot {
        std::fs::write(p, report::render_svg(&rep)).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&rep).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", report::render_text(&rep));
    }
    Ok(())
}

pub(crate) fn trace(a: TraceArgs) -> Result<(), String> {
    use ucm::replay::trace;
    let caps = trace::parse_capacities(&a.sweep).map_err(|e| format!("--sweep: {e}"))?;
    if a.limit == Some(0) {
        return Err("--limit must be at least 1".into());
    }
    let mut t = trace::read_trace(&a.file).map_err(|e| format!("{}: {e}", a.file.display()))?;
    if let Some(n) = a.limit {
        t.truncate(n);
    }
    let s = trace::summarize(&t, &caps, |line| eprintln!("ucm trace: {line}"));
    if a.json {
        println!("{}", serde_json::to_string(&s).map_err(|e| e.to_string())?);
    } else {
        print!("{}", trace::render_summary(&a.file, &s));
    }
    Ok(())
}
