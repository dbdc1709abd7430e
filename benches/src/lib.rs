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
}
