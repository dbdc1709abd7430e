//! `ucm bench device`: copy throughput through the `Device` trait against
//! the backend's raw copy path, measured in the same run.
//!
//! Cases (one JSON record each, `{"case","gib_s","limit_gib_s","ratio"}`):
//! - `h2d_pinned`, `d2h_pinned`: chunked async copies between pinned and
//!   device memory through the trait, against the backend's raw copy loop
//!   of the same bytes (memcpy on the host device, `aclrtMemcpyAsync`
//!   straight through the FFI on Ascend). Goal: ratio >= 0.9.
//! - `scatter_64k`: one batched copy of 64 KiB runs to scattered device
//!   offsets, against one contiguous copy of the same bytes through the
//!   trait. Goal: ratio >= 0.8.

use std::time::Instant;

use serde::Serialize;
use ucm_device::{CopyRun, Device, DeviceError, Memory};

use super::{gib_s, median};

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
    /// `gib_s / limit_gib_s`.
    pub ratio: f64,
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

fn record(case: &str, ours: &[f64], limit: &[f64]) -> DeviceBenchRecord {
    let (g, l) = (median(ours), median(limit));
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    DeviceBenchRecord {
        case: case.to_string(),
        gib_s: r3(g),
        limit_gib_s: r3(l),
        ratio: if l > 0.0 { r3(g / l) } else { 0.0 },
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
    let bytes = cfg.bytes / (64 << 10) * (64 << 10);
    let cfg = DeviceBenchConfig { bytes, ..*cfg };
    let host = dev.alloc_pinned(bytes)?;
    host.write_host(0, &crate::device::conformance::pattern(7, bytes))?;
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
        let r = record(case, &ours, &limit);
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
    let r = record("scatter_64k", &ours, &limit);
    progress(&format!(
        "scatter_64k: {:.3} GiB/s vs contiguous {:.3} GiB/s (ratio {:.2})",
        r.gib_s, r.limit_gib_s, r.ratio
    ));
    out.push(r);
    Ok(out)
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
}
