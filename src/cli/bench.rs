//! `ucm bench`: device copies, I/O engines, hashing, the store, the
//! layerwise path and the remote tier, each against a same-run baseline.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use ucm::bench::io::{self as iobench, IoBenchConfig, Pattern};
use ucm::device::IoEngineKind;
use ucm::store::SyncMode;

#[derive(Subcommand)]
pub(crate) enum BenchCmd {
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
pub(crate) struct LayerwiseArgs {
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
    /// Where the engine's KV regions live: `host` or `cuda[:N]` (a build
    /// with the `cuda` feature: the loads go from the pool into GPU
    /// memory; the per-layer compute stays a host sleep).
    #[arg(long, default_value = "host")]
    device: String,
}

#[derive(Args)]
pub(crate) struct HashArgs {
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
pub(crate) struct RemoteArgs {
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
pub(crate) struct StoreArgs {
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
    /// Where the loads' destination and the dumps' source live: `host`
    /// (memcpy is the pool paths' limit) or `cuda[:N]` (a build with the
    /// `cuda` feature; the limit is the contiguous pinned-to-GPU copy of the
    /// same bytes).
    #[arg(long, default_value = "host")]
    device: String,
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
pub(crate) struct DeviceArgs {
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
pub(crate) struct IoArgs {
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

pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
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

#[cfg(not(feature = "redis"))]
pub(crate) fn bench_remote(_: RemoteArgs) -> Result<(), String> {
    Err("`ucm bench remote` needs a build with the `redis` feature".into())
}

#[cfg(feature = "redis")]
pub(crate) fn bench_remote(a: RemoteArgs) -> Result<(), String> {
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

pub(crate) fn bench_device(a: DeviceArgs) -> Result<(), String> {
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
            let path = dev.copy_path();
            progress(&format!("batched copies: {}", path.name()));
            if let Some(why) = dev.copy_kernel_unavailable() {
                progress(&format!("no copy kernel: {why}"));
            }
            let mut recs = devbench::run(&dev, &raw, &cfg, progress).map_err(err)?;
            for r in &mut recs {
                r.copy_path = Some(path.name().into());
            }
            records.extend(recs);
            // The scatter case again on the other paths: a call per run,
            // then the batch API where the driver has it.
            dev.set_copy_kernel(false);
            let mut others = vec![ucm::device::accel::cuda::CopyPath::PerRun];
            if dev.batch_api_available() {
                others.push(ucm::device::accel::cuda::CopyPath::BatchApi);
            }
            for other in others.into_iter().filter(|&p| p != path) {
                dev.set_batch_api(other == ucm::device::accel::cuda::CopyPath::BatchApi);
                let mut r = devbench::run(&dev, &raw, &cfg, |_| {}).map_err(err)?;
                if let Some(mut s) = r.pop() {
                    s.case = format!("scatter_64k_{}", other.name());
                    s.copy_path = Some(other.name().into());
                    progress(&format!("{}: ratio {:.2}", s.case, s.ratio));
                    records.push(s);
                }
            }
            dev.set_batch_api(false);
            dev.set_copy_kernel(true);
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

pub(crate) fn bench_layerwise(a: LayerwiseArgs) -> Result<(), String> {
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
    struct OnDevice<'a>(&'a LayerwiseConfig);
    impl ucm::device::DeviceVisitor for OnDevice<'_> {
        type Output = Result<Vec<lw::LayerwiseRecord>, lw::LayerwiseError>;
        fn visit<D: ucm::device::Device>(self, dev: &std::sync::Arc<D>) -> Self::Output {
            lw::run_on(std::sync::Arc::clone(dev), self.0, |l| eprintln!("{l}"))
        }
    }
    let records = open_device(&a.device)?
        .visit(OnDevice(&cfg))
        .map_err(|e| e.to_string())?;
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

pub(crate) fn bench_hash(a: HashArgs) -> Result<(), String> {
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

pub(crate) fn bench_store(a: StoreArgs) -> Result<(), String> {
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
    let spec: ucm::device::DeviceSpec = a.device.parse().map_err(|e| format!("--device: {e}"))?;
    let progress = |l: &str| eprintln!("{l}");
    let records = match spec {
        ucm::device::DeviceSpec::Host if tiers.is_empty() => {
            storebench::run(&cfg, progress).map_err(|e| e.to_string())?
        }
        ucm::device::DeviceSpec::Host => {
            ucm::bench::tiers::run(&cfg, &tiers, progress).map_err(|e| e.to_string())?
        }
        _ if !tiers.is_empty() => {
            return Err("--remote and --cold measure the host device only".into());
        }
        #[cfg(feature = "cuda")]
        ucm::device::DeviceSpec::Cuda(_) => match open_device(&a.device)? {
            ucm::device::DeviceHandle::Cuda(dev, _) => store_on_cuda(dev, &cfg, progress)?,
            _ => unreachable!("cuda opens a CUDA device"),
        },
        other => {
            return Err(format!(
                "--device {other}: the store bench runs on host{}",
                if cfg!(feature = "cuda") {
                    " and cuda"
                } else {
                    " (cuda needs a build with the `cuda` feature)"
                }
            ))
        }
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
                    + &r.checked_paired
                        .as_ref()
                        .map(|s| format!(" (vs fio+memcpy+crc32c {})", s.text(3)))
                        .unwrap_or_default()
            );
        }
    }
    Ok(())
}

/// The device `name` names (`host`, `cuda[:N]`, `npu[:N]`), opened
/// through the HAL's one handle; for a GPU, says when libcuda is UCM's
/// test double and which path batched copies take.
pub(crate) fn open_device(name: &str) -> Result<ucm::device::DeviceHandle, String> {
    let spec: ucm::device::DeviceSpec = name.parse().map_err(|e| format!("--device: {e}"))?;
    let handle =
        ucm::device::DeviceHandle::open(spec).map_err(|e| format!("--device {spec}: {e}"))?;
    #[cfg(feature = "cuda")]
    if let ucm::device::DeviceHandle::Cuda(dev, _) = &handle {
        if let Some((path, true)) = ucm::device::accel::cuda::preloaded() {
            eprintln!(
                "note: libcuda is UCM's host-memory test double ({}): a smoke run, not a GPU",
                path.display()
            );
        }
        eprintln!("batched copies: {}", dev.copy_path().name());
    }
    Ok(handle)
}

/// `ucm bench store --device cuda:N`: the data on GPU `ordinal`, the pool
/// paths against the contiguous copy of the same bytes from one pinned
/// buffer.
#[cfg(feature = "cuda")]
fn store_on_cuda(
    dev: std::sync::Arc<ucm::device::accel::cuda::CudaDevice>,
    cfg: &ucm::bench::store::StoreBenchConfig,
    progress: impl FnMut(&str),
) -> Result<Vec<ucm::bench::store::StoreBenchRecord>, String> {
    use std::sync::Mutex;
    use ucm::bench::store::StoreBenchError;
    use ucm::device::{Device, Memory};
    let staging: Mutex<Option<Memory>> = Mutex::new(None);
    let limit = |dst: &Memory, _src: &Memory, n: usize| -> Result<f64, StoreBenchError> {
        let mut g = staging.lock().unwrap_or_else(|e| e.into_inner());
        let host = match g.take() {
            Some(m) if m.len() >= n => m,
            _ => dev.alloc_pinned(n)?,
        };
        let t = std::time::Instant::now();
        let r = dev.raw_copy(dst, &host, n, n);
        let secs = t.elapsed().as_secs_f64();
        *g = Some(host);
        r?;
        Ok(ucm::bench::gib_s(n as u64, secs))
    };
    ucm::bench::store::run_on(&dev, &limit, cfg, progress).map_err(|e| e.to_string())
}

pub(crate) fn bench_io(a: IoArgs) -> Result<(), String> {
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
            "goal: ours >= 0.9 of the loop over the client's own buffers in the same pattern \
             (the bound of any engine serving it), as the median of paired per-round ratios; \
             fio beside it"
        );
        println!(
            "{:<9} {:<10} {:>9} {:>5} {:>21} {:>21} {:>6} {:>21} {:>6}",
            "engine", "op", "block", "depth", "GiB/s", "loop", "ratio", "fio", "ratio"
        );
        for r in &records {
            let opt = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
            println!(
                "{:<9} {:<10} {:>8}K {:>5} {:>21} {:>21} {:>6} {:>21} {:>6}",
                r.engine,
                r.op.to_string(),
                r.block_bytes >> 10,
                r.depth,
                r.spread.text(3),
                r.loop_spread.text(3),
                format!("{:.3}", r.loop_ratio),
                r.fio_spread.map_or("-".to_string(), |s| s.text(3)),
                opt(r.ratio),
            );
        }
    }
    Ok(())
}
