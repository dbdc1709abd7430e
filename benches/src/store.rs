//! `ucm bench store`: the whole tiered store, on the host device or (with
//! [`run_on`]) with the data on another device.
//!
//! For each shard size, `blocks x shards` of it (1 GiB by default):
//! - `dump_cold`: dump everything and wait until durable; limit: fio writing
//!   the same bytes sequentially with the same block size, in the same dir;
//! - `load_cold`: a fresh store (empty pool) loads everything from disk;
//!   limit: fio reading them back;
//! - `load_warm`: load everything again (pool hits); limit: memcpy of the
//!   same bytes (below);
//! - `load_layerwise`: one shard index at a time across all blocks (pool
//!   hits); limit: memcpy;
//! - `lookup_disk` / `lookup_pool`: 10,000 ids of which 9,000 are present
//!   (a one-shard geometry); limits: a raw batched `statx` of the same paths
//!   (built beforehand, on as many threads as the store has workers), and a
//!   hash-set probe of the same ids.
//!
//! The memcpy limit is defined once ([`memcpy_limit`]): the C library's
//! `memcpy` of the same bytes, from the bench's source region into its
//! destination region (both allocated by the host device, page-aligned and
//! pre-faulted before the first round), one call per thread on as many
//! threads as the store copies with ([`STORE_WORKERS`], one device stream
//! each). It allocates nothing: the bench holds the source, the destination
//! and the pool (which fills to the data size), about three times the data.
//!
//! One record per path: `{"path","shard_bytes","gib_s"|"blocks_s","limit",
//! "ratio","spread","limit_spread","load_average"}`. Every path and its limit
//! run `reps` times, interleaved; `gib_s`/`blocks_s` and `limit` are the
//! medians, `ratio` their quotient, and the spreads give the median, min and
//! max of each side's rounds.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use ucm_device::{CopyRun, Device, HostDevice, IoEngineConfig, IoEngineKind, Memory};
use ucm_store::pool::PoolMode;
use ucm_store::{
    BlockId, BlockStore, BlockStoreConfig, ClockPool, DiskConfig, DiskTier, Geometry, ItemOutcome,
    PoolConfig, RemoteTier, StoreError, SyncMode, TaskItem, TieredBlockStore,
};

use super::io::{fio_available, run_fio, Pattern};
use super::{gib_s, round_to, Paired, Spread};

/// Worker threads of the bench's stores: each copies on its own device
/// stream, so the memcpy limit runs on as many threads.
pub const STORE_WORKERS: usize = 2;

/// What to measure.
#[derive(Clone, Debug)]
pub struct StoreBenchConfig {
    /// Where the store's directories go (removed afterwards).
    pub dir: PathBuf,
    /// Shard sizes to run.
    pub shard_sizes: Vec<usize>,
    /// Shards per block.
    pub shards: u32,
    /// Bytes per workload (blocks = bytes / (shards x shard size)).
    pub bytes: usize,
    /// Compare disk paths with fio when installed.
    pub use_fio: bool,
    /// Ids looked up in the lookup paths (nine in ten present).
    pub lookups: usize,
    /// Rounds of every path and its limit, interleaved; the medians are
    /// compared (the machines are shared and noisy).
    pub reps: usize,
    /// The store's I/O engine.
    pub engine: IoEngineKind,
    /// How the disk tier makes dumps durable.
    pub sync: SyncMode,
}

impl Default for StoreBenchConfig {
    fn default() -> Self {
        StoreBenchConfig {
            dir: std::env::temp_dir(),
            shard_sizes: vec![64 << 10, 2 << 20],
            shards: 32,
            bytes: 1 << 30,
            use_fio: true,
            lookups: 10_000,
            reps: 5,
            engine: IoEngineKind::Auto,
            sync: SyncMode::Auto,
        }
    }
}

/// One record.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StoreBenchRecord {
    /// The path measured.
    pub path: String,
    /// Shard size of the workload.
    pub shard_bytes: usize,
    /// Throughput (data paths), the median round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gib_s: Option<f64>,
    /// Lookups per second (lookup paths, in blocks per second), the median
    /// round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocks_s: Option<f64>,
    /// The same-run limit's median, in the same unit (None without fio).
    pub limit: Option<f64>,
    /// Ours over the limit: the median of the per-round ratios.
    pub ratio: Option<f64>,
    /// Ours over the limit round by round, their median and quartiles
    /// (None without a limit).
    pub paired: Option<Paired>,
    /// Our rounds: median, min, max.
    pub spread: Spread,
    /// The limit's rounds (None without a limit).
    pub limit_spread: Option<Spread>,
    /// Disk paths on the host device: the limit of doing fio's transfer
    /// and a memcpy of the same bytes one after the other, `1 / (1/fio +
    /// 1/memcpy)`: a host-device dump or load moves every byte twice
    /// (device <-> pool, pool <-> file) where fio moves it once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial_limit: Option<f64>,
    /// Ours over the serial limit: the median of the per-round ratios
    /// (each round's serial limit from its own fio and memcpy rounds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial_ratio: Option<f64>,
    /// Ours over the serial limit round by round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial_paired: Option<Paired>,
    /// Disk paths: the serial limit with the store's checksum pass added,
    /// `1 / (1/fio + 1/memcpy + 1/crc32c)`: a dump checksums every shard
    /// it writes and a cold load every shard it reads, a third pass over
    /// each byte that neither fio nor memcpy makes ([`crc_rate`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checked_limit: Option<f64>,
    /// Ours over the checked limit, round by round, their median and
    /// quartiles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checked_paired: Option<Paired>,
    /// The machine's 1-minute load average when the bench started.
    pub load_average: Option<f64>,
    /// `dump_cold`: the disk tier's sync mode, and the `syncfs` calls of
    /// its last round (0 where every file and directory is fsynced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_mode: Option<String>,
    /// See `sync_mode`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs_syncs: Option<u64>,
    /// The disk paths: the I/O engine the disk tier ran on (`--engine
    /// auto` resolved for the directory: POSIX on tmpfs, D88).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

/// Errors of the store bench.
#[derive(Debug, thiserror::Error)]
pub enum StoreBenchError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The device failed.
    #[error(transparent)]
    Device(#[from] ucm_device::DeviceError),
    /// The fio baseline failed.
    #[error(transparent)]
    Fio(#[from] super::io::IoBenchError),
    /// Something failed that a bench cannot measure around.
    #[error("{0}")]
    Other(String),
}

/// The record of a path from its rounds and its limit's (`limit` empty:
/// none).
pub(super) fn record(
    path: &str,
    shard_bytes: usize,
    ours: &[f64],
    limit: &[f64],
    lookups: bool,
) -> StoreBenchRecord {
    let digits = if lookups { 0 } else { 3 };
    let spread = Spread::of(ours);
    let limit_spread = (!limit.is_empty()).then(|| Spread::of(limit));
    let (o, l) = (spread.median, limit_spread.map(|s| s.median));
    let paired = (!limit.is_empty()).then(|| Paired::of(ours, limit, 3));
    StoreBenchRecord {
        path: path.into(),
        shard_bytes,
        gib_s: (!lookups).then(|| round_to(o, 3)),
        blocks_s: lookups.then(|| o.round()),
        limit: l.map(|l| if lookups { l.round() } else { round_to(l, 3) }),
        ratio: l
            .filter(|l| *l > 0.0)
            .and(paired.as_ref().map(|p| p.median)),
        paired,
        spread: spread.rounded(digits),
        limit_spread: limit_spread.map(|s| s.rounded(digits)),
        serial_limit: None,
        serial_ratio: None,
        serial_paired: None,
        checked_limit: None,
        checked_paired: None,
        load_average: None,
        sync_mode: None,
        fs_syncs: None,
        engine: None,
    }
}

/// A disk-path record with its serial (fio then memcpy) limit, on medians.
fn disk_record(
    path: &str,
    shard_bytes: usize,
    ours: &[f64],
    fio: &[f64],
    memcpy: &[f64],
    crc: &[f64],
) -> StoreBenchRecord {
    let mut r = record(path, shard_bytes, ours, fio, false);
    let serial = |f: f64, m: f64| 1.0 / (1.0 / f + 1.0 / m);
    let memcpy_median = Spread::of(memcpy).median;
    if let Some(f) = r
        .limit_spread
        .map(|s| s.median)
        .filter(|f| *f > 0.0 && memcpy_median > 0.0)
    {
        r.serial_limit = Some(round_to(serial(f, memcpy_median), 3));
        let rounds: Vec<f64> = fio
            .iter()
            .zip(memcpy)
            .map(|(&f, &m)| {
                if f > 0.0 && m > 0.0 {
                    serial(f, m)
                } else {
                    f64::NAN
                }
            })
            .collect();
        let p = Paired::of(ours, &rounds, 3);
        r.serial_ratio = Some(p.median);
        r.serial_paired = Some(p);
        let crc_median = Spread::of(crc).median;
        if crc_median > 0.0 {
            let three = |f: f64, m: f64, c: f64| 1.0 / (1.0 / f + 1.0 / m + 1.0 / c);
            r.checked_limit = Some(round_to(three(f, memcpy_median, crc_median), 3));
            let rounds: Vec<f64> = fio
                .iter()
                .zip(memcpy)
                .zip(crc)
                .map(|((&f, &m), &c)| {
                    if f > 0.0 && m > 0.0 && c > 0.0 {
                        three(f, m, c)
                    } else {
                        f64::NAN
                    }
                })
                .collect();
            r.checked_paired = Some(Paired::of(ours, &rounds, 3));
        }
    }
    r
}

/// GiB/s of the store's shard checksum (CRC-32C) over `data`, one shard
/// at a time, split over as many threads as the store has workers: the
/// third pass a dump or a cold load makes over every byte.
pub(super) fn crc_rate(data: &[u8], shard_bytes: usize) -> Result<f64, StoreBenchError> {
    let part = data
        .len()
        .div_ceil(STORE_WORKERS)
        .next_multiple_of(shard_bytes.max(1));
    let t = Instant::now();
    let sums: u32 = std::thread::scope(|sc| {
        let handles: Vec<_> = data
            .chunks(part)
            .map(|c| {
                sc.spawn(move || {
                    c.chunks(shard_bytes.max(1))
                        .fold(0u32, |a, s| a ^ crc32c::crc32c(s))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| StoreBenchError::Other("a checksum thread panicked".into()))
            })
            .try_fold(0u32, |a, r| r.map(|x| a ^ x))
    })?;
    std::hint::black_box(sums);
    Ok(gib_s(data.len() as u64, t.elapsed().as_secs_f64()))
}

pub(super) fn id(n: u64) -> BlockId {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8..].copy_from_slice(&n.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
    b
}

pub(super) fn open_store<D: Device>(
    dev: &Arc<D>,
    dir: &Path,
    geo: Geometry,
    slots: usize,
    cfg: &StoreBenchConfig,
) -> Result<TieredBlockStore<D>, StoreBenchError> {
    open_store_with(
        dev,
        dir,
        geo,
        slots,
        cfg,
        Vec::new(),
        Duration::from_secs(5),
    )
}

/// [`open_store`] with `tiers` below the disk and a pool load timeout of
/// `load_timeout`.
pub(super) fn open_store_with<D: Device>(
    dev: &Arc<D>,
    dir: &Path,
    geo: Geometry,
    slots: usize,
    cfg: &StoreBenchConfig,
    tiers: Vec<RemoteTier>,
    load_timeout: Duration,
) -> Result<TieredBlockStore<D>, StoreBenchError> {
    let ways = 256.min(slots);
    let pool = ClockPool::open(PoolConfig {
        shard_bytes: geo.shard_bytes,
        slots: slots.div_ceil(ways) * ways,
        ways,
        mode: PoolMode::Private,
        load_timeout,
        dirty_timeout: Duration::from_secs(600),
    })?;
    let engine = Arc::from(IoEngineConfig::for_dir(cfg.engine, dir).build()?);
    let mut dcfg = DiskConfig::new(dir, geo, u64::MAX / 2);
    dcfg.sync = cfg.sync;
    let disk = DiskTier::open(dcfg, engine)?;
    let bcfg = BlockStoreConfig {
        workers: STORE_WORKERS,
        ..BlockStoreConfig::default()
    };
    Ok(TieredBlockStore::with_tiers(
        Arc::clone(dev),
        pool,
        disk,
        tiers,
        bcfg,
    )?)
}

/// The workload of one shard size: `blocks x shards` shards of
/// `shard_bytes` in `bytes`, and a pool of twice that.
pub(super) struct Workload {
    pub(super) geo: Geometry,
    pub(super) blocks: usize,
    pub(super) bytes: usize,
    pub(super) slots: usize,
}

/// The workload of `shard_bytes` under `cfg` (at least one block).
pub(super) fn workload(
    cfg: &StoreBenchConfig,
    shard_bytes: usize,
) -> Result<Workload, StoreBenchError> {
    let geo = Geometry {
        shard_bytes,
        shards_per_block: cfg.shards,
    };
    geo.validate()?;
    let block_bytes = shard_bytes * cfg.shards as usize;
    let blocks = (cfg.bytes / block_bytes).max(1);
    Ok(Workload {
        geo,
        blocks,
        bytes: blocks * block_bytes,
        slots: blocks * cfg.shards as usize * 2,
    })
}

/// The seed of the store bench's source pattern.
const SOURCE_SEED: u64 = 11;
/// The pattern chunk a source repeats.
const SOURCE_CHUNK: usize = 1 << 20;

/// The chunk of `seed`'s pattern that a source of `bytes` repeats.
fn source_chunk(bytes: usize, seed: u64) -> Vec<u8> {
    ucm_device::conformance::pattern(seed, SOURCE_CHUNK.min(bytes))
}

/// Device memory of `bytes`, filled with a pattern of `seed` (1 MiB
/// repeated, copied from one 1 MiB host buffer).
pub(super) fn pattern_source<D: Device>(
    dev: &D,
    bytes: usize,
    seed: u64,
) -> Result<Memory, StoreBenchError> {
    let src = dev.alloc_device(bytes)?;
    fill_pattern(dev, &src, bytes, seed)?;
    Ok(src)
}

/// Writes `seed`'s pattern (1 MiB repeated) over the first `bytes` of
/// device memory `mem`.
fn fill_pattern<D: Device>(
    dev: &D,
    mem: &Memory,
    bytes: usize,
    seed: u64,
) -> Result<(), StoreBenchError> {
    let host = dev.alloc_pinned(SOURCE_CHUNK.min(bytes))?;
    host.write_host(0, &source_chunk(bytes, seed))?;
    let s = dev.create_stream()?;
    let runs: Vec<CopyRun<'_>> = (0..bytes)
        .step_by(SOURCE_CHUNK)
        .map(|off| CopyRun::new(mem, off, &host, 0, SOURCE_CHUNK.min(bytes - off)))
        .collect();
    dev.copy_batch_async(&s, &runs)?;
    dev.synchronize_stream(&s)?;
    Ok(())
}

/// Checks that the first `bytes` of device memory `mem` hold `seed`'s
/// pattern, reading it back 1 MiB at a time; the first wrong byte is an
/// error naming `what` and its offset.
fn check_pattern<D: Device>(
    dev: &D,
    mem: &Memory,
    bytes: usize,
    seed: u64,
    what: &str,
) -> Result<(), StoreBenchError> {
    let want = source_chunk(bytes, seed);
    let host = dev.alloc_pinned(want.len())?;
    let s = dev.create_stream()?;
    let mut got = vec![0u8; want.len()];
    for off in (0..bytes).step_by(SOURCE_CHUNK) {
        let n = SOURCE_CHUNK.min(bytes - off);
        dev.copy_async(&s, &CopyRun::new(&host, 0, mem, off, n))?;
        dev.synchronize_stream(&s)?;
        host.read_host(0, &mut got[..n])?;
        if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
            return Err(StoreBenchError::Other(format!(
                "{what}: wrong byte at offset {} of the destination",
                off + i
            )));
        }
    }
    Ok(())
}

/// The memcpy limit of the pool paths: `bytes` from `src` to `dst`, one
/// call of the C library's `memcpy` per thread over a contiguous part, on
/// [`STORE_WORKERS`] threads. Returns GiB/s.
pub(super) fn memcpy_limit(
    dev: &HostDevice,
    dst: &Memory,
    src: &Memory,
    bytes: usize,
) -> Result<f64, StoreBenchError> {
    let part = bytes.div_ceil(STORE_WORKERS).next_multiple_of(4096);
    let t = Instant::now();
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..bytes)
            .step_by(part)
            .map(|off| sc.spawn(move || dev.raw_copy_at(dst, off, src, off, part.min(bytes - off))))
            .collect();
        handles.into_iter().try_for_each(|h| match h.join() {
            Ok(r) => r.map_err(StoreBenchError::from),
            Err(_) => Err(StoreBenchError::Other("a memcpy thread panicked".into())),
        })
    })?;
    Ok(gib_s(bytes as u64, t.elapsed().as_secs_f64()))
}

pub(super) fn task(
    geo: Geometry,
    blocks: usize,
    mem: &Memory,
    shards: std::ops::Range<u32>,
) -> Vec<TaskItem> {
    let mut v = Vec::new();
    for b in 0..blocks {
        for s in shards.clone() {
            v.push(TaskItem {
                block: id(b as u64),
                shard: s,
                memory: mem.clone(),
                offset: (b * geo.shards_per_block as usize + s as usize) * geo.shard_bytes,
            });
        }
    }
    v
}

pub(super) fn expect_ok(
    outs: &[(BlockId, u32, ItemOutcome)],
    what: &str,
) -> Result<(), StoreBenchError> {
    match outs.iter().find(|(_, _, o)| *o != ItemOutcome::Ok) {
        None => Ok(()),
        Some((_, s, o)) => Err(StoreBenchError::Other(format!("{what}: shard {s}: {o:?}"))),
    }
}

/// The limit of the pool paths on a device: GiB/s of moving `bytes` into
/// the destination (device memory) the way the device moves bytes best,
/// measured once per round.
pub type PoolLimit<'a> = dyn Fn(&Memory, &Memory, usize) -> Result<f64, StoreBenchError> + 'a;

/// Runs every path for every shard size on the host device, the pool
/// paths against [`memcpy_limit`].
pub fn run(
    cfg: &StoreBenchConfig,
    progress: impl FnMut(&str),
) -> Result<Vec<StoreBenchRecord>, StoreBenchError> {
    let dev = Arc::new(HostDevice::new());
    let limit = |dst: &Memory, src: &Memory, n: usize| memcpy_limit(&dev, dst, src, n);
    run_on(&dev, &limit, cfg, progress)
}

/// Runs every path for every shard size with the data on `dev`: the
/// loads' destination and the dumps' source are its memory, the pool is
/// registered with it. `limit(dst, src, bytes)` is the pool paths' limit
/// (on a GPU: the contiguous pinned-to-device copy of the same bytes); the
/// disk paths' serial limits use it in place of memcpy. Every load path's
/// destination is checked byte for byte in the first round.
pub fn run_on<D: Device>(
    dev: &Arc<D>,
    limit: &PoolLimit<'_>,
    cfg: &StoreBenchConfig,
    mut progress: impl FnMut(&str),
) -> Result<Vec<StoreBenchRecord>, StoreBenchError> {
    if cfg.bytes == 0 || cfg.reps == 0 || cfg.shard_sizes.contains(&0) {
        return Err(StoreBenchError::Other(
            "--size, --reps and every shard size must be positive".into(),
        ));
    }
    if cfg.shard_sizes.iter().any(|&s| s > cfg.bytes) {
        return Err(StoreBenchError::Other(format!(
            "a shard size exceeds --size ({} bytes): no whole block fits",
            cfg.bytes
        )));
    }
    let load = super::announce_load(&mut progress);
    let fio = cfg.use_fio && fio_available();
    if cfg.use_fio && !fio {
        progress("fio not found: disk-path limits will be null");
    }
    let scratch = ucm_harness::scratch::Scratch::new(&cfg.dir, "bench-store")
        .map_err(|e| StoreBenchError::Other(format!("{}: {e}", cfg.dir.display())))?;
    let root = scratch.path().to_path_buf();
    let result = (|| {
        let mut out = Vec::new();
        for &shard_bytes in &cfg.shard_sizes {
            out.extend(run_size(
                dev,
                limit,
                cfg,
                &root,
                shard_bytes,
                fio,
                &mut progress,
            )?);
        }
        out.extend(run_lookups(cfg, &root, &mut progress)?);
        for r in &mut out {
            r.load_average = load;
        }
        Ok(out)
    })();
    drop(scratch);
    result
}

fn run_size<D: Device>(
    dev: &Arc<D>,
    limit: &PoolLimit<'_>,
    cfg: &StoreBenchConfig,
    root: &Path,
    shard_bytes: usize,
    fio: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<StoreBenchRecord>, StoreBenchError> {
    let Workload {
        geo,
        blocks,
        bytes,
        slots,
    } = workload(cfg, shard_bytes)?;
    let dir = root.join(format!("s{shard_bytes}"));
    progress(&format!(
        "store bench: {blocks} blocks x {} shards of {} KiB ({} MiB)",
        cfg.shards,
        shard_bytes >> 10,
        bytes >> 20
    ));
    let src = pattern_source(&**dev, bytes, SOURCE_SEED)?;
    let reps = cfg.reps.max(1);
    let fio_file = root.join("fio.dat");
    // fio on a file of the same size in the same directory tree, with the
    // same block size (the shard) at depth 32.
    let fio_run = |pattern| -> Result<Option<f64>, StoreBenchError> {
        if !fio {
            return Ok(None);
        }
        // fio's own figure: one job, so its runtime is its span.
        Ok(Some(
            run_fio(
                IoEngineKind::IoUring,
                &fio_file,
                pattern,
                shard_bytes,
                32,
                bytes as u64,
                false,
            )?
            .own,
        ))
    };
    let (mut dump, mut load_cold, mut warm, mut layerwise, mut memcpy) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut fio_w, mut fio_r) = (Vec::new(), Vec::new());
    let mut fs_syncs = None;
    let mut engine = None;
    let dst = dev.alloc_device(bytes)?;
    // Pre-fault the destination (the source is already written).
    limit(&dst, &src, bytes)?;
    // Before a checked load, the destination holds another pattern.
    let poison = |what: &str| -> Result<(), StoreBenchError> {
        fill_pattern(&**dev, &dst, bytes, SOURCE_SEED + 1)
            .map_err(|e| StoreBenchError::Other(format!("{what}: clearing: {e}")))
    };
    let check = |what: &str| check_pattern(&**dev, &dst, bytes, SOURCE_SEED, what);
    // The source's bytes in host memory, for the checksum rate: the
    // chunk `pattern_source` repeats.
    let host_copy: Vec<u8> = source_chunk(bytes, SOURCE_SEED)
        .into_iter()
        .cycle()
        .take(bytes)
        .collect();
    let mut crc = Vec::new();
    for rep in 0..reps {
        progress(&format!("round {}/{reps}", rep + 1));
        let rdir = dir.join(format!("r{rep}"));
        // dump_cold, against fio writing the same bytes (a new file).
        let st = open_store(dev, &rdir, geo, slots, cfg)?;
        let t = Instant::now();
        let h = st.dump(task(geo, blocks, &src, 0..cfg.shards), None)?;
        expect_ok(&h.wait(), "dump")?;
        if let Some((_, d)) = h
            .wait_durable()
            .into_iter()
            .find(|(_, d)| *d != ucm_store::Durability::Durable)
        {
            return Err(StoreBenchError::Other(format!("dump not durable: {d:?}")));
        }
        let ours = gib_s(bytes as u64, t.elapsed().as_secs_f64());
        dump.push(ours);
        fs_syncs = st
            .disk()
            .map(|d| d.stats().fs_syncs.load(Ordering::Relaxed));
        if rep == 0 {
            engine = st.disk().map(|d| d.engine_name());
            progress(&format!(
                "disk tier on the {} engine",
                engine.unwrap_or("no")
            ));
        }
        drop(st);
        let _ = std::fs::remove_file(&fio_file);
        let w = fio_run(Pattern::SeqWrite)?;
        fio_w.extend(w);
        progress(&format!("dump_cold: {ours:.3} GiB/s (fio {})", opt3(w)));

        // load_cold: a fresh store (empty pool), everything from disk.
        let st = open_store(dev, &rdir, geo, slots, cfg)?;
        if rep == 0 {
            poison("load_cold")?;
        }
        let t = Instant::now();
        expect_ok(
            &st.load(task(geo, blocks, &dst, 0..cfg.shards))?.wait(),
            "load_cold",
        )?;
        let ours = gib_s(bytes as u64, t.elapsed().as_secs_f64());
        if rep == 0 {
            check("load_cold")?;
        }
        load_cold.push(ours);
        let r = fio_run(Pattern::SeqRead)?;
        fio_r.extend(r);
        progress(&format!("load_cold: {ours:.3} GiB/s (fio {})", opt3(r)));

        // The memcpy limit of the pool paths (see the module).
        let m = limit(&dst, &src, bytes)?;
        memcpy.push(m);
        crc.push(crc_rate(&host_copy, shard_bytes)?);

        // load_warm: everything again, from the pool.
        let hits = st
            .stats()
            .pool_hits
            .load(std::sync::atomic::Ordering::Relaxed);
        if rep == 0 {
            poison("load_warm")?;
        }
        let t = Instant::now();
        expect_ok(
            &st.load(task(geo, blocks, &dst, 0..cfg.shards))?.wait(),
            "load_warm",
        )?;
        let ours = gib_s(bytes as u64, t.elapsed().as_secs_f64());
        let hit = st
            .stats()
            .pool_hits
            .load(std::sync::atomic::Ordering::Relaxed)
            - hits;
        if hit < (blocks * cfg.shards as usize) as u64 {
            return Err(StoreBenchError::Other(format!(
                "load_warm: {hit} of {} shards came from the pool",
                blocks * cfg.shards as usize
            )));
        }
        if rep == 0 {
            check("load_warm")?;
        }
        warm.push(ours);
        progress(&format!("load_warm: {ours:.3} GiB/s (memcpy {m:.3})"));

        // load_layerwise: one shard index at a time across all blocks.
        if rep == 0 {
            poison("load_layerwise")?;
        }
        let t = Instant::now();
        for s in 0..cfg.shards {
            expect_ok(
                &st.load(task(geo, blocks, &dst, s..s + 1))?.wait(),
                "load_layerwise",
            )?;
        }
        let ours = gib_s(bytes as u64, t.elapsed().as_secs_f64());
        if rep == 0 {
            check("load_layerwise")?;
        }
        layerwise.push(ours);
        progress(&format!("load_layerwise: {ours:.3} GiB/s (memcpy {m:.3})"));
        drop(st);
        let _ = std::fs::remove_dir_all(&rdir);
    }
    let _ = std::fs::remove_file(&fio_file);
    let mut dump_record = disk_record("dump_cold", shard_bytes, &dump, &fio_w, &memcpy, &crc);
    dump_record.sync_mode = Some(cfg.sync.to_string());
    dump_record.fs_syncs = fs_syncs;
    dump_record.engine = engine.map(str::to_string);
    let mut load_record = disk_record("load_cold", shard_bytes, &load_cold, &fio_r, &memcpy, &crc);
    load_record.engine = dump_record.engine.clone();
    Ok(vec![
        dump_record,
        load_record,
        record("load_warm", shard_bytes, &warm, &memcpy, false),
        record("load_layerwise", shard_bytes, &layerwise, &memcpy, false),
    ])
}

fn opt3(x: Option<f64>) -> String {
    x.map_or_else(|| "n/a".into(), |v| format!("{v:.3}"))
}

/// Ids a timed lookup pass covers at least: a pass of 10,000 ids in the
/// pool takes a few hundred microseconds, too short to time on a shared
/// machine, so each pass repeats the lookup until it has asked this many.
const PASS_IDS: usize = 1 << 20;

/// Lookups per second of `ours` and `base` (each looks up `n` ids per call)
/// over 5 interleaved passes of each, each pass as many calls as make up
/// `pass_ids` ids (at least one), so that one short pass on a shared
/// machine does not decide the ratio.
fn rates(
    n: usize,
    pass_ids: usize,
    mut ours: impl FnMut(),
    mut base: impl FnMut(),
) -> (Vec<f64>, Vec<f64>) {
    let calls = pass_ids.div_ceil(n.max(1)).max(1);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..calls {
            ours();
        }
        a.push((n * calls) as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for _ in 0..calls {
            base();
        }
        b.push((n * calls) as f64 / t.elapsed().as_secs_f64());
    }
    (a, b)
}

fn run_lookups(
    cfg: &StoreBenchConfig,
    root: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<StoreBenchRecord>, StoreBenchError> {
    let geo = Geometry {
        shard_bytes: 4096,
        shards_per_block: 1,
    };
    let total = cfg.lookups.max(10);
    let present = total - total / 10;
    let dev = Arc::new(HostDevice::new());
    let dir = root.join("lookup");
    let st = open_store(&dev, &dir, geo, 2 * total, cfg)?;
    let src = dev.alloc_device(present * 4096)?;
    let h = st.dump(task(geo, present, &src, 0..1), None)?;
    expect_ok(&h.wait(), "lookup setup")?;
    h.wait_durable();
    let ids: Vec<BlockId> = (0..total as u64).map(id).collect();

    // lookup_pool: ids the memory tier holds (an absent id is asked of the
    // disk tier too, which lookup_disk measures), against a hash set of the
    // same ids.
    let held = &ids[..present];
    let set: HashSet<BlockId> = held.iter().copied().collect();
    let (mut hits, mut base_hits) = (0, 0);
    let (ours, limit) = rates(
        present,
        PASS_IDS,
        || {
            hits = st.lookup(held).iter().filter(|&&p| p).count();
        },
        || {
            base_hits = held.iter().filter(|i| set.contains(*i)).count();
        },
    );
    if hits != present || base_hits != present {
        return Err(StoreBenchError::Other(format!(
            "lookup_pool found {hits} of {present}"
        )));
    }
    let mut out = vec![lookup_record(progress, "lookup_pool", &ours, &limit)];
    drop(st);

    // lookup_disk: a fresh store (a new process), empty pool: presence
    // from the files, each round in a store opened afresh; against raw
    // stats of the same files.
    let mut st = open_store(&dev, &dir, geo, 64, cfg)?;
    let disk = st
        .disk()
        .ok_or_else(|| StoreBenchError::Other("the lookup bench needs a disk tier".into()))?;
    let paths: Vec<PathBuf> = ids.iter().map(|i| disk.path_of(i)).collect();
    let file_len = disk.file_bytes();
    let (mut ours, mut limit) = (Vec::new(), Vec::new());
    let (mut hits, mut base_hits) = (0, 0);
    for round in 0..5 {
        if round > 0 {
            drop(st);
            st = open_store(&dev, &dir, geo, 64, cfg)?;
        }
        let t = Instant::now();
        hits = st.lookup(&ids).iter().filter(|&&p| p).count();
        ours.push(total as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        base_hits = raw_stats(&paths, file_len);
        limit.push(total as f64 / t.elapsed().as_secs_f64());
    }
    if hits != present || base_hits != present {
        return Err(StoreBenchError::Other(format!(
            "lookup_disk found {hits} of {present}"
        )));
    }
    out.push(lookup_record(progress, "lookup_disk", &ours, &limit));
    // lookup_disk_warm: the same store again: the ids it found are in its
    // presence summary (lazily invalidated), the absent ones are stat'ed.
    let (mut hits, mut base_hits) = (0, 0);
    // One call per pass: the baseline stats every file each time.
    let (ours, limit) = rates(
        total,
        total,
        || {
            hits = st.lookup(&ids).iter().filter(|&&p| p).count();
        },
        || {
            base_hits = raw_stats(&paths, file_len);
        },
    );
    if hits != present || base_hits != present {
        return Err(StoreBenchError::Other(format!(
            "lookup_disk_warm found {hits} of {present}"
        )));
    }
    out.push(lookup_record(progress, "lookup_disk_warm", &ours, &limit));
    Ok(out)
}

/// The raw batched `statx` baseline of the disk lookups: the same files'
/// metadata (links not followed) from paths built beforehand, split over
/// [`STORE_WORKERS`] threads; counts regular files of `len` bytes.
fn raw_stats(paths: &[PathBuf], len: u64) -> usize {
    let count = |part: &[PathBuf]| {
        part.iter()
            .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file() && m.len() == len))
            .count()
    };
    let per = paths.len().div_ceil(STORE_WORKERS).max(1);
    std::thread::scope(|s| {
        let others: Vec<_> = paths
            .chunks(per)
            .skip(1)
            .map(|c| s.spawn(move || count(c)))
            .collect();
        let mine = paths.chunks(per).next().map_or(0, count);
        mine + others
            .into_iter()
            .map(|h| h.join().unwrap_or(0))
            .sum::<usize>()
    })
}

fn lookup_record(
    progress: &mut dyn FnMut(&str),
    path: &str,
    ours: &[f64],
    limit: &[f64],
) -> StoreBenchRecord {
    let r = record(path, 4096, ours, limit, true);
    progress(&format!(
        "{path}: {} blocks/s (baseline {})",
        r.spread.text(0),
        r.limit_spread.unwrap_or_default().text(0)
    ));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_content_check_finds_a_wrong_byte() {
        let dev = HostDevice::new();
        let bytes = 3 * SOURCE_CHUNK + 5;
        let mem = pattern_source(&dev, bytes, 7).unwrap();
        check_pattern(&dev, &mem, bytes, 7, "t").unwrap();
        // Another pattern, and one flipped byte past the first chunk.
        assert!(check_pattern(&dev, &mem, bytes, 8, "t").is_err());
        let at = 2 * SOURCE_CHUNK + 3;
        let one = dev.alloc_pinned(1).unwrap();
        let s = dev.create_stream().unwrap();
        dev.copy_async(&s, &CopyRun::new(&one, 0, &mem, at, 1))
            .unwrap();
        dev.synchronize_stream(&s).unwrap();
        let mut b = [0u8; 1];
        one.read_host(0, &mut b).unwrap();
        one.write_host(0, &[b[0] ^ 1]).unwrap();
        dev.copy_async(&s, &CopyRun::new(&mem, at, &one, 0, 1))
            .unwrap();
        dev.synchronize_stream(&s).unwrap();
        let e = check_pattern(&dev, &mem, bytes, 7, "load_x").unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("load_x: wrong byte at offset {at}")),
            "{e}"
        );
    }

    #[test]
    fn a_small_store_bench_reports_every_path() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StoreBenchConfig {
            dir: dir.path().to_path_buf(),
            shard_sizes: vec![64 << 10],
            shards: 4,
            bytes: 4 << 20,
            use_fio: false,
            lookups: 200,
            reps: 2,
            engine: IoEngineKind::Auto,
            sync: SyncMode::Auto,
        };
        let recs = run(&cfg, |_| {}).unwrap();
        let paths: Vec<_> = recs.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "dump_cold",
                "load_cold",
                "load_warm",
                "load_layerwise",
                "lookup_pool",
                "lookup_disk",
                "lookup_disk_warm"
            ]
        );
        assert!(recs[..4].iter().all(|r| r.gib_s.is_some_and(|g| g > 0.0)));
        assert!(recs[4..]
            .iter()
            .all(|r| r.blocks_s.is_some_and(|b| b > 0.0) && r.ratio.is_some()));
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "cleaned up"
        );
    }
}
