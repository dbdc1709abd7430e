//! `ucm bench store --remote URL` / `--cold URL`: the tiers below the disk,
//! each path against the same path without them, in the same run.
//!
//! For each shard size, `blocks x shards` of it (`--size`), per round, in a
//! namespace of the round's own:
//! - `dump_tiers`: dump everything and wait until durable, with the tiers
//!   below the disk (a block is durable once on disk and written to each
//!   tier); limit: the same dump to disk only;
//! - `load_tiers`: another instance (its own empty pool and disk) loads
//!   everything, from the nearest tier that holds it; every byte is
//!   compared with what was dumped (outside the timing); limit: a cold load
//!   from the local disk (a fresh pool over the disk-only store);
//! - `lookup_tiers`: a third instance (empty pool and disk) looks up every
//!   id (blocks per second; no limit).
//!
//! The round's blocks are deleted from the tiers afterwards. Figures from
//! a local test server (moto) measure UCM's overhead and that server, not
//! a production store.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ucm_device::{CopyRun, Device, HostDevice, Memory};
use ucm_store::{BlockId, BlockStore, RemoteConfig, RemoteTier, TieredBlockStore};

use super::gib_s;
use super::store::{
    expect_ok, id, open_store, open_store_with, pattern_source, record, task, workload,
    StoreBenchConfig, StoreBenchError, Workload,
};

fn open_tiered(
    dev: &Arc<HostDevice>,
    dir: &Path,
    w: &Workload,
    cfg: &StoreBenchConfig,
    urls: &[String],
    ns: &str,
) -> Result<TieredBlockStore<HostDevice>, StoreBenchError> {
    let mut tiers = Vec::new();
    for u in urls {
        let mut rc = RemoteConfig::from_url(u, ns, w.geo)?;
        rc.timeout = Duration::from_secs(10);
        tiers.push(RemoteTier::new(rc)?);
    }
    open_store_with(
        dev,
        dir,
        w.geo,
        w.slots,
        cfg,
        tiers,
        Duration::from_secs(30),
    )
}

fn durable(h: &ucm_store::TaskHandle, what: &str) -> Result<(), StoreBenchError> {
    match h
        .wait_durable()
        .into_iter()
        .find(|(_, d)| *d != ucm_store::Durability::Durable)
    {
        None => Ok(()),
        Some((_, d)) => Err(StoreBenchError::Other(format!(
            "{what}: not durable: {d:?}"
        ))),
    }
}

fn host_copy(dev: &HostDevice, mem: &Memory, bytes: usize) -> Result<Vec<u8>, StoreBenchError> {
    let host = dev.alloc_pinned(bytes)?;
    let s = dev.create_stream()?;
    dev.copy_async(&s, &CopyRun::new(&host, 0, mem, 0, bytes))?;
    dev.synchronize_stream(&s)?;
    let mut v = vec![0u8; bytes];
    host.read_host(0, &mut v)?;
    Ok(v)
}

/// Runs the tier paths for every shard size, below a scratch directory of
/// `cfg.dir`.
pub fn run(
    cfg: &StoreBenchConfig,
    urls: &[String],
    mut progress: impl FnMut(&str),
) -> Result<Vec<super::store::StoreBenchRecord>, StoreBenchError> {
    if urls.is_empty() {
        return Err(StoreBenchError::Other(
            "the tier bench needs --remote or --cold".into(),
        ));
    }
    if cfg.bytes == 0 || cfg.reps == 0 || cfg.shard_sizes.contains(&0) {
        return Err(StoreBenchError::Other(
            "--size, --reps and every shard size must be positive".into(),
        ));
    }
    let load = super::announce_load(&mut progress);
    let scratch = ucm_harness::scratch::Scratch::new(&cfg.dir, "bench-tiers")
        .map_err(|e| StoreBenchError::Other(format!("{}: {e}", cfg.dir.display())))?;
    let root = scratch.path().to_path_buf();
    let mut out = Vec::new();
    for &shard_bytes in &cfg.shard_sizes {
        out.extend(run_size(cfg, urls, &root, shard_bytes, &mut progress)?);
    }
    for r in &mut out {
        r.load_average = load;
    }
    drop(scratch);
    Ok(out)
}

fn run_size(
    cfg: &StoreBenchConfig,
    urls: &[String],
    root: &Path,
    shard_bytes: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<super::store::StoreBenchRecord>, StoreBenchError> {
    let w = workload(cfg, shard_bytes)?;
    let (geo, blocks, bytes, slots) = (w.geo, w.blocks, w.bytes, w.slots);
    let dev = Arc::new(HostDevice::new());
    progress(&format!(
        "tier bench: {blocks} blocks x {} shards of {} KiB ({} MiB) below the disk: {}",
        cfg.shards,
        shard_bytes >> 10,
        bytes >> 20,
        urls.join(" then ")
    ));
    let src = pattern_source(&*dev, bytes, 13)?;
    let expected = host_copy(&dev, &src, bytes)?;
    let dst = dev.alloc_device(bytes)?;
    let ids: Vec<BlockId> = (0..blocks as u64).map(id).collect();
    let (mut dump, mut dump_disk, mut load, mut load_disk, mut lookup) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for rep in 0..cfg.reps {
        let ns = format!("bench-{}-{rep}-{shard_bytes}", std::process::id());
        let dir = root.join(format!("s{shard_bytes}-r{rep}"));
        // dump_tiers, then the same dump to disk only.
        let a = open_tiered(&dev, &dir.join("a"), &w, cfg, urls, &ns)?;
        let t = Instant::now();
        let h = a.dump(task(geo, blocks, &src, 0..cfg.shards), None)?;
        expect_ok(&h.wait(), "dump_tiers")?;
        durable(&h, "dump_tiers")?;
        let ours = gib_s(bytes as u64, t.elapsed().as_secs_f64());
        dump.push(ours);
        let written: u64 = a
            .remotes()
            .iter()
            .map(|r| r.stats().written.load(std::sync::atomic::Ordering::Relaxed))
            .min()
            .unwrap_or(0);
        if written < blocks as u64 {
            return Err(StoreBenchError::Other(format!(
                "dump_tiers: only {written} of {blocks} blocks reached every tier"
            )));
        }
        let d = open_store(&dev, &dir.join("d"), geo, slots, cfg)?;
        let t = Instant::now();
        let h = d.dump(task(geo, blocks, &src, 0..cfg.shards), None)?;
        expect_ok(&h.wait(), "dump_disk")?;
        durable(&h, "dump_disk")?;
        let base = gib_s(bytes as u64, t.elapsed().as_secs_f64());
        dump_disk.push(base);
        drop(d);
        progress(&format!(
            "round {}/{}: dump_tiers {ours:.3} GiB/s (disk only {base:.3})",
            rep + 1,
            cfg.reps
        ));
        // load_tiers from another instance, then a cold disk load.
        let b = open_tiered(&dev, &dir.join("b"), &w, cfg, urls, &ns)?;
        let t = Instant::now();
        expect_ok(
            &b.load(task(geo, blocks, &dst, 0..cfg.shards))?.wait(),
            "load_tiers",
        )?;
        let ours = gib_s(bytes as u64, t.elapsed().as_secs_f64());
        load.push(ours);
        if host_copy(&dev, &dst, bytes)? != expected {
            return Err(StoreBenchError::Other(
                "load_tiers: the bytes loaded are not the bytes dumped".into(),
            ));
        }
        drop(b);
        let d = open_store(&dev, &dir.join("d"), geo, slots, cfg)?;
        let t = Instant::now();
        expect_ok(
            &d.load(task(geo, blocks, &dst, 0..cfg.shards))?.wait(),
            "load_disk",
        )?;
        let base = gib_s(bytes as u64, t.elapsed().as_secs_f64());
        load_disk.push(base);
        drop(d);
        // lookup_tiers from a third instance.
        let c = open_tiered(&dev, &dir.join("c"), &w, cfg, urls, &ns)?;
        let t = Instant::now();
        let found = c.lookup(&ids);
        let rate = ids.len() as f64 / t.elapsed().as_secs_f64();
        if found.iter().any(|f| !f) {
            return Err(StoreBenchError::Other(
                "lookup_tiers: a dumped block was not found".into(),
            ));
        }
        lookup.push(rate);
        progress(&format!(
            "round {}/{}: load_tiers {ours:.3} GiB/s (cold disk {base:.3}), lookup {rate:.0} blk/s",
            rep + 1,
            cfg.reps
        ));
        for r in a.remotes() {
            for chunk in ids.chunks(256) {
                let _ = r.delete(chunk);
            }
        }
        drop((a, c));
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(vec![
        record("dump_tiers", shard_bytes, &dump, &dump_disk, false),
        record("load_tiers", shard_bytes, &load, &load_disk, false),
        record("lookup_tiers", shard_bytes, &lookup, &[], true),
    ])
}
