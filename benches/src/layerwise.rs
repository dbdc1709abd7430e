//! `ucm bench layerwise`: how much of the load I/O the adapter hides
//! behind per-unit compute, on the host device ([`run`]) or any other
//! ([`run_on`]: the engine's KV regions in that device's memory, the pool
//! registered with it; `ucm bench layerwise --device cuda`).
//!
//! A one-group model of `units` layers is stored once (one request of
//! `blocks` blocks per layer). Each measurement reopens the stores (empty
//! pools: every unit comes from disk) and drives the adapter as an engine
//! would for a request that hits all of it: `start_load_kv`, then per layer
//! `wait_for_layer_load`, a simulated compute (a sleep: an accelerator's
//! compute does not take the host CPU) and `save_kv_layer`. First with no
//! compute, which gives the I/O per unit; then with compute set to that I/O
//! divided by each ratio.
//!
//! Per ratio: `exposed_io_ms` = wall time - the time the simulated compute
//! actually took (a sleep overshoots by ~0.1 ms); `ideal_exposed_ms`
//! = one unit's I/O (the first unit cannot overlap anything) + the I/O in
//! excess of compute for the others; `hidden_fraction` = (I/O - exposed) /
//! (I/O - ideal exposed), 1 when the overlap is perfect. Goal: >= 0.9
//! whenever the I/O per unit is at most the compute per unit.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::round_to;
use ucm_coordinator::adapter::{
    Allocation, EngineRequest, LayerRegistration, Scheduled, Scheduler, StoreSet, StoreSetConfig,
    UnitMap, Worker, WorkerConfig,
};
use ucm_coordinator::{CheckpointDirectory, CoordError, Deployment, RequestKeys, SpecTable};
use ucm_device::{Device, HostDevice, IoEngineKind};

/// What to measure.
#[derive(Clone, Debug)]
pub struct LayerwiseConfig {
    /// Store directory (removed afterwards).
    pub dir: PathBuf,
    /// Units (layers) of the model.
    pub units: u32,
    /// Blocks of 16 tokens loaded per unit.
    pub blocks: usize,
    /// Bytes per token per layer (a block is 16 of them).
    pub bytes_per_token: u64,
    /// I/O-to-compute ratios to run.
    pub ratios: Vec<f64>,
    /// Runs per ratio (the median counts; min and max are reported).
    pub reps: usize,
    /// Units loaded ahead.
    pub lookahead: usize,
    /// The stores' I/O engine.
    pub engine: IoEngineKind,
}

/// Where the bench's store goes by default: tmpfs `/dev/shm` where the
/// machine has it, else the temporary directory. The bench measures how
/// much of the I/O the pipeline hides, not the disk: on a virtual disk
/// whose speed drifts by tens of percent within seconds, the I/O measured
/// before the compute rounds is not the I/O during them (`--dir` measures
/// a disk all the same).
pub fn default_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

impl Default for LayerwiseConfig {
    fn default() -> Self {
        LayerwiseConfig {
            dir: default_dir(),
            units: 32,
            blocks: 64,
            bytes_per_token: 4096,
            ratios: vec![0.25, 0.5, 1.0, 2.0],
            reps: 5,
            lookahead: ucm_coordinator::adapter::DEFAULT_LOOKAHEAD,
            engine: IoEngineKind::Auto,
        }
    }
}

/// One record per ratio.
#[derive(Clone, Debug, Serialize)]
pub struct LayerwiseRecord {
    /// I/O per unit, measured with no compute.
    pub io_per_unit_ms: f64,
    /// Simulated compute per unit.
    pub compute_per_unit_ms: f64,
    /// Wall time not covered by compute.
    pub exposed_io_ms: f64,
    /// The least exposure possible.
    pub ideal_exposed_ms: f64,
    /// Share of the hideable I/O that was hidden (from the medians).
    pub hidden_fraction: f64,
    /// The rounds of the I/O per unit (ms): median, min, max.
    pub io_spread: super::Spread,
    /// The rounds of the exposed time (ms) at this ratio.
    pub exposed_spread: super::Spread,
    /// The hidden fraction each round's exposure would give: min, max.
    pub hidden_spread: super::Spread,
    /// The machine's 1-minute load average when the bench started.
    pub load_average: Option<f64>,
}

/// Errors of the bench.
#[derive(Debug, thiserror::Error)]
pub enum LayerwiseError {
    /// The adapter or a store failed.
    #[error(transparent)]
    Coord(#[from] CoordError),
    /// The host device failed.
    #[error(transparent)]
    Device(#[from] ucm_device::DeviceError),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

struct Model<D: Device> {
    spec: Arc<SpecTable>,
    units: Arc<UnitMap>,
    dev: Arc<D>,
    tokens: Arc<Vec<u32>>,
    /// Each layer's KV region, allocated and touched once, as an engine
    /// allocates its KV cache at start-up: a region allocated per round
    /// would put its first-touch page faults inside the timed loads.
    layers: Vec<ucm_device::Memory>,
}

fn open<D: Device>(
    m: &Model<D>,
    dir: &Path,
    cfg: &LayerwiseConfig,
) -> Result<(Arc<StoreSet<D>>, Arc<CheckpointDirectory>), LayerwiseError> {
    let stores = StoreSet::open(
        &m.spec,
        &m.units,
        dir,
        Arc::clone(&m.dev),
        &StoreSetConfig {
            pool_slots: cfg.blocks * cfg.units as usize * 2,
            engine: cfg.engine,
            ..StoreSetConfig::default()
        },
    )?;
    Ok((Arc::new(stores), Arc::new(CheckpointDirectory::new())))
}

/// Drives one request through one step; returns (wall time, time spent
/// in the simulated compute, matched).
fn drive<D: Device>(
    m: &Model<D>,
    dir: &Path,
    cfg: &LayerwiseConfig,
    id: &str,
    compute: Duration,
) -> Result<(Duration, Duration, u64), LayerwiseError> {
    let (stores, directory) = open(m, dir, cfg)?;
    let mut sched = Scheduler::new(
        Arc::clone(&m.spec),
        Deployment { tp_size: 1 },
        Arc::clone(&stores),
        Arc::clone(&directory),
    );
    let mut worker = Worker::new(
        Arc::clone(&m.spec),
        Arc::clone(&m.units),
        Arc::clone(&stores),
        directory,
        Arc::clone(&m.dev),
        WorkerConfig::new(0, 1, 0..cfg.units, cfg.lookahead),
    )?;
    let stride = stores.shard_bytes(0);
    let regs = (0..cfg.units)
        .zip(&m.layers)
        .map(|(l, memory)| LayerRegistration {
            layer: l,
            memory: memory.clone(),
            stride,
        })
        .collect();
    worker.register_kv_caches(regs)?;
    let req = EngineRequest {
        id: id.into(),
        tokens: Arc::clone(&m.tokens),
        keys: RequestKeys::default(),
    };
    let (matched, _) = sched.get_num_new_matched_tokens(&req, 0)?;
    let mut alloc = Allocation::default();
    alloc.blocks.insert(0, (0..=cfg.blocks as u32).collect());
    sched.update_state_after_alloc(id, alloc, matched)?;
    let meta = sched.build_meta(&[Scheduled {
        req: id.into(),
        start: matched,
        end: m.tokens.len() as u64,
    }])?;
    let t = Instant::now();
    worker.start_load_kv(meta)?;
    let mut computed = Duration::ZERO;
    for l in 0..cfg.units {
        worker.wait_for_layer_load(l)?;
        if !compute.is_zero() {
            // The compute actually taken (a sleep overshoots a little) is
            // what the I/O may hide behind.
            let c = Instant::now();
            std::thread::sleep(compute);
            computed += c.elapsed();
        }
        worker.save_kv_layer(l, None)?;
    }
    let wall = t.elapsed();
    worker.wait_for_save()?;
    let errors = worker.block_ids_with_load_errors();
    if !errors.is_empty() {
        return Err(LayerwiseError::Other(format!(
            "{} load errors",
            errors.len()
        )));
    }
    // Wait until saves are on disk before the stores close.
    for _ in 0..1000 {
        let f = worker.get_finished(&[id.to_string()]);
        if !f.save_failed.is_empty() {
            return Err(LayerwiseError::Other(format!(
                "save failed: {:?}",
                f.save_failed
            )));
        }
        if f.saved.iter().any(|r| r == id) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok((wall, computed, matched))
}

/// Runs the bench on the host device.
pub fn run(
    cfg: &LayerwiseConfig,
    progress: impl FnMut(&str),
) -> Result<Vec<LayerwiseRecord>, LayerwiseError> {
    run_on(Arc::new(HostDevice::new()), cfg, progress)
}

/// Runs the bench with the engine's KV regions in `dev`'s memory: the
/// loads go from the pool (registered with `dev`) into device memory, the
/// saves out of it. The per-unit compute stays a host sleep, standing for
/// an accelerator's compute, which does not take the host's cores.
pub fn run_on<D: Device>(
    dev: Arc<D>,
    cfg: &LayerwiseConfig,
    mut progress: impl FnMut(&str),
) -> Result<Vec<LayerwiseRecord>, LayerwiseError> {
    if cfg.units == 0 || cfg.blocks == 0 || cfg.reps == 0 || cfg.ratios.iter().any(|r| *r <= 0.0) {
        return Err(LayerwiseError::Other(
            "units, blocks, reps and ratios must be positive".into(),
        ));
    }
    let toml = format!(
        "model = \"layerwise-bench\"\n[[group]]\nname = \"kv\"\nkind = \"chain\"\nblock_size = 16\nlayers = \"0-{}\"\nbytes_per_token = {}\n",
        cfg.units - 1,
        cfg.bytes_per_token
    );
    let spec = Arc::new(SpecTable::from_toml(&toml)?);
    let layer_bytes = usize::try_from(cfg.bytes_per_token)
        .ok()
        .and_then(|b| b.checked_mul(16 * (cfg.blocks + 1)))
        .ok_or_else(|| LayerwiseError::Other("a layer's KV region is too large".into()))?;
    let layers = (0..cfg.units)
        .map(|_| {
            let mem = dev.alloc_device(layer_bytes)?;
            ucm_device::conformance::upload(&*dev, &mem, 0, &vec![0u8; layer_bytes])?;
            Ok(mem)
        })
        .collect::<Result<Vec<_>, ucm_device::DeviceError>>()?;
    let m = Model {
        units: Arc::new(UnitMap::new(&spec)),
        spec,
        dev,
        tokens: Arc::new((0..cfg.blocks as u32 * 16 + 1).collect()),
        layers,
    };
    let load = super::announce_load(&mut progress);
    progress(&format!(
        "layerwise: lookahead {} unit(s), store in {}",
        cfg.lookahead,
        cfg.dir.display()
    ));
    let scratch = ucm_harness::scratch::Scratch::new(&cfg.dir, "bench-layerwise")
        .map_err(|e| LayerwiseError::Other(format!("{}: {e}", cfg.dir.display())))?;
    let dir = scratch.path().to_path_buf();
    let result = (|| {
        progress(&format!(
            "layerwise: storing {} units x {} blocks of {} KiB",
            cfg.units,
            cfg.blocks,
            (cfg.bytes_per_token * 16) >> 10
        ));
        // Each layer stores its own pattern; the regions are cleared
        // before the loads, and the first load must bring every byte back.
        let stored = layer_bytes - 16 * cfg.bytes_per_token as usize;
        for (l, mem) in m.layers.iter().enumerate() {
            let p = ucm_device::conformance::pattern(l as u64 + 1, stored);
            ucm_device::conformance::upload(&*m.dev, mem, 0, &p)?;
        }
        let (_, _, matched) = drive(&m, &dir, cfg, "store", Duration::ZERO)?;
        if matched != 0 {
            return Err(LayerwiseError::Other("the store was not empty".into()));
        }
        for mem in &m.layers {
            ucm_device::conformance::upload(&*m.dev, mem, 0, &vec![0u8; stored])?;
        }
        let io: Vec<f64> = (0..cfg.reps)
            .map(|i| {
                let (wall, _, matched) = drive(&m, &dir, cfg, &format!("io{i}"), Duration::ZERO)?;
                if matched == 0 {
                    return Err(LayerwiseError::Other(
                        "the stored request did not hit".into(),
                    ));
                }
                if i == 0 {
                    check_layers(&m, stored)?;
                }
                Ok(wall.as_secs_f64() * 1e3 / f64::from(cfg.units))
            })
            .collect::<Result<_, LayerwiseError>>()?;
        let io_spread = super::Spread::of(&io);
        let io = io_spread.median;
        progress(&format!("layerwise: I/O per unit {} ms", io_spread.text(3)));
        let mut out = Vec::new();
        for &r in &cfg.ratios {
            let compute_ms = io / r;
            let compute = Duration::from_secs_f64(compute_ms / 1e3);
            let mut exposed = Vec::new();
            for i in 0..cfg.reps {
                let (wall, computed, _) = drive(&m, &dir, cfg, &format!("r{r}-{i}"), compute)?;
                let ms = (wall.as_secs_f64() - computed.as_secs_f64()) * 1e3;
                exposed.push(ms.max(0.0));
            }
            let exposed_spread = super::Spread::of(&exposed);
            let n = f64::from(cfg.units);
            let total = io * n;
            let ideal = io + (n - 1.0) * (io - compute_ms).max(0.0);
            let hidden_of = |exposed: f64| {
                if total > ideal {
                    ((total - exposed) / (total - ideal)).clamp(0.0, 1.0)
                } else {
                    1.0
                }
            };
            let hidden_spread =
                super::Spread::of(&exposed.iter().map(|&e| hidden_of(e)).collect::<Vec<_>>());
            let exposed = exposed_spread.median;
            let hidden = hidden_of(exposed);
            progress(&format!(
                "layerwise: io/compute {r}: exposed {} ms (ideal {ideal:.2}), hidden {hidden:.3} (rounds {:.3}-{:.3})",
                exposed_spread.text(2),
                hidden_spread.min,
                hidden_spread.max
            ));
            out.push(LayerwiseRecord {
                io_per_unit_ms: round_to(io, 4),
                compute_per_unit_ms: round_to(compute_ms, 4),
                exposed_io_ms: round_to(exposed, 4),
                ideal_exposed_ms: round_to(ideal, 4),
                hidden_fraction: round_to(hidden, 4),
                io_spread: io_spread.rounded(4),
                exposed_spread: exposed_spread.rounded(4),
                hidden_spread: hidden_spread.rounded(4),
                load_average: load,
            });
        }
        Ok(out)
    })();
    drop(scratch);
    result
}

/// Every layer's region holds the pattern it stored, byte for byte.
fn check_layers<D: Device>(m: &Model<D>, stored: usize) -> Result<(), LayerwiseError> {
    for (l, mem) in m.layers.iter().enumerate() {
        let got = ucm_device::conformance::download(&*m.dev, mem, 0, stored)?;
        let want = ucm_device::conformance::pattern(l as u64 + 1, stored);
        if let Some(at) = got.iter().zip(&want).position(|(a, b)| a != b) {
            return Err(LayerwiseError::Other(format!(
                "layer {l}: the loaded bytes differ from the stored ones at byte {at}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_reports_every_ratio() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = LayerwiseConfig {
            dir: dir.path().to_path_buf(),
            units: 4,
            blocks: 4,
            bytes_per_token: 256,
            ratios: vec![0.5, 2.0],
            reps: 1,
            ..LayerwiseConfig::default()
        };
        let recs = run(&cfg, |_| {}).unwrap();
        assert_eq!(recs.len(), 2);
        assert!(recs
            .iter()
            .all(|r| r.io_per_unit_ms > 0.0 && (0.0..=1.0).contains(&r.hidden_fraction)));
        assert!((recs[0].compute_per_unit_ms - 2.0 * recs[0].io_per_unit_ms).abs() < 1e-3);
        let bad = LayerwiseConfig { units: 0, ..cfg };
        assert!(run(&bad, |_| {}).is_err());
    }
}
