//! `ucm bench`: throughput measured against a baseline taken in the same
//! run, reported as ratios (never as absolute goals in timed tests).

#![deny(missing_docs)]

pub mod device;
pub mod hash;
pub mod io;
pub mod layerwise;
#[cfg(feature = "redis")]
pub mod remote;
pub mod store;
pub mod tiers;

/// The median of `v` (0 for an empty slice).
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return 0.0;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// A comparison judged round by round: in round `k` ours and the baseline
/// ran back to back, so `ours[k] / base[k]` cancels what moved the
/// machine between rounds (on a shared VM the baseline alone moves 2x
/// within a run). Goals are judged on `median`; `q1`..`q3` is the spread.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Paired {
    /// Each round's ratio, in round order.
    pub ratios: Vec<f64>,
    /// Their median.
    pub median: f64,
    /// Their first quartile.
    pub q1: f64,
    /// Their third quartile.
    pub q3: f64,
}

impl Paired {
    /// The per-round ratios `ours[k] / base[k]`, rounded to `digits`
    /// decimals, for the rounds where both are finite and the baseline
    /// positive.
    pub fn of(ours: &[f64], base: &[f64], digits: i32) -> Paired {
        let ratios: Vec<f64> = ours
            .iter()
            .zip(base)
            .filter(|(o, b)| o.is_finite() && b.is_finite() && **b > 0.0)
            .map(|(o, b)| o / b)
            .collect();
        let mut sorted = ratios.clone();
        sorted.sort_by(f64::total_cmp);
        Paired {
            median: round_to(quantile(&sorted, 0.5), digits),
            q1: round_to(quantile(&sorted, 0.25), digits),
            q3: round_to(quantile(&sorted, 0.75), digits),
            ratios: ratios.iter().map(|&r| round_to(r, digits)).collect(),
        }
    }

    /// `median [q1-q3]` with `digits` decimals.
    pub fn text(&self, digits: usize) -> String {
        format!(
            "{:.d$} [{:.d$}-{:.d$}]",
            self.median,
            self.q1,
            self.q3,
            d = digits
        )
    }
}

/// The `q` quantile of sorted `v`, interpolated between neighbours (0 for
/// an empty slice).
pub fn quantile(v: &[f64], q: f64) -> f64 {
    match v.len() {
        0 => 0.0,
        1 => v[0],
        n => {
            let at = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (at - lo as f64)
        }
    }
}

/// The spread of one side of a comparison over its rounds: the median
/// (what ratios are taken on) and the extremes. Rounds that produced no
/// finite figure are left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Spread {
    /// The median round.
    pub median: f64,
    /// The slowest round.
    pub min: f64,
    /// The fastest round.
    pub max: f64,
    /// Rounds counted.
    pub rounds: usize,
}

impl Spread {
    /// The spread of `v` (all zeros for no finite value).
    pub fn of(v: &[f64]) -> Spread {
        let finite: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        if finite.is_empty() {
            return Spread::default();
        }
        Spread {
            median: median(&finite),
            min: finite.iter().copied().fold(f64::INFINITY, f64::min),
            max: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            rounds: finite.len(),
        }
    }

    /// The same spread with every figure rounded to `digits` decimals.
    pub fn rounded(self, digits: i32) -> Spread {
        let r = |x: f64| round_to(x, digits);
        Spread {
            median: r(self.median),
            min: r(self.min),
            max: r(self.max),
            rounds: self.rounds,
        }
    }

    /// `median (min-max)` with `digits` decimals.
    pub fn text(&self, digits: usize) -> String {
        format!(
            "{:.d$} ({:.d$}-{:.d$})",
            self.median,
            self.min,
            self.max,
            d = digits
        )
    }
}

/// `x` rounded to `digits` decimals (every figure a bench records).
pub fn round_to(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// The machine's 1-minute load average (from `/proc/loadavg`), recorded
/// at the start of every bench: figures taken on a busy machine are not
/// comparable with a quiet one's.
pub fn load_average() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Reports the load average at the start of a bench through `progress`
/// and returns it.
pub fn announce_load(progress: &mut dyn FnMut(&str)) -> Option<f64> {
    let l = load_average();
    match l {
        Some(l) => progress(&format!("load average at start: {l:.2}")),
        None => progress("load average at start: unknown (no /proc/loadavg)"),
    }
    l
}

/// Bytes per second as GiB/s.
pub fn gib_s(bytes: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        return 0.0;
    }
    bytes as f64 / secs / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(gib_s(1 << 30, 2.0), 0.5);
    }

    #[test]
    fn a_spread_has_the_median_and_the_extremes() {
        let s = Spread::of(&[3.0, f64::NAN, 1.0, 2.0, 10.0]);
        assert_eq!(
            s,
            Spread {
                median: 2.5,
                min: 1.0,
                max: 10.0,
                rounds: 4
            }
        );
        assert_eq!(Spread::of(&[]), Spread::default());
        assert_eq!(Spread::of(&[1.23456]).rounded(2).median, 1.23);
        assert_eq!(Spread::of(&[1.0, 2.0, 4.0]).text(1), "2.0 (1.0-4.0)");
    }

    #[test]
    fn paired_ratios_are_taken_round_by_round() {
        // The machine halves its speed in rounds 2 and 3: separate medians
        // give 1.0 / 1.0 = 1.0, the rounds say ours is 0.9 of the baseline
        // every time.
        let base = [10.0, 5.0, 5.0, 10.0, 10.0];
        let ours = [9.0, 4.5, 4.5, 9.0, 9.0];
        let p = Paired::of(&ours, &base, 3);
        assert_eq!(p.ratios, vec![0.9; 5]);
        assert_eq!((p.median, p.q1, p.q3), (0.9, 0.9, 0.9));
        // Quartiles interpolate; a round without a baseline is left out.
        let p = Paired::of(&[1.0, 2.0, 3.0, 4.0, 7.0], &[1.0, 1.0, 1.0, 1.0, 0.0], 3);
        assert_eq!(p.ratios, vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!((p.median, p.q1, p.q3), (2.5, 1.75, 3.25));
        assert_eq!(p.text(2), "2.50 [1.75-3.25]");
        assert_eq!(Paired::of(&[], &[], 3), Paired::default());
    }
}
