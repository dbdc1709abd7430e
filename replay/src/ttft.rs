//! The replay's TTFT model: per-layer compute overlapping the loads, at a
//! load rate the run measured.
//!
//! **Load time.** The replay moves its bytes at `1/bytes_scale` of their
//! size. Scaling each step's measured wait by `full / scaled` (the earlier
//! model) multiplied every fixed cost of a step (lookups, task hand-offs,
//! thread wake-ups, a stall of the shared machine) by the scale too, so one
//! slow step moved a run's TTFT by tens of percent. A step's load at full
//! size is instead what the scaled step cost, plus the bytes it did not
//! move at the rate of a copy:
//!
//! `load = scaled / rate + (full - scaled) / copy_rate`
//!
//! - `rate`: one per run, the median over the run's loading steps of the
//!   bytes a step loaded over the time its slowest rank waited. It holds
//!   every per-item and per-step cost of the real path; a median over
//!   hundreds of steps holds still where their sum does not.
//! - `copy_rate`: measured in the same run by [`CopyProbe`]:
//!   copies between two host buffers in pieces of the loads' size (a load
//!   from the memory tier is that copy; so is one from a disk tier whose
//!   files sit in the page cache or on tmpfs, as the replay's do by
//!   default), the median of several rounds.
//!
//! **Overlap.** The layerwise path loads layer `i + 1` while layer `i`
//! computes. A step that computes for `C` and loads for `D` over `L` equal
//! layers therefore takes `max(C, D) + min(C, D) / L`: the longer of the
//! two stages runs in full, the shorter shows only for the first (load) or
//! last (compute) layer. A step that loads nothing takes `C`.

use ucm_harness::StepTiming;

/// The load rate of a run, in stored (scaled) bytes per second: the median
/// of its loading steps' `loaded / load_wait`. `None` when no step loaded
/// anything with a measurable wait.
pub fn load_rate<'a>(steps: impl IntoIterator<Item = &'a StepTiming>) -> Option<f64> {
    let rates: Vec<f64> = steps
        .into_iter()
        .filter(|s| s.loaded > 0 && !s.load_wait.is_zero())
        .map(|s| s.loaded as f64 / s.load_wait.as_secs_f64())
        .collect();
    (!rates.is_empty()).then(|| crate::report::median(&rates))
}

/// Time of a step that computes for `compute_ms` and loads for `load_ms`,
/// layer by layer over `layers` layers.
pub fn pipelined_ms(compute_ms: f64, load_ms: f64, layers: u32) -> f64 {
    let layers = f64::from(layers.max(1));
    compute_ms.max(load_ms) + compute_ms.min(load_ms) / layers
}

/// What the model needs to know about the run.
#[derive(Clone, Copy, Debug)]
pub struct TtftModel {
    /// Compute per prompt token not served, in microseconds.
    pub compute_us_per_token: f64,
    /// Layers of the model (at full size, as the spec has them).
    pub layers: u32,
    /// The run's load rate (see [`load_rate`]); `None` for a run that
    /// loaded nothing.
    pub rate: Option<f64>,
    /// The host's copy rate in bytes per second (see
    /// [`CopyProbe`]).
    pub copy_rate: f64,
}

/// Measures the host's copy rate (bytes per second) through a run: each
/// [`CopyProbe::sample`] times one copy of 32 MiB between two buffers in
/// pieces of the loads' size, and [`CopyProbe::rate`] is the median
/// sample. Sampled between requests, it sees the machine as the loads did.
/// The buffers are written before the first sample, so none pays for page
/// faults.
pub struct CopyProbe {
    piece: usize,
    src: Vec<u8>,
    dst: Vec<u8>,
    samples: Vec<f64>,
}

impl CopyProbe {
    const TOTAL: usize = 32 << 20;

    /// A probe copying in pieces of `piece` bytes.
    pub fn new(piece: usize) -> CopyProbe {
        CopyProbe {
            piece: piece.clamp(1, Self::TOTAL),
            src: vec![0x5a; Self::TOTAL],
            dst: vec![0; Self::TOTAL],
            samples: Vec::new(),
        }
    }

    /// Times one copy.
    pub fn sample(&mut self) {
        let t = std::time::Instant::now();
        for (d, s) in self
            .dst
            .chunks_mut(self.piece)
            .zip(self.src.chunks(self.piece))
        {
            d.copy_from_slice(s);
        }
        std::hint::black_box(&mut self.dst);
        let secs = t.elapsed().as_secs_f64().max(1e-9);
        self.samples.push(Self::TOTAL as f64 / secs);
    }

    /// The median sample, taking one first if there is none.
    pub fn rate(&mut self) -> f64 {
        if self.samples.is_empty() {
            self.sample();
        }
        let mut v = self.samples.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }
}

impl TtftModel {
    /// The TTFT of one request of `prompt` tokens of which `served` came
    /// from the cache, run as `steps`: the prefill's steps one after the
    /// other, each with its compute overlapping its loads. Tokens the
    /// engine recomputed after a failed load count in the first step.
    pub fn request_ms(&self, prompt: u64, served: u64, steps: &[StepTiming]) -> f64 {
        let per_token = self.compute_us_per_token / 1000.0;
        let prefill: Vec<&StepTiming> = steps.iter().filter(|s| s.prefill).collect();
        let to_compute = prompt.saturating_sub(served);
        let Some((first, rest)) = prefill.split_first() else {
            return to_compute as f64 * per_token;
        };
        let rest_tokens: u64 = rest.iter().map(|s| s.end - s.start).sum();
        let first_tokens = to_compute.saturating_sub(rest_tokens);
        let load_ms = |s: &StepTiming| match self.rate {
            Some(r) if s.loaded > 0 => {
                let rest = s.loaded_full.saturating_sub(s.loaded) as f64;
                (s.loaded as f64 / r + rest / self.copy_rate) * 1000.0
            }
            _ => 0.0,
        };
        let mut total = pipelined_ms(first_tokens as f64 * per_token, load_ms(first), self.layers);
        for s in rest {
            total += pipelined_ms(
                (s.end - s.start) as f64 * per_token,
                load_ms(s),
                self.layers,
            );
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn step(start: u64, end: u64, wait_ms: u64, loaded: u64, full: u64) -> StepTiming {
        StepTiming {
            start,
            end,
            prefill: true,
            load_wait: Duration::from_millis(wait_ms),
            loaded,
            loaded_full: full,
        }
    }

    #[test]
    fn the_rate_is_the_median_of_the_loading_steps() {
        // 1000 B in 1 ms, 1000 B in 2 ms, 1000 B in 100 ms (a stall), and
        // two steps that loaded nothing: the median is 500 kB/s, not the
        // 3000 B / 103 ms a sum of waits gives.
        let steps = [
            step(0, 10, 1, 1000, 64_000),
            step(0, 10, 2, 1000, 64_000),
            step(0, 10, 100, 1000, 64_000),
            step(0, 10, 5, 0, 0),
            step(0, 10, 0, 1000, 64_000),
        ];
        assert_eq!(load_rate(&steps), Some(500_000.0));
        assert_eq!(load_rate(&steps[..2]), Some(750_000.0));
        assert_eq!(load_rate(&steps[3..4]), None);
    }

    #[test]
    fn the_copy_rate_is_the_median_sample() {
        let mut p = CopyProbe::new(64 << 10);
        let r = p.rate();
        assert!(r.is_finite() && r > 1e6, "{r}");
        p.samples = vec![3.0, 1.0, 2.0, 9.0, 5.0];
        assert_eq!(p.rate(), 3.0);
    }

    #[test]
    fn compute_overlaps_the_loads_layer_by_layer() {
        // 8 layers, compute 80 ms, load 40 ms: the load shows for one
        // layer (5 ms).
        assert_eq!(pipelined_ms(80.0, 40.0, 8), 85.0);
        // Load-bound: 40 ms of load, 8 ms of compute, the last layer's 1 ms.
        assert_eq!(pipelined_ms(8.0, 40.0, 8), 41.0);
        assert_eq!(pipelined_ms(8.0, 0.0, 8), 8.0);
        assert_eq!(pipelined_ms(0.0, 40.0, 0), 40.0);
    }

    #[test]
    fn a_request_is_its_prefill_steps_in_turn() {
        let m = TtftModel {
            compute_us_per_token: 100.0,
            layers: 4,
            // 100 kB/s of scaled bytes (every cost of the small loads),
            // 1.98 MB/s for the rest of the bytes.
            rate: Some(1e5),
            copy_rate: 1.98e6,
        };
        // 1000-token prompt, 600 served: the first step loads 100 B scaled
        // (1 ms) and 10 kB at full size (9,900 B more: 5 ms more), and
        // computes 300 tokens (30 ms); the second computes 100 tokens
        // (10 ms); a decode step does not count.
        let mut decode = step(1000, 1100, 50, 500, 50_000);
        decode.prefill = false;
        let steps = [
            step(600, 900, 3, 100, 10_000),
            step(900, 1000, 0, 0, 0),
            decode,
        ];
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(
            m.request_ms(1000, 600, &steps),
            30.0 + 6.0 / 4.0 + 10.0
        ));
        // A failed load: the engine recomputes from 500, in the first step.
        assert!(close(
            m.request_ms(1000, 500, &steps),
            40.0 + 6.0 / 4.0 + 10.0
        ));
        // Load-bound: a 100 kB load (1 ms + 99,900 B at 1.98 MB/s) outlasts
        // the 40 ms of compute, which shows for one layer.
        let big = [step(600, 1000, 3, 100, 100_000)];
        let load = 1.0 + 99_900.0 / 1.98e6 * 1000.0;
        assert!(close(m.request_ms(1000, 600, &big), load + 40.0 / 4.0));
        // No steps (recompute): compute only.
        assert_eq!(m.request_ms(1000, 0, &[]), 100.0);
        // No rate: loads cost nothing measurable.
        let none = TtftModel { rate: None, ..m };
        assert_eq!(none.request_ms(1000, 600, &steps), 40.0);
    }
}
