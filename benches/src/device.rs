//! `ucm bench device`: copy throughput through the `Device` trait against
//! the backend's raw copy path, measured in the same run.
//!
//! Cases (one JSON record each, `{"case","gib_s","limit_gib_s","ratio",
//! "spread","limit_spread","load_average"}`: medians over the rounds, the
//! ratio of the medians, each side's median, min and max):
//! - `h2d_pinned`, `d2h_pinned`: chunked async copies between pinned and
//!   device memory through the trait, against the backend's raw copy loop
//!   of the same bytes (memcpy on the host device, `aclrtMemcpyAsync`
//!   straight through the FFI on Ascend). Goal: ratio >= 0.9.
//! - `scatter_64k`: one batched copy of 64 KiB runs to scattered device
//!   offsets, against one contiguous copy of the same bytes through the
//!   trait. Goal: ratio >= 0.8.
//! - `layerwise` (where the backend has a compute kernel, or a host
//!   stand-in): per layer, an H2D load on one stream and the layer's compute
//!   on another, ordered by events with one layer of lookahead. `gib_s` is
//!   the load rate in the pipeline, `limit_gib_s` the rate if I/O and compute
//!   overlapped perfectly, and `hidden_io_fraction` the share of the I/O time
//!   hidden behind compute.

use std::time::Instant;

use serde::Serialize;
use ucm_device::{CopyRun, Device, DeviceError, Memory};

use super::{gib_s, median, round_to, Paired, Spread};

/// What to measure.
#[derive(Clone, Copy, Debug)]
pub struct DeviceBenchConfig {
    /// Bytes per copy case.
    pub bytes: usize,
    /// Chunk of the chunked copies (H2D / D2H).
    pub chunk: usize,
    /// Runs per case, interleaved with the baseline; medians are reported.
    pub reps: usize,
}

impl Default for DeviceBenchConfig {
    fn default() -> Self {
        DeviceBenchConfig {
            bytes: 256 << 20,
            chunk: 4 << 20,
            reps: 5,
        }
    }
}

/// One record of `ucm bench device --json`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DeviceBenchRecord {
    /// The case.
    pub case: String,
    /// Ours, median GiB/s.
    pub gib_s: f64,
    /// The baseline, median GiB/s.
    pub limit_gib_s: f64,
    /// The median of the per-round ratios (`paired`).
    pub ratio: f64,
    /// Ours over the baseline round by round, their median and quartiles.
    pub paired: Paired,
    /// Layerwise case only: the share of I/O time hidden behind compute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden_io_fraction: Option<f64>,
    /// Ours over the rounds (GiB/s): median, min, max.
    pub spread: Spread,
    /// The baseline over the rounds (GiB/s).
    pub limit_spread: Spread,
    /// The machine's 1-minute load average at the start of the bench.
    pub load_average: Option<f64>,
    /// How batched copies reached the device (`kernel`, `batch_api`,
    /// `per_run`), where the backend has several paths.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy_path: Option<String>,
}

/// The backend's raw copy path: copies `len` bytes `src -> dst` and returns
/// when they are there.
pub type RawCopy<'a> = dyn Fn(&Memory, &Memory, usize) -> Result<(), DeviceError> + 'a;

fn timed(f: impl FnOnce() -> Result<(), DeviceError>, bytes: usize) -> Result<f64, DeviceError> {
    let t = Instant::now();
    f()?;
    Ok(gib_s(bytes as u64, t.elapsed().as_secs_f64()))
}

fn chunked<D: Device>(
    dev: &D,
    s: &D::Stream,
    dst: &Memory,
    src: &Memory,
    cfg: &DeviceBenchConfig,
) -> Result<(), DeviceError> {
    let mut off = 0;
    while off < cfg.bytes {
        let n = cfg.chunk.min(cfg.bytes - off);
        dev.copy_async(s, &CopyRun::new(dst, off, src, off, n))?;
        off += n;
    }
    dev.synchronize_stream(s)
}

fn record(case: &str, ours: &[f64], limit: &[f64], load: Option<f64>) -> DeviceBenchRecord {
    let (g, l) = (Spread::of(ours), Spread::of(limit));
    let paired = Paired::of(ours, limit, 3);
    DeviceBenchRecord {
        case: case.to_string(),
        gib_s: round_to(g.median, 3),
        limit_gib_s: round_to(l.median, 3),
        ratio: paired.median,
        paired,
        hidden_io_fraction: None,
        copy_path: None,
        spread: g.rounded(3),
        limit_spread: l.rounded(3),
        load_average: load,
    }
}

/// Runs every case on `dev`, with `raw` as the H2D / D2H baseline.
pub fn run<D: Device>(
    dev: &D,
    raw: &RawCopy<'_>,
    cfg: &DeviceBenchConfig,
    mut progress: impl FnMut(&str),
) -> Result<Vec<DeviceBenchRecord>, DeviceError> {
    if cfg.reps == 0 || cfg.bytes < (64 << 10) || cfg.chunk == 0 {
        return Err(DeviceError::InvalidArgument(
            "bench device needs reps >= 1, at least 64 KiB and a non-zero chunk".into(),
        ));
    }
    let load = super::announce_load(&mut progress);
    let bytes = cfg.bytes / (64 << 10) * (64 << 10);
    let cfg = DeviceBenchConfig { bytes, ..*cfg };
    let host = dev.alloc_pinned(bytes)?;
    host.write_host(0, &ucm_device::conformance::pattern(7, bytes))?;
    let dmem = dev.alloc_device(bytes * 2)?;
    let s = dev.create_stream()?;
    let mut out = Vec::new();

    for (case, dst, src) in [("h2d_pinned", &dmem, &host), ("d2h_pinned", &host, &dmem)] {
        let (mut ours, mut limit) = (Vec::new(), Vec::new());
        for rep in 0..cfg.reps {
            // Alternate who goes first.
            if rep % 2 == 0 {
                ours.push(timed(|| chunked(dev, &s, dst, src, &cfg), bytes)?);
            }
            limit.push(timed(|| raw(dst, src, bytes), bytes)?);
            if rep % 2 == 1 {
                ours.push(timed(|| chunked(dev, &s, dst, src, &cfg), bytes)?);
            }
        }
        let r = record(case, &ours, &limit, load);
        progress(&format!(
            "{case}: {:.3} GiB/s vs raw {:.3} GiB/s (ratio {:.2})",
            r.gib_s, r.limit_gib_s, r.ratio
        ));
        out.push(r);
    }

    let run = 64 << 10;
    let n = bytes / run;
    let scatter: Vec<CopyRun<'_>> = (0..n)
        .map(|i| CopyRun::new(&dmem, ((i * 7919) % n) * 2 * run, &host, i * run, run))
        .collect();
    let (mut ours, mut limit) = (Vec::new(), Vec::new());
    for rep in 0..cfg.reps {
        let contiguous = || {
            dev.copy_async(&s, &CopyRun::new(&dmem, 0, &host, 0, bytes))?;
            dev.synchronize_stream(&s)
        };
        let scattered = || {
            dev.copy_batch_async(&s, &scatter)?;
            dev.synchronize_stream(&s)
        };
        if rep % 2 == 0 {
            ours.push(timed(scattered, bytes)?);
        }
        limit.push(timed(contiguous, bytes)?);
        if rep % 2 == 1 {
            ours.push(timed(scattered, bytes)?);
        }
    }
    let r = record("scatter_64k", &ours, &limit, load);
    progress(&format!(
        "scatter_64k: {:.3} GiB/s vs contiguous {:.3} GiB/s (ratio {:.2})",
        r.gib_s, r.limit_gib_s, r.ratio
    ));
    out.push(r);
    Ok(out)
}

/// One layer's compute, queued on a stream; the `u32` scales its duration.
pub type Compute<'a, S> = dyn Fn(&S, u32) -> Result<(), DeviceError> + 'a;

/// The layerwise case: `layers` loads of `layer_bytes` overlapped with as
/// many computes, calibrated so one compute takes about one load.
pub fn layerwise<D: Device>(
    dev: &D,
    compute: &Compute<'_, D::Stream>,
    layers: usize,
    layer_bytes: usize,
    reps: usize,
) -> Result<DeviceBenchRecord, DeviceError> {
    if layers < 2 || layer_bytes == 0 || reps == 0 {
        return Err(DeviceError::InvalidArgument(
            "layerwise needs at least 2 layers, a layer size and 1 repetition".into(),
        ));
    }
    let total = layers * layer_bytes;
    let host = dev.alloc_pinned(total)?;
    let dmem = dev.alloc_device(total)?;
    let (load, comp) = (dev.create_stream()?, dev.create_stream()?);
    let loaded: Vec<D::Event> = (0..layers)
        .map(|_| dev.create_event())
        .collect::<Result<_, _>>()?;
    let computed: Vec<D::Event> = (0..layers)
        .map(|_| dev.create_event())
        .collect::<Result<_, _>>()?;
    let secs = |f: &dyn Fn() -> Result<(), DeviceError>| -> Result<f64, DeviceError> {
        let t = Instant::now();
        f()?;
        Ok(t.elapsed().as_secs_f64())
    };
    let load_layer = |k: usize| {
        dev.copy_async(
            &load,
            &CopyRun::new(&dmem, k * layer_bytes, &host, k * layer_bytes, layer_bytes),
        )
    };
    // Calibrate: scale the compute so that one layer's compute ~ one load.
    // The first load and the first launch are warm-ups (first touch of the
    // memory; the kernel's module load and JIT): timing them made one
    // layer's compute a fraction of a load on a GPU, so nothing was left to
    // hide, or, with a slow first copy, many seconds per layer.
    let one_load = {
        load_layer(0)?;
        dev.synchronize_stream(&load)?;
        let t: Vec<f64> = (0..3)
            .map(|_| {
                secs(&|| {
                    load_layer(0)?;
                    dev.synchronize_stream(&load)
                })
            })
            .collect::<Result<_, _>>()?;
        median(&t)
    };
    let iters = calibrate(
        |n| {
            secs(&|| {
                compute(&comp, n)?;
                dev.synchronize_stream(&comp)
            })
        },
        one_load,
    )?;

    let (mut t_io, mut t_c, mut t_pipe) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        t_io.push(secs(&|| {
            (0..layers).try_for_each(load_layer)?;
            dev.synchronize_stream(&load)
        })?);
        t_c.push(secs(&|| {
            (0..layers).try_for_each(|_| compute(&comp, iters))?;
            dev.synchronize_stream(&comp)
        })?);
        t_pipe.push(secs(&|| {
            for k in 0..layers {
                if k >= 2 {
                    // One layer of lookahead: load k once compute k-2 is done.
                    dev.stream_wait_event(&load, &computed[k - 2])?;
                }
                load_layer(k)?;
                dev.record_event(&loaded[k], &load)?;
                dev.stream_wait_event(&comp, &loaded[k])?;
                compute(&comp, iters)?;
                dev.record_event(&computed[k], &comp)?;
            }
            dev.synchronize_stream(&load)?;
            dev.synchronize_stream(&comp)
        })?);
    }
    let (io, c) = (median(&t_io), median(&t_c));
    let hidden = ((io + c - median(&t_pipe)) / io.max(1e-12)).clamp(0.0, 1.0);
    // Per round: the pipeline's load rate, and the rate of perfect overlap.
    let rate = |t: &[f64]| -> Vec<f64> { t.iter().map(|&x| gib_s(total as u64, x)).collect() };
    let ideal: Vec<f64> = t_io.iter().zip(&t_c).map(|(a, b)| a.max(*b)).collect();
    let mut r = record(
        "layerwise",
        &rate(&t_pipe),
        &rate(&ideal),
        super::load_average(),
    );
    r.hidden_io_fraction = Some(round_to(hidden, 3));
    Ok(r)
}

/// The first iteration count [`calibrate`] times.
const CALIBRATE_START: u32 = 64;
/// At most this many timed launches after the warm-up.
const CALIBRATE_STEPS: usize = 12;
/// The largest iteration count.
const CALIBRATE_MAX: u32 = 1 << 24;

/// The iteration count at which one launch of a compute stand-in takes
/// about `target` seconds. `measure(n)` runs one launch of `n` iterations
/// and returns its seconds.
///
/// The first launch is a warm-up, never used: it carries one-time costs
/// (a kernel module's load and JIT, first touches). Then the count grows
/// fourfold from [`CALIBRATE_START`] until a launch takes at least a
/// quarter of the target, and the count is interpolated linearly between
/// the last two launches (a launch costs a fixed overhead plus a part
/// proportional to the count). No launch runs much past the target, and
/// at most [`CALIBRATE_STEPS`] are timed, so calibrating costs about two
/// targets whatever the device.
pub fn calibrate<E>(mut measure: impl FnMut(u32) -> Result<f64, E>, target: f64) -> Result<u32, E> {
    measure(CALIBRATE_START)?;
    let mut n = CALIBRATE_START;
    let mut t = measure(n)?;
    let mut prev: Option<(u32, f64)> = None;
    for _ in 1..CALIBRATE_STEPS {
        if t >= target / 4.0 || n >= CALIBRATE_MAX {
            break;
        }
        prev = Some((n, t));
        n = n.saturating_mul(4).min(CALIBRATE_MAX);
        t = measure(n)?;
    }
    let est = match prev {
        // Linear through the last two points: t = t0 + slope * (k - n0).
        Some((n0, t0)) if t > t0 => {
            let slope = (t - t0) / f64::from(n - n0);
            f64::from(n0) + (target - t0) / slope
        }
        // One point, or noise: proportional to the last.
        _ => f64::from(n) * target / t.max(1e-12),
    };
    Ok(est.round().clamp(1.0, f64::from(CALIBRATE_MAX)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ucm_device::HostDevice;

    #[test]
    fn host_device_bench_reports_every_case() {
        let dev = HostDevice::new();
        let raw = |d: &Memory, s: &Memory, n: usize| dev.raw_copy(d, s, n);
        let cfg = DeviceBenchConfig {
            bytes: 4 << 20,
            chunk: 1 << 20,
            reps: 2,
        };
        let recs = run(&dev, &raw, &cfg, |_| {}).unwrap();
        let cases: Vec<_> = recs.iter().map(|r| r.case.as_str()).collect();
        assert_eq!(cases, ["h2d_pinned", "d2h_pinned", "scatter_64k"]);
        assert!(recs
            .iter()
            .all(|r| r.gib_s > 0.0 && r.limit_gib_s > 0.0 && r.ratio > 0.0));
        assert!(run(&dev, &raw, &DeviceBenchConfig { reps: 0, ..cfg }, |_| {}).is_err());
    }

    /// Times of a launch of `n` iterations on a device whose first launch
    /// costs `first` seconds (a module load) and the others `fixed +
    /// per_iter * n`; records every timed count.
    fn device_model(
        first: f64,
        fixed: f64,
        per_iter: f64,
        seen: &mut Vec<u32>,
    ) -> impl FnMut(u32) -> Result<f64, ()> + '_ {
        move |n| {
            seen.push(n);
            Ok(if seen.len() == 1 {
                first
            } else {
                fixed + per_iter * f64::from(n)
            })
        }
    }

    #[test]
    fn calibration_ignores_the_first_launch_and_finds_the_target() {
        // A GPU-like kernel: 5 s of JIT on the first launch, then 20 us +
        // 1 us per iteration; one layer's load takes 1.3 ms.
        let mut seen = Vec::new();
        let n = calibrate(device_model(5.0, 20e-6, 1e-6, &mut seen), 1.3e-3).unwrap();
        assert!((1270..=1290).contains(&n), "{n}");
        // No timed launch ran past the target, and few ran.
        assert!(seen[1..]
            .iter()
            .all(|&k| 20e-6 + 1e-6 * f64::from(k) <= 1.3e-3));
        assert!(seen.len() <= CALIBRATE_STEPS + 1, "{seen:?}");
    }

    #[test]
    fn calibration_scales_down_a_heavy_compute_and_stays_bounded() {
        // 1 ms per iteration against a 10 ms load: 10 iterations.
        let mut seen = Vec::new();
        assert_eq!(
            calibrate(device_model(0.0, 0.0, 1e-3, &mut seen), 10e-3),
            Ok(10)
        );
        assert_eq!(seen.len(), 2, "{seen:?}");
        // A compute that never grows stops at the largest count, after a
        // bounded number of launches.
        let mut seen = Vec::new();
        assert_eq!(
            calibrate(device_model(1.0, 1e-6, 0.0, &mut seen), 1e-3),
            Ok(CALIBRATE_MAX)
        );
        assert!(seen.len() <= CALIBRATE_STEPS + 1, "{seen:?}");
        // Errors pass through.
        assert_eq!(calibrate(|_| Err::<f64, _>("launch"), 1.0), Err("launch"));
    }

    #[test]
    fn layerwise_reports_a_hidden_fraction() {
        let dev = HostDevice::new();
        let compute = |s: &<HostDevice as Device>::Stream, iters: u32| {
            dev.launch_host_fn(
                s,
                Box::new(move || {
                    let t = Instant::now();
                    while t.elapsed().as_micros() < iters as u128 {
                        std::hint::spin_loop();
                    }
                    Ok(())
                }),
            )
        };
        let r = layerwise(&dev, &compute, 8, 1 << 20, 1).unwrap();
        assert_eq!(r.case, "layerwise");
        let h = r.hidden_io_fraction.unwrap();
        assert!((0.0..=1.0).contains(&h), "{h}");
        assert!(r.gib_s > 0.0 && r.limit_gib_s > 0.0);
        assert!(layerwise(&dev, &compute, 1, 1 << 20, 1).is_err());
    }
}
