//! The `ucm` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use ucm::bench::io::{self as iobench, IoBenchConfig, Pattern};
use ucm::device::IoEngineKind;
use ucm::store::SyncMode;

/// UCM: a KV-cache storage engine for hybrid LLMs.
#[derive(Parser)]
#[command(name = "ucm", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args)]
struct TraceArgs {
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

#[derive(Subcommand)]
enum Cmd {
    /// Report which device backends and I/O engines work on this machine.
    Info {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Directory where the I/O engines are probed (O_DIRECT depends on
        /// the file system). Defaults to the system temp directory.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Instead: list the deployments' identities this store directory
        /// holds, with their bytes and idle time.
        #[arg(long)]
        store: Option<PathBuf>,
    },
    /// Replay a workload end to end on the host device (simulated engine,
    /// content oracle) in every mode, and report.
    Replay(Box<ReplayArgs>),
    /// What a public trace (Mooncake format) allows by itself: its size, the
    /// ideal prefix hit rate and a plain block-LRU's over a capacity sweep.
    Trace(TraceArgs),
    /// Why did (or didn't) a prompt hit? Materialises a scenario in a real
    /// store on the host device and runs the real resolve_hit.
    Explain(ExplainArgs),
    /// Measure throughput against a baseline taken in the same run.
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
    /// Remove what killed runs left behind: `--stale` removes the scratch
    /// stores (`ucm-<kind>.<writer>.<n>`) of `replay`, `explain` and the
    /// benches whose writer process is gone, in `--dir`. `--store DIR`
    /// removes deployments' identities (`--identity D`, or those idle
    /// longer than `--max-idle DAYS`) with their stores.
    Gc(GcArgs),
}

#[derive(Args)]
struct GcArgs {
    /// Remove the scratch stores of dead processes of this host (a run
    /// killed with SIGKILL cannot remove its own).
    #[arg(long)]
    stale: bool,
    /// Where to look (default: /dev/shm when present, else the system temp
    /// directory: where the CLI puts its scratch stores).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// A store directory whose deployments' identities to remove: one
    /// (`--identity`) or the idle ones (`--max-idle`).
    #[arg(long, conflicts_with_all = ["stale", "dir"])]
    store: Option<PathBuf>,
    /// With --store: the identity (digest, as `ucm info --store` lists it)
    /// to remove with its stores.
    #[arg(long, requires = "store")]
    identity: Option<String>,
    /// With --store: remove every identity not used for more than this
    /// many days.
    #[arg(long, requires = "store", conflicts_with = "identity")]
    max_idle: Option<f64>,
}

#[derive(Args)]
struct ReplayArgs {
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
    /// Test only: plant a deliberate bug (default: flip one loaded byte),
    /// to prove the oracle reports it and the run fails.
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "flip-byte")]
    sabotage: Option<ucm::replay::SabotageKind>,
}

#[derive(Args)]
struct ExplainArgs {
    /// The model's spec table (TOML), e.g. specs/x-hybrid-96.toml.
    #[arg(long)]
    spec: PathBuf,
    /// The scenario (JSON): {"tokens", "seed", "held", "checkpoints"}.
    #[arg(long)]
    scenario: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Keep the store in this directory (default: a temporary one).
    #[arg(long)]
    store: Option<PathBuf>,
    /// Reopen the kept store and resolve only (a warm restart); dumps nothing.
    #[arg(long, requires = "store")]
    resolve_only: bool,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Sequential and random read/write GiB/s per I/O engine, beside fio.
    Io(IoArgs),
    /// Copy GiB/s through the Device trait against the backend's raw path.
    Device(DeviceArgs),
    /// The tiered store on the host device: dump, cold and warm loads, lookups.
    Store(StoreArgs),
    /// Block hashing (chain ids) against raw md5 over the same bytes.
    Hash(HashArgs),
    /// How much load I/O the adapter hides behind simulated per-unit compute.
    Layerwise(LayerwiseArgs),
    /// The remote tier on a Redis or Valkey cluster against a raw
    /// pipelined client loop: put / get GiB/s and lookups of many ids.
    Remote(RemoteArgs),
}

#[derive(Args)]
struct LayerwiseArgs {
    /// Print one JSON record per ratio (JSON lines) on stdout.
    #[arg(long)]
    json: bool,
    /// Directory of the store (default: /dev/shm where it exists, else the
    /// temporary directory; the pipeline is measured, not the disk).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Units (layers) of the model.
    #[arg(long, default_value_t = 32)]
    units: u32,
    /// Blocks of 16 tokens loaded per unit.
    #[arg(long, default_value_t = 64)]
    blocks: usize,
    /// Bytes per token per layer.
    #[arg(long, default_value_t = 4096)]
    bytes_per_token: u64,
    /// I/O-to-compute ratios.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1,2")]
    ratios: Vec<f64>,
    /// Runs per ratio (the median counts).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Units loaded ahead of the one being waited for (the embeddings'
    /// default).
    #[arg(long, default_value_t = ucm::coordinator::adapter::DEFAULT_LOOKAHEAD)]
    lookahead: usize,
    /// The stores' I/O engine.
    #[arg(long, default_value = "auto")]
    engine: IoEngineKind,
}

#[derive(Args)]
struct HashArgs {
    /// Print one JSON record per block size (JSON lines) on stdout.
    #[arg(long)]
    json: bool,
    /// Tokens per block.
    #[arg(long, value_delimiter = ',', default_value = "16,128,256")]
    block_tokens: Vec<usize>,
    /// Tokens hashed per round.
    #[arg(long, default_value_t = 4 << 20)]
    tokens: usize,
    /// Rounds of each side, interleaved (the medians are compared).
    #[arg(long, default_value_t = 5)]
    reps: usize,
}

#[derive(Args)]
struct RemoteArgs {
    /// The cluster: `redis://host:port[,host:port...]`.
    #[arg(long)]
    remote: String,
    /// Print one JSON record per case (JSON lines) on stdout.
    #[arg(long)]
    json: bool,
    /// Value sizes.
    #[arg(long, value_delimiter = ',', default_value = "64K,2M", value_parser = parse_size)]
    values: Vec<u64>,
    /// Value bytes per round per size.
    #[arg(long, default_value = "128M", value_parser = parse_size)]
    total: u64,
    /// Values per call.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Rounds (median and min-max reported).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Ids of the lookup case.
    #[arg(long, default_value_t = 10_000)]
    lookup_ids: usize,
}

#[derive(Args)]
struct StoreArgs {
    /// Print one JSON record per path (JSON lines) on stdout.
    #[arg(long)]
    json: bool,
    /// Directory of the store (tmpfs /dev/shm gives stable numbers).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Shard sizes.
    #[arg(long, value_delimiter = ',', default_value = "64K,2M", value_parser = parse_size)]
    shard_sizes: Vec<u64>,
    /// Shards per block.
    #[arg(long, default_value_t = 32)]
    shards: u32,
    /// Bytes per workload.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Do not run fio even when installed.
    #[arg(long)]
    no_fio: bool,
    /// Rounds, interleaved with the limits; the medians are compared.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// The store's I/O engine: auto, io_uring, libaio or posix.
    #[arg(long, default_value = "auto")]
    engine: IoEngineKind,
    /// How the disk tier makes dumps durable: `auto` (one syncfs per batch
    /// where the file system allows) or `files` (an fsync per file and
    /// directory).
    #[arg(long, default_value = "auto")]
    sync_mode: SyncMode,
    /// Measure the tiers below the disk instead: a Redis or Valkey cluster
    /// (`redis://host:port,...`) ...
    #[arg(long)]
    remote: Option<String>,
    /// ... and/or an S3 bucket (`s3://bucket/prefix?endpoint=URL`): dump,
    /// another instance's load and lookups, each against the same path
    /// without the tiers.
    #[arg(long)]
    cold: Option<String>,
}

#[derive(Args)]
struct DeviceArgs {
    /// Print one JSON record per case (JSON lines) on stdout.
    #[arg(long)]
    json: bool,
    /// The device: host, cuda[:N] or npu[:N] (also ascend[:N]); the last
    /// two need their features.
    #[arg(long, default_value = "host")]
    device: String,
    /// Accelerator index where `--device` names none.
    #[arg(long, default_value_t = 0)]
    #[cfg_attr(not(any(feature = "cuda", feature = "ascend")), allow(dead_code))]
    index: i32,
    /// Layers of the layerwise case.
    #[arg(long, default_value_t = 32)]
    layers: usize,
    /// Bytes loaded per layer in the layerwise case.
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    layer_size: u64,
    /// Bytes per case.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    size: u64,
    /// Chunk of the chunked H2D / D2H copies.
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    chunk: u64,
    /// Runs per case (medians reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
}

#[derive(Args)]
struct IoArgs {
    /// Print one JSON record per case (JSON lines) on stdout.
    #[arg(long)]
    json: bool,
    /// Directory of the bench file (tmpfs /dev/shm gives stable numbers).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Engines to measure.
    #[arg(long, value_delimiter = ',', default_value = "io_uring,libaio,posix")]
    engines: Vec<IoEngineKind>,
    /// Access patterns.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "seq_write,seq_read,rand_write,rand_read"
    )]
    ops: Vec<Pattern>,
    /// Block sizes (suffixes K and M are powers of two).
    #[arg(long, value_delimiter = ',', default_value = "64K,512K,2M", value_parser = parse_size)]
    blocks: Vec<u64>,
    /// Queue depths.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    depths: Vec<usize>,
    /// Bytes each run moves: the bench file's size (1 GiB by default: at
    /// 256 MiB a fio job of a 32-job psync run moves four 2 MiB blocks, and
    /// fio's own rounds ranged over 30x).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Interleaved rounds of ours and fio's per case (medians compared,
    /// min-max reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Do not run fio even when installed.
    #[arg(long)]
    no_fio: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a size like 4096, 64K, 2M or 1G"))
}

/// Logs warnings and errors to stderr (`UCM_LOG=info` or `debug` for more).
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("[{}] {}", r.level(), r.args());
        }
    }

    fn flush(&self) {}
}

fn init_logging() {
    static LOGGER: StderrLogger = StderrLogger;
    let level = match std::env::var("UCM_LOG").as_deref() {
        Ok("debug") => log::LevelFilter::Debug,
        Ok("info") => log::LevelFilter::Info,
        Ok("error") => log::LevelFilter::Error,
        _ => log::LevelFilter::Warn,
    };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Info {
            json,
            store: Some(store),
            ..
        } => identities_info(json, &store),
        Cmd::Info {
            json,
            dir,
            store: None,
        } => info(json, dir),
        Cmd::Gc(args) => gc(args),
        Cmd::Explain(args) => explain(args),
        Cmd::Trace(args) => trace(args),
        Cmd::Replay(args) => replay(*args),
        Cmd::Bench {
            what: BenchCmd::Io(args),
        } => bench_io(args),
        Cmd::Bench {
            what: BenchCmd::Device(args),
        } => bench_device(args),
        Cmd::Bench {
            what: BenchCmd::Store(args),
        } => bench_store(args),
        Cmd::Bench {
            what: BenchCmd::Hash(args),
        } => bench_hash(args),
        Cmd::Bench {
            what: BenchCmd::Layerwise(args),
        } => bench_layerwise(args),
        Cmd::Bench {
            what: BenchCmd::Remote(args),
        } => bench_remote(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ucm: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "redis"))]
fn bench_remote(_: RemoteArgs) -> Result<(), String> {
    Err("`ucm bench remote` needs a build with the `redis` feature".into())
}

#[cfg(feature = "redis")]
fn bench_remote(a: RemoteArgs) -> Result<(), String> {
    use ucm::bench::remote;
    let values = a
        .values
        .iter()
        .map(|&v| usize::try_from(v).map_err(|_| format!("--values: {v} is too large")))
        .collect::<Result<Vec<_>, _>>()?;
    if values.iter().any(|&v| v == 0 || v > 512 << 20) {
        return Err("--values: each size must be 1 byte to 512 MiB (Redis's value limit)".into());
    }
    let cfg = remote::RemoteBenchConfig {
        url: a.remote,
        value_sizes: values,
        total_bytes: a.total,
        batch: a.batch,
        rounds: a.rounds,
        lookup_ids: a.lookup_ids,
    };
    let recs = remote::run(&cfg, |l| eprintln!("ucm bench: {l}")).map_err(|e| e.to_string())?;
    if a.json {
        for r in &recs {
            println!("{}", serde_json::to_string(r).map_err(|e| e.to_string())?);
        }
    } else {
        print!("{}", remote::render(&recs));
    }
    Ok(())
}

/// Runs of each loading mode in a workload replay, for the TTFT's spread.
const DEFAULT_REPLAY_RUNS: usize = 3;

fn replay(a: ReplayArgs) -> Result<(), String> {
    use std::io::Write;
    if a.trace.is_some() {
        return replay_trace(a);
    }
    for (flag, set) in [
        ("--sweep", a.sweep.is_some()),
        ("--engine-capacity", a.engine_capacity.is_some()),
        ("--limit", a.limit.is_some()),
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
    let dir = a.dir.unwrap_or_else(default_scratch_parent);
    let cfg = ucm::replay::ReplayConfig {
        spec: a.spec,
        workload: a.workload,
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
        return replay_instances(&cfg, a.instances, a.json);
    }
    let progress = |l: &str| {
        let mut e = std::io::stderr();
        let _ = write!(e, "\r{l}");
        let _ = e.flush();
    };
    let report = ucm::replay::run(&cfg, &progress).map_err(|e| e.to_string())?;
    eprintln!();
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
fn replay_instance(
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
fn replay_instances(
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

fn explain(a: ExplainArgs) -> Result<(), String> {
    use ucm::coordinator::SpecTable;
    use ucm::explain::{ExplainOptions, Scenario};
    let spec = SpecTable::load(&a.spec).map_err(|e| e.to_string())?;
    let sc = Scenario::load(&a.scenario).map_err(|e| e.to_string())?;
    let opts = ExplainOptions {
        store: a.store,
        resolve_only: a.resolve_only,
    };
    let out = ucm::explain::explain(&spec, &sc, &opts).map_err(|e| e.to_string())?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&out).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", out.render_text(&spec));
    }
    Ok(())
}

fn gc(a: GcArgs) -> Result<(), String> {
    if let Some(store) = &a.store {
        let idle = match a.max_idle {
            Some(d) if (0.0..1e6).contains(&d) => {
                Some(std::time::Duration::from_secs_f64(d * 86_400.0))
            }
            Some(d) => return Err(format!("--max-idle {d}: give days, 0 to 1e6")),
            None => None,
        };
        println!(
            "{}",
            ucm::identities::gc(store, a.identity.as_deref(), idle).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    if !a.stale {
        return Err("say what to remove: --stale (the scratch stores of killed runs)".into());
    }
    let dir = a.dir.unwrap_or_else(default_scratch_parent);
    if !dir.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    let removed = ucm::scratch::clear_stale(&dir);
    println!(
        "removed {removed} scratch stores of dead processes in {}",
        dir.display()
    );
    Ok(())
}

/// Where the replay's stores go by default: /dev/shm when present.
fn default_scratch_parent() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// `ucm replay --trace F --limit N --bytes`: the byte-moving sample set
/// beside the capacity-only model.
fn sample(
    a: &ReplayArgs,
    t: &[ucm::replay::trace::TraceRequest],
    model: &ucm::replay::sim::units::Model,
    cfg: &ucm::replay::sim::SimConfig,
) -> Result<(), String> {
    use std::io::Write;
    if a.limit.is_none() {
        return Err("--bytes moves every block: give a sample with --limit".into());
    }
    let dir = a.dir.clone().unwrap_or_else(default_scratch_parent);
    let line = |l: &str| {
        let mut e = std::io::stderr();
        let _ = write!(e, "\r{l}");
        let _ = e.flush();
    };
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
    eprintln!();
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
fn parse_modes<M: clap::ValueEnum>(
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
const DEFAULT_POOL_CAPACITY: &str = "1e7";
const DEFAULT_DISK_CAPACITY: &str = "1e8";
/// The engine cache in front of the offload modes in a capacity sweep
/// (tokens of K/V): none, so that every mode holds the same capacity and
/// the sweep compares policies.
const DEFAULT_SWEEP_ENGINE: u64 = 0;

fn one_capacity(flag: &str, v: &str) -> Result<u64, String> {
    match ucm::replay::trace::parse_capacities(v).map_err(|e| format!("{flag}: {e}"))?[..] {
        [c] => Ok(c),
        _ => Err(format!("{flag} takes one capacity")),
    }
}

fn replay_trace(a: ReplayArgs) -> Result<(), String> {
    use std::io::Write;
    use ucm::replay::sim::{self, report, SimConfig, SimMode};
    use ucm::replay::trace;
    let file = a.trace.clone().unwrap_or_default();
    if a.remote.is_some()
        || a.cold.is_some()
        || a.no_disk
        || a.sync_mode != SyncMode::Auto
        || a.runs.is_some()
    {
        return Err(
            "--remote, --cold, --no-disk, --sync-mode and --runs apply to workload replays, not to --trace"
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
    let cfg = SimConfig {
        seed: a.seed,
        pool_tokens: one_capacity("--pool-capacity", &a.pool_capacity)?,
        disk_tokens: one_capacity("--disk-capacity", &a.disk_capacity)?,
        compute_us_per_token: a.compute_us_per_token,
        pool_gib_s: a.pool_gib_s,
        disk_gib_s: a.disk_gib_s,
        decode_retention: !a.no_decode_retention,
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

fn trace(a: TraceArgs) -> Result<(), String> {
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

fn identities_info(json: bool, store: &std::path::Path) -> Result<(), String> {
    let rows = ucm::identities::rows(store).map_err(|e| e.to_string())?;
    if json {
        println!(
            "{}",
            serde_json::to_string(&rows).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", ucm::identities::render_text(store, &rows));
    }
    Ok(())
}

fn info(json: bool, dir: Option<PathBuf>) -> Result<(), String> {
    let dir = dir.unwrap_or_else(std::env::temp_dir);
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let report = ucm::info::collect(&dir);
    if json {
        let s = serde_json::to_string(&report).map_err(|e| e.to_string())?;
        println!("{s}");
    } else {
        print!("{}", ucm::info::render_text(&report));
    }
    Ok(())
}

fn bench_device(a: DeviceArgs) -> Result<(), String> {
    use ucm::bench::device::{self as devbench, DeviceBenchConfig};
    use ucm::device::{Device, HostDevice, Memory};
    let to_usize = |v: u64| usize::try_from(v).map_err(|_| format!("{v} is too large"));
    let cfg = DeviceBenchConfig {
        bytes: to_usize(a.size)?,
        chunk: to_usize(a.chunk)?,
        reps: a.reps,
    };
    let layer_bytes = to_usize(a.layer_size)?;
    let progress = |line: &str| eprintln!("{line}");
    let err = |e: ucm::device::DeviceError| e.to_string();
    let mut records = Vec::new();
    let spec: ucm::device::DeviceSpec = a.device.parse().map_err(|e| format!("--device: {e}"))?;
    // An ordinal in the name wins over --index.
    #[cfg_attr(
        not(any(feature = "cuda", feature = "ascend")),
        allow(unused_variables)
    )]
    let ordinal = if a.device.contains(':') {
        spec.ordinal()
    } else {
        u32::try_from(a.index).map_err(|_| format!("--index {} is negative", a.index))?
    };
    match spec {
        ucm::device::DeviceSpec::Host => {
            let dev = HostDevice::new();
            let raw = |d: &Memory, s: &Memory, n: usize| dev.raw_copy(d, s, n);
            records.extend(devbench::run(&dev, &raw, &cfg, progress).map_err(err)?);
            // The host stand-in for a layer's compute: a spin of `iters` µs.
            let compute = |s: &<HostDevice as Device>::Stream, iters: u32| {
                dev.launch_host_fn(
                    s,
                    Box::new(move || {
                        let t = std::time::Instant::now();
                        while t.elapsed().as_micros() < u128::from(iters) {
                            std::hint::spin_loop();
                        }
                        Ok(())
                    }),
                )
            };
            records.push(
                devbench::layerwise(&dev, &compute, a.layers, layer_bytes, a.reps).map_err(err)?,
            );
        }
        #[cfg(feature = "cuda")]
        ucm::device::DeviceSpec::Cuda(_) => {
            let dev = ucm::device::accel::cuda::CudaDevice::new(ordinal as usize).map_err(err)?;
            if let Some((path, double)) = ucm::device::accel::cuda::preloaded() {
                progress(&if double {
                    format!(
                        "note: libcuda is UCM's host-memory test double ({}): a smoke run, \
                         the figures below measure memcpy on threads, not a GPU",
                        path.display()
                    )
                } else {
                    format!("note: libcuda is {} (UCM_CUDA_LIB)", path.display())
                });
            }
            let chunk = cfg.chunk;
            let raw = |d: &Memory, s: &Memory, n: usize| dev.raw_copy(d, s, n, chunk);
            records.extend(devbench::run(&dev, &raw, &cfg, progress).map_err(err)?);
            if dev.batch_api_available() {
                dev.set_batch_api(true);
                let mut r = devbench::run(&dev, &raw, &cfg, |_| {}).map_err(err)?;
                dev.set_batch_api(false);
                if let Some(mut s) = r.pop() {
                    s.case = "scatter_64k_batch_api".into();
                    progress(&format!("scatter_64k_batch_api: ratio {:.2}", s.ratio));
                    records.push(s);
                }
            }
            let scratch = dev.alloc_device(layer_bytes).map_err(err)?;
            let compute = |s: &ucm::device::accel::cuda::CudaStream, iters: u32| {
                dev.launch_layer_compute(s, &scratch, iters)
            };
            records.push(
                devbench::layerwise(&dev, &compute, a.layers, layer_bytes, a.reps).map_err(err)?,
            );
        }
        #[cfg(feature = "ascend")]
        ucm::device::DeviceSpec::Npu(_) => {
            let dev = ucm::device::accel::ascend::AscendDevice::new(ordinal as i32).map_err(err)?;
            let chunk = cfg.chunk;
            let raw = |d: &Memory, s: &Memory, n: usize| dev.raw_copy(d, s, n, chunk);
            records.extend(devbench::run(&dev, &raw, &cfg, progress).map_err(err)?);
        }
        #[allow(unreachable_patterns)]
        other => {
            let mut built = vec!["host"];
            if cfg!(feature = "cuda") {
                built.push("cuda");
            }
            if cfg!(feature = "ascend") {
                built.push("ascend");
            }
            return Err(format!(
                "device `{other}` is not available in this build (built: {})",
                built.join(", ")
            ));
        }
    }
    if let Some(l) = records.iter().find(|r| r.case == "layerwise") {
        progress(&format!(
            "layerwise: {:.3} GiB/s of loads, {:.0}% of the I/O hidden behind compute",
            l.gib_s,
            100.0 * l.hidden_io_fraction.unwrap_or(0.0)
        ));
    }
    for r in &records {
        if a.json {
            println!("{}", serde_json::to_string(r).map_err(|e| e.to_string())?);
        } else {
            println!(
                "{:<22} {} GiB/s  baseline {} GiB/s  paired ratio {}",
                r.case,
                r.spread.text(3),
                r.limit_spread.text(3),
                r.paired.text(3)
            );
        }
    }
    Ok(())
}

fn bench_layerwise(a: LayerwiseArgs) -> Result<(), String> {
    use ucm::bench::layerwise::{self as lw, LayerwiseConfig};
    let cfg = LayerwiseConfig {
        dir: a.dir.unwrap_or_else(lw::default_dir),
        units: a.units,
        blocks: a.blocks,
        bytes_per_token: a.bytes_per_token,
        ratios: a.ratios,
        reps: a.reps,
        lookahead: a.lookahead,
        engine: a.engine,
    };
    let records = lw::run(&cfg, |l| eprintln!("{l}")).map_err(|e| e.to_string())?;
    if !a.json {
        if let Some(l) = records.first().and_then(|r| r.load_average) {
            println!(
                "load average at start: {l:.2}; lookahead {}; median (min-max) of {} rounds",
                cfg.lookahead, cfg.reps
            );
        }
    }
    for r in &records {
        if a.json {
            println!("{}", serde_json::to_string(r).map_err(|e| e.to_string())?);
        } else {
            println!(
                "io {} ms/unit  compute {:.3} ms/unit  exposed {} ms (ideal {:.2})  hidden {:.3} ({:.3}-{:.3})",
                r.io_spread.text(3),
                r.compute_per_unit_ms,
                r.exposed_spread.text(2),
                r.ideal_exposed_ms,
                r.hidden_fraction,
                r.hidden_spread.min,
                r.hidden_spread.max
            );
        }
    }
    Ok(())
}

fn bench_hash(a: HashArgs) -> Result<(), String> {
    if a.block_tokens.contains(&0) || a.reps == 0 {
        return Err("block sizes and reps must be positive".into());
    }
    if a.block_tokens.iter().any(|&b| b > a.tokens) {
        return Err(format!("--tokens {} is smaller than a block", a.tokens));
    }
    let records = ucm::bench::hash::run(&a.block_tokens, a.tokens, a.reps, |l| eprintln!("{l}"));
    for r in &records {
        if a.json {
            println!("{}", serde_json::to_string(r).map_err(|e| e.to_string())?);
        } else {
            println!(
                "chain_ids {:>4}-token blocks  {} GiB/s  raw md5 {} GiB/s  paired ratio {}",
                r.block_tokens,
                r.spread.text(3),
                r.limit_spread.text(3),
                r.paired.text(3)
            );
        }
    }
    Ok(())
}

fn bench_store(a: StoreArgs) -> Result<(), String> {
    use ucm::bench::store::{self as storebench, StoreBenchConfig};
    let to_usize = |v: u64| usize::try_from(v).map_err(|_| format!("{v} is too large"));
    let cfg = StoreBenchConfig {
        dir: a.dir.unwrap_or_else(std::env::temp_dir),
        shard_sizes: a
            .shard_sizes
            .iter()
            .map(|&s| to_usize(s))
            .collect::<Result<_, _>>()?,
        shards: a.shards,
        bytes: to_usize(a.size)?,
        use_fio: !a.no_fio,
        lookups: 10_000,
        reps: a.reps,
        engine: a.engine,
        sync: a.sync_mode,
    };
    let tiers: Vec<String> = a.remote.iter().chain(&a.cold).cloned().collect();
    let records = if tiers.is_empty() {
        storebench::run(&cfg, |l| eprintln!("{l}")).map_err(|e| e.to_string())?
    } else {
        ucm::bench::tiers::run(&cfg, &tiers, |l| eprintln!("{l}")).map_err(|e| e.to_string())?
    };
    if !a.json {
        if let Some(l) = records.first().and_then(|r| r.load_average) {
            println!("load average at start: {l:.2}; figures are median (min-max) of the rounds, ratios of medians");
        }
    }
    for r in &records {
        if a.json {
            println!("{}", serde_json::to_string(r).map_err(|e| e.to_string())?);
        } else {
            let (digits, unit) = if r.blocks_s.is_some() {
                (0, "blk/s")
            } else {
                (3, "GiB/s")
            };
            println!(
                "{:<16} {:>5} KiB  {:>26}  limit {:>26}  paired ratio {}{}",
                r.path,
                r.shard_bytes >> 10,
                format!("{} {unit}", r.spread.text(digits)),
                r.limit_spread.map_or("-".to_string(), |s| s.text(digits)),
                r.paired.as_ref().map_or("-".to_string(), |p| p.text(3)),
                r.serial_paired
                    .as_ref()
                    .map(|s| format!("  (vs fio+memcpy {})", s.text(3)))
                    .unwrap_or_default()
            );
        }
    }
    Ok(())
}

fn bench_io(a: IoArgs) -> Result<(), String> {
    let blocks = a
        .blocks
        .iter()
        .map(|&b| usize::try_from(b).map_err(|_| format!("block size {b} too large")))
        .collect::<Result<Vec<_>, _>>()?;
    let cfg = IoBenchConfig {
        dir: a.dir.unwrap_or_else(std::env::temp_dir),
        engines: a.engines,
        ops: a.ops,
        blocks,
        depths: a.depths,
        file_bytes: a.size,
        reps: a.reps,
        use_fio: !a.no_fio,
    };
    let json = a.json;
    let records = iobench::run(&cfg, |line| eprintln!("{line}")).map_err(|e| e.to_string())?;
    if json {
        for r in &records {
            println!("{}", serde_json::to_string(r).map_err(|e| e.to_string())?);
        }
    } else {
        if let Some(l) = records.first().and_then(|r| r.load_average) {
            println!("load average at start: {l:.2}; GiB/s as median (min-max) of the rounds");
        }
        println!(
            "{:<9} {:<10} {:>9} {:>5} {:>21} {:>21} {:>6} {:>21} {:>6}",
            "engine", "op", "block", "depth", "GiB/s", "fio", "ratio", "loop", "ratio"
        );
        for r in &records {
            let opt = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
            println!(
                "{:<9} {:<10} {:>8}K {:>5} {:>21} {:>21} {:>6} {:>21} {:>6.3}",
                r.engine,
                r.op.to_string(),
                r.block_bytes >> 10,
                r.depth,
                r.spread.text(3),
                r.fio_spread.map_or("-".to_string(), |s| s.text(3)),
                opt(r.ratio),
                r.loop_spread.text(3),
                r.loop_ratio
            );
        }
    }
    Ok(())
}
